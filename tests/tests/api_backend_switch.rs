//! A live switch of an API pipeline's state backend (issue 20, item 3), on the real broker and
//! S3 server: `memory` → `lsm` → `memory` under steady input with exactly-once delivery; each
//! partition drains and checkpoints on the old backend and is converted on its next open.

use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

const KEYS: u64 = 40;
const RECORDS: u64 = 3_000;

async fn switch_to(addr: SocketAddr, key: &str, backend: &str) -> anyhow::Result<()> {
    let (status, _, view) = call(
        addr,
        Method::PATCH,
        "/v1/pipelines/switching",
        Some(key),
        json_body(&json!({"state_backend": backend})),
    )
    .await?;
    anyhow::ensure!(status == StatusCode::OK, "PATCH: {status} {view}");
    assert_eq!(view["definition"]["spec"]["state_backend"], backend);
    // The new run has taken over its partitions and processes records.
    wait_for_pipeline(addr, key, "switching", Duration::from_secs(60), |v| {
        state_of(v) == "running" && v["status"]["records_done"].as_u64() > Some(0)
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_switch_between_backends_keeps_exact_counts_with_exactly_once_outputs()
-> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let tenant = tenant_id("switch");
    let key = tenant_with_key(addr, &tenant).await?;
    upload_counter(addr, &key, 1).await?;
    let input = kafka_topic_of(&tenant, "in");
    let output = kafka_topic_of(&tenant, "out");
    create_topics(&[
        (&input, 2),
        (&output, 1),
        (&kafka_topic_of(&tenant, "dlq"), 1),
    ])
    .await?;
    create_pipeline(
        addr,
        &key,
        "switching",
        &json!({
            "operator": "counter", "operator_version": 1,
            "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
            "checkpoint_interval_ms": 300, "delivery": "exactly_once",
            "state_backend": "memory",
        }),
    )
    .await?;

    // Steady input: a batch every 100 ms until the backend has switched twice (at least
    // RECORDS): each new run has records to process, however soon it starts. (A fixed number
    // of batches ran out before the second switch's run opened once runs started at once.)
    let switched = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let input = input.clone();
        let switched = switched.clone();
        tokio::spawn(async move {
            let mut expected = BTreeMap::new();
            let mut batch = 0;
            while batch < RECORDS / 100 || !switched.load(std::sync::atomic::Ordering::Relaxed) {
                produce_counter(
                    &input,
                    2,
                    (batch * 100, batch * 100 + 100),
                    KEYS,
                    &mut expected,
                )
                .await?;
                batch += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(expected)
        })
    };
    wait_for_pipeline(addr, &key, "switching", Duration::from_secs(60), |v| {
        v["status"]["records_done"].as_u64() >= Some(300)
    })
    .await?;
    switch_to(addr, &key, "lsm").await?;
    switch_to(addr, &key, "memory").await?;
    switched.store(true, std::sync::atomic::Ordering::Relaxed);
    let expected = producer.await??;

    // Every count of every key once: exact, and no output twice (read_committed).
    let done = |counts: &BTreeMap<String, Vec<u64>>| {
        expected
            .iter()
            .all(|(k, n)| counts.get(k).is_some_and(|c| c.contains(n)))
    };
    let counts = read_counts_until(&output, Duration::from_secs(90), done).await?;
    for (k, n) in &expected {
        let mut seen = counts[k].clone();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (1..=*n).collect::<Vec<_>>(),
            "key {k}: each count once, none missing"
        );
    }
    let (status, _, verified) = call(
        addr,
        Method::GET,
        "/v1/pipelines/switching/verify",
        Some(&key),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(verified["restorable"], true, "{verified:#}");
    let (status, _, _) = call(
        addr,
        Method::POST,
        "/v1/pipelines/switching/stop",
        Some(&key),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    Ok(())
}
