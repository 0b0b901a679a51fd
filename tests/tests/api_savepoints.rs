//! Savepoints of an API pipeline on the real broker and S3 server (issue 20, item 1): taken
//! while it runs, reset to after an operator switch, restored into a new pipeline that
//! outlives the savepoint and its source pipeline, and refused where they do not fit.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

const KEYS: u64 = 30;

async fn verify(addr: SocketAddr, key: &str, name: &str) -> anyhow::Result<Value> {
    let path = format!("/v1/pipelines/{name}/verify");
    let (status, _, verified) = call(addr, Method::GET, &path, Some(key), None).await?;
    anyhow::ensure!(status == StatusCode::OK, "{verified}");
    Ok(verified)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_resets_its_pipeline_and_seeds_a_new_one_that_outlives_it() -> anyhow::Result<()>
{
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let tenant = tenant_id("sp");
    let key = tenant_with_key(addr, &tenant).await?;
    // Version 1 counts; version 2 (`tests/guests/counter-v2`) adds 10 a record.
    upload_counter(addr, &key, 1).await?;
    let (status, _, v2) = call(
        addr,
        Method::POST,
        "/v1/operators/counter",
        Some(&key),
        Some((
            "application/wasm",
            std::fs::read(guest("weir_test_counter_v2"))?,
        )),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{v2}");
    let input = kafka_topic_of(&tenant, "in");
    let output = kafka_topic_of(&tenant, "out");
    let output_b = kafka_topic_of(&tenant, "out-b");
    create_topics(&[
        (&input, 2),
        (&output, 1),
        (&output_b, 1),
        (&kafka_topic_of(&tenant, "dlq"), 1),
        (&kafka_topic_of(&tenant, "other"), 2),
    ])
    .await?;
    let spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 300,
    });
    create_pipeline(addr, &key, "a", &spec).await?;

    // 300 records on v1, then a savepoint of the running pipeline.
    let mut saved = BTreeMap::new();
    produce_counter(&input, 2, (0, 300), KEYS, &mut saved).await?;
    let counts = read_counts(&output, &saved, Duration::from_secs(60)).await?;
    assert_counts_exact(&saved, &counts);
    let taken = post(
        addr,
        &key,
        "/v1/pipelines/a/savepoints",
        json!({"name": "before-v2"}),
    )
    .await?;
    assert_eq!(taken["name"], "before-v2");
    assert_eq!(taken["shards"].as_array().map(Vec::len), Some(2), "{taken}");
    let saved_offsets: i64 = taken["shards"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["offsets"]["in"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(
        saved_offsets, 300,
        "the savepoint holds every record: {taken}"
    );
    assert!(taken["bytes"].as_u64() > Some(0), "{taken}");
    // A second of that name is refused; the list shows one.
    let (status, _, _) = call(
        addr,
        Method::POST,
        "/v1/pipelines/a/savepoints",
        Some(&key),
        json_body(&json!({"name": "before-v2"})),
    )
    .await?;
    assert_eq!(status, StatusCode::CONFLICT);
    let (_, _, listed) = call(
        addr,
        Method::GET,
        "/v1/pipelines/a/savepoints",
        Some(&key),
        None,
    )
    .await?;
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");

    // Switched to v2, 300 more records.
    let (status, _, body) = call(
        addr,
        Method::PUT,
        "/v1/pipelines/a/operator",
        Some(&key),
        json_body(&json!({"operator_version": 2})),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    new_run_started(addr, &key, "a", 2).await?;
    let mut all = saved.clone();
    produce_counter(&input, 2, (300, 600), KEYS, &mut all).await?;
    let on_v2: BTreeMap<String, u64> = all
        .iter()
        .map(|(k, n)| (k.clone(), saved[k] + 10 * (n - saved[k])))
        .collect();
    read_counts_until(&output, Duration::from_secs(60), |seen| {
        on_v2
            .iter()
            .all(|(k, n)| seen.get(k).and_then(|c| c.last()) == Some(n))
    })
    .await?;

    // A new pipeline from the savepoint counts on from it: only what came after S.
    let mut from_spec = spec.clone();
    from_spec["output_topic"] = json!("out-b");
    from_spec["from_savepoint"] = json!({"pipeline": "a", "savepoint": "before-v2"});
    create_pipeline(addr, &key, "b", &from_spec).await?;
    let counts_b = read_counts(&output_b, &all, Duration::from_secs(60)).await?;
    for (k, n) in &all {
        let seen = &counts_b[k];
        assert_eq!(seen.iter().max(), Some(n), "key {k}: final count in b");
        assert!(
            seen.iter().all(|c| *c > saved[k]),
            "key {k}: b starts after the savepoint's {}: {seen:?}",
            saved[k]
        );
    }

    // Stop a, reset to the savepoint (which puts v1, that took it, back), start: what came
    // after S is counted again from the savepoint's counts, ending where one pass of v1 ends;
    // v2's effects are gone. The reset is asked for while the hosts still drain: it waits for
    // them.
    let (status, _, body) =
        call(addr, Method::POST, "/v1/pipelines/a/stop", Some(&key), None).await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    let reset = post(
        addr,
        &key,
        "/v1/pipelines/a/reset",
        json!({"savepoint": "before-v2"}),
    )
    .await?;
    assert_eq!(reset["operator_version"], 1, "{reset}");
    // Each partition's reset checkpoint is above every version its shard holds.
    let after_reset = verify(addr, &key, "a").await?;
    for shard in reset["shards"].as_array().into_iter().flatten() {
        let partition = shard["partition"].as_i64();
        let stored = after_reset["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["partition"].as_i64() == partition)
            .map(|s| s["versions"].clone())
            .unwrap_or_default();
        let newest = stored[0]["version"].as_u64();
        assert_eq!(
            shard["version"].as_u64(),
            newest,
            "checkpoint ids stay monotonic: partition {partition:?} {stored:#}"
        );
        assert_eq!(stored[0]["restorable"], true, "{stored:#}");
    }
    set_desired(addr, &key, "a", "start").await?;
    // Per key: v1's counts to S, v2's, then the replay from S on v1: S+1 ..= one pass's count.
    let replayed = |k: &String, seen: &[u64]| -> bool {
        let again: Vec<u64> = (saved[k] + 1..=all[k]).collect();
        seen.ends_with(&again)
    };
    let counts = read_counts_until(&output, Duration::from_secs(60), |seen| {
        all.keys()
            .all(|k| seen.get(k).is_some_and(|s| replayed(k, s)))
    })
    .await?;
    for (k, n) in &all {
        let seen = &counts[k];
        assert_eq!(seen.last(), Some(n), "key {k}: one pass's count, last");
        assert!(replayed(k, seen), "key {k}: {seen:?}");
        assert!(
            seen.contains(&on_v2[k]),
            "key {k}: v2 ran before the reset: {seen:?}"
        );
    }

    // Both verify, the savepoint with them; another tenant sees none of it.
    let verified = verify(addr, &key, "a").await?;
    assert_eq!(verified["restorable"], true, "{verified:#}");
    assert_eq!(verified["savepoints"][0]["name"], "before-v2");
    assert_eq!(
        verified["savepoints"][0]["restorable"], true,
        "{verified:#}"
    );
    let other = tenant_with_key(addr, &tenant_id("spo")).await?;
    let (status, _, _) = call(
        addr,
        Method::GET,
        "/v1/pipelines/a/savepoints",
        Some(&other),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Other topics do not fit: refused with the reason; a missing savepoint too.
    for (change, needle) in [
        (json!({"input_topics": ["other"]}), "topics"),
        (
            json!({"from_savepoint": {"pipeline": "a", "savepoint": "nope"}}),
            "no savepoint",
        ),
    ] {
        let mut bad = from_spec.clone();
        for (field, value) in change.as_object().into_iter().flatten() {
            bad[field] = value.clone();
        }
        let (status, _, problem) = call(
            addr,
            Method::POST,
            "/v1/pipelines/bad",
            Some(&key),
            json_body(&bad),
        )
        .await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains(needle)),
            "{problem}"
        );
    }

    // Into the other backend, through the portable format (exported once, kept with the
    // savepoint): a `memory` pipeline counts on from the savepoint's `lsm` state.
    let mut memory_spec = from_spec.clone();
    memory_spec["state_backend"] = json!("memory");
    memory_spec["output_topic"] = json!("out-c");
    create_topics(&[(&kafka_topic_of(&tenant, "out-c"), 1)]).await?;
    create_pipeline(addr, &key, "c", &memory_spec).await?;
    let counts_c = read_counts(
        &kafka_topic_of(&tenant, "out-c"),
        &all,
        Duration::from_secs(60),
    )
    .await?;
    for (k, n) in &all {
        assert_eq!(
            counts_c[k].iter().max(),
            Some(n),
            "key {k}: final count in c"
        );
        assert!(counts_c[k].iter().all(|c| *c > saved[k]), "key {k}");
    }
    set_desired(addr, &key, "c", "stop").await?;
    // The export itself: JSON lines a user can read, holding the savepoint's counts.
    let exported = post(
        addr,
        &key,
        "/v1/pipelines/a/savepoints/before-v2/exports",
        json!({}),
    )
    .await?;
    let mut exported_counts = BTreeMap::new();
    for part in exported.as_array().into_iter().flatten() {
        let path = part["download"].as_str().unwrap_or_default();
        let (status, _, _) = call(addr, Method::GET, path, Some(&other), None).await?;
        assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's export");
        let url = format!("http://{addr}{path}");
        let text = reqwest::Client::new()
            .get(&url)
            .bearer_auth(&key)
            .send()
            .await?
            .text()
            .await?;
        let lines: Vec<Value> = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        assert_eq!(lines[0]["format"], "weir-state-export", "{text}");
        assert_eq!(lines.last().map(|l| l["end"].clone()), Some(json!(true)));
        for line in &lines[1..lines.len() - 1] {
            if line["state"] == "count" {
                let key = line["key"].as_str().unwrap_or_default().to_owned();
                exported_counts.insert(key, line["value"].as_u64().unwrap_or(0));
            }
        }
    }
    assert_eq!(
        exported_counts, saved,
        "the export holds the savepoint's counts"
    );

    // The savepoint, then its pipeline, deleted: b still restores, every key right.
    assert_eq!(verify(addr, &key, "b").await?["restorable"], true);
    let (status, _, _) = call(
        addr,
        Method::DELETE,
        "/v1/pipelines/a/savepoints/before-v2",
        Some(&key),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(verify(addr, &key, "b").await?["restorable"], true);
    set_desired(addr, &key, "a", "stop").await?;
    let (status, _, _) = call(addr, Method::DELETE, "/v1/pipelines/a", Some(&key), None).await?;
    assert_eq!(status, StatusCode::NO_CONTENT);
    set_desired(addr, &key, "b", "stop").await?;
    let after = verify(addr, &key, "b").await?;
    assert_eq!(after["restorable"], true, "{after:#}");
    set_desired(addr, &key, "b", "start").await?;
    produce_counter(&input, 2, (600, 660), KEYS, &mut all).await?;
    let counts_b = read_counts(&output_b, &all, Duration::from_secs(60)).await?;
    for (k, n) in &all {
        assert_eq!(
            counts_b[k].iter().max(),
            Some(n),
            "key {k}: b's final count"
        );
    }
    // A savepoint without a body is named for its time.
    let (status, _, taken) = call(
        addr,
        Method::POST,
        "/v1/pipelines/b/savepoints",
        Some(&key),
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{taken}");
    assert!(
        taken["name"].as_str().is_some_and(|n| n.starts_with("sp-")),
        "{taken}"
    );
    set_desired(addr, &key, "b", "stop").await?;
    Ok(())
}
