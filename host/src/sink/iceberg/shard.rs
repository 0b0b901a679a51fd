//! One shard's part of the Iceberg sink (docs/iceberg.md, "Exactly once"): its open data
//! files, and the list of its closed files not yet in the table, kept as a reserved entry of
//! the shard's own state so that every checkpoint holds it.
//!
//! At each checkpoint ([`IcebergShard::prepare`]) the open files are closed and listed under
//! the version the checkpoint will have; entries the table already has (its committed version
//! for this shard is at or above theirs) are dropped; the list is written to the shard before
//! the checkpoint. When the shard opens, the list comes back with the state
//! ([`IcebergShard::restore`]): entries of checkpoints that never became decided are not in
//! it, and their files are orphans for GC.

use super::catalog::Lakehouse;
use super::commit::{Covered, committed_covered, committed_versions};
use super::files::{FilesError, ShardFiles, decode_data_file, encode_data_file};
use super::schema::TableSchema;
use crate::ids::{ManifestVersion, Offset, Partition};
use crate::runtime::InputRecord;
use crate::state::StateWrite;
use crate::state::checkpoint::InputOffsets;
use bytes::Bytes;
use iceberg::TableIdent;
use iceberg::spec::DataFile;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The reserved state key of a shard's pending list: `FF FF FF FF 'i'` (the reserved key
/// space of time/keys.rs; no state key starts with `FF FF FF FF`).
pub const PENDING_KEY: [u8; 5] = crate::time::keys::TABLE_PENDING_KEY;

/// The pending list as stored (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingList {
    /// The pipeline (its uid) whose files these are: a shard restored from another
    /// pipeline's savepoint does not take them over (they are that pipeline's to commit, to
    /// its table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Oldest first.
    pub entries: Vec<PendingEntry>,
}

/// The files of one checkpoint that are not in the table yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingEntry {
    /// The checkpoint's manifest version.
    pub version: ManifestVersion,
    /// Its data files, each in Iceberg's JSON form ([`encode_data_file`]).
    pub files: Vec<String>,
    /// The input offsets the checkpoint covers (topic → next offset).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub offsets: BTreeMap<String, Offset>,
    /// The event-time timers it covers: all with a time (ms) at or before this had fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers_through_ms: Option<i64>,
}

impl PendingList {
    /// The list a shard's stored value holds; an empty one for none.
    ///
    /// # Errors
    /// [`serde_json::Error`] for a value that is not one (a corrupt shard).
    pub fn decode(value: Option<&[u8]>) -> Result<Self, serde_json::Error> {
        value.map_or(Ok(Self::default()), serde_json::from_slice)
    }

    /// The value to store.
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("strings and numbers encode"))
    }
}

/// Why the shard's sink part failed: the shard reopens from its checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum IcebergShardError {
    /// Writing or closing a data file, or reading the table, failed.
    #[error("iceberg table operation failed. what=`{what}`")]
    Table {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: Box<iceberg::Error>,
    },
    /// An emit did not fit the table (the emit import checks each one first: a bug if seen).
    #[error(transparent)]
    Files(Box<FilesError>),
    /// The stored pending list does not decode.
    #[error("the shard's pending list of data files does not decode")]
    Corrupt(#[source] serde_json::Error),
}

/// One shard's open files and pending list.
#[derive(Debug)]
pub struct IcebergShard {
    lakehouse: Lakehouse,
    ident: TableIdent,
    uid: String,
    partition: Partition,
    files: ShardFiles,
    pending: PendingList,
    /// What the table holds of this shard's output, as of opening: emits of records below
    /// its offsets and of event-time timers through its time are not written again (a reset
    /// to a savepoint or a fallback past a committed checkpoint replays them).
    written: Covered,
    /// Where the shard's input is against `written` (timer emits are judged by it).
    replay: Replay,
}

/// Where a shard's input is against what the table holds of its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// Below the table's offsets in some input topic.
    Behind,
    /// At exactly the table's offsets.
    AtTable,
    /// Past them, or the table holds nothing of the shard.
    Past,
}

impl Replay {
    fn of(written: &Covered, position: &InputOffsets) -> Self {
        if written.offsets.is_empty() {
            return Replay::Past;
        }
        let mut at = true;
        for (topic, &next) in &written.offsets {
            let p = position.next(topic).unwrap_or(Offset(0));
            if p < next {
                return Replay::Behind;
            }
            at &= p == next;
        }
        let other_topic = position
            .iter()
            .any(|(topic, _)| !written.offsets.contains_key(topic));
        if at && !other_topic {
            Replay::AtTable
        } else {
            Replay::Past
        }
    }
}

impl IcebergShard {
    /// The shard part of `partition` for pipeline `uid` writing `tenant`'s `table`; files are
    /// named `weir-{uid}-{partition}-{random}-{n}.parquet`.
    ///
    /// # Errors
    /// [`IcebergShardError::Table`] when the table cannot be loaded or created.
    pub async fn open(
        lakehouse: &Lakehouse,
        (tenant, table): (&str, &str),
        schema: &TableSchema,
        uid: &str,
        partition: Partition,
    ) -> Result<Self, IcebergShardError> {
        let loaded = lakehouse
            .table(tenant, table, schema)
            .await
            .map_err(|e| match e {
                super::LakehouseError::Iceberg { what, source } => IcebergShardError::Table {
                    what,
                    source: Box::new(source),
                },
                other => IcebergShardError::Table {
                    what: "open the table",
                    source: Box::new(iceberg::Error::new(
                        iceberg::ErrorKind::DataInvalid,
                        other.to_string(),
                    )),
                },
            })?;
        let prefix = format!("weir-{uid}-{partition}-{:08x}", rand::random::<u32>());
        let files = ShardFiles::new(
            &loaded,
            schema.clone(),
            prefix,
            lakehouse.settings().target_file_size_bytes,
        )
        .map_err(|source| IcebergShardError::Table {
            what: "open the data file writer",
            source: Box::new(source),
        })?;
        Ok(Self {
            lakehouse: lakehouse.clone(),
            ident: Lakehouse::ident(tenant, table),
            uid: uid.to_owned(),
            partition,
            files,
            pending: PendingList {
                uid: Some(uid.to_owned()),
                entries: Vec::new(),
            },
            written: committed_covered(&loaded, uid)
                .remove(&partition)
                .unwrap_or_default(),
            replay: Replay::Past,
        })
    }

    /// Whether the rows emitted for `source` are in the table already, so that this emit is
    /// not written again:
    /// - a record's: its offset is below what the table holds of its topic (a check of the
    ///   record alone, whatever order concurrent batches' emits come in);
    /// - an event-time timer's (offset -1, its time as timestamp): the shard's input, as of
    ///   the round ([`IcebergShard::position`]), is behind what the table holds — every round
    ///   there ran before the table's checkpoint — or exactly at it and the timer's time is at
    ///   or before those the checkpoint had fired (the round may have run before or after
    ///   it); once the input is past, never;
    /// - a processing-time timer's: never (whether it fired before the table's checkpoint
    ///   depends on the clock, not on the input).
    pub fn written(&self, source: &InputRecord) -> bool {
        if source.offset >= 0 {
            return self
                .written
                .offsets
                .get(&*source.topic)
                .is_some_and(|&next| source.offset < next.0);
        }
        if self.replay == Replay::Past {
            return false;
        }
        let event_time = source
            .headers
            .iter()
            .any(|h| h.name == "weir.timer.domain" && h.value == b"event-time");
        event_time
            && match self.replay {
                Replay::Behind => true,
                Replay::AtTable => self
                    .written
                    .timers_through_ms
                    .is_some_and(|through| source.timestamp_ms <= through),
                Replay::Past => false,
            }
    }

    /// The shard's input is processed up to `offsets` (exact: no record is in flight), before
    /// a timer round's emits.
    pub fn position(&mut self, offsets: &InputOffsets) {
        if self.replay != Replay::Past {
            self.replay = Replay::of(&self.written, offsets);
            if self.replay == Replay::Past {
                tracing::info!(
                    partition = self.partition.0,
                    "the shard's input is past what the table holds"
                );
            }
        }
    }

    /// Takes the pending list the shard's state holds (`value` of [`PENDING_KEY`]) and the
    /// input offsets the shard resumes at.
    ///
    /// # Errors
    /// [`IcebergShardError::Corrupt`].
    pub fn restore(
        &mut self,
        value: Option<&[u8]>,
        resume: &InputOffsets,
    ) -> Result<(), IcebergShardError> {
        self.replay = Replay::of(&self.written, resume);
        if self.replay == Replay::Behind {
            tracing::info!(partition = self.partition.0, table = %self.ident, written = ?self.written, resume = ?resume, "the shard resumes behind what the table holds (a reset or a fallback): the replayed input's rows are not written again");
        }
        let restored = PendingList::decode(value).map_err(IcebergShardError::Corrupt)?;
        if restored.uid.as_deref().is_some_and(|uid| uid != self.uid) {
            tracing::warn!(partition = self.partition.0, from = ?restored.uid, files = restored.entries.iter().map(|e| e.files.len()).sum::<usize>(), "the restored state lists another pipeline's uncommitted data files; they stay that pipeline's");
            self.pending = PendingList::default();
        } else {
            self.pending = restored;
        }
        self.pending.uid = Some(self.uid.clone());
        Ok(())
    }

    /// Appends an emit's row.
    ///
    /// # Errors
    /// [`IcebergShardError::Files`].
    pub async fn push(&mut self, value: &[u8]) -> Result<(), IcebergShardError> {
        self.files
            .push(value)
            .await
            .map_err(|e| IcebergShardError::Files(Box::new(e)))
    }

    /// The pending list now.
    pub fn pending(&self) -> &PendingList {
        &self.pending
    }

    /// Closes the open files as checkpoint `version`'s — covering the input below `offsets`
    /// and the event-time timers through `timers_through_ms` — drops the entries the table
    /// has, and returns the state write of the new list (to apply before the checkpoint).
    /// Nothing is written when nothing changed.
    ///
    /// # Errors
    /// [`IcebergShardError::Table`]: the open files are lost; the shard must reopen from its
    /// checkpoint (which replays their rows).
    pub async fn prepare(
        &mut self,
        version: ManifestVersion,
        offsets: &InputOffsets,
        timers_through_ms: Option<i64>,
    ) -> Result<Option<StateWrite>, IcebergShardError> {
        let closed: Vec<DataFile> =
            self.files
                .close()
                .await
                .map_err(|source| IcebergShardError::Table {
                    what: "close the data files",
                    source: Box::new(source),
                })?;
        let before = self.pending.clone();
        if !closed.is_empty() {
            fail::fail_point!("iceberg-after-files", |_| crate::fail_points::crash(
                "iceberg-after-files"
            ));
            let files = closed
                .into_iter()
                .map(encode_data_file)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| IcebergShardError::Table {
                    what: "encode a data file",
                    source: Box::new(source),
                })?;
            self.pending.entries.push(PendingEntry {
                version,
                files,
                offsets: offsets.iter().map(|(t, o)| (t.to_owned(), o)).collect(),
                timers_through_ms,
            });
        }
        if !self.pending.entries.is_empty() {
            // Dropping what the table has is housekeeping: with the catalog away, the list
            // is kept whole (it is cumulative) and the checkpoint goes on.
            match self.lakehouse.catalog().load_table(&self.ident).await {
                Ok(table) => {
                    if let Some(&committed) =
                        committed_versions(&table, &self.uid).get(&self.partition)
                    {
                        self.pending.entries.retain(|e| e.version > committed);
                    }
                }
                Err(e) => {
                    tracing::warn!(partition = self.partition.0, table = %self.ident, error = %crate::error::Chain(&e), "cannot read the table's committed checkpoints; the shard keeps its whole list of pending files");
                }
            }
        }
        tracing::debug!(
            partition = self.partition.0,
            version = version.0,
            entries = self.pending.entries.len(),
            "iceberg files prepared"
        );
        let max = self.lakehouse.settings().pending_checkpoints_max;
        let (was, is) = (
            before.entries.len() >= max,
            self.pending.entries.len() >= max,
        );
        if is && !was {
            tracing::warn!(partition = self.partition.0, table = %self.ident, checkpoints = self.pending.entries.len(), "the table's commits lag: this many checkpoints' files wait for one; the partition takes no more input until they land");
        } else if was && !is {
            tracing::info!(partition = self.partition.0, table = %self.ident, checkpoints = self.pending.entries.len(), "the table's commits caught up; the partition takes input again");
        }
        Ok((self.pending != before).then(|| StateWrite {
            key: PENDING_KEY.to_vec(),
            value: Some(self.pending.encode()),
            expires_at_ms: None,
        }))
    }
}

/// The pending checkpoints a shard's list names, decoded against the table's `schema`.
///
/// # Errors
/// [`iceberg::Error`] for a file that does not decode.
pub fn pending_checkpoints(
    partition: Partition,
    list: &PendingList,
    schema: &iceberg::spec::Schema,
) -> iceberg::Result<Vec<super::PendingCheckpoint>> {
    list.entries
        .iter()
        .map(|e| {
            Ok(super::PendingCheckpoint {
                partition,
                version: e.version,
                files: e
                    .files
                    .iter()
                    .map(|f| decode_data_file(f, schema))
                    .collect::<iceberg::Result<_>>()?,
                covered: Covered {
                    offsets: e.offsets.clone(),
                    timers_through_ms: e.timers_through_ms,
                },
            })
        })
        .collect()
}
