//! Kafka consumer adapter, the pipeline's [`Source`] over Kafka ([`KafkaSource`]): joins the
//! pipeline's consumer group, reports revoked and assigned partitions, and turns fetched
//! messages into the WIT `input-record`. [`memory`] is an in-memory [`Source`] for tests of
//! the pipeline without a broker.
//!
//! Offsets are never committed automatically (auto-commit off): the pipeline commits the
//! offsets of its checkpoints (docs/checkpoints.md).

pub mod memory;

use crate::config::Settings;
use crate::pipeline::ports::{Fetched, GroupOffsets, Source, SourceError};
use crate::runtime::{Header, InputRecord};
use crate::state::checkpoint::{InputOffsets, parse_manifest_metadata};
use futures::FutureExt;
use rdkafka::ClientContext;
use rdkafka::Offset;
use rdkafka::Statistics;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::CommitMode;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The consumer's context: collects partitions revoked by rebalances for the pipeline loop,
/// and wakes it (a revoke must be acted on — the shard checkpointed and closed — even when no
/// record follows it).
#[derive(Debug, Default, Clone)]
pub struct SourceContext {
    revoked: Arc<Mutex<Vec<i32>>>,
    /// Set when `revoked` may be non-empty: the loop asks for revokes before every record, and
    /// this keeps that to one atomic load on the record path.
    any_revoked: Arc<AtomicBool>,
    assigned: Arc<Mutex<Vec<i32>>>,
    wake: Arc<tokio::sync::Notify>,
    /// Last stable offset (the high watermark a `read_committed` consumer reads up to) by topic
    /// and partition, from librdkafka's statistics (every `statistics.interval.ms`).
    high_watermarks: Arc<Mutex<HashMap<(String, i32), i64>>>,
}

impl SourceContext {
    /// Takes the partitions revoked since the last call.
    pub fn take_revoked(&self) -> Vec<i32> {
        if !self.any_revoked.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.revoked.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes the partitions assigned since the last call (their shards are opened at once,
    /// not when their first record arrives).
    pub fn take_assigned(&self) -> Vec<i32> {
        std::mem::take(&mut *self.assigned.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Completes once partitions were revoked or assigned since the last wake-up (at once if some were
    /// revoked while nobody waited).
    pub async fn revoked(&self) {
        self.wake.notified().await;
    }
}

impl SourceContext {
    /// The high watermark (last stable offset) of `topic` `partition` as librdkafka's last
    /// statistics gave it, if they covered it.
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        self.high_watermarks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(topic.to_owned(), partition))
            .copied()
    }
}

impl ClientContext for SourceContext {
    /// Keeps the fetched partitions' high watermarks (for lag), nothing else.
    fn stats(&self, statistics: Statistics) {
        let mut highs = self
            .high_watermarks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (name, topic) in statistics.topics {
            for (partition, p) in topic.partitions {
                // -1 is librdkafka's "internal" partition, and offsets not yet known.
                let high = if p.ls_offset >= 0 {
                    p.ls_offset
                } else {
                    p.hi_offset
                };
                if partition >= 0 && high >= 0 {
                    highs.insert((name.clone(), partition), high);
                }
            }
        }
    }
}

impl ConsumerContext for SourceContext {
    /// Resumes every newly assigned partition: a pause set by the application outlives a
    /// revoke and re-assignment in librdkafka, and the pipeline forgets its paused partitions
    /// on revoke, so without this a partition paused during an outage and then reassigned
    /// would never be fetched again. Resuming a partition that is not paused does nothing.
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance
            && let Err(err) = consumer.resume(tpl)
        {
            tracing::warn!(error = %err, "cannot resume newly assigned partitions");
        }
    }

    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let parts: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                tracing::info!(partitions = ?parts, "partitions revoked");
                self.revoked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(parts);
                self.any_revoked.store(true, Ordering::Release);
                self.wake.notify_one();
            }
            Rebalance::Assign(tpl) => {
                let parts: Vec<(String, i32)> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition()))
                    .collect();
                tracing::info!(partitions = ?parts, "partitions assigned");
                self.assigned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(parts.iter().map(|(_, p)| *p));
                self.wake.notify_one();
            }
            Rebalance::Error(err) => tracing::warn!(error = %err, "rebalance error"),
        }
    }
}

/// The pipeline's consumer type.
pub type SourceConsumer = StreamConsumer<SourceContext>;

/// Creates the consumer (not yet subscribed).
///
/// Defaults: auto-commit and offset store off, `auto.offset.reset=earliest`,
/// `isolation.level=read_committed`, statistics every second (for lag); `kafka.consumer` settings override them.
///
/// # Errors
/// [`KafkaError`] when librdkafka rejects the configuration.
pub fn consumer(settings: &Settings) -> Result<(SourceConsumer, SourceContext), KafkaError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.kafka.bootstrap_servers)
        .set("group.id", settings.pipeline.group_id())
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        // Per-partition high watermarks for the pipeline's lag (SourceContext::stats).
        .set("statistics.interval.ms", "1000");
    for (k, v) in &settings.kafka.consumer {
        config.set(k, v);
    }
    let context = SourceContext::default();
    let consumer = config.create_with_context(context.clone())?;
    Ok((consumer, context))
}

/// Copies a fetched message into an `input-record` (one copy: the guest call lowers from it).
pub fn to_input_record(msg: &BorrowedMessage<'_>) -> InputRecord {
    let headers = msg
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| Header {
                    name: h.key.to_owned(),
                    value: h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    InputRecord {
        key: msg.key().map(<[u8]>::to_vec).unwrap_or_default(),
        value: msg.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        timestamp_ms: msg.timestamp().to_millis().unwrap_or(-1),
        headers,
        topic: msg.topic().to_owned(),
        partition: msg.partition(),
        offset: msg.offset(),
    }
}

/// How long a seek may wait for librdkafka to accept it.
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long reading the committed offsets may wait (they are read once no transaction is
/// pending on them).
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(30);

/// The pipeline's [`Source`] over Kafka: a consumer subscribed to the input topics.
#[derive(Clone)]
pub struct KafkaSource {
    consumer: Arc<SourceConsumer>,
    context: SourceContext,
    topics: Vec<String>,
    /// Where a partition without a checkpoint offset starts (`auto.offset.reset`).
    reset: Offset,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Creates the consumer of the pipeline `settings` describe and subscribes it to the
    /// input topics.
    ///
    /// # Errors
    /// [`KafkaError`] when librdkafka rejects the configuration or the subscription.
    pub fn new(settings: &Settings) -> Result<Self, KafkaError> {
        let (consumer, context) = consumer(settings)?;
        let topics = settings.pipeline.input_topics.clone();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names)?;
        let reset = match settings
            .kafka
            .consumer
            .get("auto.offset.reset")
            .map(String::as_str)
        {
            Some("latest" | "largest" | "end") => Offset::End,
            _ => Offset::Beginning,
        };
        Ok(Self {
            consumer: Arc::new(consumer),
            context,
            topics,
            reset,
        })
    }

    /// The consumer (exactly-once transactions carry its group metadata).
    pub fn consumer(&self) -> Arc<SourceConsumer> {
        self.consumer.clone()
    }

    fn fetched(msg: Result<BorrowedMessage<'_>, KafkaError>) -> Fetched {
        match msg {
            Ok(msg) => Fetched::Record(to_input_record(&msg)),
            Err(err) => Fetched::Error(Box::new(err)),
        }
    }

    fn partition_list(&self, partition: i32) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for topic in &self.topics {
            tpl.add_partition(topic, partition);
        }
        tpl
    }
}

fn source_error(what: impl Into<String>, source: KafkaError) -> SourceError {
    SourceError {
        what: what.into(),
        source: Box::new(source),
    }
}

impl Source for KafkaSource {
    async fn recv(&self) -> Fetched {
        Self::fetched(self.consumer.recv().await)
    }

    fn try_recv(&self) -> Option<Fetched> {
        self.consumer.recv().now_or_never().map(Self::fetched)
    }

    async fn rebalanced(&self) {
        // librdkafka runs the rebalance callbacks inside `recv`, which returns only with a
        // record: the context wakes the loop.
        self.context.revoked().await;
    }

    fn take_revoked(&self) -> Vec<i32> {
        self.context.take_revoked()
    }

    fn take_assigned(&self) -> Vec<i32> {
        self.context.take_assigned()
    }

    fn set_paused(&self, partition: i32, paused: bool) -> Result<(), SourceError> {
        let tpl = self.partition_list(partition);
        let result = if paused {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        result.map_err(|e| source_error(format!("pause partition {partition}"), e))
    }

    fn seek(&self, partition: i32, offsets: &InputOffsets) -> Result<(), SourceError> {
        for topic in &self.topics {
            let to = offsets.next(topic).map_or(self.reset, Offset::Offset);
            self.consumer
                .seek(topic, partition, to, SEEK_TIMEOUT)
                .map_err(|e| source_error(format!("seek `{topic}` partition {partition}"), e))?;
        }
        Ok(())
    }

    fn commit(&self, offsets: &GroupOffsets, wait: bool) -> Result<(), SourceError> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in offsets {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))
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

    async fn committed_checkpoint(&self, partition: i32) -> Result<Option<u64>, SourceError> {
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
        tracing::info!(partition, ?version, "committed offsets read");
        Ok(version)
    }

    fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        self.context.high_watermark(topic, partition)
    }
}
