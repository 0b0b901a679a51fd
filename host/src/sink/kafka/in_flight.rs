//! What is in flight on an internal topic, for savepoints and resets of a pipeline of stages
//! (docs/topologies.md, "Savepoints and resets"): [`read_to_end`] reads one partition's
//! committed records from a downstream shard's checkpoint offset to the end, as its
//! `read_committed` consumer would; [`seed`] writes them, in order, into the same partition of
//! a new, empty topic, where they take the offsets `0..n`.

use crate::checkpoints::savepoint::in_flight::{CHUNK_BYTES, InFlightRecord};
use crate::config::KafkaSettings;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use std::time::Duration;

/// How long a read waits for the broker without a record or the partition's end.
const QUIET_MAX: Duration = Duration::from_secs(30);
/// How long a metadata or produce request waits.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the in-flight records cannot be read or seeded.
#[derive(Debug, thiserror::Error)]
pub enum InFlightError {
    /// The client could not be made, or the broker failed a request.
    #[error("Kafka failed reading or writing internal topic `{topic}`")]
    Kafka {
        /// The topic.
        topic: String,
        /// What failed.
        #[source]
        source: KafkaError,
    },
    /// A transaction is still open on the partition (a host killed while it ran one, its
    /// shard not taken over since): records others committed after it are not readable until
    /// it is aborted, when the producer's `transaction.timeout.ms` passes.
    #[error(
        "partition {partition} of internal topic `{topic}` has a transaction still open (its records after offset {stable} are not readable yet): take the savepoint again once it times out"
    )]
    OpenTransaction {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Where `read_committed` reads end.
        stable: i64,
    },
    /// The broker sent nothing for [`QUIET_MAX`].
    #[error("partition {partition} of internal topic `{topic}` sent nothing for {QUIET_MAX:?}")]
    Quiet {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// The seeded partition does not hold exactly the records written (it was not new).
    #[error(
        "partition {partition} of internal topic `{topic}` holds offsets {low}..{high} after its seed of {records} records, not 0..{records}"
    )]
    Seeded {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Its log start and end after the seed.
        low: i64,
        /// See `low`.
        high: i64,
        /// Records written.
        records: u64,
    },
}

/// The context of [`read_to_end`]'s consumer: librdkafka's errors logged as rust-rdkafka logs
/// them, but for the end of the partition, which the read waits for (and which librdkafka
/// reports as a global error too).
struct QuietEof;

impl rdkafka::ClientContext for QuietEof {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::Global(RDKafkaErrorCode::PartitionEOF)) {
            tracing::error!("librdkafka: {error}: {reason}");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for QuietEof {}

/// What [`read_to_end`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRange {
    /// The first offset read (the log start, when asked for none).
    pub from: i64,
    /// The partition's end: every committed record below it was read.
    pub end: i64,
    /// Records read.
    pub records: u64,
}

/// Reads partition `partition` of `topic` from `from` (`None`: its log start) to its end as a
/// `read_committed` consumer does (aborted records left out, markers in), sending the records
/// in chunks of about [`CHUNK_BYTES`] to `chunks`; blocking (run it off the runtime's threads).
/// A receiver gone ends the read early.
///
/// # Errors
/// [`InFlightError`]: the broker failed, went quiet, or a transaction is still open there.
pub fn read_to_end(
    kafka: &KafkaSettings,
    topic: &str,
    partition: i32,
    from: Option<i64>,
    chunks: &tokio::sync::mpsc::Sender<Vec<InFlightRecord>>,
) -> Result<ReadRange, InFlightError> {
    let failed = |source| InFlightError::Kafka {
        topic: topic.to_owned(),
        source,
    };
    let consumer: BaseConsumer<QuietEof> = kafka
        .client_config()
        .set("group.id", "weir-savepoint")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create_with_context(QuietEof)
        .map_err(failed)?;
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
        .map_err(failed)?;
    let from = from.unwrap_or(low).max(low);
    let mut range = ReadRange {
        from,
        end: high,
        records: 0,
    };
    if from >= high {
        return Ok(range);
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, KafkaOffset::Offset(from))
        .map_err(failed)?;
    consumer.assign(&assignment).map_err(failed)?;
    let (mut chunk, mut bytes) = (Vec::new(), 0);
    let mut heard = crate::clock::monotonic_now();
    loop {
        match consumer.poll(Duration::from_millis(500)) {
            None if heard.elapsed() > QUIET_MAX => {
                return Err(InFlightError::Quiet {
                    topic: topic.to_owned(),
                    partition,
                });
            }
            None => continue,
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => return Err(failed(e)),
            Some(Ok(message)) => {
                heard = crate::clock::monotonic_now();
                let record = in_flight_record(&message);
                bytes += record.size();
                chunk.push(record);
                range.records += 1;
                if bytes >= CHUNK_BYTES {
                    if chunks.blocking_send(std::mem::take(&mut chunk)).is_err() {
                        return Ok(range);
                    }
                    bytes = 0;
                }
            }
        }
    }
    if !chunk.is_empty() {
        let _ = chunks.blocking_send(chunk);
    }
    range.end = end_if_stable(&consumer, topic, partition, from)?;
    Ok(range)
}

/// `message` as a savepoint keeps it.
fn in_flight_record(message: &rdkafka::message::BorrowedMessage<'_>) -> InFlightRecord {
    InFlightRecord {
        offset: message.offset(),
        timestamp_ms: message.timestamp().to_millis(),
        key: message.key().map(<[u8]>::to_vec),
        value: message.payload().map(<[u8]>::to_vec),
        headers: message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The end of `partition` of `topic` once `consumer` read to it, when no transaction is open
/// there: `read_committed` stops at the last stable offset, below the end while one is.
fn end_if_stable(
    consumer: &BaseConsumer<QuietEof>,
    topic: &str,
    partition: i32,
    from: i64,
) -> Result<i64, InFlightError> {
    let failed = |source| InFlightError::Kafka {
        topic: topic.to_owned(),
        source,
    };
    let stable = consumer
        .position()
        .map_err(failed)?
        .find_partition(topic, partition)
        .and_then(|p| p.offset().to_raw())
        .unwrap_or(from);
    let (_, high) = consumer
        .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
        .map_err(failed)?;
    if stable < high {
        return Err(InFlightError::OpenTransaction {
            topic: topic.to_owned(),
            partition,
            stable,
        });
    }
    Ok(high)
}

/// The producer [`seed`] writes with: idempotent, so that records keep their order and none
/// is written twice.
///
/// # Errors
/// [`InFlightError::Kafka`] when librdkafka refuses the configuration.
pub fn seed_producer(kafka: &KafkaSettings, topic: &str) -> Result<FutureProducer, InFlightError> {
    kafka
        .client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.max.bytes", "104857600")
        .create()
        .map_err(|source| InFlightError::Kafka {
            topic: topic.to_owned(),
            source,
        })
}

/// Writes `records` to partition `partition` of `topic`, in their order, each with its key,
/// value, headers and timestamp, and waits for every one to be acknowledged.
///
/// # Errors
/// [`InFlightError::Kafka`] for the first record the broker did not take.
pub async fn seed(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    records: &[InFlightRecord],
) -> Result<(), InFlightError> {
    let failed = |source| InFlightError::Kafka {
        topic: topic.to_owned(),
        source,
    };
    let mut deliveries = Vec::with_capacity(records.len());
    for record in records {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key,
                value: value.as_deref(),
            });
        }
        let mut out = FutureRecord::<[u8], [u8]>::to(topic)
            .partition(partition)
            .headers(headers);
        if let Some(key) = &record.key {
            out = out.key(key.as_slice());
        }
        if let Some(value) = &record.value {
            out = out.payload(value.as_slice());
        }
        if let Some(ms) = record.timestamp_ms {
            out = out.timestamp(ms);
        }
        loop {
            match producer.send_result(out) {
                Ok(delivery) => {
                    deliveries.push(delivery);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    out = back;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((e, _)) => return Err(failed(e)),
            }
        }
    }
    for delivery in deliveries {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => return Err(failed(e)),
            Err(_) => return Err(failed(KafkaError::Canceled)),
        }
    }
    Ok(())
}

/// Checks that partition `partition` of `topic` holds exactly the `records` a seed wrote, at
/// offsets `0..records` (a topic made for the seed, written by one idempotent producer).
///
/// # Errors
/// [`InFlightError::Seeded`] when it holds other offsets; [`InFlightError::Kafka`].
pub async fn check_seeded(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    records: u64,
) -> Result<(), InFlightError> {
    let failed = |source| InFlightError::Kafka {
        topic: topic.to_owned(),
        source,
    };
    let (producer, name) = (producer.clone(), topic.to_owned());
    let (low, high) = tokio::task::spawn_blocking(move || {
        producer.flush(REQUEST_TIMEOUT)?;
        producer
            .client()
            .fetch_watermarks(&name, partition, REQUEST_TIMEOUT)
    })
    .await
    .map_err(|_| failed(KafkaError::Canceled))?
    .map_err(failed)?;
    if low != 0 || u64::try_from(high).ok() != Some(records) {
        return Err(InFlightError::Seeded {
            topic: topic.to_owned(),
            partition,
            low,
            high,
            records,
        });
    }
    Ok(())
}
