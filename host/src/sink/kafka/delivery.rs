//! [`KafkaSink`]: one partition's producer handle — emits to the operator's output topics,
//! dead letters to the dead-letter topic, each sized against its topic's limit — and the deliveries it waits
//! for, counted ([`super::producer::Deliveries`]) and bounded by [`PENDING_DELIVERIES_MAX`]. A
//! refused delivery is sent again until it goes through ([`KafkaSink::deliver_refused`]);
//! exactly-once, the shard's transaction is committed with the checkpoint
//! ([`super::transaction`]).

use super::dead_letter::{DeadLetterSource, cut_again, dead_letter_parts};
use super::limits::RecordLimits;
use super::producer::{Deliveries, KafkaProducer, Record, Refused, Tag, owned};
use super::{DeadLetterKind, DeliveryGuard, PENDING_DELIVERIES_MAX, SinkError};
use crate::ids::Partition;
use crate::runtime::{InputRecord, StagedEmit};
use crate::source::kafka::SourceConsumer;
use crate::time::edge::{ORIGIN_HEADER, TopicKey};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::Producer;
use std::sync::Arc;
use std::time::Duration;

mod edge;
mod replay;

/// Where a sent record goes, kept with its delivery until acknowledged.
#[derive(Debug, Clone, Copy)]
pub(super) enum Destination {
    /// Output `output`'s topic ([`KafkaSink::outputs`]); emitted for the input record at
    /// `offset` of `partition` of the input topic `topic` (an index into
    /// [`KafkaSink::input_topics`]).
    Output {
        output: u16,
        topic: u16,
        partition: Partition,
        offset: i64,
    },
    /// The dead-letter topic.
    DeadLetter,
}

/// Where one of the operator's outputs goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputTopic {
    /// The topic.
    pub topic: String,
    /// It is an internal topic of this many partitions: each checkpoint's watermark marker
    /// goes to every one ([`KafkaSink::watermark`]), and each record emitted for an input
    /// record says where it came from (`crate::time::edge::Origin`).
    pub marker_partitions: Option<i32>,
}

/// Where a sink's dead letters go, and what they say of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetters {
    /// The dead-letter topic.
    pub topic: String,
    /// The stage, in a pipeline of stages: each dead letter's `weir.stage` header
    /// ([`super::HEADER_STAGE`]).
    pub stage: Option<String>,
}

/// One partition's handle on a producer.
pub struct KafkaSink {
    pub(super) producer: KafkaProducer,
    /// The operator's outputs' topics by [`StagedEmit::output`]: `default` first (none when
    /// the pipeline writes its emits only to an Iceberg table), then its named outputs.
    outputs: Vec<Option<OutputTopic>>,
    dead_letter_topic: String,
    /// The stage, in a pipeline of stages ([`DeadLetters::stage`]).
    stage: Option<String>,
    limits: RecordLimits,
    /// Exactly-once: the pipeline's consumer, whose group metadata goes with the transaction's
    /// offsets. A failed delivery then loses the open transaction, so it is returned, not
    /// retried.
    group: Option<Arc<SourceConsumer>>,
    guard: DeliveryGuard,
    /// The input topics of the records emitted for (few: co-partitioned inputs).
    input_topics: Vec<Arc<str>>,
    /// Their keys in an [`Origin`](crate::time::edge::Origin) (by the same index).
    input_keys: Vec<TopicKey>,
    /// The offsets below which a record's outputs may have been sent before
    /// ([`KafkaSink::replay_below`]), per input topic; and by the same index as
    /// `input_topics`, for each emit ([`i64::MIN`]: none).
    replay_below: Vec<(String, i64)>,
    input_replay_below: Vec<i64>,
    /// Exactly-once: outputs not sent again, committed before (`delivery::replay`).
    withheld: u64,
    /// This sink's deliveries not yet acknowledged, and those refused.
    deliveries: Arc<Deliveries>,
    /// Exactly-once: when the open transaction began, and the `transaction.timeout.ms` after
    /// which the broker aborts it (SCENARIOS.md S19: a checkpoint slower than that).
    pub(super) transaction_clock: Option<(std::time::Instant, Duration)>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("outputs", &self.outputs)
            .field("limits", &self.limits)
            .field("outstanding", &self.deliveries.outstanding())
            .finish_non_exhaustive()
    }
}

/// The smallest limit a dead letter is cut to when its topic refuses it as too large: its
/// `weir.*` headers must fit.
const DEAD_LETTER_BYTES_FLOOR: u64 = 16 << 10;

/// First wait before a refused record is sent again; doubles up to [`RESEND_BACKOFF_MAX`].
const RESEND_BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest wait between sends of a refused record.
const RESEND_BACKOFF_MAX: Duration = Duration::from_secs(10);

impl KafkaSink {
    /// A sink writing the operator's `outputs` (by [`StagedEmit::output`]; an emit to one
    /// that is `None` is refused) and `dead_letters`, sizing records by
    /// `limits`, reporting failing deliveries to `guard`. `group`: the producer is a shard's
    /// transactional one (exactly-once) and this the pipeline's consumer.
    pub fn new(
        producer: KafkaProducer,
        outputs: Vec<Option<OutputTopic>>,
        dead_letters: DeadLetters,
        limits: RecordLimits,
        group: Option<Arc<SourceConsumer>>,
        guard: DeliveryGuard,
    ) -> Self {
        Self {
            producer,
            outputs,
            dead_letter_topic: dead_letters.topic,
            stage: dead_letters.stage,
            limits,
            group,
            guard,
            input_topics: Vec::new(),
            input_keys: Vec::new(),
            replay_below: Vec::new(),
            input_replay_below: Vec::new(),
            withheld: 0,
            deliveries: Arc::new(Deliveries::new(PENDING_DELIVERIES_MAX)),
            transaction_clock: None,
        }
    }

    /// This sink, whose transaction began now and is aborted by the broker once open longer
    /// than `timeout` (`transaction.timeout.ms`).
    pub fn with_transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_clock = Some((crate::clock::monotonic_now(), timeout));
        self
    }

    /// Exactly-once: the consumer whose group metadata goes with the transaction.
    pub(super) fn group(&self) -> Option<Arc<SourceConsumer>> {
        self.group.clone()
    }

    /// The record size limits the sink sizes by.
    pub fn limits(&self) -> RecordLimits {
        self.limits
    }

    /// Sends an operator emit to its output's topic, with the timestamp the operator gave it or
    /// else that of the input record it was emitted for (`source`; its `timestamp_ms`, ms
    /// since the Unix epoch; negative: none, the producer's clock), as Kafka Streams gives an
    /// output record its input's timestamp. The emit import has refused emits over
    /// [`RecordLimits::output_bytes_max`].
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    pub async fn emit(&mut self, emit: &StagedEmit, source: &InputRecord) -> Result<(), SinkError> {
        let topic = match self.input_topics.iter().position(|t| **t == *source.topic) {
            Some(i) => i,
            None => {
                self.input_topics.push(source.topic.clone());
                self.input_keys.push(TopicKey::of(&source.topic));
                self.input_replay_below
                    .push(self.replay_below_of(&source.topic));
                self.input_topics.len() - 1
            }
        };
        if self.committed_before(emit.output, topic, source.offset) {
            return Ok(());
        }
        let origin = (source.offset < self.input_replay_below[topic])
            .then(|| self.origin(emit, source, self.input_keys[topic]))
            .flatten();
        // No header list at all for an emit without headers (most): librdkafka would allocate,
        // serialize and free an empty one per record.
        let headers = (!emit.headers.is_empty() || origin.is_some()).then(|| {
            let headers = emit.headers.iter().fold(
                OwnedHeaders::new_with_capacity(emit.headers.len() + 1),
                |headers, h| {
                    headers.insert(KafkaHeader {
                        key: &h.name,
                        value: Some(&h.value),
                    })
                },
            );
            match &origin {
                Some(origin) => headers.insert(KafkaHeader {
                    key: ORIGIN_HEADER,
                    value: Some(origin.as_slice()),
                }),
                None => headers,
            }
        });
        let key = (!emit.key.is_empty()).then_some(emit.key.as_slice());
        let destination = Destination::Output {
            output: emit.output,
            topic: u16::try_from(topic).unwrap_or(u16::MAX),
            partition: Partition(source.partition),
            offset: source.offset,
        };
        let slot = usize::from(emit.output);
        let Some(output) = self.outputs.get_mut(slot).and_then(Option::take) else {
            return Err(SinkError {
                topic: format!("output {}", emit.output),
                source: "the output has no topic".into(),
            });
        };
        let sent = self
            .send(
                (&output.topic, None),
                key,
                &emit.value,
                headers,
                emit.timestamp_ms.unwrap_or(source.timestamp_ms),
                destination,
            )
            .await;
        self.outputs[slot] = Some(output);
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
        if self.dead_letter_committed_before(record) {
            return Ok(());
        }
        let original: Vec<(&str, &[u8])> = record
            .headers
            .iter()
            .map(|h| (h.name.as_str(), h.value.as_slice()))
            .collect();
        let (key, value, headers) = dead_letter_parts(
            DeadLetterSource {
                topic: &record.topic,
                partition: Partition(record.partition),
                offset: record.offset,
                stage: self.stage.as_deref(),
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
                (&topic, None),
                (!key.is_empty()).then_some(key),
                value,
                Some(headers),
                record.timestamp_ms,
                Destination::DeadLetter,
            )
            .await;
        self.dead_letter_topic = topic;
        sent
    }

    async fn send(
        &mut self,
        (topic, partition): (&str, Option<i32>),
        key: Option<&[u8]>,
        value: &[u8],
        headers: Option<OwnedHeaders>,
        timestamp_ms: i64,
        destination: Destination,
    ) -> Result<(), SinkError> {
        while self.deliveries.outstanding() >= PENDING_DELIVERIES_MAX {
            self.deliveries.settled().await;
            self.resend_refused().await?;
        }
        let tag = Box::new(Tag {
            deliveries: self.deliveries.clone(),
            destination,
        });
        let mut record = Record::with_opaque_to(topic, tag).payload(value);
        if let Some(headers) = headers {
            record = record.headers(headers);
        }
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        if timestamp_ms >= 0 {
            record = record.timestamp(timestamp_ms);
        }
        if let Err((error, message)) = self.enqueue(record).await {
            // Refused at once (a topic librdkafka knows is missing or forbidden): handled as
            // a refused delivery, the partition waiting until it goes through.
            self.deliver_refused(Refused {
                error,
                message,
                destination,
            })
            .await?;
        }
        Ok(())
    }

    /// Hands `record` to librdkafka, waiting for room in its queue when it is full. A record
    /// librdkafka refuses at once is returned with the refusal, as an owned message.
    async fn enqueue(&self, mut record: Record<'_>) -> Result<(), (KafkaError, OwnedMessage)> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // librdkafka's queue is full (shared by the producer's sinks): let
                    // deliveries complete and retry.
                    record = back;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((error, back)) => return Err((error, owned(&back))),
            }
        }
    }

    /// Waits until none of this sink's deliveries is outstanding (refused ones not sent again).
    async fn settle_all(&self) {
        while self.deliveries.outstanding() > 0 {
            self.deliveries.settled().await;
        }
    }

    /// Sends the records refused so far again, each until it goes through
    /// ([`KafkaSink::deliver_refused`]).
    async fn resend_refused(&mut self) -> Result<(), SinkError> {
        let mut refused = self.deliveries.take_refused().into_iter();
        while let Some(next) = refused.next() {
            self.deliveries.put_back(refused.collect());
            self.deliver_refused(next).await?;
            refused = self.deliveries.take_refused().into_iter();
        }
        Ok(())
    }

    /// Sends a refused record again until it goes through: a record too large for its topic
    /// after all (its limit was lowered) is cut further (a dead letter) or dead-lettered (an
    /// output); any other refusal (a missing topic, denied access) is retried with backoff
    /// while the guard reports the stall, so that the partition pauses instead of losing or
    /// skipping the record. A transactional producer's refusal, or one the owner gave up on
    /// (its partition was revoked, or the pipeline is shutting down: the wait is cut short),
    /// is returned.
    async fn deliver_refused(&mut self, mut refused: Refused) -> Result<(), SinkError> {
        let mut backoff = RESEND_BACKOFF_MIN;
        let mut stalled = false;
        loop {
            let topic = self.topic_of(refused.destination).to_owned();
            if self.group.is_some() || self.guard.given_up() {
                return Err(SinkError {
                    topic,
                    source: Box::new(refused.error),
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
                    self.guard.output_refused();
                }
                self.refused_as_dead_letter(&refused)
            } else {
                let reason = format!(
                    "delivery to `{topic}` failed ({}); retrying in {backoff:?}",
                    refused.error
                );
                tracing::warn!(topic, error = %refused.error, retry_in = ?backoff, "delivery failed; the partition waits and sends the record again");
                self.guard.stalled(Some(reason)).await;
                stalled = true;
                // Cut short when the partition is revoked or the pipeline shuts down: the
                // check above then returns the failure.
                self.guard.wait(backoff).await;
                backoff = (backoff * 2).min(RESEND_BACKOFF_MAX);
                (refused.message, refused.destination)
            };
            let topic = self.topic_of(destination).to_owned();
            let tag = Box::new(Tag {
                deliveries: self.deliveries.clone(),
                destination,
            });
            let mut again =
                Record::with_opaque_to(&topic, tag).payload(record.payload().unwrap_or_default());
            if let Some(key) = record.key() {
                again = again.key(key);
            }
            // A record sent to a partition of its own (a watermark marker) goes there again.
            if record.partition() >= 0 {
                again = again.partition(record.partition());
            }
            if let Some(headers) = record.headers() {
                again = again.headers(headers.clone());
            }
            if let Some(ms) = record.timestamp().to_millis() {
                again = again.timestamp(ms);
            }
            refused = match self.enqueue(again).await {
                Ok(()) => {
                    // Everything this sink sent has settled: a refusal now may be this
                    // record's or an earlier one's; either needs sending again, the others
                    // wait their turn.
                    self.settle_all().await;
                    let mut more = self.deliveries.take_refused();
                    if more.is_empty() {
                        if stalled {
                            self.guard.stalled(None).await;
                        }
                        return Ok(());
                    }
                    let next = more.remove(0);
                    self.deliveries.put_back(more);
                    next
                }
                Err((error, message)) => Refused {
                    error,
                    message,
                    destination,
                },
            };
        }
    }

    fn topic_of(&self, destination: Destination) -> &str {
        match destination {
            // An output destination exists only for a record sent to that output's topic.
            Destination::Output { output, .. } => self
                .outputs
                .get(usize::from(output))
                .and_then(Option::as_ref)
                .map_or("", |o| o.topic.as_str()),
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
                ..
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
                        stage: self.stage.as_deref(),
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

    /// Waits until everything sent so far is acknowledged (refused records sent again until
    /// they go through, [`KafkaSink::deliver_refused`]).
    ///
    /// # Errors
    /// [`SinkError`] for the first delivery that failed for good.
    pub async fn drain(&mut self) -> Result<(), SinkError> {
        loop {
            self.settle_all().await;
            let refused = self.deliveries.take_refused();
            if refused.is_empty() {
                return Ok(());
            }
            self.deliveries.put_back(refused);
            self.resend_refused().await?;
        }
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
