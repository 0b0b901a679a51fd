//! Liveness, readiness and the brokers' state, for Kubernetes probes and dashboards.
//!
//! - `/healthz`: the process is alive and serving (always 200 while it answers).
//! - `/readyz`: it can do its work. `weir serve`: its catalog store answers (the brokers' state
//!   is in the body, not a condition: the API and the status page stay up through a Kafka
//!   outage). `weir run`: its brokers answer too (its only work is the pipeline).
//!
//! The brokers' state comes from a [`KafkaProbe`]: a metadata request every few seconds through
//! a client of its own, with the cause librdkafka gives when it fails
//! ([`crate::source::kafka::broker`]), also exported as the gauge `weir_kafka_reachable`
//! (docs/metrics.md).

use crate::config::KafkaSettings;
use crate::source::kafka::broker;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rdkafka::consumer::Consumer as _;
use serde::Serialize;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The brokers as the last probe saw them.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerState {
    /// The bootstrap servers probed.
    pub bootstrap_servers: String,
    /// Whether the last metadata request was answered.
    pub reachable: bool,
    /// Why not, when not: the request's error and librdkafka's cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Milliseconds since that request ended.
    pub checked_ms_ago: u64,
}

#[derive(Debug)]
struct Seen {
    reachable: bool,
    error: Option<String>,
    at: Instant,
}

/// Probes the cluster in the background every `interval` (until dropped).
#[derive(Debug)]
pub struct KafkaProbe {
    bootstrap_servers: String,
    kafka: KafkaSettings,
    seen: Arc<RwLock<Option<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KafkaProbe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How often a probe asks, and how long it waits for the answer.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);

impl KafkaProbe {
    /// Starts probing `kafka`'s brokers every `interval`, each request waiting at most
    /// `interval` (a metadata request of the whole cluster, answered from any broker).
    pub fn spawn(kafka: &KafkaSettings, interval: Duration) -> Self {
        let seen: Arc<RwLock<Option<Seen>>> = Arc::default();
        let settings = kafka.clone();
        let kafka = kafka.clone();
        let bootstrap_servers = kafka.bootstrap_servers.clone();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let gauge = metrics::gauge!("weir_kafka_reachable");
            let client = match broker::metadata_client(&kafka) {
                Ok(client) => Arc::new(client),
                Err(e) => {
                    gauge.set(0.0);
                    *record.write().unwrap_or_else(|e| e.into_inner()) = Some(Seen {
                        reachable: false,
                        error: Some(format!("cannot create a Kafka client: {e}")),
                        at: crate::clock::monotonic_now(),
                    });
                    return;
                }
            };
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let asking = client.clone();
                let answer = tokio::task::spawn_blocking(move || {
                    match asking.fetch_metadata(None, interval) {
                        Ok(_) => {
                            asking.context().clear();
                            None
                        }
                        Err(e) => Some(broker::explain(&asking, &e)),
                    }
                })
                .await
                .unwrap_or_else(|e| Some(format!("the probe panicked: {e}")));
                gauge.set(if answer.is_none() { 1.0 } else { 0.0 });
                *record.write().unwrap_or_else(|e| e.into_inner()) = Some(Seen {
                    reachable: answer.is_none(),
                    error: answer,
                    at: crate::clock::monotonic_now(),
                });
            }
        });
        Self {
            bootstrap_servers,
            kafka: settings,
            seen,
            task,
        }
    }

    /// The brokers' settings it probes with (for other metadata requests of the API).
    pub fn kafka(&self) -> &KafkaSettings {
        &self.kafka
    }

    /// The last probe's result; `None` before the first one ended.
    pub fn state(&self) -> Option<BrokerState> {
        let seen = self.seen.read().unwrap_or_else(|e| e.into_inner());
        seen.as_ref().map(|seen| BrokerState {
            bootstrap_servers: self.bootstrap_servers.clone(),
            reachable: seen.reachable,
            error: seen.error.clone(),
            checked_ms_ago: u64::try_from(seen.at.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }
}

/// A readiness answer: 200 when ready, else 503, with each check in the JSON body.
#[derive(Debug, Serialize)]
pub struct Readiness {
    /// Whether the process is ready.
    pub ready: bool,
    /// The catalog store (`weir serve`): `"ok"` or why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The brokers, when this process uses them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<BrokerState>,
}

impl IntoResponse for Readiness {
    fn into_response(self) -> Response {
        let status = if self.ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, Json(self)).into_response()
    }
}

/// `/healthz`: alive.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Serves [`admin_router`] on `listener` until the task is dropped.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    probe: Arc<KafkaProbe>,
) -> std::io::Result<()> {
    axum::serve(listener, admin_router(probe)).await
}

/// `weir run`'s admin listener: `/healthz`, `/readyz` (ready while the probe last reached the
/// brokers) and `/metrics` (the process's Prometheus page).
pub fn admin_router(probe: Arc<KafkaProbe>) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/readyz",
            get(move || {
                let kafka = probe.state();
                async move {
                    Readiness {
                        ready: kafka.as_ref().is_some_and(|k| k.reachable),
                        store: None,
                        kafka,
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(|| async {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    crate::telemetry::prometheus().render(),
                )
            }),
        )
}
