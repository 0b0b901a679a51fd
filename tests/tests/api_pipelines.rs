//! Pipelines through the API (`weir serve` with a `[pipelines]` section) on the real broker
//! and S3 server: the whole lifecycle (create, status, checkpoint, switch version and change
//! settings keeping state, stop, delete) for one tenant while another tenant's every attempt on it answers
//! 404, topics scoped per tenant, a missing topic reported as the reason of a failed
//! pipeline, and an operator version in use refused deletion.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weir_tests::api::*;
use weir_tests::*;

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
    let created = create_pipeline(addr, &acme, "counts", &spec).await?;
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
                    // A partition's report can come before its first checkpoint's (its lag
                    // is 0 while its high watermark is still unknown, -1).
                    && ps
                        .iter()
                        .map(|p| p["checkpointed_offsets"][&input].as_i64().unwrap_or(0))
                        .sum::<i64>()
                        == 2_000
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
        (
            Method::PATCH,
            "/v1/pipelines/counts",
            json_body(&json!({"failure_policy": "skip"})),
        ),
        (Method::DELETE, "/v1/pipelines/counts", None),
    ] {
        let (status, _, problem) = call(addr, method.clone(), path, Some(&globex), body).await?;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {problem}");
    }
    // Its figures are in /metrics: for its tenant, and for the admin, never for another tenant.
    let run = format!(r#"tenant="{acme_id}",pipeline="counts""#);
    let (status, page) = metrics_page(addr, Some(&acme)).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        sample(&page, "weir_records_in_total", &run),
        Some(2_000.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "weir_records_out_total", &run),
        Some(2_000.0),
        "{page}"
    );
    for kind in ["rejected", "trapped", "deadline", "output-refused"] {
        assert_eq!(
            sample(
                &page,
                "weir_records_dead_lettered_total",
                &format!(r#"{run},kind="{kind}""#)
            ),
            Some(0.0),
            "{kind}"
        );
    }
    for histogram in [
        "weir_batch_processing_seconds_count",
        "weir_state_get_seconds_count",
        "weir_state_put_seconds_count",
        "weir_checkpoint_duration_seconds_count",
        "weir_checkpoint_uploaded_bytes_count",
        "weir_recovery_duration_seconds_count",
    ] {
        assert!(
            sample(&page, histogram, &run) >= Some(1.0),
            "{histogram} of the run: {page}"
        );
    }
    assert!(
        sample(
            &page,
            "weir_object_store_requests_total",
            &format!(r#"{run},op="put""#)
        ) >= Some(1.0),
        "{page}"
    );
    assert!(
        sample(
            &page,
            "weir_object_store_bytes_total",
            &format!(r#"{run},op="put""#)
        ) > Some(0.0),
        "{page}"
    );
    for partition in 0..4 {
        assert_eq!(
            sample(
                &page,
                "weir_consumer_lag_records",
                &format!(r#"{run},partition="{partition}""#)
            ),
            Some(0.0),
            "{page}"
        );
    }
    assert!(page.contains(r#"weir_lsm_cache_hits_total{"#), "{page}");
    assert!(
        page.lines()
            .filter(|l| !l.starts_with('#'))
            .all(|l| l.contains(&format!(r#"tenant="{acme_id}""#))),
        "a tenant sees only its own series: {page}"
    );
    let (_, other) = metrics_page(addr, Some(&globex)).await?;
    assert!(
        !other.contains(&acme_id),
        "another tenant sees none of them: {other}"
    );
    let (_, host) = metrics_page(addr, Some(ADMIN_KEY)).await?;
    assert_eq!(sample(&host, "weir_records_in_total", &run), Some(2_000.0));
    assert!(
        host.lines()
            .any(|l| l == "weir_checkpoint_fallbacks_total 0"),
        "host-wide counters exist from the start, at 0: {host}"
    );
    assert_eq!(metrics_page(addr, None).await?.0, StatusCode::UNAUTHORIZED);

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

    // Every partition's stored checkpoints verify (SSTs present, whole, checksums), and
    // another tenant cannot ask.
    let (status, _, verified) = call(
        addr,
        Method::GET,
        "/v1/pipelines/counts/verify",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{verified}");
    assert_eq!(verified["restorable"], true, "{verified:#}");
    assert_eq!(verified["shards"].as_array().map(Vec::len), Some(4));
    let (status, _, _) = call(
        addr,
        Method::GET,
        "/v1/pipelines/counts/verify",
        Some(&globex),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::NOT_FOUND);

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
    // The new run reports the offsets it resumed from before any new record or checkpoint.
    wait_for_pipeline(addr, &acme, "counts", Duration::from_secs(30), |v| {
        let partitions = v["status"]["partitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        v["status"]["hosts"][0]["phase"] == "running"
            && v["status"]["records_done"] == 0
            && partitions.len() == 4
            && partitions
                .iter()
                .map(|p| p["checkpointed_offsets"][&input].as_i64().unwrap_or(0))
                .sum::<i64>()
                == 2_400
    })
    .await?;
    // Switching to the version it runs changes nothing (no new revision).
    let (status, _, again) = call(
        addr,
        Method::PUT,
        "/v1/pipelines/counts/operator",
        Some(&acme),
        json_body(&json!({"operator_version": 2})),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        again["definition"]["revision"], switched["definition"]["revision"],
        "a no-op writes no revision"
    );
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

    // Settings change keeping state: a new run generation with the new failure policy.
    let (status, _, changed) = call(
        addr,
        Method::PATCH,
        "/v1/pipelines/counts",
        Some(&acme),
        json_body(&json!({"failure_policy": "skip", "checkpoint_interval_ms": 400})),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["definition"]["spec"]["failure_policy"], "skip");
    assert_eq!(changed["definition"]["run_generation"], 3);
    let (status, _, problem) = call(
        addr,
        Method::PATCH,
        "/v1/pipelines/counts",
        Some(&acme),
        json_body(&json!({"input_topics": ["other"]})),
    )
    .await?;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "topics cannot change: {problem}"
    );
    produce_counter(&input, partitions, (3_000, 3_200), 50, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);

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
    let (status, _, _) = call(
        addr,
        Method::POST,
        "/v1/pipelines/counts/start",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a deleted pipeline cannot be started"
    );

    // Its name can be used again: a new pipeline, with a new uid (so new state).
    let (status, _, again) = call(
        addr,
        Method::POST,
        "/v1/pipelines/counts",
        Some(&acme),
        json_body(&json!({
            "operator": "counter", "operator_version": 2,
            "input_topics": ["clicks"], "output_topic": "counts", "dead_letter_topic": "dlq",
        })),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_ne!(again["definition"]["uid"], created["definition"]["uid"]);
    call(
        addr,
        Method::POST,
        "/v1/pipelines/counts/stop",
        Some(&acme),
        None,
    )
    .await?;
    Ok(())
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
    create_pipeline(addr, &initech, "orders", &spec).await?;
    let (view, reason) = failure_of(addr, &initech, "orders").await?;
    assert!(
        reason.contains("`orders`") && reason.contains(&format!("`{initech_id}.orders`")),
        "the reason names the topic: {view:#}"
    );
    assert_eq!(
        view["status"]["reason_kind"], "invalid_input",
        "a missing topic is the definition's to fix: {view:#}"
    );

    // Co-partitioned input topics must have as many partitions each.
    create_topics(&[
        (&kafka_topic_of(&initech_id, "one"), 1),
        (&kafka_topic_of(&initech_id, "two"), 2),
    ])
    .await?;
    let spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["one", "two"], "output_topic": "out", "dead_letter_topic": "dlq",
    });
    create_pipeline(addr, &initech, "mixed", &spec).await?;
    let (view, reason) = failure_of(addr, &initech, "mixed").await?;
    assert!(
        reason.contains("`one` has 1") && reason.contains("`two` has 2"),
        "the reason names the topics and their partitions: {view:#}"
    );
    assert_eq!(view["status"]["reason_kind"], "invalid_input", "{view:#}");
    for name in ["orders", "mixed"] {
        call(
            addr,
            Method::POST,
            &format!("/v1/pipelines/{name}/stop"),
            Some(&initech),
            None,
        )
        .await?;
    }

    // A JSON array is not a spec.
    let (status, _, problem) = call(
        addr,
        Method::POST,
        "/v1/pipelines/bad",
        Some(&initech),
        json_body(&json!(["counter", 1, ["a"], "o", "d"])),
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    // Bad specs answer 400 naming the field.
    for (spec, needle) in [
        (
            json!({"operator": "counter", "operator_version": 1, "input_topics": ["a"], "output_topic": "o", "dead_letter_topic": "o"}),
            "must differ",
        ),
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

/// Produces `n` records to `input` (one partition per key modulo `partitions`), one every
/// `every`, for the counter: record `i` has key `k{i % keys}`. Returns when each `(key,
/// count)` output is expected and when its input was sent.
async fn produce_paced(
    input: &str,
    partitions: i32,
    (from, n): (u64, u64),
    keys: u64,
    every: Duration,
    counts: &mut BTreeMap<String, u64>,
) -> anyhow::Result<BTreeMap<(String, u64), Instant>> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("linger.ms", "0")
        .create()?;
    let mut sent = BTreeMap::new();
    let mut ticks = tokio::time::interval(every);
    for i in from..from + n {
        ticks.tick().await;
        let key = format!("k{}", i % keys);
        let count = counts.entry(key.clone()).or_default();
        *count += 1;
        sent.insert((key.clone(), *count), Instant::now());
        let partition = i32::try_from(i % keys)? % partitions;
        let value = format!("record {i}");
        let record = FutureRecord::to(input)
            .partition(partition)
            .key(key.as_bytes())
            .payload(value.as_bytes());
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(sent)
}

/// When each `(key, count)` output of the counter on `output` was first seen, recorded from
/// now on by a reader of every partition (`partitions`) from the beginning.
type Seen = std::sync::Arc<std::sync::Mutex<BTreeMap<(String, u64), Instant>>>;

fn spawn_output_reader(output: &str, partitions: i32) -> anyhow::Result<Seen> {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("latency"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()?;
    // Assigned, not subscribed: no group rebalance delays the first fetch.
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(output, p, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let seen: Seen = Default::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok(msg) = consumer.recv().await else {
                continue;
            };
            let now = Instant::now();
            let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
            let Ok(value) = serde_json::from_slice::<Value>(msg.payload().unwrap_or_default())
            else {
                continue;
            };
            let count = value["count"].as_u64().unwrap_or_default();
            record
                .lock()
                .expect("seen lock")
                .entry((key, count))
                .or_insert(now);
        }
    });
    Ok(seen)
}

/// Waits until every `(key, count)` of `sent` was seen, and returns each one's latency
/// (first seen − sent), sorted.
async fn latencies(
    seen: &Seen,
    sent: &BTreeMap<(String, u64), Instant>,
    timeout: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let deadline = Instant::now() + timeout;
    loop {
        {
            let seen = seen.lock().expect("seen lock");
            let found: Vec<Duration> = sent
                .iter()
                .filter_map(|(k, at)| seen.get(k).map(|s| s.saturating_duration_since(*at)))
                .collect();
            if found.len() == sent.len() {
                let mut found = found;
                found.sort();
                return Ok(found);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} of {} outputs seen in {timeout:?}",
                found.len(),
                sent.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Hostile guests of one tenant (an endless loop, a 1 GiB allocation, endless recursion, a
/// 100 MB emit flood) run beside a well-behaved pipeline of another tenant on the same host:
/// every hostile record is dead-lettered, the host and both pipelines keep running, and the
/// well-behaved pipeline's end-to-end latency (produce → output seen) is printed alone and
/// beside the hostile one (measured, not asserted: tests assert no wall-clock times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_are_dead_lettered_and_another_tenants_pipeline_keeps_running()
-> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let (good_id, evil_id) = (tenant_id("good"), tenant_id("evil"));
    let good = tenant_with_key(addr, &good_id).await?;
    let evil = tenant_with_key(addr, &evil_id).await?;
    for (id, key) in [(&good_id, &good), (&evil_id, &evil)] {
        upload_counter(addr, key, 1).await?;
        create_topics(&[
            (&kafka_topic_of(id, "in"), 2),
            (&kafka_topic_of(id, "out"), 2),
            (&kafka_topic_of(id, "dlq"), 1),
        ])
        .await?;
        let spec = json!({
            "operator": "counter", "operator_version": 1,
            "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
            "checkpoint_interval_ms": 1000,
        });
        create_pipeline(addr, key, "counts", &spec).await?;
    }
    for key in [&good, &evil] {
        wait_for_pipeline(addr, key, "counts", Duration::from_secs(60), |v| {
            state_of(v) == "running"
                && v["status"]["partitions"].as_array().map(Vec::len) == Some(2)
        })
        .await?;
    }
    let (good_in, good_out) = (
        kafka_topic_of(&good_id, "in"),
        kafka_topic_of(&good_id, "out"),
    );
    let seen = spawn_output_reader(&good_out, 2)?;
    let mut counts = BTreeMap::new();
    let every = Duration::from_millis(10);
    // Warm-up, not measured: the first outputs of a new pipeline take ~500 ms more.
    let warm_up = produce_paced(&good_in, 2, (0, 20), 20, every, &mut counts).await?;
    latencies(&seen, &warm_up, Duration::from_secs(60)).await?;
    let sent = produce_paced(&good_in, 2, (20, 500), 20, every, &mut counts).await?;
    let alone = latencies(&seen, &sent, Duration::from_secs(60)).await?;

    // The hostile tenant sends its poisons all along the second measurement.
    let poisons: [&[u8]; 4] = [
        b"poison:loop",
        b"poison:alloc",
        b"poison:recurse",
        b"poison:emit-flood",
    ];
    let evil_in = kafka_topic_of(&evil_id, "in");
    let hostile = tokio::spawn(async move {
        let mut sent = 0u64;
        for round in 0..6 {
            let records: Vec<(Vec<u8>, Vec<u8>)> = poisons
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("e{round}-{i}").into_bytes(), p.to_vec()))
                .collect();
            produce(&evil_in, round % 2, &records).await?;
            sent += records.len() as u64;
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        anyhow::Ok(sent)
    });
    let sent = produce_paced(&good_in, 2, (520, 500), 20, every, &mut counts).await?;
    let beside = latencies(&seen, &sent, Duration::from_secs(60)).await?;
    let hostile_sent = hostile.await??;

    let view = wait_for_pipeline(addr, &evil, "counts", Duration::from_secs(120), |v| {
        v["status"]["dead_lettered"].as_u64() == Some(hostile_sent)
    })
    .await?;
    assert_eq!(
        state_of(&view),
        "running",
        "the hostile pipeline goes on: {view:#}"
    );
    let good_view = wait_for_pipeline(addr, &good, "counts", Duration::from_secs(30), |v| {
        v["status"]["records_done"] == 1020
    })
    .await?;
    assert_eq!(state_of(&good_view), "running");
    assert_eq!(good_view["status"]["dead_lettered"], 0);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "well-behaved pipeline, end-to-end latency over {} records at 100/s: alone p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; beside {hostile_sent} hostile records (loop, 1 GiB alloc, recursion, 100 MB emit flood): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        alone.len(),
        ms(percentile(&alone, 0.5)),
        ms(percentile(&alone, 0.99)),
        ms(percentile(&alone, 1.0)),
        ms(percentile(&beside, 0.5)),
        ms(percentile(&beside, 0.99)),
        ms(percentile(&beside, 1.0)),
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_never_exceed_the_per_tenant_pipeline_limit() -> anyhow::Result<()> {
    // No runner: only the definitions matter here.
    let addr = start_server().await?;
    let key = tenant_with_key(addr, &tenant_id("busy")).await?;
    upload_counter(addr, &key, 1).await?;
    let creates = (0..24).map(|i| {
        let key = key.clone();
        async move {
            let spec = json!({
                "operator": "counter", "operator_version": 1,
                "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
            });
            call(
                addr,
                Method::POST,
                &format!("/v1/pipelines/p{i}"),
                Some(&key),
                json_body(&spec),
            )
            .await
            .map(|(status, _, _)| status)
        }
    });
    let statuses = futures::future::try_join_all(creates).await?;
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    let (_, _, list) = call(addr, Method::GET, "/v1/pipelines", Some(&key), None).await?;
    let listed = list.as_array().map_or(0, Vec::len);
    assert_eq!(created + refused, 24, "{statuses:?}");
    assert_eq!(listed, created, "every 201 is a pipeline that exists");
    assert!(listed <= 16, "{listed} pipelines, above the limit of 16");
    Ok(())
}
