//! Reaching the brokers, and saying why not. librdkafka reports why a connection failed —
//! wrong SASL credentials, a certificate it does not trust, a refused connection — only to
//! its error callback, while the request that waited on it just times out; a
//! [`ReasonContext`] keeps that reason so that the request's error can name it.

use crate::config::KafkaSettings;
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

/// Checks that the cluster answers a metadata request within `timeout` (blocking).
///
/// # Errors
/// Why not, with the cause librdkafka reported (see [`ReasonContext::explain`]).
pub fn check_reachable(kafka: &KafkaSettings, timeout: Duration) -> Result<(), String> {
    let client =
        metadata_client(kafka).map_err(|e| format!("cannot create a Kafka client: {e}"))?;
    client
        .fetch_metadata(None, timeout)
        .map(|_| ())
        .map_err(|e| {
            format!(
                "cannot reach Kafka at {}: {}",
                kafka.bootstrap_servers,
                explain(&client, &e)
            )
        })
}
