//! SCENARIOS.md S15 across an edge (docs/topologies.md, "Repeats across an edge"), through the
//! API on the real broker and S3 server: a pipeline of stages whose first stage falls back to an
//! older checkpoint counts no record twice in its second, and only the records sent again carry
//! an origin. The rig and the two-stage spec are `api_stages`'.

use crate::api_stages::{PARTITIONS, count_state, rekeyed, rig, spec, stored_objects};
use object_store::ObjectStoreExt as _;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

/// Asks pipeline `name` for a checkpoint of every partition (`POST …/checkpoints`) each second
/// until `done` holds for its view.
async fn checkpoint_until(
    addr: std::net::SocketAddr,
    key: &str,
    name: &str,
    what: &str,
    mut done: impl FnMut(&Value) -> bool,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let path = format!("/v1/pipelines/{name}/checkpoints");
        let (status, _, body) = call(addr, Method::POST, &path, Some(key), None).await?;
        anyhow::ensure!(status == StatusCode::ACCEPTED, "{status}: {body}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let path = format!("/v1/pipelines/{name}");
        let (_, _, view) = call(addr, Method::GET, &path, Some(key), None).await?;
        if done(&view) {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{what}: not after 90 s of checkpoints: {view:#}"
        );
    }
}

/// The `rekey` stage's records of `input` its checkpoints cover, summed over its partitions.
fn rekey_checkpointed(view: &Value, input: &str) -> i64 {
    view["status"]["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["stage"] == "rekey")
        .filter_map(|p| p["checkpointed_offsets"][input].as_i64())
        .sum()
}

/// `weir_edge_repeats_dropped_total` of tenant `tenant`'s pipeline `name`, from this process's
/// metrics (the host runs in it).
fn repeats_dropped(tenant: &str, name: &str) -> f64 {
    weir_host::telemetry::prometheus()
        .render()
        .lines()
        .filter(|l| l.starts_with("weir_edge_repeats_dropped_total{"))
        .filter(|l| l.contains(&format!("tenant=\"{tenant}\"")) && l.contains(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Of the committed records of `topic` (its first [`PARTITIONS`] partitions, from their start
/// to their end), how many there are and how many carry a `weir.origin` header.
fn records_with_origin(topic: &str) -> anyhow::Result<(u64, u64)> {
    use rdkafka::Message as _;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Headers as _;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("origins"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut assignment = rdkafka::TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for partition in 0..PARTITIONS {
        let (_, high) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
        if high > 0 {
            ends.insert(partition, high);
            assignment.add_partition_offset(topic, partition, rdkafka::Offset::Beginning)?;
        }
    }
    consumer.assign(&assignment)?;
    let (mut records, mut with_origin) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !ends.is_empty() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{topic} not read to its end"
        );
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            // Past the last record of a partition only commit markers are left.
            for (partition, end) in ends.clone() {
                let position = consumer.position()?;
                if let Some(rdkafka::Offset::Offset(at)) = position
                    .find_partition(topic, partition)
                    .map(|p| p.offset())
                    && at >= end
                {
                    ends.remove(&partition);
                }
            }
            continue;
        };
        let message = message?;
        let headers = message.headers();
        let marker = headers.is_some_and(|h| h.iter().any(|h| h.key == "weir.watermark"));
        if !marker {
            records += 1;
            with_origin +=
                u64::from(headers.is_some_and(|h| h.iter().any(|h| h.key == "weir.origin")));
        }
        if message.offset() + 1 >= ends.get(&message.partition()).copied().unwrap_or(0) {
            ends.remove(&message.partition());
        }
    }
    Ok((records, with_origin))
}

/// SCENARIOS.md S15 across an edge (docs/topologies.md, "Repeats across an edge"): the first
/// stage's newest checkpoints of one partition are unusable, so it falls back to an older one
/// and sends again what it had sent since; the second stage drops exactly those records, by
/// their origin, and counts each input record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_whose_upstream_falls_back_to_an_older_checkpoint_counts_no_record_twice()
-> anyhow::Result<()> {
    use weir_host::state::manifest::{ManifestKind, ManifestStore};
    let rig = rig(1).await?;
    let addr = rig.addr;
    let (store_url, acme_id, acme) = (rig.store_url, rig.acme_id, rig.acme);
    let (input, output) = (rig.input, rig.output);
    let mut expected = BTreeMap::new();
    // Checkpoints only when asked for, so that the first stage's are where the test puts them.
    let mut graph = spec(1);
    graph["checkpoint_interval_ms"] = json!(3_600_000);
    produce_counter(&input, PARTITIONS, (0, 2_000), 500, &mut expected).await?;
    let created = create_pipeline(addr, &acme, "fall", &graph).await?;
    let uid = created["definition"]["uid"].as_str().unwrap_or_default();
    let edge = format!("{acme_id}.fall.{uid}.rekey.default.internal");
    checkpoint_until(addr, &acme, "fall", "the first half checkpointed", |v| {
        rekey_checkpointed(v, &input) == 2_000
    })
    .await?;
    produce_counter(&input, PARTITIONS, (2_000, 4_000), 500, &mut expected).await?;
    checkpoint_until(addr, &acme, "fall", "the second half checkpointed", |v| {
        rekey_checkpointed(v, &input) == 4_000
    })
    .await?;
    set_desired(addr, &acme, "fall", "stop").await?;
    // Running on from its checkpoints, a stage's records carry no origin: nothing they answer
    // can have been sent before.
    let (sent, with_origin) = records_with_origin(&edge)?;
    assert_eq!(
        (sent, with_origin),
        (4_000, 0),
        "records of {edge}, with an origin"
    );

    // Every checkpoint of the first stage's partition 0 past its oldest retained one loses its
    // snapshot: recovery falls back to that one.
    let (store, objects) = stored_objects(&store_url).await?;
    let manifest = objects
        .iter()
        .map(|o| o.location.to_string())
        .find(|p| p.contains("@rekey/shards/00000/manifest/"))
        .ok_or_else(|| anyhow::anyhow!("no manifest of the rekey stage's partition 0"))?;
    let root = &manifest[..manifest.find("/manifest/").unwrap_or(manifest.len())];
    let manifests = ManifestStore::new(store.clone(), object_store::path::Path::from(root));
    let mut checkpoints = Vec::new();
    for version in manifests.versions().await? {
        let m = manifests.read(version).await?;
        // (A checkpoint asked for before the first record has no offset.)
        if m.kind == ManifestKind::Checkpoint
            && let Some(offset) = m.metadata.get(&format!("offset/{input}"))
        {
            checkpoints.push((offset.parse::<i64>()?, m.metadata["snapshot"].clone()));
        }
    }
    checkpoints.sort();
    let (oldest, kept) = checkpoints[0].clone();
    let newest = checkpoints.last().map_or(oldest, |(o, _)| *o);
    anyhow::ensure!(
        oldest < newest,
        "the retained checkpoints of partition 0 all cover {newest} records: {checkpoints:?}"
    );
    for (_, snapshot) in checkpoints
        .iter()
        .filter(|(o, s)| *o > oldest && *s != kept)
    {
        store
            .delete(&object_store::path::Path::from(format!(
                "{root}/{snapshot}"
            )))
            .await?;
    }

    // Started again: partition 0 of the first stage sends its records from `oldest` to
    // `newest` again; the second stage drops each of them and its counts stay exact.
    let dropped_before = repeats_dropped(&acme_id, "fall");
    set_desired(addr, &acme, "fall", "start").await?;
    let want = rekeyed(&expected, 7);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let path = "/v1/pipelines/fall/checkpoints";
        let (status, _, body) = call(addr, Method::POST, path, Some(&acme), None).await?;
        anyhow::ensure!(status == StatusCode::ACCEPTED, "{status}: {body}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let dropped = repeats_dropped(&acme_id, "fall") - dropped_before;
        let counted = count_state(addr, &acme, ("fall", "")).await?;
        if dropped >= (newest - oldest) as f64 && counted == want {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "after 90 s: {dropped} repeats dropped of {}, counts {counted:?} (want {want:?})",
            newest - oldest
        );
    }
    let counts = read_counts_until(&output, Duration::from_secs(60), |counts| {
        want.iter()
            .all(|(k, n)| counts.get(k).and_then(|c| c.last()) == Some(n))
    })
    .await?;
    for (key, seen) in &counts {
        assert!(
            seen.iter().max() <= want.get(key),
            "key {key} counted past {:?}: {seen:?}",
            want.get(key)
        );
    }
    assert_eq!(
        repeats_dropped(&acme_id, "fall") - dropped_before,
        (newest - oldest) as f64,
        "each record sent again dropped once"
    );
    // Only what partition 0 sent again, from below its group's committed offsets, names its
    // origin.
    let (_, with_origin) = records_with_origin(&edge)?;
    assert_eq!(with_origin, (newest - oldest) as u64);
    set_desired(addr, &acme, "fall", "stop").await?;
    assert_eq!(count_state(addr, &acme, ("fall", "")).await?, want);
    Ok(())
}
