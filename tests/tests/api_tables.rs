//! Table inputs through the API (docs/topologies.md, "Tables"), on the real broker and S3
//! server: a stage of the counter guest whose `count` state a table seeds — the table's row of
//! a key is where that key's count starts, loaded before any click runs, queryable as any
//! state, kept with its offsets through an operator switch, a backend switch and a savepoint,
//! and rewound with the state by a reset; and a global table
//! that a stage of the `join` guest looks clicks up in by a field of theirs, the tenant's own
//! topic only.

use crate::api_stages::{PARTITIONS, Rig, rig};
use anyhow::Context as _;
use rdkafka::Message;
use serde_json::json;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_seeds_a_stages_state_through_the_api() -> anyhow::Result<()> {
    let Rig {
        addr,
        acme_id,
        acme,
        input,
        output,
        ..
    } = rig(2).await?;
    let seeds = kafka_topic_of(&acme_id, "seeds");
    create_topics(&[(&seeds, PARTITIONS)]).await?;
    // k0's count starts at 100; k1 has no row; k9 has a row and no clicks. The clicks are
    // there before the pipeline.
    produce(
        &seeds,
        0,
        &[
            (b"k0".to_vec(), b"100".to_vec()),
            (b"k9".to_vec(), b"7".to_vec()),
        ],
    )
    .await?;
    let click = |key: &[u8]| (key.to_vec(), b"v".to_vec());
    produce(&input, 0, &[click(b"k0"), click(b"k0")]).await?;
    produce(&input, 1, &[click(b"k1")]).await?;
    let spec = json!({
        "stages": [{
            "name": "count", "operator": "counter", "operator_version": 1,
            "inputs": [{"topic": "clicks"}, {"topic": "seeds", "table": "count"}],
            "outputs": {"default": {"topic": "counts"}},
        }],
        "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 500,
        "delivery": "exactly_once",
        "state_backend": "memory",
    });
    create_pipeline(addr, &acme, "seeded", &spec).await?;
    let mut counts = read_counts_exactly(&output, 3).await?;
    counts.sort();
    assert_eq!(
        counts,
        [
            ("k0".to_owned(), 101),
            ("k0".to_owned(), 102),
            ("k1".to_owned(), 1)
        ]
    );
    // The table's rows are state like any other: queryable, the row with no click too, once
    // a checkpoint holds the clicks.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let query = |k: &str| format!("/v1/pipelines/seeded/state/count?stage=count&key={k}");
    let value = |body: &serde_json::Value| body["entries"][0]["value"].as_u64();
    loop {
        let (status, _, k0) =
            call(addr, reqwest::Method::GET, &query("k0"), Some(&acme), None).await?;
        anyhow::ensure!(status == reqwest::StatusCode::OK, "{status} {k0}");
        if value(&k0) == Some(102) {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "k0's count is not 102 in a checkpoint after 60 s: {k0}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, _, k9) = call(addr, reqwest::Method::GET, &query("k9"), Some(&acme), None).await?;
    assert_eq!(value(&k9), Some(7), "a table row no click touched: {k9}");

    // Switches keep the table: the stage's operator, then the backend, each new run opening
    // its shards from the last checkpoint, the table's rows and offsets with them (a table
    // read again from its beginning would set k0 back to 100 first).
    let switches = [
        (
            reqwest::Method::PUT,
            "/v1/pipelines/seeded/operator",
            json!({"operator_version": 2, "stage": "count"}),
        ),
        (
            reqwest::Method::PATCH,
            "/v1/pipelines/seeded",
            json!({"state_backend": "lsm"}),
        ),
    ];
    for (n, (method, path, body)) in (3_u64..).zip(switches) {
        let (status, _, view) = call(addr, method, path, Some(&acme), json_body(&body)).await?;
        anyhow::ensure!(status == reqwest::StatusCode::OK, "{path}: {status} {view}");
        produce(&input, 0, &[click(b"k0")]).await?;
        let counts = read_counts_exactly(&output, usize::try_from(n)? + 1).await?;
        let k0: Vec<u64> = counts
            .iter()
            .filter(|(key, _)| key == "k0")
            .map(|(_, count)| *count)
            .collect();
        assert_eq!(k0, (101..=100 + n).collect::<Vec<u64>>(), "after {body}");
    }
    let (_, _, verified) = call(
        addr,
        reqwest::Method::GET,
        "/v1/pipelines/seeded/verify",
        Some(&acme),
        None,
    )
    .await?;
    assert_eq!(verified["restorable"], true, "{verified:#}");

    // A savepoint (of the stopped pipeline, as a pipeline of stages is saved) holds the
    // table's rows and offsets: a pipeline started from it, on the `memory` backend again,
    // counts on from 104.
    set_desired(addr, &acme, "seeded", "stop").await?;
    let taken = post(
        addr,
        &acme,
        "/v1/pipelines/seeded/savepoints",
        json!({"name": "s"}),
    )
    .await?;
    assert_eq!(taken["name"], "s", "{taken}");
    let output_b = kafka_topic_of(&acme_id, "counts-b");
    create_topics(&[(&output_b, PARTITIONS)]).await?;
    let mut from = spec.clone();
    from["stages"][0]["outputs"]["default"]["topic"] = json!("counts-b");
    from["from_savepoint"] = json!({"pipeline": "seeded", "savepoint": "s"});
    create_pipeline(addr, &acme, "seeded-b", &from).await?;
    produce(&input, 0, &[click(b"k0")]).await?;
    let read = read_exactly(
        &output_b,
        1,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await?;
    let after: serde_json::Value = serde_json::from_slice(read[0].payload().unwrap_or_default())?;
    assert_eq!(after["count"], 105, "{after}");

    // A reset rewinds the table with the state. The table changes after the savepoint (k0 :=
    // 500) and the pipeline goes on: both clicks since (the copy's and one more) see the new
    // row. Reset to the savepoint, it reads the table on from the savepoint's offsets, so the
    // update applies again before the clicks replay: the same 501 and 502, where a table left
    // at its later offsets would count on from 104.
    set_desired(addr, &acme, "seeded-b", "stop").await?;
    produce(&seeds, 0, &[(b"k0".to_vec(), b"500".to_vec())]).await?;
    set_desired(addr, &acme, "seeded", "start").await?;
    produce(&input, 0, &[click(b"k0")]).await?;
    let k0_counts = |counts: Vec<(String, u64)>| -> Vec<u64> {
        counts
            .into_iter()
            .filter(|(key, _)| key == "k0")
            .map(|(_, count)| count)
            .collect()
    };
    let counts = read_counts_exactly(&output, 7).await?;
    assert_eq!(k0_counts(counts), [101, 102, 103, 104, 501, 502]);
    set_desired(addr, &acme, "seeded", "stop").await?;
    let (status, _, restored) = call(
        addr,
        reqwest::Method::POST,
        "/v1/pipelines/seeded/reset",
        Some(&acme),
        json_body(&json!({"savepoint": "s"})),
    )
    .await?;
    assert_eq!(status, reqwest::StatusCode::OK, "{restored}");
    set_desired(addr, &acme, "seeded", "start").await?;
    let counts = read_counts_exactly(&output, 9).await?;
    assert_eq!(k0_counts(counts), [101, 102, 103, 104, 501, 502, 501, 502]);
    Ok(())
}

/// The first `n` outputs of the counter guest on `topic` (read committed; no more within a
/// second): (key, count), partition by partition in offset order.
async fn read_counts_exactly(topic: &str, n: usize) -> anyhow::Result<Vec<(String, u64)>> {
    let read = read_exactly(topic, n, Duration::from_secs(60), Duration::from_secs(1)).await?;
    let mut read: Vec<_> = read.iter().collect();
    read.sort_by_key(|m| (m.partition(), m.offset()));
    read.into_iter()
        .map(|m| {
            let value: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())?;
            let count = value["count"].as_u64().context("a count")?;
            Ok((
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                count,
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_table_enriches_a_stage_through_the_api_from_the_tenants_own_topic()
-> anyhow::Result<()> {
    use reqwest::{Method, StatusCode};
    let Rig {
        addr,
        acme_id,
        acme,
        input,
        output,
        store_url,
    } = rig(1).await?;
    let wasm = std::fs::read(guest("weir_test_join"))?;
    let (status, _, body) = call(
        addr,
        Method::POST,
        "/v1/operators/enrich",
        Some(&acme),
        Some(("application/wasm", wasm)),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // acme's planes, and another tenant's topic of the same name with other rows.
    let planes = kafka_topic_of(&acme_id, "planes");
    let others = kafka_topic_of(&tenant_id("globex"), "planes");
    create_topics(&[(&planes, 3), (&others, 1)]).await?;
    produce(
        &planes,
        2,
        &[(b"N1".to_vec(), br#"{"maker":"BOEING"}"#.to_vec())],
    )
    .await?;
    produce(
        &planes,
        0,
        &[(b"N5".to_vec(), br#"{"maker":"AIRBUS"}"#.to_vec())],
    )
    .await?;
    produce(
        &others,
        0,
        &[(b"N1".to_vec(), br#"{"maker":"NOT ACME'S"}"#.to_vec())],
    )
    .await?;
    produce(
        &others,
        0,
        &[(b"N2".to_vec(), br#"{"maker":"NOT ACME'S"}"#.to_vec())],
    )
    .await?;
    let click = |tail: &str| {
        (
            b"c".to_vec(),
            format!(r#"{{"tailnum":"{tail}"}}"#).into_bytes(),
        )
    };
    produce(&input, 0, &[click("N1"), click("N2")]).await?;
    let spec = json!({
        "stages": [{
            "name": "enrich", "operator": "enrich", "operator_version": 1,
            "inputs": [{"topic": "clicks"}, {"topic": "planes", "global_table": "planes"}],
            "parameters": {"join": "lookup", "table": "planes", "field": "tailnum"},
            "outputs": {"default": {"topic": "counts"}},
        }],
        "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 500,
        "delivery": "exactly_once",
        "state_backend": "memory",
    });
    create_pipeline(addr, &acme, "enriched", &spec).await?;
    let read = read_exactly(&output, 2, Duration::from_secs(60), Duration::ZERO).await?;
    let rows: Vec<serde_json::Value> = read
        .iter()
        .map(|m| serde_json::from_slice(m.payload().unwrap_or_default()).expect("lookup JSON"))
        .collect();
    assert_eq!(
        rows,
        [
            json!({"l": {"tailnum": "N1"}, "r": {"maker": "BOEING"}}),
            json!({"l": {"tailnum": "N2"}, "r": null}),
        ],
        "acme's row of N1; N2 is only in another tenant's topic"
    );
    global_table_reads(addr, &acme, &store_url).await
}

/// The stage's global table `planes` read through the API (its rows as its snapshot holds
/// them): a point read, a scan in pages, a scan whose snapshot is replaced between its pages,
/// and a read of a savepoint refused.
async fn global_table_reads(
    addr: std::net::SocketAddr,
    acme: &str,
    store_url: &str,
) -> anyhow::Result<()> {
    use reqwest::{Method, StatusCode};
    let read = |query: String| async move {
        call(
            addr,
            Method::GET,
            &format!("/v1/pipelines/enriched/state/planes?stage=enrich&{query}"),
            Some(acme),
            None,
        )
        .await
    };
    // The table is saved as soon as it is loaded, which the outputs above came after; the
    // save itself runs beside the stage, so the first read may come before it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let point = loop {
        let (status, _, page) = read("key=N1".into()).await?;
        assert_eq!(status, StatusCode::OK, "{page}");
        if !page["entries"].as_array().is_none_or(Vec::is_empty) {
            break page;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no snapshot of planes: {page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        point["entries"],
        json!([{"key": "N1", "value_b64": "eyJtYWtlciI6IkJPRUlORyJ9", "value": {"maker": "BOEING"}}]),
        "the row as produced, with no partition (every host holds the whole table)"
    );
    assert_eq!(
        point["table_offsets"],
        json!([
            {"partition": 0, "next_offset": 1},
            {"partition": 1, "next_offset": 0},
            {"partition": 2, "next_offset": 1}
        ]),
        "the offsets of acme's topic the rows reflect"
    );
    let (status, _, n2) = read("key=N2".into()).await?;
    assert_eq!(status, StatusCode::OK, "{n2}");
    assert_eq!(
        n2["entries"],
        json!([]),
        "N2 is only in another tenant's topic"
    );
    let (status, _, first) = read("limit=1".into()).await?;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["entries"][0]["key"], "N1");
    let token = first["next_page_token"].as_str().expect("a second page");
    let (status, _, second) = read(format!("limit=1&page_token={token}")).await?;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["entries"][0]["value"], json!({"maker": "AIRBUS"}));
    assert_eq!(
        second["next_page_token"],
        serde_json::Value::Null,
        "two rows in all"
    );
    // Another host saves the table between two pages of a scan: the scan starts again.
    let (status, _, first) = read("limit=1".into()).await?;
    assert_eq!(status, StatusCode::OK, "{first}");
    let token = first["next_page_token"].as_str().expect("a second page");
    replace_snapshot(store_url).await?;
    let (status, _, gone) = read(format!("limit=1&page_token={token}")).await?;
    assert_eq!(status, StatusCode::GONE, "{gone}");
    let (_, _, again) = read("prefix=N".into()).await?;
    let keys: Vec<&str> = again["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["key"].as_str())
        .collect();
    assert_eq!(keys, ["N1", "N5", "N7"], "the new snapshot, in key order");
    let (status, _, problem) = read("key=N1&savepoint=any".into()).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("savepoints do not hold global tables")),
        "{problem}"
    );
    Ok(())
}

/// Overwrites the stage's snapshot of `planes` as another host's save would: the same rows
/// and one more (N7), at later offsets.
async fn replace_snapshot(store_url: &str) -> anyhow::Result<()> {
    use object_store::ObjectStoreExt as _;
    use weir_host::runtime::InputRecord;
    use weir_host::state::global_table::GlobalTable;
    let (store, objects) = crate::api_stages::stored_objects(store_url).await?;
    let path = objects
        .iter()
        .map(|o| &o.location)
        .find(|p| p.as_ref().contains("/global-tables/"))
        .context("the snapshot of planes")?;
    let row = |partition: i32, offset: i64, key: &str, maker: &str| InputRecord {
        key: key.as_bytes().to_vec(),
        value: format!(r#"{{"maker":"{maker}"}}"#).into_bytes(),
        timestamp_ms: 0,
        headers: Vec::new(),
        topic: "planes".into(),
        partition,
        offset,
        input: 0,
    };
    let table = GlobalTable::default();
    table.apply(&[
        row(0, 0, "N5", "AIRBUS"),
        row(0, 1, "N7", "EMBRAER"),
        row(2, 0, "N1", "BOEING"),
    ]);
    table.advance(1, 0);
    store.put(path, table.snapshot().0.into()).await?;
    Ok(())
}
