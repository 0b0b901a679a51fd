//! Schema evolution on the real broker and S3 server (issue 20, item 6; SCENARIOS.md S12): a
//! pipeline switched from `counter` (its `count` a plain number) to `counter` v2 (`count` is
//! `{count, last_seen_ms}` at schema version 1, upgraded as read; it adds 10 a record) keeps
//! every key's count; the switch back is refused before anything stops, naming the state.

use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

const KEYS: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_that_upgrades_a_states_schema_keeps_every_count_and_the_way_back_is_refused()
-> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("schema")))).await?;
    let tenant = tenant_id("schema");
    let key = tenant_with_key(addr, &tenant).await?;
    upload_counter(addr, &key, 1).await?;
    let v2 = std::fs::read(guest("weir_test_counter_v2"))?;
    let (status, _, uploaded) = call(
        addr,
        Method::POST,
        "/v1/operators/counter",
        Some(&key),
        Some(("application/wasm", v2)),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{uploaded}");
    assert_eq!(uploaded["version"], 2);
    assert_eq!(uploaded["states"][0]["version"], 1, "{uploaded}");
    let (input, output) = counter_pipeline_p(addr, &key, &tenant, json!({})).await?;
    let mut expected = BTreeMap::new();
    produce_counter(&input, 2, (0, 300), KEYS, &mut expected).await?;
    read_counts(&output, &expected, Duration::from_secs(60)).await?;

    let switch = |version: u64| {
        call(
            addr,
            Method::PUT,
            "/v1/pipelines/p/operator",
            Some(&key),
            json_body(&json!({ "operator_version": version })),
        )
    };
    let (status, _, body) = switch(2).await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    new_run_started(addr, &key, "p", 2).await?;
    let mut second = BTreeMap::new();
    produce_counter(&input, 2, (300, 600), KEYS, &mut second).await?;
    // v1's count carried over, then 10 a record.
    let finals: BTreeMap<String, u64> = expected
        .iter()
        .map(|(k, n)| (k.clone(), n + 10 * second[k]))
        .collect();
    let counts = read_counts_until(&output, Duration::from_secs(60), |seen| {
        finals
            .iter()
            .all(|(k, n)| seen.get(k).and_then(|c| c.last()) == Some(n))
    })
    .await?;
    for (k, n) in &finals {
        let tail: Vec<u64> = counts[k].iter().rev().take(10).rev().copied().collect();
        let steps: Vec<u64> = (1..=10).map(|i| expected[k] + 10 * i).collect();
        assert_eq!(
            tail, steps,
            "key {k}: counts on from v1's {} to {n}",
            expected[k]
        );
    }
    // The upgraded value, as stored (behind its version header) and as read.
    checkpointed(addr, &key, "p", 600).await?;
    let (status, _, read) = call(
        addr,
        Method::GET,
        "/v1/pipelines/p/state/count?key=key7",
        Some(&key),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(
        read["entries"][0]["value"]["count"], finals["key7"],
        "{read}"
    );
    assert!(
        read["entries"][0]["value"]["last_seen_ms"].is_i64(),
        "{read}"
    );

    // Back to the version that reads schema version 0: refused, naming the state; v2 runs on.
    let (status, _, refused) = switch(1).await?;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let detail = refused["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("state `count`") && detail.contains("no upgrade path"),
        "{detail}"
    );
    let (_, _, view) = call(addr, Method::GET, "/v1/pipelines/p", Some(&key), None).await?;
    assert_eq!(view["definition"]["spec"]["operator_version"], 2, "{view}");
    Ok(())
}
