//! A table input's load (docs/topologies.md, "Tables"): one partition of its topic read outside
//! the consumer group, from the shard's checkpoint offset to the end the partition had when the
//! read began — as Kafka Streams' restore consumer reads a changelog before the task runs.

use super::to_input_record;
use crate::ids::{Offset, Partition};
use crate::pipeline::ports::SourceError;
use crate::runtime::InputRecord;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::topic_partition_list::TopicPartitionList;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Records per chunk handed to the open, which applies each to the shard as it comes.
const CHUNK_RECORDS: usize = 1024;

/// How long one poll waits before the read looks whether the open still wants it.
const POLL: Duration = Duration::from_millis(100);

/// How long the lookup of the partition's end may take.
const WATERMARKS_TIMEOUT: Duration = Duration::from_secs(10);

/// The table reads' client configuration: the pipeline consumer's, outside its group — a
/// group of its own, `{group}.tables`, which librdkafka wants of a consumer but which the read
/// never joins nor commits to — reading committed records only, and told when it reaches the
/// partition's end.
pub(super) fn table_config(settings: &crate::config::Settings) -> ClientConfig {
    let mut config = settings.kafka.client_config();
    config.set(
        "group.id",
        format!("{}.tables", settings.pipeline.group_id()),
    );
    for (k, v) in &settings.kafka.consumer {
        if !k.starts_with("group.") && k != "partition.assignment.strategy" {
            config.set(k, v);
        }
    }
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true");
    config
}

/// The table readers' client context: as rust-rdkafka's default, but a partition EOF that
/// reaches the error callback (naming no partition) is the end of a partition, not an error.
pub(super) struct TableReaderContext;

impl rdkafka::ClientContext for TableReaderContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(
            error,
            KafkaError::Global(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
        ) {
            tracing::trace!(
                reason,
                "table reader: partition end reported without its partition"
            );
        } else {
            tracing::error!("librdkafka: {error}: {reason}");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for TableReaderContext {}

/// A table reader's consumer.
pub(super) type TableConsumer = BaseConsumer<TableReaderContext>;

/// What a table read is: which partition of which input, from where.
pub(super) struct TableRead {
    pub topic: Arc<str>,
    /// The topic's index among the run's inputs.
    pub input: u32,
    pub partition: Partition,
    /// Where to start: the shard's checkpoint offset, or the partition's beginning.
    pub from: Option<Offset>,
}

/// [`read_to_end`] on a blocking thread.
///
/// # Errors
/// As [`read_to_end`]'s, or the thread's panic.
pub(super) async fn read(
    config: ClientConfig,
    read: TableRead,
    chunks: mpsc::Sender<Vec<InputRecord>>,
) -> Result<Offset, SourceError> {
    let what = format!("table `{}` partition {}", read.topic, read.partition.0);
    tokio::task::spawn_blocking(move || read_to_end(&config, &read, &chunks))
        .await
        .map_err(|err| SourceError {
            what,
            source: Box::new(err),
        })?
}

/// Reads `read`'s partition up to the end it has now, in chunks into `chunks`; returns the
/// offset after the last record (or control record) read: where the group's consumer goes on.
/// Blocking: run it on a blocking thread. Ends early, with an error, once `chunks` is closed
/// (the open was given up).
///
/// # Errors
/// [`SourceError`] when the client cannot be made, the end cannot be looked up, a fetch fails
/// for good or the open gave the read up.
fn read_to_end(
    config: &ClientConfig,
    read: &TableRead,
    chunks: &mpsc::Sender<Vec<InputRecord>>,
) -> Result<Offset, SourceError> {
    let failed = |what: &str, err: KafkaError| SourceError {
        what: format!(
            "table `{}` partition {}: {what}",
            read.topic, read.partition.0
        ),
        source: Box::new(err),
    };
    let consumer: TableConsumer = config
        .create_with_context(TableReaderContext)
        .map_err(|err| failed("cannot make its reader", err))?;
    let (low, high) = consumer
        .fetch_watermarks(&read.topic, read.partition.0, WATERMARKS_TIMEOUT)
        .map_err(|err| failed("cannot look up its end", err))?;
    let start = read.from.map_or(low, |from| from.0.max(low));
    if start >= high {
        return Ok(Offset(start));
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(
            &read.topic,
            read.partition.0,
            rdkafka::Offset::Offset(start),
        )
        .map_err(|err| failed("cannot assign it", err))?;
    consumer
        .assign(&assignment)
        .map_err(|err| failed("cannot assign it", err))?;
    let mut next = start;
    let mut chunk = Vec::with_capacity(CHUNK_RECORDS);
    while next < high {
        if chunks.is_closed() {
            return Err(given_up(read));
        }
        match consumer.poll(POLL) {
            // Nothing for a while: past the end already? (An end whose EOF reached the error
            // callback instead, or transaction markers after the last record.)
            None => {
                if let Some(at) = position(&consumer, read).filter(|p| *p >= high) {
                    next = next.max(at);
                    break;
                }
            }
            Some(Ok(message)) => {
                next = message.offset() + 1;
                chunk.push(to_input_record(&message, &read.topic, read.input));
                if chunk.len() >= CHUNK_RECORDS {
                    send(chunks, std::mem::take(&mut chunk), read)?;
                }
            }
            // The end of what a committed read sees (an open transaction's records and the
            // markers after the last record are not handed out): the position is past them.
            Some(Err(KafkaError::PartitionEOF(_))) => {
                next = position(&consumer, read).map_or(next, |p| p.max(next));
                break;
            }
            Some(Err(err)) => return Err(failed("cannot read it", err)),
        }
    }
    if !chunk.is_empty() {
        send(chunks, chunk, read)?;
    }
    Ok(Offset(next))
}

/// Hands `chunk` to the open (blocking while it applies the one before).
fn send(
    chunks: &mpsc::Sender<Vec<InputRecord>>,
    chunk: Vec<InputRecord>,
    read: &TableRead,
) -> Result<(), SourceError> {
    chunks.blocking_send(chunk).map_err(|_| given_up(read))
}

/// The open stopped waiting for the read (the partition was revoked, the pipeline stops, or
/// applying a chunk failed).
fn given_up(read: &TableRead) -> SourceError {
    SourceError {
        what: format!("table `{}` partition {}", read.topic, read.partition.0),
        source: "the load was given up".into(),
    }
}

/// The reader's position in its partition: the offset it fetches next.
fn position(consumer: &TableConsumer, read: &TableRead) -> Option<i64> {
    let positions = consumer.position().ok()?;
    let element = positions.find_partition(&read.topic, read.partition.0)?;
    match element.offset() {
        rdkafka::Offset::Offset(offset) => Some(offset),
        _ => None,
    }
}
