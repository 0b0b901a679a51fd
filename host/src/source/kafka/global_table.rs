//! A global table's reader (docs/topologies.md, "Global tables"): every partition of its topic,
//! read outside the consumer group from the offsets of the table's snapshot, first to the end
//! the partitions have when it starts, then on as records come — as Kafka Streams' global
//! stream thread reads a GlobalKTable's topic.

use super::table::{TableConsumer, TableReaderContext};
use super::to_input_record;
use crate::pipeline::ports::{SourceError, TableUpdate};
use crate::runtime::InputRecord;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Most records per update handed over.
const CHUNK_RECORDS: usize = 1024;

/// How long one poll waits when nothing is pending, before the reader looks whether it is
/// still wanted.
const POLL: Duration = Duration::from_millis(100);

/// How long the topic's metadata and each partition's end may take to look up.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// [`follow`] on a blocking thread, which it keeps until `updates` is closed.
///
/// # Errors
/// As [`follow`]'s, or the thread's panic.
pub(super) async fn read(
    config: ClientConfig,
    topic: Arc<str>,
    from: BTreeMap<i32, i64>,
    updates: mpsc::Sender<TableUpdate>,
) -> Result<(), SourceError> {
    let what = format!("global table `{topic}`");
    tokio::task::spawn_blocking(move || follow(&config, &topic, &from, &updates))
        .await
        .map_err(|err| SourceError {
            what,
            source: Box::new(err),
        })?
}

/// Where a read starts: each partition's first offset and the end it has now.
struct Start {
    next: BTreeMap<i32, i64>,
    /// Partitions not read to their end yet → that end.
    pending: BTreeMap<i32, i64>,
    /// An offset of `from` was past its partition's end: every partition is read from its
    /// beginning.
    reset: bool,
}

/// Reads every partition of `topic` from `from` on (see [`crate::pipeline::Source::follow_table`]).
/// Blocking.
///
/// # Errors
/// [`SourceError`] when the client cannot be made, the topic or its ends cannot be looked
/// up, or a fetch fails before the reader caught up.
fn follow(
    config: &ClientConfig,
    topic: &Arc<str>,
    from: &BTreeMap<i32, i64>,
    updates: &mpsc::Sender<TableUpdate>,
) -> Result<(), SourceError> {
    let failed = |what: &str, err: KafkaError| SourceError {
        what: format!("global table `{topic}`: {what}"),
        source: Box::new(err),
    };
    let consumer: TableConsumer = config
        .create_with_context(TableReaderContext)
        .map_err(|err| failed("cannot make its reader", err))?;
    let Start {
        mut next,
        mut pending,
        reset,
    } = start(&consumer, topic, from)?;
    if reset && updates.blocking_send(TableUpdate::Reset).is_err() {
        return Ok(());
    }
    let mut assignment = TopicPartitionList::new();
    for (partition, offset) in &next {
        assignment
            .add_partition_offset(topic, *partition, rdkafka::Offset::Offset(*offset))
            .map_err(|err| failed("cannot assign it", err))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|err| failed("cannot assign it", err))?;
    let mut caught_up = false;
    let mut chunk: Vec<InputRecord> = Vec::new();
    loop {
        if !caught_up && pending.is_empty() {
            if !send(updates, &mut chunk)
                || updates
                    .blocking_send(TableUpdate::CaughtUp(next.clone()))
                    .is_err()
            {
                return Ok(());
            }
            caught_up = true;
        }
        if updates.is_closed() {
            return Ok(());
        }
        // What is fetched already goes in one update; then a wait.
        let wait = if chunk.is_empty() {
            POLL
        } else {
            Duration::ZERO
        };
        match consumer.poll(wait) {
            None => {
                if !send(updates, &mut chunk) {
                    return Ok(());
                }
                drop_read_partitions(&consumer, topic, &mut pending, &mut next);
            }
            Some(Ok(message)) => {
                let partition = message.partition();
                next.insert(partition, message.offset() + 1);
                if pending
                    .get(&partition)
                    .is_some_and(|end| message.offset() + 1 >= *end)
                {
                    pending.remove(&partition);
                }
                chunk.push(to_input_record(&message, topic, 0));
                if chunk.len() >= CHUNK_RECORDS && !send(updates, &mut chunk) {
                    return Ok(());
                }
            }
            // The end of what a committed read sees: past markers and open transactions.
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                if let Some(position) = position(&consumer, topic, partition) {
                    let at = next.entry(partition).or_insert(position);
                    *at = (*at).max(position);
                }
                pending.remove(&partition);
            }
            Some(Err(err)) if !caught_up => return Err(failed("cannot read it", err)),
            Some(Err(err)) => {
                tracing::warn!(topic = %topic, error = %err, "global table: a read failed; the reader goes on");
            }
        }
    }
}

/// Drops from `pending` each partition whose position is past its end, moving `next` there:
/// read, though no EOF came through the poll (one that reached the error callback instead, or
/// transaction markers after the last record). For when nothing came for a while.
fn drop_read_partitions(
    consumer: &TableConsumer,
    topic: &str,
    pending: &mut BTreeMap<i32, i64>,
    next: &mut BTreeMap<i32, i64>,
) {
    pending.retain(|partition, end| {
        position(consumer, topic, *partition).is_none_or(|at| {
            if at >= *end {
                let next = next.entry(*partition).or_insert(at);
                *next = (*next).max(at);
            }
            at < *end
        })
    });
}

/// Each partition's first offset (`from`'s, or the partition's beginning when `from` names
/// none or one before it, or one of `from` is past its partition's end) and the end it has
/// now.
///
/// # Errors
/// [`SourceError`] when the topic or an end cannot be looked up, or the topic has no
/// partitions.
fn start(
    consumer: &TableConsumer,
    topic: &str,
    from: &BTreeMap<i32, i64>,
) -> Result<Start, SourceError> {
    let failed = |what: &str, source: crate::pipeline::ports::Cause| SourceError {
        what: format!("global table `{topic}`: {what}"),
        source,
    };
    let metadata = consumer
        .fetch_metadata(Some(topic), LOOKUP_TIMEOUT)
        .map_err(|err| failed("cannot look it up", Box::new(err)))?;
    let partitions: Vec<i32> = match metadata.topics().first() {
        Some(t) if t.error().is_none() => t.partitions().iter().map(|p| p.id()).collect(),
        Some(t) => {
            return Err(failed(
                "cannot look it up",
                format!("the broker answered {:?}", t.error()).into(),
            ));
        }
        None => Vec::new(),
    };
    if partitions.is_empty() {
        return Err(failed(
            "cannot look it up",
            "the topic has no partitions".into(),
        ));
    }
    let mut ends = BTreeMap::new();
    for partition in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, LOOKUP_TIMEOUT)
            .map_err(|err| failed("cannot look up its end", Box::new(err)))?;
        ends.insert(partition, (low, high));
    }
    let reset = ends
        .iter()
        .any(|(p, (_, high))| from.get(p).is_some_and(|f| f > high));
    let mut start = Start {
        next: BTreeMap::new(),
        pending: BTreeMap::new(),
        reset,
    };
    for (partition, (low, high)) in ends {
        let from = if reset { None } else { from.get(&partition) };
        let first = from.map_or(low, |f| (*f).max(low));
        start.next.insert(partition, first);
        if first < high {
            start.pending.insert(partition, high);
        }
    }
    Ok(start)
}

/// Hands `chunk` over (blocking while the table applies the one before), if it holds
/// anything; `false` once the reader is no longer wanted.
fn send(updates: &mpsc::Sender<TableUpdate>, chunk: &mut Vec<InputRecord>) -> bool {
    chunk.is_empty()
        || updates
            .blocking_send(TableUpdate::Records(std::mem::take(chunk)))
            .is_ok()
}

/// The reader's position in `partition`: the offset it fetches next.
fn position(consumer: &TableConsumer, topic: &str, partition: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        rdkafka::Offset::Offset(offset) => Some(offset),
        _ => None,
    }
}
