//! Pipelines through the API (`weir serve` with a `[pipelines]` section) on the real broker
//! and S3 server: the whole lifecycle (create, status, checkpoint, switch version keeping
//! state, stop, delete) for one tenant while another tenant's every attempt on it answers
//! 404, topics scoped per tenant, a missing topic reported as the reason of a failed
//! pipeline, and an operator version in use refused deletion.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use weir_host::api::runner::RunnerConfig;
use weir_tests::api::*;
use weir_tests::*;

/// A runner config for tests: reconcile every 200 ms, 4 KiB memtables (state goes through
/// SSTs on S3).
fn runner_config(host: &str) -> RunnerConfig {
    RunnerConfig {
        host_id: Some(host.to_owned()),
        bootstrap_servers: kafka_bootstrap(),
        consumer: BTreeMap::new(),
        producer: BTreeMap::new(),
        reconcile_interval: Duration::from_millis(200),
        work_dir: None,
        memtable_bytes_max: 4 << 10,
        block_cache_bytes: 8 << 20,
        disk_cache_bytes: 16 << 20,
    }
}

/// Polls `GET /v1/pipelines/{name}` until `done` holds for it, failing after `timeout` with
/// the last answer.
async fn wait_for_pipeline(
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
            "pipeline `{name}` did not reach the expected status in {timeout:?}: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn state_of(view: &Value) -> &str {
    view["status"]["state"].as_str().unwrap_or_default()
}

/// Uploads the counter component as operator `counter` of the tenant `times` times.
async fn upload_counter(addr: SocketAddr, key: &str, times: u64) -> anyhow::Result<()> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_runs_checkpoints_switches_version_keeping_state_stops_and_is_deleted()
-> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let acme_id = tenant_id("acme");
    let acme = tenant_with_key(addr, &acme_id).await?;
    let globex = tenant_with_key(addr, &tenant_id("globex")).await?;
    upload_counter(addr, &acme, 2).await?;
    let partitions = 4;
    let input = kafka_topic_of(&acme_id, "clicks");
    let output = kafka_topic_of(&acme_id, "counts");
    create_topics(&[
        (&input, partitions),
        (&output, partitions),
        (&kafka_topic_of(&acme_id, "dlq"), 1),
    ])
    .await?;
    let mut expected = BTreeMap::new();
    produce_counter(&input, partitions, (0, 2_000), 50, &mut expected).await?;

    let spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["clicks"], "output_topic": "counts", "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 500, "delivery": "exactly_once",
        "limits": {"record_deadline_ms": 50},
    });
    let (status, _, created) = call(
        addr,
        Method::POST,
        "/v1/pipelines/counts",
        Some(&acme),
        json_body(&spec),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["definition"]["desired"], "running");
    assert_eq!(
        created["definition"]["spec"]["failure_policy"],
        "dead_letter"
    );

    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);
    let view = wait_for_pipeline(addr, &acme, "counts", Duration::from_secs(30), |v| {
        state_of(v) == "running"
            && v["status"]["partitions"].as_array().map(Vec::len) == Some(4)
            && v["status"]["partitions"].as_array().is_some_and(|ps| {
                ps.iter()
                    .all(|p| p["lag"] == 0 && p["state_bytes"].as_u64() > Some(0))
            })
    })
    .await?;
    assert_eq!(view["status"]["records_done"], 2_000, "{view:#}");
    assert_eq!(view["status"]["dead_lettered"], 0);
    assert!(view["status"]["state_bytes"].as_u64() > Some(0), "{view:#}");
    assert!(
        view["status"]["last_checkpoint"]["version"]
            .as_u64()
            .is_some()
    );
    let offsets: i64 = view["status"]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["checkpointed_offsets"][&input].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(
        offsets, 2_000,
        "checkpointed offsets cover the input: {view:#}"
    );

    // Every attempt of another tenant on it answers 404, and its list is empty.
    for (method, path, body) in [
        (Method::GET, "/v1/pipelines/counts", None),
        (Method::POST, "/v1/pipelines/counts/stop", None),
        (Method::POST, "/v1/pipelines/counts/start", None),
        (Method::POST, "/v1/pipelines/counts/checkpoints", None),
        (Method::GET, "/v1/pipelines/counts/checkpoints", None),
        (
            Method::PUT,
            "/v1/pipelines/counts/operator",
            json_body(&json!({"operator_version": 2})),
        ),
        (Method::DELETE, "/v1/pipelines/counts", None),
    ] {
        let (status, _, problem) = call(addr, method.clone(), path, Some(&globex), body).await?;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {problem}");
    }
    let (_, _, list) = call(addr, Method::GET, "/v1/pipelines", Some(&globex), None).await?;
    assert_eq!(list, json!([]));

    // A version in use cannot be deleted.
    let (status, _, problem) = call(
        addr,
        Method::DELETE,
        "/v1/operators/counter/versions/1",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("counts"),
        "{problem}"
    );

    // A checkpoint on request: committed after the request, by every partition with news.
    produce_counter(&input, partitions, (2_000, 2_400), 50, &mut expected).await?;
    let (status, _, requested) = call(
        addr,
        Method::POST,
        "/v1/pipelines/counts/checkpoints",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{requested}");
    let requested_ms = requested["requested_ms"].as_u64().expect("requested_ms");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, _, checkpoints) = call(
            addr,
            Method::GET,
            "/v1/pipelines/counts/checkpoints",
            Some(&acme),
            None,
        )
        .await?;
        let after: Vec<&Value> = checkpoints
            .as_array()
            .expect("a list")
            .iter()
            .filter(|c| c["committed_ms"].as_u64() >= Some(requested_ms))
            .collect();
        if after.len() >= 4 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no checkpoints after the request: {checkpoints:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Switch to version 2: drained, checkpointed, resumed with the state (counts go on).
    let (status, _, switched) = call(
        addr,
        Method::PUT,
        "/v1/pipelines/counts/operator",
        Some(&acme),
        json_body(&json!({"operator_version": 2})),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{switched}");
    assert_eq!(switched["definition"]["spec"]["operator_version"], 2);
    assert_eq!(switched["definition"]["run_generation"], 2);
    produce_counter(&input, partitions, (2_400, 3_000), 50, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);
    let (status, _, _) = call(
        addr,
        Method::DELETE,
        "/v1/operators/counter/versions/1",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "version 1 is no longer used"
    );

    // Running: delete refused. Stopped: deleted with its state.
    let (status, _, problem) = call(
        addr,
        Method::DELETE,
        "/v1/pipelines/counts",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    let (status, _, stopped) = call(
        addr,
        Method::POST,
        "/v1/pipelines/counts/stop",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    wait_for_pipeline(addr, &acme, "counts", Duration::from_secs(30), |v| {
        state_of(v) == "stopped"
    })
    .await?;
    let (status, _, _) = call(
        addr,
        Method::DELETE,
        "/v1/pipelines/counts",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = call(addr, Method::GET, "/v1/pipelines/counts", Some(&acme), None).await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    Ok(())
}

/// The Kafka topic of a tenant's topic (as `weir_host::api::pipelines::kafka_topic`).
fn kafka_topic_of(tenant: &str, topic: &str) -> String {
    weir_host::api::pipelines::kafka_topic(tenant, topic)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_the_tenants_own_and_a_missing_one_fails_the_pipeline_naming_it()
-> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let initech_id = tenant_id("initech");
    let initech = tenant_with_key(addr, &initech_id).await?;
    upload_counter(addr, &initech, 1).await?;
    // The output and dead-letter topics exist, the input does not.
    create_topics(&[
        (&kafka_topic_of(&initech_id, "out"), 1),
        (&kafka_topic_of(&initech_id, "dlq"), 1),
    ])
    .await?;
    let spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["orders"], "output_topic": "out", "dead_letter_topic": "dlq",
    });
    let (status, _, created) = call(
        addr,
        Method::POST,
        "/v1/pipelines/orders",
        Some(&initech),
        json_body(&spec),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let view = wait_for_pipeline(addr, &initech, "orders", Duration::from_secs(30), |v| {
        state_of(v) == "failed"
    })
    .await?;
    let reason = view["status"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("`orders`") && reason.contains(&format!("`{initech_id}.orders`")),
        "the reason names the topic: {view:#}"
    );

    // Bad specs answer 400 naming the field.
    for (spec, needle) in [
        (
            json!({"operator": "counter", "operator_version": 1, "input_topics": ["a/b"], "output_topic": "o", "dead_letter_topic": "d"}),
            "topic names",
        ),
        (
            json!({"operator": "counter", "operator_version": 9, "input_topics": ["a"], "output_topic": "o", "dead_letter_topic": "d"}),
            "no version 9",
        ),
        (
            json!({"operator": "counter", "operator_version": 1, "input_topics": ["a"], "output_topic": "a", "dead_letter_topic": "d"}),
            "both an input",
        ),
        (
            json!({"operator": "counter", "operator_version": 1, "input_topics": ["a"], "output_topic": "o", "dead_letter_topic": "d", "limits": {"instance_memory_bytes_max": 1u64 << 40}}),
            "limits.instance_memory_bytes_max",
        ),
        (
            json!({"operator": "counter", "operator_version": 1, "input_topics": ["a"], "output_topic": "o", "dead_letter_topic": "d", "failure_policy": "retry"}),
            "failure_policy",
        ),
    ] {
        let (status, _, problem) = call(
            addr,
            Method::POST,
            "/v1/pipelines/bad",
            Some(&initech),
            json_body(&spec),
        )
        .await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{spec}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(needle),
            "{spec}: `{needle}` not in {detail}"
        );
    }
    Ok(())
}
