//! Reaching the brokers, and saying why not. librdkafka reports why a connection failed —
//! wrong SASL credentials, a certificate it does not trust, a refused connection — only to
//! its error callback, while the request that waited on it just times out; a
//! [`ReasonContext`] keeps that reason so that the request's error can name it.

use crate::config::KafkaSettings;
use crate::ids::Partition;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use std::sync::Mutex;
use std::time::Duration;

/// A client context that keeps the last error librdkafka reported (and logs it).
#[derive(Debug, Default)]
pub struct ReasonContext {
    last: Mutex<Option<String>>,
}

impl ReasonContext {
    /// The last error librdkafka reported, if any: `"{error}: {reason}"`.
    pub fn last_error(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forgets the last error (a later request succeeded).
    pub fn clear(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `err`, followed by the last error librdkafka reported when there is one, which is
    /// usually the cause (`SASL authentication error: … invalid credentials`, `SSL handshake
    /// failed: … certificate verify failed`).
    pub fn explain(&self, err: &KafkaError) -> String {
        match self.last_error() {
            Some(cause) => format!("{err} (librdkafka: {cause})"),
            None => err.to_string(),
        }
    }
}

impl ClientContext for ReasonContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!("librdkafka: {error}: {reason}");
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{error}: {reason}"));
    }
}

impl ConsumerContext for ReasonContext {}

/// `err` of a request `client` made, with the cause librdkafka reported: the client is polled
/// briefly first, since its error events reach the context only when it is polled.
pub fn explain(client: &BaseConsumer<ReasonContext>, err: &KafkaError) -> String {
    // Serves the events queued so far (errors included) and returns: the client never
    // subscribes, so there is no record to wait for.
    let _ = client.poll(Duration::from_millis(100));
    client.context().explain(err)
}

/// A metadata client of the cluster (a consumer that never subscribes): `kafka`'s brokers,
/// security and consumer properties.
///
/// # Errors
/// [`KafkaError`] when librdkafka refuses the configuration.
pub fn metadata_client(kafka: &KafkaSettings) -> Result<BaseConsumer<ReasonContext>, KafkaError> {
    let mut config = kafka.client_config();
    for (k, v) in &kafka.consumer {
        config.set(k, v);
    }
    config.create_with_context(ReasonContext::default())
}

/// Why [`topic_partitions`] has no answer.
#[derive(Debug, thiserror::Error)]
pub enum TopicLookupError {
    /// librdkafka refused the client's configuration.
    #[error("cannot create a Kafka client")]
    Client(#[source] KafkaError),
    /// The cluster did not answer for `topic` (with the cause librdkafka reported).
    #[error("cannot read the metadata of topic `{topic}`: {reason}")]
    Unavailable {
        /// The Kafka topic.
        topic: String,
        /// Why, as [`explain`] says it.
        reason: String,
    },
    /// `topic` does not exist in the cluster (or has no partition).
    #[error("topic `{topic}` does not exist; create it first")]
    Missing {
        /// The Kafka topic.
        topic: String,
    },
}

/// The number of partitions of each of `topics` (Kafka names), in their order, each read by a
/// metadata request that waits up to `timeout`. Blocking: the runner's topic check and the
/// savepoints' restore call it from `spawn_blocking`.
///
/// # Errors
/// [`TopicLookupError`] for the first topic without an answer, or that does not exist.
pub fn topic_partitions(
    kafka: &KafkaSettings,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<usize>, TopicLookupError> {
    let client = metadata_client(kafka).map_err(TopicLookupError::Client)?;
    topics
        .iter()
        .map(|topic| {
            let metadata = client.fetch_metadata(Some(topic), timeout).map_err(|e| {
                TopicLookupError::Unavailable {
                    topic: topic.clone(),
                    reason: explain(&client, &e),
                }
            })?;
            match metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none())
                .map_or(0, |t| t.partitions().len())
            {
                0 => Err(TopicLookupError::Missing {
                    topic: topic.clone(),
                }),
                n => Ok(n),
            }
        })
        .collect()
}

/// Why [`check_reachable`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    /// librdkafka refused the client's configuration.
    #[error("cannot create a Kafka client")]
    Client(#[source] KafkaError),
    /// The cluster did not answer in time.
    #[error("cannot reach Kafka at {servers}: {reason}")]
    Unreachable {
        /// The bootstrap servers asked.
        servers: String,
        /// Why, with the cause librdkafka reported ([`ReasonContext::explain`]).
        reason: String,
    },
}

/// Checks that the cluster answers a metadata request within `timeout` (blocking).
///
/// # Errors
/// [`ReachError`], with the cause librdkafka reported.
pub fn check_reachable(kafka: &KafkaSettings, timeout: Duration) -> Result<(), ReachError> {
    let client = metadata_client(kafka).map_err(ReachError::Client)?;
    client
        .fetch_metadata(None, timeout)
        .map(|_| ())
        .map_err(|e| ReachError::Unreachable {
            servers: kafka.bootstrap_servers.clone(),
            reason: explain(&client, &e),
        })
}

/// The checkpoint versions the consumer group `group`'s committed offsets of `topics` name in
/// their metadata, per partition of `partitions` (exactly-once; docs/checkpoints.md,
/// "Recovery" step 3): read with a `read_committed` client that joins nothing. Blocking.
///
/// # Errors
/// What librdkafka said ([`KafkaError`]), when the client cannot be made or the offsets cannot
/// be read.
pub fn committed_checkpoint_versions(
    kafka: &KafkaSettings,
    group: &str,
    topics: &[String],
    partitions: &[Partition],
) -> Result<std::collections::BTreeMap<Partition, crate::ids::ManifestVersion>, KafkaError> {
    let mut config = kafka.client_config();
    for (k, v) in &kafka.consumer {
        config.set(k, v);
    }
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer = config.create()?;
    let mut wanted = rdkafka::TopicPartitionList::new();
    for topic in topics {
        for p in partitions {
            wanted.add_partition(topic, p.0);
        }
    }
    let committed = consumer.committed_offsets(wanted, Duration::from_secs(10))?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| {
            let version = crate::state::checkpoint::parse_manifest_metadata(e.metadata())?;
            Some((Partition(e.partition()), version))
        })
        .collect())
}
