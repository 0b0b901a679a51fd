//! Kafka consumer adapter, the pipeline's [`Source`] over Kafka ([`KafkaSource`]): joins the
//! pipeline's consumer group, reports revoked and assigned partitions, and turns fetched
//! messages into the WIT `input-record`.
//!
//! Offsets are never committed automatically (auto-commit off): the pipeline commits the
//! offsets of its checkpoints (docs/checkpoints.md).

pub mod broker;
mod client;
mod context;
mod ends;
mod global_table;
mod retry;
mod table;

use crate::config::Settings;
use crate::ids::Partition;
use crate::pipeline::ports::{Cause, Committed, GroupOffsets, Source, SourceError};
use crate::runtime::InputRecord;
use crate::state::checkpoint::{InputOffsets, parse_manifest_metadata};
use ends::Ends;
use rdkafka::Offset;
use rdkafka::consumer::Consumer;
use rdkafka::consumer::{CommitMode, base_consumer::PartitionQueue};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use client::{consumer, to_input_record};
pub use context::{SourceConsumer, SourceContext};
use retry::{retry_while_outdated, seek_retried};

/// How long a seek may wait for librdkafka to accept it.
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a seek waits for a newly assigned partition's fetcher to start.
const FETCHER_START_WAIT: Duration = Duration::from_secs(1);

/// How long reading the committed offsets may wait (until no transaction is pending on them).
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(30);

/// Records taken from the consumer's own queue in one fetch at most (messages of partitions
/// assigned a moment ago, before their queue of their own was split off).
const CONSUMER_QUEUE_FETCH_MAX: usize = 4096;

/// A partition's queue of one input topic (librdkafka's partition queue).
type TopicQueue = (Arc<str>, PartitionQueue<SourceContext>);

/// Partition → the queues of its topics. Dropped before the consumer: a partition queue holds
/// the consumer, and would otherwise drop the last reference to it (destroying the client)
/// before destroying the queue itself.
struct PartitionQueues {
    by_partition: BTreeMap<i32, Vec<TopicQueue>>,
    /// Alive while the queues are dropped.
    _consumer: Arc<SourceConsumer>,
}

impl Drop for PartitionQueues {
    fn drop(&mut self) {
        self.by_partition.clear();
    }
}

/// The pipeline's [`Source`] over Kafka: a consumer of the input topics (subscribed at
/// [`Source::subscribe`], once the run's global tables loaded), each assigned partition with a queue of its own (librdkafka's partition queues), so that a fetch
/// takes a bounded number of records of every partition rather than whatever one queue of all
/// of them holds first. The consumer's own queue (rebalances, errors, statistics) is served
/// first in every fetch: a revoke is seen before any record fetched after it.
#[derive(Clone)]
pub struct KafkaSource {
    consumer: Arc<SourceConsumer>,
    context: SourceContext,
    topics: Vec<Arc<str>>,
    /// Where a partition without a checkpoint offset starts (`auto.offset.reset`).
    reset: Offset,
    /// The inputs that are internal topics between stages (docs/topologies.md): read from
    /// their beginning whatever `auto.offset.reset` says, as Kafka Streams reads its
    /// repartition topics, so that nothing an upstream stage wrote before the downstream
    /// first opened is skipped.
    internal: Vec<Arc<str>>,
    /// (topic, partition) → the offset below which nothing is handed out: the end a partition
    /// without a checkpoint was seeked to under `auto.offset.reset = latest`. librdkafka may
    /// go back on a seek made while it still resolves a start offset, and fetch from the
    /// beginning; with a checkpoint the worker skips what comes below it, without one this
    /// does (see [`Source::seek`]).
    floors: Arc<Mutex<HashMap<TopicPartition, i64>>>,
    /// Partition → the queues of its topics, split off on its first assignment (librdkafka
    /// keeps a queue the application split off through revokes and assignments).
    queues: Arc<Mutex<PartitionQueues>>,
    /// Notified when a queue becomes non-empty.
    ready: Arc<tokio::sync::Notify>,
    /// Where the consumer stands against each partition's end ([`Ends`]).
    ends: Arc<Ends>,
    /// The client configuration of table loads ([`Source::read_table`]).
    table_config: rdkafka::ClientConfig,
}

/// An input topic's partition.
type TopicPartition = (Arc<str>, i32);

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Creates the consumer of the pipeline `settings` describe; it joins the group at
    /// [`Source::subscribe`].
    ///
    /// # Errors
    /// [`KafkaError`] when librdkafka rejects the configuration.
    pub fn new(settings: &Settings) -> Result<Self, KafkaError> {
        let ready = Arc::new(tokio::sync::Notify::new());
        let (consumer, context) = consumer(settings, ready.clone())?;
        let topics: Vec<Arc<str>> = settings
            .pipeline
            .input_topics
            .iter()
            .map(|t| Arc::from(t.as_str()))
            .collect();
        let reset = match settings
            .kafka
            .consumer
            .get("auto.offset.reset")
            .map(String::as_str)
        {
            Some("latest" | "largest" | "end") => Offset::End,
            _ => Offset::Beginning,
        };
        let consumer = Arc::new(consumer);
        Ok(Self {
            queues: Arc::new(Mutex::new(PartitionQueues {
                by_partition: BTreeMap::new(),
                _consumer: consumer.clone(),
            })),
            consumer,
            context,
            internal: topics
                .iter()
                .filter(|t| settings.pipeline.edges.inputs.contains_key(&***t))
                .cloned()
                .collect(),
            topics,
            reset,
            floors: Arc::default(),
            ready,
            ends: Arc::default(),
            table_config: table::table_config(settings),
        })
    }

    /// The consumer (exactly-once transactions carry its group metadata).
    pub fn consumer(&self) -> Arc<SourceConsumer> {
        self.consumer.clone()
    }

    fn partition_list(&self, partition: Partition) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for topic in &self.topics {
            tpl.add_partition(topic, partition.0);
        }
        tpl
    }

    /// Serves the consumer's own queue until it is empty or a rebalance was served (then
    /// gives the newly assigned partitions their queues and returns true), taking the messages
    /// it holds into `records`. Errors in it (a broker down, a failed connection) are served
    /// and go on: the context logged them, librdkafka retries on its own, and the events
    /// behind them — records too — wait on no one (the queue wakes the loop only when it goes
    /// from empty to not empty).
    fn serve_consumer_queue(&self, records: &mut Vec<InputRecord>) -> bool {
        let rebalances = self.context.rebalances.load(Ordering::Acquire);
        serve_queue(CONSUMER_QUEUE_FETCH_MAX, || {
            let events = self.context.events.load(Ordering::Acquire);
            match self.consumer.poll(Duration::ZERO) {
                Some(Ok(msg)) => {
                    let (topic, input) = self.topic(msg.topic());
                    let partition = Partition(msg.partition());
                    let offset = msg.offset();
                    if offset >= self.floor(&topic, partition) {
                        records.push(to_input_record(&msg, &topic, input));
                    }
                    self.ends.handed((topic, partition.0), Some(offset), false);
                    Polled::Served
                }
                // The event names no topic: with one input topic it is that one's (with more,
                // the partition counts as caught up after its next record and end).
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    if let [topic] = self.topics.as_slice() {
                        self.ends.handed((topic.clone(), partition), None, true);
                    }
                    Polled::Served
                }
                // Logged by the context's `error`.
                Some(Err(_)) => Polled::Served,
                None if self.context.rebalances.load(Ordering::Acquire) != rebalances => {
                    self.split_assigned();
                    Polled::Rebalanced
                }
                // Nothing was served: the queue is empty.
                None if self.context.events.load(Ordering::Acquire) == events => Polled::Empty,
                // An event the context handled (statistics, a commit's result, a log line).
                None => Polled::Served,
            }
        })
    }

    /// The offset of `topic` `partition` below which nothing is handed out (see `floors`).
    fn floor(&self, topic: &Arc<str>, partition: Partition) -> i64 {
        self.floors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(topic.clone(), partition.0))
            .copied()
            .unwrap_or(i64::MIN)
    }

    /// Seeks `topic` `partition` to `to`, waiting up to [`FETCHER_START_WAIT`] for its fetcher
    /// to start: librdkafka refuses a seek until then (`Local: Erroneous state`), which it does
    /// once the group coordinator has answered for the committed offsets of a new assignment
    /// (a few milliseconds; longer, the pipeline holds the partition and opens it again).
    /// Blocks the calling thread meanwhile, as librdkafka's seek does.
    fn seek_started(&self, topic: &str, partition: Partition, to: Offset) -> KafkaResult<()> {
        seek_retried(FETCHER_START_WAIT, || {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition.0, to)?;
            self.consumer
                .seek_partitions(tpl, SEEK_TIMEOUT)?
                .elements()
                .first()
                .map_or(Ok(()), |e| e.error())
        })
    }

    /// The shared name of input topic `name`, and its index among the inputs.
    fn topic(&self, name: &str) -> (Arc<str>, u32) {
        match self.topics.iter().position(|t| **t == *name) {
            Some(i) => (self.topics[i].clone(), input_index(i)),
            None => (Arc::from(name), 0),
        }
    }

    /// Splits the queues of newly assigned partitions off the consumer's queue.
    fn split_assigned(&self) {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        for (topic, partition) in self.context.take_unsplit() {
            let of_partition = queues.by_partition.entry(partition).or_default();
            if of_partition.iter().any(|(t, _)| **t == *topic) {
                continue;
            }
            let (topic, _) = self.topic(&topic);
            match self.consumer.split_partition_queue(&topic, partition) {
                Some(mut queue) => {
                    let ready = self.ready.clone();
                    queue.set_nonempty_callback(move || ready.notify_one());
                    of_partition.push((topic, queue));
                    // What arrived before the callback was set wakes nobody.
                    self.ready.notify_one();
                }
                None => {
                    tracing::warn!(topic = %topic, partition, "no queue of its own for the partition; its records come through the consumer's queue");
                }
            }
        }
    }
}

fn source_error(what: impl Into<String>, source: KafkaError) -> SourceError {
    SourceError {
        what: what.into(),
        source: Box::new(source),
    }
}

/// An input's index as `input-record.input` carries it (a pipeline has a few inputs).
fn input_index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

impl Source for KafkaSource {
    async fn ready(&self) {
        self.ready.notified().await;
    }

    fn fetch(
        &self,
        per_partition_max: usize,
        records: &mut Vec<InputRecord>,
    ) -> Result<bool, Cause> {
        if self.serve_consumer_queue(records) {
            return Ok(true);
        }
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let paused = self
            .context
            .paused
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let floors = self.floors.lock().unwrap_or_else(|e| e.into_inner());
        let mut more = false;
        for (partition, of_partition) in &queues.by_partition {
            if paused.contains(partition) {
                continue;
            }
            let mut budget = per_partition_max;
            for (topic, queue) in of_partition {
                let input = self
                    .topics
                    .iter()
                    .position(|t| t == topic)
                    .map_or(0, input_index);
                let floor = match floors.is_empty() {
                    true => i64::MIN,
                    false => floors
                        .get(&(topic.clone(), *partition))
                        .copied()
                        .unwrap_or(i64::MIN),
                };
                // Whether the last event of the queue was its end (EOF follows the records
                // before it in the queue).
                let (mut end, mut last) = (None, None);
                while budget > 0 {
                    match queue.poll(Duration::ZERO) {
                        Some(Ok(msg)) => {
                            if msg.offset() >= floor {
                                records.push(to_input_record(&msg, topic, input));
                            }
                            end = Some(false);
                            last = Some(msg.offset());
                        }
                        Some(Err(KafkaError::PartitionEOF(_))) => {
                            end = Some(true);
                            continue;
                        }
                        Some(Err(err)) => return Err(Box::new(err)),
                        None => break,
                    }
                    budget -= 1;
                }
                if let Some(end) = end {
                    self.ends.handed((topic.clone(), *partition), last, end);
                }
            }
            more |= budget == 0;
        }
        Ok(more)
    }

    fn subscribe(&self) -> Result<(), SourceError> {
        let names: Vec<&str> = self.topics.iter().map(|t| &**t).collect();
        self.consumer.subscribe(&names).map_err(|e| SourceError {
            what: format!("subscribing to {}", names.join(", ")),
            source: Box::new(e),
        })
    }

    fn take_revoked(&self) -> Vec<Partition> {
        let revoked = self.context.take_revoked();
        revoked.into_iter().map(Partition).collect()
    }

    fn take_assigned(&self) -> Vec<Partition> {
        let assigned = self.context.take_assigned();
        if !assigned.is_empty() {
            // A new assignment is caught up only once its fetches say so.
            self.ends.assigned(&assigned);
        }
        assigned.into_iter().map(Partition).collect()
    }

    /// Pauses or resumes `partition`'s fetches. A partition the rebalance paused on
    /// assignment is not paused again: until its seek succeeds its fetcher may be starting,
    /// and a pause then would make librdkafka drop the start (see
    /// [`SourceContext::pre_rebalance`]).
    fn set_paused(&self, partition: Partition, paused: bool) -> Result<(), SourceError> {
        let tpl = self.partition_list(partition);
        let result = if paused {
            if self.context.is_paused(partition) {
                return Ok(());
            }
            self.context.set_paused(partition, true);
            self.consumer.pause(&tpl)
        } else {
            let result = self.consumer.resume(&tpl);
            self.context.set_paused(partition, false);
            // Records fetched before the pause wait in its queue, which wakes nobody.
            self.ready.notify_one();
            result
        };
        result.map_err(|e| source_error(format!("pause partition {partition}"), e))
    }

    /// Seeks each input topic's `partition` to the checkpoint's next offset; without one, to
    /// the beginning, or under `auto.offset.reset = latest` to the partition's end as it is
    /// now (read from the broker), below which nothing is then handed out.
    fn seek(&self, partition: Partition, offsets: &InputOffsets) -> Result<(), SourceError> {
        for topic in &self.topics {
            let failed = |e| source_error(format!("seek `{topic}` partition {partition}"), e);
            let reset = if self.internal.contains(topic) {
                Offset::Beginning
            } else {
                self.reset
            };
            let (to, floor) = match (offsets.next(topic), reset) {
                (Some(next), _) => (Offset::Offset(next.0), None),
                (None, Offset::End) => {
                    let (_, end) = retry_while_outdated(SEEK_TIMEOUT, || {
                        self.consumer
                            .fetch_watermarks(topic, partition.0, SEEK_TIMEOUT)
                    })
                    .map_err(failed)?;
                    (Offset::Offset(end), Some(end))
                }
                (None, reset) => (reset, None),
            };
            {
                let mut floors = self.floors.lock().unwrap_or_else(|e| e.into_inner());
                match floor {
                    Some(floor) => floors.insert((topic.clone(), partition.0), floor),
                    None => floors.remove(&(topic.clone(), partition.0)),
                };
            }
            self.seek_started(topic, partition, to).map_err(failed)?;
            let next = match to {
                Offset::Offset(next) => Some(next),
                _ => None,
            };
            self.ends.seeked((topic.clone(), partition.0), next);
        }
        Ok(())
    }

    fn commit(&self, offsets: &GroupOffsets, wait: bool) -> Result<(), SourceError> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in offsets {
            tpl.add_partition_offset(topic, partition.0, Offset::Offset(*next))
                .map_err(|e| source_error("list offsets to commit", e))?;
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        let mode = if wait {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        self.consumer
            .commit(&tpl, mode)
            .map_err(|e| source_error("commit offsets", e))
    }

    async fn committed_checkpoint(&self, partition: Partition) -> Result<Committed, SourceError> {
        let wanted = self.partition_list(partition);
        let consumer = self.consumer.clone();
        // With `isolation.level = read_committed` librdkafka asks for stable offsets: the
        // fetch waits until no transaction is pending for them. A blocking call.
        let committed = tokio::task::spawn_blocking(move || {
            consumer.committed_offsets(wanted, COMMITTED_TIMEOUT)
        })
        .await
        .unwrap_or(Err(KafkaError::Canceled))
        .map_err(|e| {
            source_error(
                format!("read the committed offsets of partition {partition}"),
                e,
            )
        })?;
        let version = committed
            .elements()
            .iter()
            .find_map(|e| parse_manifest_metadata(e.metadata()));
        let mut offsets = InputOffsets::new();
        for e in committed.elements() {
            if let rdkafka::Offset::Offset(next) = e.offset() {
                offsets.advance(e.topic(), crate::ids::Offset(next - 1));
            }
        }
        tracing::info!(
            partition = partition.0,
            ?version,
            ?offsets,
            "committed offsets read"
        );
        Ok(Committed { version, offsets })
    }

    /// As the last statistics say, but at the partition's end ([`Source::at_end`]) the offset
    /// after the last record handed out when that is lower: what follows it there are
    /// transaction markers and aborted records, no record to process ([`Ends`]).
    fn high_watermark(&self, topic: &str, partition: Partition) -> Option<i64> {
        let high = self.context.high_watermark(topic, partition)?;
        if !self.at_end(topic, partition) {
            return Some(high);
        }
        let (shared, _) = self.topic(topic);
        let next = self.ends.next(&(shared, partition.0));
        Some(next.map_or(high, |next| next.min(high)))
    }

    /// Caught up by the last partition EOF event, or by the last statistics (the EOF of a
    /// partition fetched before its queue was split off can reach librdkafka's error callback
    /// instead, which names no partition; a consumer that resumed at the end has no position
    /// until a record comes, but gets an EOF).
    fn read_table(
        &self,
        topic: &str,
        partition: Partition,
        from: Option<crate::ids::Offset>,
        chunks: tokio::sync::mpsc::Sender<Vec<InputRecord>>,
    ) -> impl std::future::Future<Output = Result<crate::ids::Offset, SourceError>> + Send {
        let (topic, input) = self.topic(topic);
        let read = table::TableRead {
            topic,
            input,
            partition,
            from,
        };
        table::read(self.table_config.clone(), read, chunks)
    }

    fn follow_table(
        &self,
        topic: &str,
        from: BTreeMap<i32, i64>,
        updates: tokio::sync::mpsc::Sender<crate::pipeline::ports::TableUpdate>,
    ) -> impl std::future::Future<Output = Result<(), SourceError>> + Send {
        global_table::read(self.table_config.clone(), Arc::from(topic), from, updates)
    }

    fn at_end(&self, topic: &str, partition: Partition) -> bool {
        let (shared, _) = self.topic(topic);
        self.ends.at_end(&(shared, partition.0))
            || self
                .context
                .caught_up
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&(topic.to_owned(), partition.0))
    }
}

/// What one poll of a queue did ([`serve_queue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polled {
    /// An event was served: a record, a partition's end, an error, statistics, a log line.
    Served,
    /// A rebalance was served.
    Rebalanced,
    /// Nothing: the queue is empty.
    Empty,
}

/// Polls (`poll`) until the queue is empty (false), a rebalance was served or `max` events
/// were (true: there may be more).
fn serve_queue(max: usize, mut poll: impl FnMut() -> Polled) -> bool {
    for _ in 0..max {
        match poll() {
            Polled::Served => {}
            Polled::Rebalanced => return true,
            Polled::Empty => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests;
