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
