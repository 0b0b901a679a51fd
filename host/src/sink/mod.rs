//! Kafka producer adapter: the operator's emits to the output topic, failed records to the
//! dead-letter topic.
//!
//! Each partition worker owns a [`Sink`] (sharing one idempotent producer per host) and keeps
//! the delivery futures of what it sent, bounded by [`PENDING_DELIVERIES_MAX`].

use crate::config::Settings;
use crate::runtime::{InputRecord, StagedEmit};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use std::collections::VecDeque;
use std::time::Duration;

/// Deliveries a worker may have outstanding before it waits for the oldest.
pub const PENDING_DELIVERIES_MAX: usize = 100_000;

/// Header naming why a record was dead-lettered.
pub const HEADER_ERROR: &str = "weir.error";
/// Header with the failure kind: `rejected`, `trapped` or `deadline`.
pub const HEADER_ERROR_KIND: &str = "weir.error.kind";
/// Header with the source topic of a dead-lettered record.
pub const HEADER_SOURCE_TOPIC: &str = "weir.source.topic";
/// Header with the source partition (decimal text).
pub const HEADER_SOURCE_PARTITION: &str = "weir.source.partition";
/// Header with the source offset (decimal text).
pub const HEADER_SOURCE_OFFSET: &str = "weir.source.offset";

/// Why a record was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// The operator returned `reject`.
    Rejected,
    /// The operator trapped on this record alone.
    Trapped,
    /// The operator ran past its CPU deadline on this record alone.
    Deadline,
}

impl DeadLetterKind {
    /// The `weir.error.kind` header value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::Rejected => "rejected",
            DeadLetterKind::Trapped => "trapped",
            DeadLetterKind::Deadline => "deadline",
        }
    }
}

/// Why producing failed for good.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The broker refused or timed out a record after librdkafka's own retries.
    #[error("delivery failed. topic=`{topic}`")]
    Delivery {
        /// The topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
}

/// Creates the host's idempotent producer; `kafka.producer` settings override the defaults.
///
/// # Errors
/// [`KafkaError`] when librdkafka rejects the configuration.
pub fn producer(settings: &Settings) -> Result<FutureProducer, KafkaError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.kafka.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("compression.type", "lz4");
    for (k, v) in &settings.kafka.producer {
        config.set(k, v);
    }
    config.create()
}

/// The stable `transactional.id` of a shard's producer in exactly-once mode:
/// `weir.{pipeline}.{partition}`. The same on every host, so that the next owner's
/// `init_transactions` fences the previous owner's producer and aborts its open transaction.
/// (Tenants are not modelled yet; their id will join the pipeline's here.)
pub fn transactional_id(settings: &Settings, partition: i32) -> String {
    format!("weir.{}.{partition}", settings.pipeline.name)
}

/// Creates the transactional producer of one shard (exactly-once mode): the defaults of
/// [`producer`], `transactional.id` from [`transactional_id`] and a transaction timeout of
/// three checkpoint intervals (at least 60 s, at most 15 min — the broker's default cap).
/// `init_transactions` is the caller's to run (it blocks).
///
/// # Errors
/// [`KafkaError`] when librdkafka rejects the configuration.
pub fn transactional_producer(
    settings: &Settings,
    partition: i32,
) -> Result<FutureProducer, KafkaError> {
    let interval_ms = settings.pipeline.checkpoint_interval.as_millis() as u64;
    let timeout_ms = interval_ms.saturating_mul(3).clamp(60_000, 900_000);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.kafka.bootstrap_servers)
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("transactional.id", transactional_id(settings, partition))
        .set("transaction.timeout.ms", timeout_ms.to_string());
    for (k, v) in &settings.kafka.producer {
        config.set(k, v);
    }
    config.create()
}

/// One worker's handle on the producer.
pub struct Sink {
    producer: FutureProducer,
    output_topic: String,
    dead_letter_topic: String,
    pending: VecDeque<(DeliveryFuture, bool)>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("output_topic", &self.output_topic)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl Sink {
    /// A sink writing to `output_topic` and `dead_letter_topic`.
    pub fn new(producer: FutureProducer, output_topic: String, dead_letter_topic: String) -> Self {
        Self {
            producer,
            output_topic,
            dead_letter_topic,
            pending: VecDeque::new(),
        }
    }

    /// Sends an operator emit to the output topic, with the timestamp of the input record it
    /// was emitted for (`timestamp_ms`, ms since the Unix epoch; negative: none, the producer's
    /// clock), as Kafka Streams gives an output record its input's timestamp.
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    pub async fn emit(&mut self, emit: &StagedEmit, timestamp_ms: i64) -> Result<(), SinkError> {
        let mut headers = OwnedHeaders::new_with_capacity(emit.headers.len());
        for h in &emit.headers {
            headers = headers.insert(KafkaHeader {
                key: &h.name,
                value: Some(&h.value),
            });
        }
        let key = (!emit.key.is_empty()).then_some(emit.key.as_slice());
        let topic = self.output_topic.clone();
        self.send(&topic, key, &emit.value, headers, timestamp_ms, false)
            .await
    }

    /// Sends a failed input record to the dead-letter topic with its original key, value,
    /// timestamp and headers plus the `weir.*` headers naming the error and the source position.
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    pub async fn dead_letter(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> Result<(), SinkError> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 5);
        for h in &record.headers {
            headers = headers.insert(KafkaHeader {
                key: &h.name,
                value: Some(&h.value),
            });
        }
        let partition = record.partition.to_string();
        let offset = record.offset.to_string();
        for (k, v) in [
            (HEADER_ERROR, error.as_bytes()),
            (HEADER_ERROR_KIND, kind.as_str().as_bytes()),
            (HEADER_SOURCE_TOPIC, record.topic.as_bytes()),
            (HEADER_SOURCE_PARTITION, partition.as_bytes()),
            (HEADER_SOURCE_OFFSET, offset.as_bytes()),
        ] {
            headers = headers.insert(KafkaHeader {
                key: k,
                value: Some(v),
            });
        }
        let key = (!record.key.is_empty()).then_some(record.key.as_slice());
        let topic = self.dead_letter_topic.clone();
        self.send(
            &topic,
            key,
            &record.value,
            headers,
            record.timestamp_ms,
            true,
        )
        .await
    }

    async fn send(
        &mut self,
        topic: &str,
        key: Option<&[u8]>,
        value: &[u8],
        headers: OwnedHeaders,
        timestamp_ms: i64,
        dead_letter: bool,
    ) -> Result<(), SinkError> {
        while self.pending.len() >= PENDING_DELIVERIES_MAX {
            self.wait_oldest().await?;
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(value)
            .headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        if timestamp_ms >= 0 {
            record = record.timestamp(timestamp_ms);
        }
        loop {
            match self.producer.send_result(record) {
                Ok(delivery) => {
                    self.pending.push_back((delivery, dead_letter));
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // librdkafka's queue is full: wait for a delivery (or briefly) and retry.
                    record = back;
                    if self.pending.is_empty() {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    } else {
                        self.wait_oldest().await?;
                    }
                }
                Err((source, _)) => {
                    return Err(SinkError::Delivery {
                        topic: topic.to_owned(),
                        source,
                    });
                }
            }
        }
    }

    async fn wait_oldest(&mut self) -> Result<(), SinkError> {
        let Some((delivery, dead_letter)) = self.pending.pop_front() else {
            return Ok(());
        };
        let topic = if dead_letter {
            &self.dead_letter_topic
        } else {
            &self.output_topic
        };
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((source, _))) => Err(SinkError::Delivery {
                topic: topic.clone(),
                source,
            }),
            Err(_canceled) => Err(SinkError::Delivery {
                topic: topic.clone(),
                source: KafkaError::Canceled,
            }),
        }
    }

    /// Waits until everything sent so far is acknowledged.
    ///
    /// # Errors
    /// [`SinkError`] for the first delivery that failed.
    pub async fn drain(&mut self) -> Result<(), SinkError> {
        while !self.pending.is_empty() {
            self.wait_oldest().await?;
        }
        Ok(())
    }

    /// Flushes the producer's queue (blocking up to `timeout`); used at shutdown.
    pub fn flush(&self, timeout: Duration) {
        if let Err(err) = self.producer.flush(timeout) {
            tracing::warn!(error = %err, "producer flush at shutdown did not complete");
        }
    }
}
