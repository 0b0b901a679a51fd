//! Disaster recovery from a replica of the store (issue 20, item 4) on the real broker and S3
//! server: a running pipeline's objects are copied to a second bucket late and out of order, as
//! cross-region replication does, with the newest objects missing; hosts started on the second
//! bucket open each shard's newest checkpoint whose every object is present (recording, and
//! auditing, the others they fall back past), replay Kafka from its offsets and end exact.

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;
use std::time::Duration;
use weir_host::ids::ManifestVersion;
use weir_host::state::lsm::backend::object_store_from_url;
use weir_host::state::manifest::{ManifestKind, ManifestStore};
use weir_host::state::snapshot::snapshot_name;
use weir_tests::api::*;
use weir_tests::*;

const KEYS: u64 = 30;
const ROUND: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lsm_pipeline_fails_over_to_a_lagging_replica_and_ends_exact() -> anyhow::Result<()> {
    fail_over("lsm", "at_least_once").await
}

/// Exactly-once: Kafka's committed offsets name a checkpoint the replica lacks; the restore
/// behind it re-emits the outputs since (audited), and the counts still end exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_pipeline_fails_over_behind_its_committed_checkpoint() -> anyhow::Result<()>
{
    fail_over("lsm", "exactly_once").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_pipeline_fails_over_to_a_lagging_replica_and_ends_exact() -> anyhow::Result<()> {
    fail_over("memory", "at_least_once").await
}

/// A pipeline on `backend` with `delivery` fails over to a replica that lacks the newest
/// objects (module docs).
async fn fail_over(backend: &str, delivery: &str) -> anyhow::Result<()> {
    let primary = format!("s3://{}/weir", create_s3_bucket().await?);
    let replica = format!("s3://{}/weir", create_s3_bucket().await?);
    let (region_down, down) = tokio::sync::oneshot::channel::<()>();
    let (addr_a, runner_a) =
        start_server_on(&primary, Some(runner_config(&unique("dr-a"))), async move {
            let _ = down.await;
        })
        .await?;
    let tenant = tenant_id("dr");
    let key = tenant_with_key(addr_a, &tenant).await?;
    upload_counter(addr_a, &key, 1).await?;
    let extra = json!({"state_backend": backend, "delivery": delivery});
    let (input, output) = counter_pipeline_p(addr_a, &key, &tenant, extra).await?;

    // Three rounds, each checkpointed: every shard has several checkpoints, each with objects
    // (SSTs, a snapshot) of its own.
    let mut expected = BTreeMap::new();
    for round in 0..3 {
        produce_counter(
            &input,
            2,
            (round * ROUND, (round + 1) * ROUND),
            KEYS,
            &mut expected,
        )
        .await?;
        checkpointed(addr_a, &key, "p", (round + 1) * ROUND).await?;
    }

    // A fourth round in flight while the replication copies what it listed, in an order of its
    // own; then the primary region goes down (its last writes never reach the replica).
    produce_counter(&input, 2, (3 * ROUND, 4 * ROUND), KEYS, &mut expected).await?;
    let (from, from_prefix) = object_store_from_url(&primary, &s3_options())?;
    let (to, _) = object_store_from_url(&replica, &s3_options())?;
    let copied = replicate_out_of_order(&from, &to, &from_prefix).await?;
    assert!(copied > 0, "nothing replicated");
    let _ = region_down.send(());
    runner_a.expect("runs pipelines").await?;

    // The newest objects missing: in every shard, the objects that the newest checkpoint
    // adding any brought (replication had not copied them yet).
    let shards = shard_roots(&to, &tenant).await?;
    assert_eq!(shards.len(), 2, "two shards replicated: {shards:?}");
    let mut skipped: BTreeMap<Path, (BTreeSet<ManifestVersion>, ManifestVersion)> = BTreeMap::new();
    for root in &shards {
        let (incomplete, newest_complete) = drop_newest_objects(&to, root).await?;
        skipped.insert(root.clone(), (incomplete, newest_complete));
    }

    // Verify on the replica (a host that runs nothing) names the incomplete checkpoints and
    // the newest complete one of each shard.
    let (addr_b, _) = start_server_on(&replica, None, std::future::pending()).await?;
    let verified = verify_quick(addr_b, &key, "p").await?;
    for shard in verified["shards"].as_array().into_iter().flatten() {
        let root = shards
            .iter()
            .find(|r| {
                let partition = shard["partition"].as_i64().unwrap_or(-1);
                r.as_ref().ends_with(&format!("/{partition:05}"))
            })
            .expect("a replicated shard");
        let (incomplete, newest_complete) = &skipped[root];
        for version in shard["versions"].as_array().into_iter().flatten() {
            let v = version["version"].as_u64().expect("a version");
            if incomplete.contains(&v) {
                assert_eq!(version["restorable"], false, "{version}");
                let problem = version["problem"].as_str().unwrap_or_default();
                assert!(problem.contains("missing"), "{version}");
            }
        }
        let newest = shard["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["restorable"] == true)
            .and_then(|v| v["version"].as_u64())
            .map(ManifestVersion);
        assert_eq!(newest, Some(*newest_complete), "{shard}");
    }

    // Hosts on the replica: the catalog came with the state (the tenant's key works, the
    // pipeline is there and running).
    let mut stored_before = BTreeMap::new();
    for root in &shards {
        let versions = ManifestStore::new(to.clone(), root.clone())
            .versions()
            .await?;
        stored_before.insert(root.clone(), versions.last().copied().unwrap_or_default());
    }
    let (addr_b, _) = start_server_on(
        &replica,
        Some(runner_config(&unique("dr-b"))),
        std::future::pending(),
    )
    .await?;

    // Each shard's new owner claimed it from the newest complete checkpoint, recording the
    // incomplete ones it fell back past (with an audit line each, logged by the same call) —
    // exactly-once from the newest complete one that is also decided, which may be older.
    // Read before more input: an idle shard neither checkpoints nor collects its claim.
    for (root, (incomplete, newest_complete)) in &skipped {
        let claim = claim_above(&to, root, stored_before[root]).await?;
        if delivery == "exactly_once" {
            assert!(
                claim.parent.is_some_and(|p| p <= *newest_complete),
                "shard {root}: {claim:?}"
            );
        } else {
            assert_eq!(
                claim.parent,
                Some(*newest_complete),
                "shard {root}: {claim:?}"
            );
            for version in incomplete {
                let recorded = claim.rejected.iter().find(|r| r.version == *version);
                assert!(
                    recorded.is_some_and(|r| r.reason.contains("missing")),
                    "shard {root}: version {version} not recorded as skipped: {claim:?}"
                );
            }
        }
    }
    produce_counter(&input, 2, (4 * ROUND, 5 * ROUND), KEYS, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(90)).await?;
    assert_counts_exact(&expected, &counts);
    checkpointed(addr_b, &key, "p", 5 * ROUND).await?;
    Ok(())
}

/// The first claim written in the shard at `root` above version `above` (a new owner's),
/// waited for.
async fn claim_above(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    above: ManifestVersion,
) -> anyhow::Result<weir_host::state::manifest::Manifest> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        for version in manifests.versions().await? {
            if version > above {
                let manifest = manifests.read(version).await?;
                if manifest.kind == ManifestKind::Claim {
                    return Ok(manifest);
                }
            }
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{root}: no new owner claimed it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copies what `from` lists under `prefix` to `to`, in an order unrelated to the objects'
/// age, skipping what is deleted meanwhile (GC); returns how many it copied.
async fn replicate_out_of_order(
    from: &Arc<dyn ObjectStore>,
    to: &Arc<dyn ObjectStore>,
    prefix: &Path,
) -> anyhow::Result<usize> {
    let mut listed: Vec<Path> = from
        .list(Some(prefix))
        .map_ok(|meta| meta.location)
        .try_collect()
        .await?;
    let order = BuildHasherDefault::<DefaultHasher>::default();
    listed.sort_by_key(|path| order.hash_one(path.as_ref()));
    let mut copied = 0;
    for path in listed {
        match from.get(&path).await {
            Ok(got) => {
                to.put(&path, got.bytes().await?.into()).await?;
                copied += 1;
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(copied)
}

/// The state shards of `tenant`'s pipeline in `store` (each `…/shards/{partition:05}`).
async fn shard_roots(store: &Arc<dyn ObjectStore>, tenant: &str) -> anyhow::Result<Vec<Path>> {
    let listed: Vec<Path> = store
        .list(None)
        .map_ok(|meta| meta.location)
        .try_collect()
        .await?;
    let roots: BTreeSet<String> = listed
        .iter()
        .filter_map(|path| {
            let path = path.as_ref();
            let (root, _) = path.split_once("/manifest/")?;
            (root.contains(tenant) && root.contains("/shards/")).then(|| root.to_owned())
        })
        .collect();
    Ok(roots.into_iter().map(Path::from).collect())
}

/// Deletes from the shard at `root` the objects (SSTs, snapshot) that its newest checkpoint
/// adding any (to its previous checkpoint) added; returns the checkpoints newer than the newest
/// one left complete (which a recovery skips), and that one.
async fn drop_newest_objects(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
) -> anyhow::Result<(BTreeSet<ManifestVersion>, ManifestVersion)> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let mut checkpoints = Vec::new(); // newest first: (version, its objects)
    for version in manifests.versions().await?.into_iter().rev() {
        let manifest = manifests.read(version).await?;
        if manifest.kind == ManifestKind::Checkpoint {
            let mut objects: HashSet<String> = manifest
                .levels
                .iter()
                .flatten()
                .map(|r| r.id().object_name())
                .collect();
            objects.extend(snapshot_name(&manifest.metadata).map(str::to_owned));
            checkpoints.push((version, objects));
        }
    }
    let dropped: HashSet<String> = checkpoints
        .windows(2)
        .map(|pair| pair[0].1.difference(&pair[1].1).cloned().collect())
        .find(|added: &HashSet<String>| !added.is_empty())
        .ok_or_else(|| anyhow::anyhow!("{root}: no checkpoint added objects: {checkpoints:?}"))?;
    for name in &dropped {
        store.delete(&Path::from(format!("{root}/{name}"))).await?;
    }
    // Newest first, the checkpoints up to the first whose every object is present (some may
    // also lack objects that GC deleted between the listing and the copy).
    let shard_prefix = format!("{root}/");
    let present: HashSet<String> = store
        .list(Some(root))
        .map_ok(|meta| {
            let path = meta.location.as_ref();
            path.strip_prefix(&shard_prefix).unwrap_or(path).to_owned()
        })
        .try_collect()
        .await?;
    let newest_complete = checkpoints
        .iter()
        .find(|(_, objects)| objects.is_subset(&present))
        .map(|(v, _)| *v)
        .ok_or_else(|| anyhow::anyhow!("{root}: no complete checkpoint left"))?;
    let incomplete: BTreeSet<ManifestVersion> = checkpoints
        .iter()
        .map(|(v, _)| *v)
        .filter(|v| *v > newest_complete)
        .collect();
    Ok((incomplete, newest_complete))
}
