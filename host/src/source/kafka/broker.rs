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
    last: Mutex<Option<Reported>>,
}

/// An error librdkafka reported to [`ReasonContext`].
#[derive(Debug)]
struct Reported {
    /// `"{error}: {reason}"`.
    text: String,
    /// Whether it says the cluster refused this client ([`refuses`]).
    refused: bool,
}

/// Whether `error` says the cluster refused the client — SASL authentication failed, or the TLS
/// handshake did (a certificate one side does not trust) — which no retry within a request's
/// timeout changes. The Java client does not retry these either (KIP-152:
/// `AuthenticationException`, `SslAuthenticationException`).
fn refuses(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        error.rdkafka_error_code(),
        Some(Code::Authentication | Code::SaslAuthenticationFailed | Code::SSL)
    )
}

impl ReasonContext {
    /// The last error librdkafka reported, if any: `"{error}: {reason}"`.
    pub fn last_error(&self) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|r| r.text.clone())
    }

    /// Whether the last error librdkafka reported says the cluster refused this client (wrong
    /// SASL credentials, an untrusted certificate): [`fetch_metadata`] then gives up after its
    /// first second rather than at its timeout.
    pub fn refused(&self) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|r| r.refused)
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
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Reported {
            text: format!("{error}: {reason}"),
            refused: refuses(&error),
        });
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

/// How long the first request of [`fetch_metadata`] waits before it looks whether the cluster
/// refused the client: a local broker refuses within ~0.1 s, a remote one over TLS within a
/// few round trips.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);

/// The cluster's metadata (of `topic`, or of every topic), as `client.fetch_metadata` reads it
/// within `timeout`, except that it gives up after [`REFUSAL_WAIT`] when the cluster refused
/// the client by then ([`ReasonContext::refused`]): wrong credentials or an untrusted
/// certificate are told in about a second, not after the whole timeout. librdkafka reports a
/// refusal only to the error events, served between two requests, so the request is asked
/// twice: for [`REFUSAL_WAIT`], then for the rest of `timeout` (the client's connection
/// carries over, so a slow but working cluster loses nothing). Blocking.
///
/// # Errors
/// librdkafka's error of the last request: a timeout, or any other error at once.
pub fn fetch_metadata(
    client: &BaseConsumer<ReasonContext>,
    topic: Option<&str>,
    timeout: Duration,
) -> Result<rdkafka::metadata::Metadata, KafkaError> {
    let deadline = crate::clock::monotonic_now() + timeout;
    match client.fetch_metadata(topic, timeout.min(REFUSAL_WAIT)) {
        Err(err)
            if timeout > REFUSAL_WAIT
                && err.rdkafka_error_code()
                    == Some(rdkafka::types::RDKafkaErrorCode::OperationTimedOut) =>
        {
            // Serves the error events queued so far into the context, then returns: the
            // client never subscribes, so there is no record to wait for.
            let _ = client.poll(Duration::ZERO);
            if client.context().refused() {
                return Err(err);
            }
            let left = deadline.saturating_duration_since(crate::clock::monotonic_now());
            client.fetch_metadata(topic, left)
        }
        answered => answered,
    }
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
            let metadata = fetch_metadata(&client, Some(topic), timeout).map_err(|e| {
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
    fetch_metadata(&client, None, timeout)
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

#[cfg(test)]
mod tests {
    use super::refuses;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as Code;

    #[test]
    fn failed_authentication_or_tls_refuse_the_client_and_an_unreachable_broker_does_not() {
        assert!(refuses(&KafkaError::Global(Code::Authentication)));
        assert!(refuses(&KafkaError::Global(Code::SSL)));
        assert!(refuses(&KafkaError::MetadataFetch(
            Code::SaslAuthenticationFailed
        )));
        // A broker that is down, or slow, may answer later: waited for until the timeout.
        assert!(!refuses(&KafkaError::Global(Code::AllBrokersDown)));
        assert!(!refuses(&KafkaError::Global(Code::BrokerTransportFailure)));
        assert!(!refuses(&KafkaError::MetadataFetch(
            Code::OperationTimedOut
        )));
    }
}
