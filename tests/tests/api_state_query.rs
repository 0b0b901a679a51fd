//! Queryable state (issue 20, item 5) on the real broker and S3 server: point reads and paged
//! scans of a running pipeline's state, answered by a host that runs nothing, while a second
//! host joins (a rebalance) and new checkpoints make GC collect versions above the one a scan
//! reads; the scan's lease keeps that version, and every page reads it.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

const KEYS: u64 = 30;

async fn read(addr: SocketAddr, key: &str, query: &str) -> anyhow::Result<(StatusCode, Value)> {
    let path = format!("/v1/pipelines/p/state/{query}");
    let (status, _, body) = call(addr, Method::GET, &path, Some(key), None).await?;
    Ok((status, body))
}

/// Each entry's key and decoded count.
fn counts_of(page: &Value) -> Vec<(String, u64)> {
    page["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["key"].as_str().unwrap_or_default().to_owned(),
                e["value"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_reads_page_through_one_checkpoint_from_a_host_that_runs_nothing()
-> anyhow::Result<()> {
    let (addr, url) = start_server_with(Some(runner_config(&unique("qs-a")))).await?;
    let (reader, _) = start_server_on(&url, None, std::future::pending()).await?;
    let tenant = tenant_id("qs");
    let key = tenant_with_key(addr, &tenant).await?;
    upload_counter(addr, &key, 1).await?;
    let (input, output) = counter_pipeline_p(addr, &key, &tenant, json!({})).await?;
    let mut first = BTreeMap::new();
    produce_counter(&input, 2, (0, 300), KEYS, &mut first).await?;
    checkpointed(reader, &key, "p", 300).await?;

    // Point reads, from the host that runs nothing.
    for k in ["key0", "key7", "key29"] {
        let (status, page) = read(reader, &key, &format!("count?key={k}")).await?;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(counts_of(&page), vec![(k.to_owned(), first[k])], "{page}");
    }
    let (_, absent) = read(reader, &key, "count?key=nobody").await?;
    assert_eq!(absent["entries"], json!([]), "{absent}");

    // The first page of a scan, 7 entries a page.
    let (status, page) = read(reader, &key, "count?limit=7").await?;
    assert_eq!(status, StatusCode::OK, "{page}");
    let read_at = page["checkpoints"].clone();
    let mut scanned = counts_of(&page);
    let mut token = page["next_page_token"].as_str().map(str::to_owned);
    let first_token = token.clone().expect("a next page");
    // A token is bound to its read: not another state's, key's or prefix's.
    let (status, body) = read(
        reader,
        &key,
        &format!("count?key=key7&page_token={first_token}"),
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Between the pages: more input, a second host joins (a rebalance), and GC collects
    // versions above the one the scan reads in every partition.
    let (_, _joined) = start_server_on(
        &url,
        Some(runner_config(&unique("qs-b"))),
        std::future::pending(),
    )
    .await?;
    // Rounds of input, each checkpointed, until GC has deleted a version above the one read
    // in every partition (without the lease, that one would be gone too).
    let mut all = first.clone();
    let mut produced = 300;
    while !collected_around(reader, &key, &read_at).await? {
        anyhow::ensure!(produced < 3_000, "GC collected nothing above {read_at}");
        produce_counter(&input, 2, (produced, produced + 60), KEYS, &mut all).await?;
        produced += 60;
        checkpointed(reader, &key, "p", produced).await?;
    }
    let counts = read_counts(&output, &all, Duration::from_secs(90)).await?;
    assert_counts_exact(&all, &counts);
    // A point read meanwhile sees the newest checkpoint.
    let (_, now) = read(reader, &key, "count?key=key7").await?;
    assert_eq!(counts_of(&now), vec![("key7".to_owned(), all["key7"])]);

    // The rest of the scan: the same versions, the first 300 records' counts.
    while let Some(t) = token {
        let (status, page) = read(reader, &key, &format!("count?limit=7&page_token={t}")).await?;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(page["checkpoints"], read_at, "every page reads one version");
        scanned.extend(counts_of(&page));
        token = page["next_page_token"].as_str().map(str::to_owned);
    }
    let scanned: BTreeMap<String, u64> = scanned.into_iter().collect();
    assert_eq!(
        scanned, first,
        "the scan shows the checkpoint it started at"
    );

    // A prefix scan; bad requests; another tenant sees nothing.
    let (_, page) = read(reader, &key, "count?prefix=key1&limit=1000").await?;
    let want: Vec<(String, u64)> = all
        .iter()
        .filter(|(k, _)| k.starts_with("key1"))
        .map(|(k, n)| (k.clone(), *n))
        .collect();
    let mut got = counts_of(&page);
    got.sort();
    assert_eq!(got, want, "{page}");
    for bad in [
        "count?limit=0",
        "count?key=a&prefix=b",
        "!timers",
        "count?page_token=xyz",
    ] {
        let (status, body) = read(reader, &key, bad).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (status, body) = read(reader, &key, "nosuch?key=key7").await?;
    assert_eq!(status, StatusCode::NOT_FOUND, "an undeclared state: {body}");
    let other = tenant_with_key(addr, &tenant_id("qs-other")).await?;
    let (status, _) = read(reader, &other, "count?key=key7").await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    Ok(())
}

/// Whether, in every partition of `read_at` (`[{partition, version}]`), GC has deleted a
/// version newer than the one read there; that one must still be stored (its lease holds it).
async fn collected_around(addr: SocketAddr, key: &str, read_at: &Value) -> anyhow::Result<bool> {
    let verified = verify_quick(addr, key, "p").await?;
    let mut done = true;
    for at in read_at.as_array().into_iter().flatten() {
        let version = at["version"].as_u64().unwrap_or_default();
        let shard = verified["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["partition"] == at["partition"]);
        let stored: Vec<u64> = shard
            .and_then(|s| s["versions"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v["version"].as_u64())
            .collect();
        assert!(
            stored.contains(&version),
            "version {version} collected: {verified}"
        );
        let newest = stored.iter().copied().max().unwrap_or_default();
        let above = stored.iter().filter(|v| **v > version).count() as u64;
        done &= above < newest - version;
    }
    Ok(done)
}
