//! A pipeline of the API on the `memory` state backend (`state_backend = "memory"`), on the
//! real broker and S3 server: its state is checkpointed under the pipeline's prefix and
//! restored by a restart, and a write past its `state_bytes_max` fails its record.

use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

/// The quota: one partition, so all of it; the counter's entries (64 bytes of overhead, the
/// encoded key `key{n}` with its state name, a JSON count) are ~100 bytes, so a few hundred
/// keys fit and two thousand do not.
const STATE_BYTES_MAX: u64 = 32 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_pipeline_keeps_its_state_across_a_restart_and_fails_writes_past_its_quota()
-> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let tenant = tenant_id("mem");
    let key = tenant_with_key(addr, &tenant).await?;
    upload_counter(addr, &key, 1).await?;
    let input = kafka_topic_of(&tenant, "in");
    let output = kafka_topic_of(&tenant, "out");
    create_topics(&[
        (&input, 1),
        (&output, 1),
        (&kafka_topic_of(&tenant, "dlq"), 1),
    ])
    .await?;

    // On `lsm` a quota means nothing: refused, naming the backend it is for.
    let mut spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 200, "state_bytes_max": STATE_BYTES_MAX,
    });
    let (status, _, problem) = call(
        addr,
        Method::POST,
        "/v1/pipelines/counts",
        Some(&key),
        json_body(&spec),
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("state_backend = \"memory\"")),
        "{problem}"
    );
    spec["state_backend"] = json!("memory");
    let created = create_pipeline(addr, &key, "counts", &spec).await?;
    assert_eq!(created["definition"]["spec"]["state_backend"], "memory");

    let mut expected = BTreeMap::new();
    produce_counter(&input, 1, (0, 300), 30, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);
    // Checkpointed: its snapshot holds every key.
    wait_for_pipeline(addr, &key, "counts", Duration::from_secs(30), |v| {
        v["status"]["partitions"][0]["checkpointed_offsets"][&input].as_i64() == Some(300)
            && v["status"]["state_bytes"].as_u64() > Some(0)
    })
    .await?;

    // Its stored checkpoints verify: the snapshot present and whole.
    let (status, _, verified) = call(
        addr,
        Method::GET,
        "/v1/pipelines/counts/verify",
        Some(&key),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{verified}");
    assert_eq!(verified["restorable"], true, "{verified:#}");
    assert_eq!(verified["checksums"], true);
    let newest = &verified["shards"][0]["versions"]
        .as_array()
        .and_then(|v| {
            v.iter()
                .find(|c| c["kind"] == "checkpoint" && c["restorable"] == true)
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(newest["objects"], 1, "one snapshot: {verified:#}");
    assert_eq!(newest["offsets"][&input], 300, "{verified:#}");

    // Stopped and started again: the counts go on from the snapshot.
    for action in ["stop", "start"] {
        let path = format!("/v1/pipelines/counts/{action}");
        let (status, _, body) = call(addr, Method::POST, &path, Some(&key), None).await?;
        assert_eq!(status, StatusCode::OK, "{action}: {body}");
        let want = if action == "stop" {
            "stopped"
        } else {
            "running"
        };
        wait_for_pipeline(addr, &key, "counts", Duration::from_secs(30), |v| {
            state_of(v) == want
        })
        .await?;
    }
    produce_counter(&input, 1, (300, 600), 30, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);

    // Two thousand new keys: those past the quota are dead-lettered, the rest counted.
    let mut more = BTreeMap::new();
    produce_counter(&input, 1, (30, 2_030), 2_030, &mut more).await?;
    // (This run's records: 300 after the restart, then these.)
    let view = wait_for_pipeline(addr, &key, "counts", Duration::from_secs(60), |v| {
        v["status"]["records_done"].as_u64() == Some(2_300)
    })
    .await?;
    let dead = view["status"]["dead_lettered"].as_u64().unwrap_or(0);
    assert!(
        (1_000..2_000).contains(&dead),
        "most new keys do not fit, some do: {dead} dead-lettered of 2,000\n{view:#}"
    );
    // The keys already counted still count: an overwrite that does not grow fits.
    produce_counter(&input, 1, (600, 630), 30, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);
    let (status, _, _) = call(
        addr,
        Method::POST,
        "/v1/pipelines/counts/stop",
        Some(&key),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    Ok(())
}
