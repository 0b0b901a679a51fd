//! Helpers of the API tests: a `weir serve` in process on a new bucket of the S3 server, one
//! call with a bearer key, a tenant with a key.

use crate::{create_s3_bucket, guest, init_tracing, kafka_bootstrap, s3_options};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_host::api::{ApiSettings, ApiState};
use weir_host::catalog::Catalog;
use weir_host::catalog::sha256;
use weir_host::runner::{Runner, RunnerConfig};
use weir_host::state::lsm::backend::object_store_from_url;

/// The admin key of the test servers.
pub const ADMIN_KEY: &str = "test-admin-key-0123456789abcdef0123456789";

/// Largest component the test server accepts: the server's default, 32 MiB, room for a Python
/// component (~18 MiB, CPython included).
pub const OPERATOR_BYTES_MAX: usize = 32 << 20;

/// A `weir serve` on a new bucket of the S3 server, on a free local port.
pub async fn start_server() -> anyhow::Result<SocketAddr> {
    Ok(start_server_with(None).await?.0)
}

/// A tenant id unique to this test run: `{prefix}-{pid}-{hex}`, at most 32 bytes (`prefix`
/// is cut to 12).
pub fn tenant_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    let n = NEXT.fetch_add(1, Ordering::Relaxed) & 0xff;
    format!(
        "{}-{}-{:x}",
        &prefix[..prefix.len().min(12)],
        std::process::id(),
        (nanos << 8) | n
    )
}

/// A `weir serve` on a new bucket of the S3 server, on a free local port, that also runs
/// pipelines when `runner` is given (its `[pipelines]` section); returns its address and the
/// store's URL (`s3://{bucket}/weir`).
pub async fn start_server_with(
    runner: Option<RunnerConfig>,
) -> anyhow::Result<(SocketAddr, String)> {
    init_tracing();
    let bucket = create_s3_bucket().await?;
    let store_url = format!("s3://{bucket}/weir");
    let (addr, _) = start_server_on(&store_url, runner, std::future::pending()).await?;
    Ok((addr, store_url))
}

/// A `weir serve` on `store_url` (of the S3 server), on a free local port, that also runs
/// pipelines when `runner` is given, until `shutdown` completes (then it drains every run, a
/// last checkpoint each, as `weir serve` on SIGTERM); returns its address and the runner's
/// task, which ends once the runs have stopped.
pub async fn start_server_on(
    store_url: &str,
    runner: Option<RunnerConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, Option<tokio::task::JoinHandle<()>>)> {
    init_tracing();
    let (store, prefix) = object_store_from_url(store_url, &s3_options())?;
    // As `weir serve` does: a host that runs pipelines reports its brokers in /readyz.
    let probe = runner.as_ref().map(|config| {
        std::sync::Arc::new(weir_host::health::KafkaProbe::spawn(
            &config.kafka(),
            weir_host::health::PROBE_INTERVAL,
        ))
    });
    // As `weir serve`: what the API writes wakes the runner at once.
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let running = match runner {
        Some(config) => {
            let runner = Runner::new(
                Catalog::new(store.clone(), prefix.clone()),
                config,
                crate::runtime_settings(),
            )?
            .with_wake(wake.clone());
            Some(tokio::spawn(runner.run(shutdown)))
        }
        None => None,
    };
    let state = ApiState::new(
        Catalog::new(store, prefix).with_changes(wake),
        ApiSettings {
            operator_bytes_max: OPERATOR_BYTES_MAX,
            admin_key_sha256: sha256(ADMIN_KEY.as_bytes()),
            runtime: crate::runtime_settings(),
            pipelines_per_tenant_max: 16,
            pipeline_state_bytes_max: weir_host::api::DEFAULT_PIPELINE_STATE_BYTES_MAX,
            status_sample_interval: Duration::from_millis(500),
        },
    )?;
    let state = match probe {
        Some(probe) => state.with_kafka_probe(probe),
        None => state,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(weir_host::api::serve(
        listener,
        state,
        std::future::pending(),
    ));
    Ok((addr, running))
}

/// One request: `key` as bearer token, `body` as given; returns the status, the content type
/// and the JSON body (`Null` when empty).
pub async fn call(
    addr: SocketAddr,
    method: Method,
    path: &str,
    key: Option<&str>,
    body: Option<(&str, Vec<u8>)>,
) -> anyhow::Result<(StatusCode, String, Value)> {
    let mut request = reqwest::Client::new().request(method, format!("http://{addr}{path}"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some((content_type, bytes)) = body {
        request = request.header("content-type", content_type).body(bytes);
    }
    let response = request.send().await?;
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = response.bytes().await?;
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)?
    };
    Ok((status, content_type, value))
}

/// `GET /metrics` with `key`: the status and the Prometheus text.
pub async fn metrics_page(
    addr: SocketAddr,
    key: Option<&str>,
) -> anyhow::Result<(StatusCode, String)> {
    let mut request = reqwest::Client::new().get(format!("http://{addr}/metrics"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await?;
    Ok((response.status(), response.text().await?))
}

/// The value of the sample `name{labels}` in a Prometheus text `page`, its labels given in
/// the order the exporter writes them (`tenant="t",pipeline="p"`).
pub fn sample(page: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    page.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

pub fn json_body(value: &Value) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).expect("json")))
}

/// Creates tenant `id` and returns a key of it.
pub async fn tenant_with_key(addr: SocketAddr, id: &str) -> anyhow::Result<String> {
    let (status, _, tenant) = call(
        addr,
        Method::POST,
        "/v1/tenants",
        Some(ADMIN_KEY),
        json_body(&json!({"id": id, "name": format!("Tenant {id}")})),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{tenant}");
    let (status, _, key) = call(
        addr,
        Method::POST,
        &format!("/v1/tenants/{id}/api-keys"),
        Some(ADMIN_KEY),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{key}");
    assert_eq!(key["tenant"], id);
    Ok(key["key"].as_str().expect("a key").to_owned())
}

pub fn counter_component() -> Vec<u8> {
    std::fs::read(guest("weir_test_counter")).expect("the counter guest is built")
}

/// A runner config for tests: reconcile every second (a change through the host's own API
/// wakes it at once), 4 KiB memtables (state goes through SSTs on S3).
pub fn runner_config(host: &str) -> RunnerConfig {
    RunnerConfig {
        host_id: Some(host.to_owned()),
        bootstrap_servers: kafka_bootstrap(),
        security: Default::default(),
        consumer: BTreeMap::new(),
        producer: BTreeMap::new(),
        reconcile_interval: Duration::from_secs(1),
        work_dir: None,
        memtable_bytes_max: 4 << 10,
        block_cache_bytes: 8 << 20,
        disk_cache_bytes: 16 << 20,
        logs: Default::default(),
        iceberg: Default::default(),
    }
}

/// Polls `GET /v1/pipelines/{name}` until `done` holds for it, failing after `timeout` with
/// the last answer.
pub async fn wait_for_pipeline(
    addr: SocketAddr,
    key: &str,
    name: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, _, view) = call(
            addr,
            Method::GET,
            &format!("/v1/pipelines/{name}"),
            Some(key),
            None,
        )
        .await?;
        anyhow::ensure!(status == StatusCode::OK, "GET pipeline: {status} {view}");
        if done(&view) {
            return Ok(view);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "pipeline `{name}` did not reach the expected status in {timeout:?}: {view}\n\
             in short: {}",
            status_summary(&view)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One line of a pipeline view's status: its state and reason, its counts, and each host's
/// phase and partitions, for a failure message that a log cut to its tail still shows.
pub fn status_summary(view: &Value) -> String {
    let status = &view["status"];
    let hosts: Vec<String> = status["hosts"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|h| {
            format!(
                "{} {} partitions {} reason {} report age {} ms",
                h["host"], h["phase"], h["partitions"], h["reason"], h["report_age_ms"]
            )
        })
        .collect();
    format!(
        "state {} (reason {}), {} partitions, records_done {}, dead_lettered {}, emitted {}, \
         hosts [{}]",
        status["state"],
        status["reason"],
        status["partitions"].as_array().map_or(0, Vec::len),
        status["records_done"],
        status["dead_lettered"],
        status["emitted"],
        hosts.join("; ")
    )
}

pub fn state_of(view: &Value) -> &str {
    view["status"]["state"].as_str().unwrap_or_default()
}

/// Creates pipeline `name` with `spec` through the API, asserting 201; returns its view.
pub async fn create_pipeline(
    addr: SocketAddr,
    key: &str,
    name: &str,
    spec: &Value,
) -> anyhow::Result<Value> {
    let (status, _, created) = call(
        addr,
        Method::POST,
        &format!("/v1/pipelines/{name}"),
        Some(key),
        json_body(spec),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    Ok(created)
}

/// `POST path` with the JSON `body` as `key`; its answer, or an error for a status that is
/// not a success.
///
/// # Errors
/// The call's, or the status and answer.
pub async fn post(addr: SocketAddr, key: &str, path: &str, body: Value) -> anyhow::Result<Value> {
    let (status, _, answer) = call(addr, Method::POST, path, Some(key), json_body(&body)).await?;
    anyhow::ensure!(status.is_success(), "POST {path}: {status} {answer}");
    Ok(answer)
}

/// Stops or starts pipeline `name` (`action`: `stop`, `start`) and waits until it is stopped
/// or running.
///
/// # Errors
/// When the call fails or the pipeline does not get there within 60 s.
pub async fn set_desired(
    addr: SocketAddr,
    key: &str,
    name: &str,
    action: &str,
) -> anyhow::Result<()> {
    let path = format!("/v1/pipelines/{name}/{action}");
    let (status, _, body) = call(addr, Method::POST, &path, Some(key), None).await?;
    anyhow::ensure!(status == StatusCode::OK, "{action} {name}: {status} {body}");
    let want = if action == "stop" {
        "stopped"
    } else {
        "running"
    };
    wait_for_pipeline(addr, key, name, Duration::from_secs(60), |v| {
        state_of(v) == want
    })
    .await?;
    Ok(())
}

/// Waits until pipeline `name` is failed and returns its view and reason.
pub async fn failure_of(
    addr: SocketAddr,
    key: &str,
    name: &str,
) -> anyhow::Result<(Value, String)> {
    let view = wait_for_pipeline(addr, key, name, Duration::from_secs(30), |v| {
        state_of(v) == "failed"
    })
    .await?;
    let reason = view["status"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((view, reason))
}

/// Uploads the counter component as operator `counter` of the tenant `times` times.
pub async fn upload_counter(addr: SocketAddr, key: &str, times: u64) -> anyhow::Result<()> {
    for _ in 0..times {
        let (status, _, version) = call(
            addr,
            Method::POST,
            "/v1/operators/counter",
            Some(key),
            Some(("application/wasm", counter_component())),
        )
        .await?;
        assert_eq!(status, StatusCode::CREATED, "{version}");
    }
    Ok(())
}

/// The Kafka topic of a tenant's topic (as `weir_host::api::pipelines::kafka_topic`).
pub fn kafka_topic_of(tenant: &str, topic: &str) -> String {
    weir_host::api::pipelines::kafka_topic(tenant, topic)
}

/// `GET /v1/pipelines/{name}/verify?checksums=false` (presence and sizes only), expecting 200.
pub async fn verify_quick(addr: SocketAddr, key: &str, name: &str) -> anyhow::Result<Value> {
    let path = format!("/v1/pipelines/{name}/verify?checksums=false");
    let (status, _, verified) = call(addr, Method::GET, &path, Some(key), None).await?;
    anyhow::ensure!(status == StatusCode::OK, "{status} {verified}");
    Ok(verified)
}

/// Waits until every shard's newest restorable checkpoint of pipeline `name` holds `records`
/// input records in all (the sum of its offsets), by [`verify_quick`].
pub async fn checkpointed(
    addr: SocketAddr,
    key: &str,
    name: &str,
    records: u64,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let verified = verify_quick(addr, key, name).await?;
        let done: u64 = verified["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|shard| {
                let versions = shard["versions"].as_array()?;
                let newest = versions.iter().find(|v| v["restorable"] == true)?;
                let offsets = newest["offsets"].as_object()?;
                Some(offsets.values().filter_map(Value::as_u64).sum::<u64>())
            })
            .sum();
        if done == records {
            return Ok(verified);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "checkpoints hold {done} of {records} records: {verified}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Topics `in` (two partitions), `out` and `dlq` of `tenant`, and pipeline `p` on version 1 of
/// operator `counter` over them (300 ms checkpoints), `extra` merged into its spec; returns the
/// Kafka names of `in` and `out`.
pub async fn counter_pipeline_p(
    addr: SocketAddr,
    key: &str,
    tenant: &str,
    extra: Value,
) -> anyhow::Result<(String, String)> {
    let input = kafka_topic_of(tenant, "in");
    let output = kafka_topic_of(tenant, "out");
    crate::create_topics(&[
        (&input, 2),
        (&output, 1),
        (&kafka_topic_of(tenant, "dlq"), 1),
    ])
    .await?;
    let mut spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 300,
    });
    for (field, value) in extra.as_object().into_iter().flatten() {
        spec[field] = value.clone();
    }
    create_pipeline(addr, key, "p", &spec).await?;
    Ok((input, output))
}

/// Waits until pipeline `name`'s current run generation (after a switch or a change) runs on a
/// host with `partitions` partitions and has processed nothing yet: records produced after this
/// reach the new run, not the drained one.
pub async fn new_run_started(
    addr: SocketAddr,
    key: &str,
    name: &str,
    partitions: usize,
) -> anyhow::Result<()> {
    wait_for_pipeline(addr, key, name, Duration::from_secs(60), |v| {
        let hosts = v["status"]["hosts"].as_array().cloned().unwrap_or_default();
        let running: usize = hosts
            .iter()
            .filter(|h| h["phase"] == "running")
            .map(|h| h["partitions"].as_array().map_or(0, Vec::len))
            .sum();
        running == partitions && v["status"]["records_done"] == 0
    })
    .await?;
    Ok(())
}
