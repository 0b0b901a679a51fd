//! Kafka producer adapter: the operator's emits to the output topic, failed records to the
//! dead-letter topic.
//!
//! Each partition worker owns a [`Sink`] (sharing one idempotent producer per host) and keeps
//! the delivery futures of what it sent, bounded by [`PENDING_DELIVERIES_MAX`].

pub mod limits;

use crate::config::Settings;
use crate::runtime::{InputRecord, StagedEmit};
use limits::{
    ERROR_HEADER_BYTES_MAX, HEADER_ORIGINAL_HEADERS_BYTES, HEADER_ORIGINAL_KEY_BYTES,
    HEADER_ORIGINAL_VALUE_BYTES, HEADER_TRUNCATED, RecordLimits, cap, fit_dead_letter,
};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Why a record was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// The operator returned `reject`.
    Rejected,
    /// The operator trapped on this record alone.
    Trapped,
    /// The operator ran past its CPU deadline on this record alone.
    Deadline,
    /// The broker refused an output emitted for this record as too large for the output
    /// topic (its limit was lowered after the pipeline started): the output is dead-lettered
    /// in its place, naming the record it was emitted for.
    OutputRefused,
}

impl DeadLetterKind {
    /// Every kind, in [`DeadLetterKind::index`] order.
    pub const ALL: [DeadLetterKind; 4] = [
        DeadLetterKind::Rejected,
        DeadLetterKind::Trapped,
        DeadLetterKind::Deadline,
        DeadLetterKind::OutputRefused,
    ];

    /// The kind's position in [`DeadLetterKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The `weir.error.kind` header value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::Rejected => "rejected",
            DeadLetterKind::Trapped => "trapped",
            DeadLetterKind::Deadline => "deadline",
            DeadLetterKind::OutputRefused => "output-refused",
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

/// Creates a pipeline's idempotent producer; `kafka.producer` settings override the
/// defaults. Its `batch.size` is at most the smallest of `limits`, so that a batch of small
/// records never exceeds a topic's `max.message.bytes`.
///
/// # Errors
/// [`KafkaError`] when librdkafka rejects the configuration.
pub fn producer(settings: &Settings, limits: &RecordLimits) -> Result<FutureProducer, KafkaError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.kafka.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("batch.size", batch_bytes(limits).to_string());
    for (k, v) in &settings.kafka.producer {
        config.set(k, v);
    }
    config.create()
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
    limits: &RecordLimits,
) -> Result<FutureProducer, KafkaError> {
    let interval_ms = settings.pipeline.checkpoint_interval.as_millis() as u64;
    let timeout_ms = interval_ms.saturating_mul(3).clamp(60_000, 900_000);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.kafka.bootstrap_servers)
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("batch.size", batch_bytes(limits).to_string())
        .set("transactional.id", transactional_id(settings, partition))
        .set("transaction.timeout.ms", timeout_ms.to_string());
    for (k, v) in &settings.kafka.producer {
        config.set(k, v);
    }
    config.create()
}

/// Where a sent record goes, kept with its delivery until acknowledged.
#[derive(Debug, Clone, Copy)]
enum Destination {
    /// The output topic; emitted for the input record at `offset` of `partition` of the
    /// input topic `topic` (an index into [`Sink::input_topics`]).
    Output {
        topic: u16,
        partition: i32,
        offset: i64,
    },
    /// The dead-letter topic.
    DeadLetter,
}

/// How a sink tells its owner that deliveries keep failing, and learns that it should stop
/// retrying.
pub struct DeliveryGuard {
    /// Called with the reason while a failed delivery waits to be sent again, and with
    /// `None` once one goes through.
    pub on_stall: Box<dyn Fn(Option<String>) + Send + Sync>,
    /// Raised when the owner no longer wants the deliveries (its partition was revoked):
    /// retrying stops and the failure is returned.
    pub give_up: Arc<AtomicBool>,
    /// Called when an output the broker refused as too large is dead-lettered in its place
    /// (to count it as [`DeadLetterKind::OutputRefused`]).
    pub on_output_refused: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for DeliveryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryGuard").finish_non_exhaustive()
    }
}

impl Default for DeliveryGuard {
    fn default() -> Self {
        Self {
            on_stall: Box::new(|_| {}),
            give_up: Arc::new(AtomicBool::new(false)),
            on_output_refused: Box::new(|| {}),
        }
    }
}

/// One worker's handle on the producer.
pub struct Sink {
    producer: FutureProducer,
    output_topic: String,
    dead_letter_topic: String,
    limits: RecordLimits,
    /// Whether the producer is transactional: a failed delivery then loses the open
    /// transaction, so it is returned, not retried.
    transactional: bool,
    guard: DeliveryGuard,
    /// The input topics of the records emitted for (few: co-partitioned inputs).
    input_topics: Vec<Arc<str>>,
    pending: VecDeque<(DeliveryFuture, Destination)>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("output_topic", &self.output_topic)
            .field("limits", &self.limits)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// A record that failed delivery with what is needed to send it again.
struct Refused {
    error: KafkaError,
    message: OwnedMessage,
    destination: Destination,
}

/// The smallest limit a dead letter is cut to when its topic refuses it as too large: its
/// `weir.*` headers must fit.
const DEAD_LETTER_BYTES_FLOOR: u64 = 16 << 10;

/// First wait before a refused record is sent again; doubles up to [`RESEND_BACKOFF_MAX`].
const RESEND_BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest wait between sends of a refused record.
const RESEND_BACKOFF_MAX: Duration = Duration::from_secs(10);

impl Sink {
    /// A sink writing to `output_topic` and `dead_letter_topic`, sizing records by `limits`,
    /// reporting failing deliveries to `guard`. `transactional`: the producer is a shard's
    /// transactional one (exactly-once), whose failed deliveries are not retried.
    pub fn new(
        producer: FutureProducer,
        output_topic: String,
        dead_letter_topic: String,
        limits: RecordLimits,
        transactional: bool,
        guard: DeliveryGuard,
    ) -> Self {
        Self {
            producer,
            output_topic,
            dead_letter_topic,
            limits,
            transactional,
            guard,
            input_topics: Vec::new(),
            pending: VecDeque::new(),
        }
    }

    /// The record size limits the sink sizes by.
    pub fn limits(&self) -> RecordLimits {
        self.limits
    }

    /// Sends an operator emit to the output topic, with the timestamp of the input record it
    /// was emitted for (`source`; its `timestamp_ms`, ms since the Unix epoch; negative: none,
    /// the producer's clock), as Kafka Streams gives an output record its input's timestamp.
    /// The emit import has refused emits over [`RecordLimits::output_bytes_max`].
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    pub async fn emit(&mut self, emit: &StagedEmit, source: &InputRecord) -> Result<(), SinkError> {
        let mut headers = OwnedHeaders::new_with_capacity(emit.headers.len());
        for h in &emit.headers {
            headers = headers.insert(KafkaHeader {
                key: &h.name,
                value: Some(&h.value),
            });
        }
        let key = (!emit.key.is_empty()).then_some(emit.key.as_slice());
        let topic = match self.input_topics.iter().position(|t| **t == *source.topic) {
            Some(i) => i,
            None => {
                self.input_topics.push(Arc::from(source.topic.as_str()));
                self.input_topics.len() - 1
            }
        };
        let destination = Destination::Output {
            topic: u16::try_from(topic).unwrap_or(u16::MAX),
            partition: source.partition,
            offset: source.offset,
        };
        let output = std::mem::take(&mut self.output_topic);
        let sent = self
            .send(
                &output,
                key,
                &emit.value,
                headers,
                source.timestamp_ms,
                destination,
            )
            .await;
        self.output_topic = output;
        sent
    }

    /// Sends a failed input record to the dead-letter topic with its original key, value,
    /// timestamp and headers plus the `weir.*` headers naming the error (at most
    /// [`ERROR_HEADER_BYTES_MAX`] of it) and the source position — cut to fit the topic when
    /// it is too large ([`fit_dead_letter`]).
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    pub async fn dead_letter(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> Result<(), SinkError> {
        let original: Vec<(&str, &[u8])> = record
            .headers
            .iter()
            .map(|h| (h.name.as_str(), h.value.as_slice()))
            .collect();
        let (key, value, headers) = dead_letter_parts(
            DeadLetterSource {
                topic: &record.topic,
                partition: record.partition,
                offset: record.offset,
            },
            kind,
            error,
            &original,
            &record.key,
            &record.value,
            self.limits.dead_letter_bytes_max,
        );
        let topic = std::mem::take(&mut self.dead_letter_topic);
        let sent = self
            .send(
                &topic,
                (!key.is_empty()).then_some(key),
                value,
                headers,
                record.timestamp_ms,
                Destination::DeadLetter,
            )
            .await;
        self.dead_letter_topic = topic;
        sent
    }

    async fn send(
        &mut self,
        topic: &str,
        key: Option<&[u8]>,
        value: &[u8],
        headers: OwnedHeaders,
        timestamp_ms: i64,
        destination: Destination,
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
        match self.enqueue(record).await? {
            Ok(delivery) => self.pending.push_back((delivery, destination)),
            // Refused at once (a topic librdkafka knows is missing or forbidden): handled as
            // a refused delivery, the partition waiting until it goes through.
            Err((error, message)) => {
                self.deliver_refused(Refused {
                    error,
                    message,
                    destination,
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Hands `record` to librdkafka, waiting for room in its queue when it is full. A record
    /// librdkafka refuses at once is returned with the refusal, as an owned message.
    ///
    /// # Errors
    /// [`SinkError`] when waiting for room met a delivery that failed for good.
    async fn enqueue(
        &mut self,
        mut record: FutureRecord<'_, [u8], [u8]>,
    ) -> Result<Result<DeliveryFuture, (KafkaError, OwnedMessage)>, SinkError> {
        loop {
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok(Ok(delivery)),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // librdkafka's queue is full: wait for a delivery (or briefly) and retry.
                    record = back;
                    if self.pending.is_empty() {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    } else {
                        Box::pin(self.wait_oldest()).await?;
                    }
                }
                Err((error, back)) => {
                    let headers = back.headers.clone();
                    let message = OwnedMessage::new(
                        back.payload.map(<[u8]>::to_vec),
                        back.key.map(<[u8]>::to_vec),
                        back.topic.to_owned(),
                        back.timestamp.map_or(
                            rdkafka::Timestamp::NotAvailable,
                            rdkafka::Timestamp::CreateTime,
                        ),
                        back.partition.unwrap_or(-1),
                        -1,
                        headers,
                    );
                    return Ok(Err((error, message)));
                }
            }
        }
    }

    /// Waits for the oldest delivery; a refused one is sent again until it goes through
    /// ([`Sink::deliver_refused`]).
    async fn wait_oldest(&mut self) -> Result<(), SinkError> {
        let Some((delivery, destination)) = self.pending.pop_front() else {
            return Ok(());
        };
        match self.settle(delivery, destination).await {
            Ok(()) => Ok(()),
            Err(Err(failed)) => Err(failed),
            Err(Ok(refused)) => self.deliver_refused(refused).await,
        }
    }

    /// Sends a refused record again until it goes through: a record too large for its topic
    /// after all (its limit was lowered) is cut further (a dead letter) or dead-lettered (an
    /// output); any other refusal (a missing topic, denied access) is retried with backoff
    /// while the guard reports the stall, so that the partition pauses instead of losing or
    /// skipping the record. A transactional producer's refusal, or one the owner gave up on
    /// (its partition was revoked), is returned.
    async fn deliver_refused(&mut self, mut refused: Refused) -> Result<(), SinkError> {
        let mut backoff = RESEND_BACKOFF_MIN;
        let mut stalled = false;
        loop {
            let topic = self.topic_of(refused.destination).to_owned();
            if self.transactional || self.guard.give_up.load(Ordering::Relaxed) {
                return Err(SinkError::Delivery {
                    topic,
                    source: refused.error,
                });
            }
            let cuttable = self.limits.dead_letter_bytes_max > DEAD_LETTER_BYTES_FLOOR
                || refused.destination != Destination::DeadLetter;
            let (record, destination) = if is_too_large(&refused.error) && cuttable {
                // The topic's limit is lower than when the pipeline started: size dead
                // letters by half the limit they were cut to, and dead-letter the record.
                tracing::warn!(topic, error = %refused.error, "a record was too large for its topic after all; dead-lettering it, cut to fit");
                if refused.destination == Destination::DeadLetter {
                    self.limits.dead_letter_bytes_max =
                        (self.limits.dead_letter_bytes_max / 2).max(DEAD_LETTER_BYTES_FLOOR);
                } else {
                    (self.guard.on_output_refused)();
                }
                self.refused_as_dead_letter(&refused)
            } else {
                let reason = format!(
                    "delivery to `{topic}` failed ({}); retrying in {backoff:?}",
                    refused.error
                );
                tracing::warn!(topic, error = %refused.error, retry_in = ?backoff, "delivery failed; the partition waits and sends the record again");
                (self.guard.on_stall)(Some(reason));
                stalled = true;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RESEND_BACKOFF_MAX);
                (refused.message, refused.destination)
            };
            let topic = self.topic_of(destination).to_owned();
            let mut again = FutureRecord::<[u8], [u8]>::to(&topic)
                .payload(record.payload().unwrap_or_default());
            if let Some(key) = record.key() {
                again = again.key(key);
            }
            if let Some(headers) = record.headers() {
                again = again.headers(headers.clone());
            }
            if let Some(ms) = record.timestamp().to_millis() {
                again = again.timestamp(ms);
            }
            let outcome = match self.enqueue(again).await? {
                Ok(delivery) => self.settle(delivery, destination).await,
                Err((error, message)) => Err(Ok(Refused {
                    error,
                    message,
                    destination,
                })),
            };
            match outcome {
                Ok(()) => {
                    if stalled {
                        (self.guard.on_stall)(None);
                    }
                    return Ok(());
                }
                Err(Err(failed)) => return Err(failed),
                Err(Ok(again)) => refused = again,
            }
        }
    }

    /// Awaits one delivery: `Ok`, a refusal to handle, or a failure to return.
    async fn settle(
        &self,
        delivery: DeliveryFuture,
        destination: Destination,
    ) -> Result<(), Result<Refused, SinkError>> {
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((error, message))) => Err(Ok(Refused {
                error,
                message,
                destination,
            })),
            Err(_canceled) => Err(Err(SinkError::Delivery {
                topic: self.topic_of(destination).to_owned(),
                source: KafkaError::Canceled,
            })),
        }
    }

    fn topic_of(&self, destination: Destination) -> &str {
        match destination {
            Destination::Output { .. } => &self.output_topic,
            Destination::DeadLetter => &self.dead_letter_topic,
        }
    }

    /// A record the broker refused as too large, as a dead letter cut to the (lowered)
    /// dead-letter limit: a dead letter is cut further; an output becomes a dead letter of
    /// kind [`DeadLetterKind::OutputRefused`] naming the input record it was emitted for.
    fn refused_as_dead_letter(&self, refused: &Refused) -> (OwnedMessage, Destination) {
        let message = &refused.message;
        let headers: Vec<(&str, &[u8])> = message
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key, h.value.unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        let key = message.key().unwrap_or_default();
        let value = message.payload().unwrap_or_default();
        let (key, value, out_headers) = match refused.destination {
            Destination::DeadLetter => {
                // Already a dead letter: keep its weir.* headers, cut the rest further.
                let (weir, original): (Vec<_>, Vec<_>) = headers
                    .iter()
                    .partition(|(name, _)| name.starts_with("weir."));
                cut_again(
                    &weir,
                    &original,
                    key,
                    value,
                    self.limits.dead_letter_bytes_max,
                )
            }
            Destination::Output {
                topic,
                partition,
                offset,
            } => {
                let source_topic = self
                    .input_topics
                    .get(usize::from(topic))
                    .map_or("", |t| &**t);
                dead_letter_parts(
                    DeadLetterSource {
                        topic: source_topic,
                        partition,
                        offset,
                    },
                    DeadLetterKind::OutputRefused,
                    &format!("output refused by the broker: {}", refused.error),
                    &headers,
                    key,
                    value,
                    self.limits.dead_letter_bytes_max,
                )
            }
        };
        let owned = OwnedMessage::new(
            Some(value.to_vec()),
            (!key.is_empty()).then(|| key.to_vec()),
            self.dead_letter_topic.clone(),
            message.timestamp(),
            message.partition(),
            message.offset(),
            Some(out_headers),
        );
        (owned, Destination::DeadLetter)
    }

    /// Waits until everything sent so far is acknowledged (refused records sent again as
    /// [`Sink::wait_oldest`] says).
    ///
    /// # Errors
    /// [`SinkError`] for the first delivery that failed for good.
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

impl PartialEq for Destination {
    fn eq(&self, other: &Self) -> bool {
        matches!(
            (self, other),
            (Destination::DeadLetter, Destination::DeadLetter)
                | (Destination::Output { .. }, Destination::Output { .. })
        )
    }
}

/// Whether a delivery failed because the record (or its batch) was too large for the
/// producer or the topic.
fn is_too_large(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::MessageBatchTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
        )
    )
}

/// Where a dead-lettered record was read.
#[derive(Debug, Clone, Copy)]
struct DeadLetterSource<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
}

/// The key, value and headers of a dead letter of a record with `key`, `value` and
/// `headers`: the original headers, then the `weir.*` headers (`weir.error` capped at
/// [`ERROR_HEADER_BYTES_MAX`]); cut to `limit` bytes by [`fit_dead_letter`], with the
/// truncation headers when anything was cut.
fn dead_letter_parts<'a>(
    source: DeadLetterSource<'_>,
    kind: DeadLetterKind,
    error: &str,
    headers: &[(&str, &[u8])],
    key: &'a [u8],
    value: &'a [u8],
    limit: u64,
) -> (&'a [u8], &'a [u8], OwnedHeaders) {
    let partition = source.partition.to_string();
    let offset = source.offset.to_string();
    let weir: [(&str, &[u8]); 5] = [
        (HEADER_ERROR, cap(error, ERROR_HEADER_BYTES_MAX).as_bytes()),
        (HEADER_ERROR_KIND, kind.as_str().as_bytes()),
        (HEADER_SOURCE_TOPIC, source.topic.as_bytes()),
        (HEADER_SOURCE_PARTITION, partition.as_bytes()),
        (HEADER_SOURCE_OFFSET, offset.as_bytes()),
    ];
    cut_again(&weir, headers, key, value, limit)
}

/// Cuts a record with the `weir.*` headers `weir` (kept whole) and the original `headers`,
/// `key` and `value` to `limit` bytes; returns the kept key and value and every header.
fn cut_again<'a>(
    weir: &[(&str, &[u8])],
    headers: &[(&str, &[u8])],
    key: &'a [u8],
    value: &'a [u8],
    limit: u64,
) -> (&'a [u8], &'a [u8], OwnedHeaders) {
    let weir_bytes: u64 = weir.iter().map(|(n, v)| (n.len() + v.len()) as u64).sum();
    let sizes: Vec<u64> = headers
        .iter()
        .map(|(n, v)| (n.len() + v.len()) as u64)
        .collect();
    let cut = fit_dead_letter(
        limit,
        weir_bytes,
        weir.len() as u64,
        &sizes,
        key.len(),
        value.len(),
    );
    let kept = headers.len() - cut.headers_dropped;
    let mut out = OwnedHeaders::new_with_capacity(kept + weir.len() + 4);
    for (name, v) in headers[..kept].iter().chain(weir) {
        out = out.insert(KafkaHeader {
            key: name,
            value: Some(*v),
        });
    }
    if cut.truncated {
        let mut what = Vec::new();
        if cut.headers_dropped > 0 {
            what.push("headers");
        }
        if cut.key_kept < key.len() {
            what.push("key");
        }
        if cut.value_kept < value.len() {
            what.push("value");
        }
        let original_headers: u64 = sizes.iter().sum();
        for (name, v) in [
            (HEADER_TRUNCATED, what.join(",")),
            (HEADER_ORIGINAL_KEY_BYTES, key.len().to_string()),
            (HEADER_ORIGINAL_VALUE_BYTES, value.len().to_string()),
            (HEADER_ORIGINAL_HEADERS_BYTES, original_headers.to_string()),
        ] {
            out = out.insert(KafkaHeader {
                key: name,
                value: Some(v.as_bytes()),
            });
        }
    }
    (&key[..cut.key_kept], &value[..cut.value_kept], out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(headers: &'a OwnedHeaders, name: &str) -> Option<&'a [u8]> {
        headers.iter().find(|h| h.key == name).and_then(|h| h.value)
    }

    #[test]
    fn a_dead_letter_keeps_its_weir_headers_with_the_error_capped_at_4_kib() {
        let source = DeadLetterSource {
            topic: "in",
            partition: 3,
            offset: 42,
        };
        let original = [("trace", b"abc".as_slice())];
        let (key, value, headers) = dead_letter_parts(
            source,
            DeadLetterKind::Trapped,
            &"é".repeat(5_000),
            &original,
            b"k",
            b"v",
            1_000_000,
        );
        assert_eq!((key, value), (b"k".as_slice(), b"v".as_slice()));
        let error = header(&headers, HEADER_ERROR).expect("weir.error");
        assert_eq!(
            error.len(),
            ERROR_HEADER_BYTES_MAX,
            "cut at a character boundary"
        );
        assert_eq!(
            header(&headers, HEADER_SOURCE_OFFSET),
            Some(b"42".as_slice())
        );
        assert_eq!(header(&headers, "trace"), Some(b"abc".as_slice()));
        assert_eq!(header(&headers, HEADER_TRUNCATED), None, "nothing was cut");
    }

    #[test]
    fn a_dead_letter_too_large_for_its_topic_says_what_was_cut() {
        let source = DeadLetterSource {
            topic: "in",
            partition: 0,
            offset: 7,
        };
        let key = vec![b'k'; 30_000];
        let original = [("big", vec![b'h'; 20_000])];
        let original: Vec<(&str, &[u8])> =
            original.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let (kept_key, value, headers) = dead_letter_parts(
            source,
            DeadLetterKind::Rejected,
            "too big",
            &original,
            &key,
            b"value",
            10_000,
        );
        assert!(kept_key.len() < key.len());
        assert_eq!(value, b"value", "the value is cut last");
        assert_eq!(header(&headers, "big"), None, "headers go first");
        assert_eq!(
            header(&headers, HEADER_TRUNCATED),
            Some(b"headers,key".as_slice())
        );
        assert_eq!(
            header(&headers, HEADER_ORIGINAL_KEY_BYTES),
            Some(b"30000".as_slice())
        );
        assert_eq!(
            header(&headers, HEADER_ORIGINAL_HEADERS_BYTES),
            Some(b"20003".as_slice())
        );
        assert_eq!(header(&headers, HEADER_ERROR), Some(b"too big".as_slice()));
    }
}
