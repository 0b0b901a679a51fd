//! Table inputs (docs/topologies.md, "Tables"): a topic whose records set the value state its
//! table names for the record's key — an empty or null value clears it — as Kafka Streams'
//! KTable materialises a topic. The operator reads it with the ordinary state imports (a
//! co-partitioned table holds the keys of its shard's stream records).
//!
//! At a shard's open, before its worker starts, [`load_tables`] reads the shard's partition of
//! each table from the checkpoint's offset to its end (as Kafka Streams' restore consumer
//! reads a changelog), so that no stream record runs before the table rows that were there
//! when it started; later updates reach the worker through the consumer group with the other
//! inputs (`worker::tables`).

use super::ports::{Source, SourceError};
use crate::ids::{Offset, Partition};
use crate::runtime::InputRecord;
use crate::state::checkpoint::InputOffsets;
use crate::state::{Shard, StateError, StateWrite, key};
use std::collections::BTreeMap;
use tokio::sync::mpsc;

/// The state writes of `records` of a table into value state `state`: each sets its key's
/// value, or clears it when the value is empty (a Kafka tombstone has none). Records without a
/// key are skipped: no stream record could look them up.
pub(crate) fn table_writes(records: &[InputRecord], state: &str) -> Vec<StateWrite> {
    records
        .iter()
        .filter(|r| !r.key.is_empty())
        .map(|r| StateWrite {
            key: key::value_key(&r.key, state),
            value: (!r.value.is_empty()).then(|| bytes::Bytes::copy_from_slice(&r.value)),
            expires_at_ms: None,
        })
        .collect()
}

/// Why a table could not be loaded: the open fails and is tried again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    State(#[from] StateError),
}

/// What a shard's open loaded of its tables.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    /// Each table's end as read: where the group's consumer goes on.
    pub ends: InputOffsets,
    /// Table records applied.
    pub records: u64,
}

/// Loads `partition`'s part of each of `tables` (topic → state) into `shard`, from the offsets
/// `resume` names (the shard's checkpoint; a table it names none of from its beginning) to
/// each partition's end now.
///
/// # Errors
/// [`LoadError`] when a table cannot be read or its rows written.
pub(crate) async fn load_tables<Src: Source, S: Shard>(
    source: &Src,
    shard: &S,
    partition: Partition,
    tables: &BTreeMap<String, String>,
    resume: &InputOffsets,
) -> Result<Loaded, LoadError> {
    let mut loaded = Loaded::default();
    for (topic, state) in tables {
        // Two chunks in flight: one applied while the next is read.
        let (chunks, mut received) = mpsc::channel::<Vec<InputRecord>>(2);
        let read = source.read_table(topic, partition, resume.next(topic), chunks);
        // Moved in, so that a failed write drops the receiver and the read ends too.
        let apply = async move {
            let mut records = 0u64;
            while let Some(chunk) = received.recv().await {
                records += chunk.len() as u64;
                shard.apply(table_writes(&chunk, state)).await?;
                fail::fail_point!("table-mid-load", |_| crate::fail_points::crash(
                    "table-mid-load"
                ));
            }
            Ok::<_, StateError>(records)
        };
        let (end, applied) = tokio::join!(read, apply);
        // A failed write ended the read: its error is the cause.
        loaded.records += applied?;
        let end: Offset = end?;
        loaded.ends.advance_to(topic, end);
    }
    Ok(loaded)
}
