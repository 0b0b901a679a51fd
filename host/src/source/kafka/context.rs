//! The Kafka consumer's context ([`SourceContext`]): what rebalances revoke and assign, the
//! partitions paused, and the lag and caught-up state librdkafka's statistics report.

use crate::ids::Partition;
use rdkafka::ClientContext;
use rdkafka::Statistics;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The consumer's context: collects the partitions rebalances revoke and assign for the
/// pipeline loop, and counts the events the consumer's queue served (a fetch serves them
/// until none is left).
#[derive(Debug, Default, Clone)]
pub struct SourceContext {
    pub(super) revoked: Arc<Mutex<Vec<i32>>>,
    /// Set when `revoked` may be non-empty: asking for revokes is one atomic load.
    pub(super) any_revoked: Arc<AtomicBool>,
    pub(super) assigned: Arc<Mutex<Vec<i32>>>,
    /// Partitions paused by the pipeline: a fetch leaves their queues alone.
    pub(super) paused: Arc<Mutex<BTreeSet<i32>>>,
    /// (topic, partition) assigned whose messages do not yet have a queue of their own.
    pub(super) unsplit: Arc<Mutex<Vec<(String, i32)>>>,
    /// Rebalances served, and every event served (rebalances, statistics, commit results).
    pub(super) rebalances: Arc<AtomicU64>,
    pub(super) events: Arc<AtomicU64>,
    /// Last stable offset (the high watermark a `read_committed` consumer reads up to) by topic
    /// and partition, from librdkafka's statistics (every `statistics.interval.ms`).
    pub(super) high_watermarks: Arc<Mutex<HashMap<(String, i32), i64>>>,
    /// (topic, partition)s the consumer had handed out every record of (its position at or
    /// past the last stable offset; librdkafka's position steps over transaction markers) as
    /// of the last statistics.
    pub(super) caught_up: Arc<Mutex<BTreeSet<(String, i32)>>>,
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

    pub(super) fn is_paused(&self, partition: Partition) -> bool {
        self.paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&partition.0)
    }

    pub(super) fn set_paused(&self, partition: Partition, paused: bool) {
        let mut set = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        if paused {
            set.insert(partition.0);
        } else {
            set.remove(&partition.0);
        }
    }

    /// Takes the (topic, partition)s assigned since the last call.
    pub(super) fn take_unsplit(&self) -> Vec<(String, i32)> {
        std::mem::take(&mut *self.unsplit.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl SourceContext {
    /// The high watermark (last stable offset) of `topic` `partition` as librdkafka's last
    /// statistics gave it, if they covered it.
    pub fn high_watermark(&self, topic: &str, partition: Partition) -> Option<i64> {
        self.high_watermarks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(topic.to_owned(), partition.0))
            .copied()
    }
}

impl ClientContext for SourceContext {
    /// librdkafka's log lines, logged as rust-rdkafka does (target `librdkafka`), and counted
    /// as an event served: they come through the consumer's queue (`log.queue`), and a fetch
    /// that took one for the queue's end left every event behind it — records included —
    /// waiting for the next wake-up, about a second each. After a minute cut off from its
    /// broker, a consumer drained the failed connections' lines and errors one per second and
    /// fetched nothing for minutes.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.events.fetch_add(1, Ordering::Relaxed);
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
        }
    }

    /// librdkafka's errors, logged as rust-rdkafka does; a partition EOF that reaches the
    /// error callback (it names no partition) is the end of a partition, not an error.
    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(
            error,
            KafkaError::Global(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
        ) {
            tracing::trace!(reason, "partition end reported without its partition");
        } else {
            tracing::error!("librdkafka: {error}: {reason}");
        }
    }

    /// Keeps the fetched partitions' high watermarks (for lag) and which ones the consumer
    /// has caught up with, nothing else.
    fn stats(&self, statistics: Statistics) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let mut highs = self
            .high_watermarks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut caught_up = self.caught_up.lock().unwrap_or_else(|e| e.into_inner());
        caught_up.clear();
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
                    // `app_offset` is the position past the last record handed out (negative:
                    // none yet).
                    if p.app_offset >= high {
                        caught_up.insert((name.clone(), partition));
                    }
                }
            }
        }
    }
}

impl ConsumerContext for SourceContext {
    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        self.events.fetch_add(1, Ordering::Relaxed);
        if let Err(err) = result {
            tracing::debug!(error = %err, "offset commit failed");
        }
    }

    /// Records revoked and assigned partitions for the pipeline, and pauses the assigned ones
    /// before librdkafka takes them on: the pipeline opens their shards first, then seeks and
    /// resumes them ([`Source::set_paused`]).
    ///
    /// The pause must come before the assignment. librdkafka starts a partition's fetcher with
    /// an operation that takes a version number and is queued a moment later; a pause from
    /// another thread in between takes a newer number, and the start, now outdated, is
    /// dropped with nothing to retry it. The partition then never fetches and every seek is
    /// refused (`Local: Erroneous state`): a host under load once retried one partition's
    /// open for a minute this way. Paused here, on the thread that then assigns, the pause is
    /// applied before the start exists. It also replaces a pause left from an earlier
    /// ownership (an application pause outlives a revoke in librdkafka).
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        self.events.fetch_add(1, Ordering::Relaxed);
        self.rebalances.fetch_add(1, Ordering::Relaxed);
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let parts: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                tracing::info!(partitions = ?parts, "partitions revoked");
                self.revoked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(parts);
                self.any_revoked.store(true, Ordering::Release);
            }
            Rebalance::Assign(tpl) => {
                let parts: Vec<(String, i32)> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition()))
                    .collect();
                tracing::info!(partitions = ?parts, "partitions assigned");
                for (_, partition) in &parts {
                    self.set_paused(Partition(*partition), true);
                }
                // A partition librdkafka does not know yet is skipped (its records are held
                // by `fetch` until the seek anyway).
                if let Err(err) = consumer.pause(tpl) {
                    tracing::warn!(error = %err, "cannot pause newly assigned partitions");
                }
                self.assigned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(parts.iter().map(|(_, p)| *p));
                self.unsplit
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(parts);
            }
            Rebalance::Error(err) => tracing::warn!(error = %err, "rebalance error"),
        }
    }
}

/// The pipeline's consumer type.
pub type SourceConsumer = BaseConsumer<SourceContext>;
