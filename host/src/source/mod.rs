//! Kafka consumer adapter: joins the pipeline's consumer group, reports revoked partitions,
//! and turns fetched messages into the WIT `input-record`.
//!
//! Offsets are never committed here (auto-commit off): offsets are committed only together with
//! the state they produced, which the checkpoint layer does. Until it exists, every assignment
//! starts at the earliest offset and the `memory` backend rebuilds its shard from there.

use crate::config::Settings;
use crate::runtime::{Header, InputRecord};
use rdkafka::ClientContext;
use rdkafka::Statistics;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The consumer's context: collects partitions revoked by rebalances for the pipeline loop,
/// and wakes it (a revoke must be acted on — the shard checkpointed and closed — even when no
/// record follows it).
#[derive(Debug, Default, Clone)]
pub struct SourceContext {
    revoked: Arc<Mutex<Vec<i32>>>,
    assigned: Arc<Mutex<Vec<i32>>>,
    wake: Arc<tokio::sync::Notify>,
    /// Last stable offset (the high watermark a `read_committed` consumer reads up to) by topic
    /// and partition, from librdkafka's statistics (every `statistics.interval.ms`).
    high_watermarks: Arc<Mutex<HashMap<(String, i32), i64>>>,
}

impl SourceContext {
    /// Takes the partitions revoked since the last call.
    pub fn take_revoked(&self) -> Vec<i32> {
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
