//! Kafka producer adapter, the pipeline's [`Output`] over Kafka ([`KafkaOutput`]): the
//! operator's emits to the output topic, failed records to the dead-letter topic.
//!
//! - [`limits`]       how large a record each topic takes; dead letters cut to fit;
//! - [`delivery`]     [`KafkaSink`], one partition's producer handle and its deliveries;
//! - [`producer`]     the producer: delivery reports counted per sink, served only while due;
//! - [`dead_letter`]  a dead letter's headers and cutting;
//! - [`internal_topics`] the topics between a pipeline's stages, created when missing;
//! - [`in_flight`]    what is in flight on one, read for a savepoint and seeded by a reset;
//! - [`transaction`]  exactly-once: a shard's transaction committed with its checkpoint.
//!
//! At-least-once, every partition's sink shares one idempotent producer per pipeline run;
//! exactly-once, each has a transactional producer of its own.

mod dead_letter;
pub mod delivery;
pub mod in_flight;
pub mod internal_topics;
pub mod limits;
pub mod producer;
mod transaction;

pub use crate::pipeline::ports::{DeadLetterKind, DeliveryGuard, SinkError};
pub use delivery::{DeadLetters, KafkaSink, OutputTopic};

use crate::config::Settings;
use crate::ids::{ManifestVersion, Partition};
use crate::pipeline::ports::{CommitError, Output, ShardSink};
use crate::runtime::{InputRecord, StagedEmit};
use crate::source::kafka::SourceConsumer;
use crate::state::checkpoint::InputOffsets;
use limits::RecordLimits;
use producer::KafkaProducer;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use std::sync::Arc;
use std::time::Duration;

/// Deliveries a worker may have outstanding before it waits for the oldest.
pub const PENDING_DELIVERIES_MAX: usize = 100_000;

/// Header naming why a record was dead-lettered.
pub const HEADER_ERROR: &str = "weir.error";
/// Header with the failure kind: `rejected`, `trapped`, `deadline` or `output-refused`.
pub const HEADER_ERROR_KIND: &str = "weir.error.kind";
/// Header with the source topic of a dead-lettered record.
pub const HEADER_SOURCE_TOPIC: &str = "weir.source.topic";
/// Header with the source partition (decimal text).
pub const HEADER_SOURCE_PARTITION: &str = "weir.source.partition";
/// Header with the source offset (decimal text).
pub const HEADER_SOURCE_OFFSET: &str = "weir.source.offset";
/// Header with the stage whose operator failed the record, in a pipeline of stages (they share
/// its dead-letter topic); a one-operator pipeline's dead letters have none.
pub const HEADER_STAGE: &str = "weir.stage";

/// Creates a pipeline's idempotent producer ([`producer_config`]); `kafka.producer` settings
/// override the defaults. Its `batch.size` is at most the smallest of `limits`, so that a batch of small
/// records never exceeds a topic's `max.message.bytes`.
///
/// # Errors
/// [`KafkaError`] when librdkafka rejects the configuration.
pub fn producer(settings: &Settings, limits: &RecordLimits) -> Result<KafkaProducer, KafkaError> {
    let mut config = producer_config(settings, limits);
    config.set("enable.idempotence", "true");
    with_overrides(settings, config)
}

/// librdkafka's partitioner that places a keyed record where the Java client's default
/// partitioner does: `murmur2(key) & 0x7fffffff` modulo the partition count (Kafka's
/// `Utils.murmur2`), a record with no key at random. librdkafka's own default,
/// `consistent_random` (CRC32), places keys elsewhere, so a topic a Java client or Kafka
/// Streams writes would not be co-partitioned with one Weir writes.
pub const PARTITIONER: &str = "murmur2_random";

/// What every producer of a pipeline is set up with, before `kafka.producer`'s overrides:
/// the cluster and its security, 5 ms of linger, lz4, a `batch.size` within `limits`, and
/// the Java client's partitioner ([`PARTITIONER`]).
fn producer_config(settings: &Settings, limits: &RecordLimits) -> rdkafka::ClientConfig {
    let mut config = settings.kafka.client_config();
    config
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("batch.size", batch_bytes(limits).to_string())
        .set("partitioner", PARTITIONER);
    config
}

/// `config` with `kafka.producer`'s properties over it, as a producer.
fn with_overrides(
    settings: &Settings,
    mut config: rdkafka::ClientConfig,
) -> Result<KafkaProducer, KafkaError> {
    for (k, v) in &settings.kafka.producer {
        config.set(k, v);
    }
    KafkaProducer::new(&config)
}

/// The producer's `batch.size`: librdkafka's default (1,000,000) or the smallest topic limit.
fn batch_bytes(limits: &RecordLimits) -> u64 {
    limits
        .smallest()
        .min(limits::PRODUCER_MESSAGE_BYTES_DEFAULT)
}

/// The stable `transactional.id` of a shard's producer in exactly-once mode:
/// `weir.{pipeline}.{partition}`. The same on every host, so that the next owner's
/// `init_transactions` fences the previous owner's producer and aborts its open transaction.
/// (Tenants are not modelled yet; their id will join the pipeline's here.)
pub fn transactional_id(settings: &Settings, partition: Partition) -> String {
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
    partition: Partition,
    limits: &RecordLimits,
) -> Result<KafkaProducer, KafkaError> {
    let mut config = producer_config(settings, limits);
    config
        .set("transactional.id", transactional_id(settings, partition))
        .set(
            "transaction.timeout.ms",
            transaction_timeout(settings).as_millis().to_string(),
        );
    with_overrides(settings, config)
}

/// A shard's `transaction.timeout.ms`: three checkpoint intervals, at least 60 s, at most 15
/// min (the broker's default cap), unless `kafka.producer` sets it.
pub fn transaction_timeout(settings: &Settings) -> Duration {
    let set = settings
        .kafka
        .producer
        .get("transaction.timeout.ms")
        .and_then(|ms| ms.parse::<u64>().ok());
    let interval_ms = settings.pipeline.checkpoint_interval.as_millis() as u64;
    let ms = set.unwrap_or_else(|| interval_ms.saturating_mul(3).clamp(60_000, 900_000));
    Duration::from_millis(ms)
}

/// How long opening a shard's sink may wait for each Kafka transaction step.
const TRANSACTION_SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The pipeline's [`Output`] over Kafka: the output and dead-letter topics, their record
/// limits (read at start), the shared idempotent producer, and — exactly-once — the consumer
/// whose group metadata goes with each transaction's offsets.
pub struct KafkaOutput {
    settings: Settings,
    /// The operator's outputs' topics, by output index (`crate::topology::bind_outputs`).
    outputs: Vec<Option<String>>,
    limits: RecordLimits,
    producer: KafkaProducer,
    consumer: Arc<SourceConsumer>,
}

impl std::fmt::Debug for KafkaOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOutput")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl KafkaOutput {
    /// The output of the pipeline `settings` describe, writing the operator's `outputs` (their
    /// topics by output index: `crate::topology::bind_outputs`), reading its topics' limits;
    /// `consumer` is the pipeline's (exactly-once transactions carry its group metadata).
    ///
    /// # Errors
    /// [`KafkaError`] when librdkafka rejects the producer's configuration.
    pub async fn new(
        settings: &Settings,
        outputs: Vec<Option<String>>,
        consumer: Arc<SourceConsumer>,
    ) -> Result<Self, KafkaError> {
        let limits = limits::read_limits(settings).await;
        let producer = producer(settings, &limits)?;
        Ok(Self {
            settings: settings.clone(),
            outputs,
            limits,
            producer,
            consumer,
        })
    }
}

impl Output for KafkaOutput {
    type Sink = KafkaSink;

    async fn open(
        &self,
        partition: Partition,
        transactional: bool,
        guard: DeliveryGuard,
    ) -> Result<KafkaSink, SinkError> {
        let dead_letters = DeadLetters {
            topic: self.settings.pipeline.dead_letter_topic.clone(),
            stage: self.settings.pipeline.edges.stage.clone(),
        };
        let markers = &self.settings.pipeline.edges.output_partitions;
        let outputs: Vec<Option<OutputTopic>> = self
            .outputs
            .iter()
            .map(|topic| {
                topic.as_ref().map(|topic| OutputTopic {
                    topic: topic.clone(),
                    marker_partitions: markers.get(topic).copied(),
                })
            })
            .collect();
        if !transactional {
            return Ok(KafkaSink::new(
                self.producer.clone(),
                outputs,
                dead_letters,
                self.limits,
                None,
                guard,
            ));
        }
        let failed = |source: KafkaError| SinkError {
            topic: format!("transactional producer of partition {partition}"),
            source: Box::new(source),
        };
        let producer =
            transactional_producer(&self.settings, partition, &self.limits).map_err(failed)?;
        // Fences the previous owner's producer and aborts its open transaction.
        let init = producer.clone();
        tokio::task::spawn_blocking(move || init.init_transactions(TRANSACTION_SETUP_TIMEOUT))
            .await
            .unwrap_or(Err(KafkaError::Canceled))
            .map_err(failed)?;
        let begin = producer.clone();
        tokio::task::spawn_blocking(move || begin.begin_transaction())
            .await
            .unwrap_or(Err(KafkaError::Canceled))
            .map_err(failed)?;
        Ok(KafkaSink::new(
            producer,
            outputs,
            dead_letters,
            self.limits,
            Some(self.consumer.clone()),
            guard,
        )
        .with_transaction_timeout(transaction_timeout(&self.settings)))
    }
}

impl ShardSink for KafkaSink {
    fn output_bytes_max(&self) -> u64 {
        self.emit_bytes_max()
    }

    fn transactional(&self) -> bool {
        self.group().is_some()
    }

    fn transaction_timeout(&self) -> Option<Duration> {
        self.transaction_clock.map(|(_, timeout)| timeout)
    }

    fn writes_watermarks(&self) -> bool {
        self.writes_markers()
    }

    fn replay_below(&mut self, committed: &InputOffsets) {
        KafkaSink::replay_below(self, committed);
    }

    async fn watermark(
        &mut self,
        marker: crate::time::watermark::Marker,
        frontier: Option<&crate::time::edge::Frontier>,
    ) -> Result<(), SinkError> {
        KafkaSink::watermark(self, marker, frontier).await
    }

    async fn emit(&mut self, emit: &StagedEmit, source: &InputRecord) -> Result<(), SinkError> {
        KafkaSink::emit(self, emit, source).await
    }

    async fn dead_letter(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> Result<(), SinkError> {
        KafkaSink::dead_letter(self, record, kind, error).await
    }

    async fn drain(&mut self) -> Result<(), SinkError> {
        KafkaSink::drain(self).await
    }

    async fn commit(
        &mut self,
        partition: Partition,
        offsets: &InputOffsets,
        version: ManifestVersion,
    ) -> Result<(), CommitError> {
        let Some(consumer) = self.group() else {
            return Ok(());
        };
        let committed =
            transaction::commit(self.producer.clone(), consumer, partition, offsets, version).await;
        if let Some((began, timeout)) = &mut self.transaction_clock {
            let open = began.elapsed();
            *began = crate::clock::monotonic_now();
            committed.map_err(|err| transaction::timed_out(err, open, *timeout))?;
        } else {
            committed?;
        }
        // Committed: every delivery of the interval completed with it; forget them.
        KafkaSink::drain(self)
            .await
            .map_err(|e| CommitError::Failed(Box::new(e)))
    }
}
