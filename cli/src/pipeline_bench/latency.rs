//! `weir bench`'s latency phase: reads the output topic and measures each record's latency.

use super::input::high_watermarks;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::time::Duration;

/// Reads the output topic from its current end and measures each record's latency: the time
/// it is read minus its timestamp (its input's produce time), ms.
pub(super) struct OutputReader {
    task: tokio::task::JoinHandle<Vec<u64>>,
    stop: tokio::sync::watch::Sender<Option<Target>>,
}

/// When the reader stops: `wanted` outputs of events produced since `since_ms` read, or
/// `deadline` passed.
#[derive(Debug, Clone, Copy)]
struct Target {
    since_ms: i64,
    wanted: usize,
    deadline: tokio::time::Instant,
}

impl OutputReader {
    pub(super) fn start(bootstrap: &str, topic: &str) -> Result<Self, KafkaError> {
        let consumer: StreamConsumer = crate::kafka::client(bootstrap)
            .set("group.id", format!("{topic}-latency-reader"))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "5")
            .set("fetch.min.bytes", "1")
            .create()?;
        let mut assignment = TopicPartitionList::new();
        for (partition, high) in high_watermarks(bootstrap, topic)? {
            assignment.add_partition_offset(topic, partition, Offset::Offset(high))?;
        }
        consumer.assign(&assignment)?;
        let (stop, mut stopped) = tokio::sync::watch::channel(None::<Target>);
        let task = tokio::spawn(async move {
            let mut seen: Vec<(i64, u64)> = Vec::new();
            let (mut counted, mut targeted) = (0usize, false);
            loop {
                let target = *stopped.borrow_and_update();
                if let Some(t) = target
                    && !targeted
                {
                    targeted = true;
                    counted = seen.iter().filter(|(ts, _)| *ts >= t.since_ms).count();
                }
                let deadline = target.map(|t| t.deadline);
                if let Some(t) = target
                    && counted >= t.wanted
                {
                    break;
                }
                tokio::select! {
                    message = consumer.recv() => {
                        let Ok(message) = message else { continue };
                        let now_ms = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as i64);
                        if let Some(ts) = message.timestamp().to_millis() {
                            seen.push((ts, now_ms.saturating_sub(ts).max(0) as u64));
                            if target.is_some_and(|t| ts >= t.since_ms) {
                                counted += 1;
                            }
                        }
                    }
                    changed = stopped.changed() => {
                        if changed.is_err() {
                            break;
                        }
                    }
                    () = async {
                        match deadline {
                            Some(d) => tokio::time::sleep_until(d).await,
                            None => std::future::pending().await,
                        }
                    } => break,
                }
            }
            let since = stopped.borrow().map_or(0, |t| t.since_ms);
            seen.into_iter()
                .filter(|(ts, _)| *ts >= since)
                .map(|(_, latency)| latency)
                .collect()
        });
        Ok(Self { task, stop })
    }

    /// The latencies of the outputs of events produced since `since_ms`, once `wanted` are
    /// read or `grace` has passed (then those read by then).
    pub(super) async fn finish(self, since_ms: i64, wanted: usize, grace: Duration) -> Vec<u64> {
        let _ = self.stop.send(Some(Target {
            since_ms,
            wanted,
            deadline: tokio::time::Instant::now() + grace,
        }));
        self.task.await.unwrap_or_default()
    }
}

/// The `p` quantile (0..=1) of sorted `values`, nearest rank; 0 when empty.
pub(super) fn percentile_u64(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}
