//! The tree against a `BTreeMap` model, on the in-memory and the local-filesystem object store,
//! with a memtable of a few hundred bytes and tiny level targets, so that flushes, compactions
//! (into several levels) and GC really happen; plus reopening at any retained checkpoint.

use super::cache::{BlockCaches, CacheSettings, SstFiles};
use super::gc::{LiveWriter, collect_garbage};
use super::tree::{LsmSettings, LsmTree};
use crate::clock::{ManualClock, SharedClock};
use crate::ids::ManifestVersion;
use crate::state::manifest::{Manifest, ManifestKind, ManifestStore};
use crate::state::manifest::{Protected, RetentionPolicy};
use crate::state::test_support::block_on;
use crate::state::{Shard, StateWrite};
use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>, Vec<u8>, Option<u64>),
    Delete(Vec<u8>),
    Get(Vec<u8>),
    Scan(Vec<u8>, Option<Vec<u8>>, usize),
    Flush,
    Compact,
    Advance(u64),
    /// Flush and commit a checkpoint manifest.
    Checkpoint,
    /// Claim the shard as a new owner from one of the retained checkpoints (index modulo
    /// their number) and open the tree there; the model goes back to that checkpoint.
    ReopenAt(usize),
    /// Run GC with no grace period, keeping the last [`RETAINED`] checkpoints.
    Gc,
}

const RETAINED: usize = 3;

fn key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..4, 0..5)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (key(), proptest::collection::vec(any::<u8>(), 0..24), proptest::option::of(1u64..50))
            .prop_map(|(k, v, ttl)| Op::Put(k, v, ttl)),
        1 => key().prop_map(Op::Delete),
        2 => key().prop_map(Op::Get),
        2 => (key(), proptest::option::of(key()), 0usize..6).prop_map(|(p, a, l)| Op::Scan(p, a, l)),
        1 => Just(Op::Flush),
        1 => Just(Op::Compact),
        1 => (1u64..30).prop_map(Op::Advance),
        1 => Just(Op::Checkpoint),
        1 => any::<usize>().prop_map(Op::ReopenAt),
        1 => Just(Op::Gc),
    ]
}

/// A memtable of a few hundred bytes, 64-byte blocks, compaction from two L0 SSTs and level
/// targets of a few hundred bytes, so that flushes, multi-block SSTs and compactions into
/// several levels happen within a few dozen writes.
pub(crate) fn small_settings() -> LsmSettings {
    LsmSettings {
        memtable_bytes_max: 400,
        block_size_bytes: 64,
        target_file_bytes: 256,
        l0_compaction_trigger: 2,
        level_base_bytes: 512,
        level_size_ratio: 2,
        levels_max: 4,
        ..LsmSettings::default()
    }
}

/// Which caches the tree reads through: none, a memory tier only, or both tiers (small, so
/// that evictions happen).
fn files(store: Arc<dyn ObjectStore>, caches: u8) -> SstFiles {
    let settings = match caches {
        0 => CacheSettings::default(),
        1 => CacheSettings {
            block_cache_bytes: 2 << 10,
            ..CacheSettings::default()
        },
        _ => CacheSettings {
            block_cache_bytes: 1 << 10,
            disk_cache_bytes: 2 << 10,
            disk_cache_dir: None,
        },
    };
    SstFiles::new(
        store,
        Arc::new(BlockCaches::new(&settings).expect("caches")),
    )
}

/// The model: key → (value, expiry).
type Model = BTreeMap<Vec<u8>, (Vec<u8>, Option<u64>)>;

fn live(model: &Model, now: u64) -> impl Iterator<Item = (&Vec<u8>, &Vec<u8>)> {
    model
        .iter()
        .filter(move |(_, (_, at))| at.is_none_or(|at| now < at))
        .map(|(k, (v, _))| (k, v))
}

async fn check_everything(tree: &LsmTree, model: &Model, now: u64) -> Result<(), TestCaseError> {
    let got: Vec<(Vec<u8>, Vec<u8>)> = tree
        .scan(b"", None, usize::MAX)
        .await
        .expect("scan")
        .into_iter()
        .map(|(k, v)| (k, v.to_vec()))
        .collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = live(model, now)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    prop_assert_eq!(&got, &want);
    for (k, v) in want {
        prop_assert_eq!(
            tree.get(&k).await.expect("get").map(|b| b.to_vec()),
            Some(v)
        );
    }
    Ok(())
}

// The model-based test's interpreter: one arm per operation, each next to what the model does
// for it, so that the tree and the model are read side by side.
#[allow(clippy::too_many_lines)]
async fn run(store: Arc<dyn ObjectStore>, caches: u8, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(1_000);
    let shared: SharedClock = Arc::new(clock.clone());
    let settings = small_settings();
    let root = Path::from("shard");
    let files = files(store.clone(), caches);
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let mut owner = manifests.claim("owner-0", None, &[]).await.expect("claims");
    let mut tree = LsmTree::new(
        files.clone(),
        root.clone(),
        owner.writer_epoch,
        settings.clone(),
        shared.clone(),
    );
    let mut model = Model::new();
    let mut checkpoints: Vec<(Manifest, Model)> = Vec::new();
    let mut compactions = 0;
    let mut last = owner.clone();
    for op in ops {
        let now = clock.now_ms_for_test();
        match op {
            Op::Put(k, v, ttl) => {
                let at = ttl.map(|t| now + t);
                tree.apply(vec![StateWrite {
                    key: k.clone(),
                    value: Some(Bytes::from(v.clone())),
                    expires_at_ms: at,
                }])
                .await
                .expect("apply");
                model.insert(k, (v, at));
            }
            Op::Delete(k) => {
                tree.apply(vec![StateWrite {
                    key: k.clone(),
                    value: None,
                    expires_at_ms: None,
                }])
                .await
                .expect("apply");
                model.remove(&k);
            }
            Op::Get(k) => {
                let got = tree.get(&k).await.expect("get").map(|b| b.to_vec());
                let want = live(&model, now)
                    .find(|(mk, _)| **mk == k)
                    .map(|(_, v)| v.clone());
                prop_assert_eq!(got, want);
            }
            Op::Scan(prefix, after, limit) => {
                let got: Vec<(Vec<u8>, Vec<u8>)> = tree
                    .scan(&prefix, after.as_deref(), limit)
                    .await
                    .expect("scan")
                    .into_iter()
                    .map(|(k, v)| (k, v.to_vec()))
                    .collect();
                let want: Vec<(Vec<u8>, Vec<u8>)> = live(&model, now)
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .filter(|(k, _)| after.as_ref().is_none_or(|a| k.as_slice() > a.as_slice()))
                    .take(limit)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                prop_assert_eq!(got, want);
            }
            Op::Flush => tree.flush().await.expect("flush"),
            Op::Compact => {
                tree.compact_until_settled().await.expect("compacts");
            }
            Op::Advance(ms) => clock.advance_ms(ms),
            Op::Checkpoint => {
                tree.flush().await.expect("flush");
                let seq = tree.next_seq();
                let checkpoint = last.next_checkpoint(tree.levels(), Default::default());
                manifests.commit(&checkpoint).await.expect("commits");
                tree.checkpoint_committed(seq);
                last = checkpoint.clone();
                checkpoints.push((checkpoint, model.clone()));
            }
            Op::ReopenAt(i) => {
                let retained = &checkpoints[checkpoints.len().saturating_sub(RETAINED)..];
                if retained.is_empty() {
                    continue;
                }
                let (base, base_model) = retained[i % retained.len()].clone();
                compactions += tree.compactions();
                let token = format!("owner-{}", owner.writer_epoch);
                owner = manifests
                    .claim(&token, Some(&base), &[])
                    .await
                    .expect("claims");
                last = owner.clone();
                tree = LsmTree::open(
                    files.clone(),
                    root.clone(),
                    &owner,
                    owner.writer_epoch,
                    settings.clone(),
                    shared.clone(),
                )
                .expect("opens");
                prop_assert_eq!(tree.loaded_ssts(), 0, "opening reads no SST");
                model = base_model;
            }
            Op::Gc => {
                let gc = RetentionPolicy {
                    retained_checkpoints: RETAINED,
                    grace: Duration::ZERO,
                    ..RetentionPolicy::default()
                };
                let now_ms = crate::clock::Clock::now_ms(&crate::clock::SystemClock) + 1;
                collect_garbage(
                    &store,
                    &root,
                    &LiveWriter::of(&tree, &gc),
                    &Protected::default(),
                    &gc,
                    now_ms,
                )
                .await
                .expect("gc");
            }
        }
    }
    // Every case ends with enough writes to flush and compact, and a full comparison.
    let now = clock.now_ms_for_test();
    for i in 0u8..40 {
        let k = vec![9, i];
        tree.apply(vec![StateWrite {
            key: k.clone(),
            value: Some(Bytes::from(vec![i; 20])),
            expires_at_ms: None,
        }])
        .await
        .expect("apply");
        model.insert(k, (vec![i; 20], None));
    }
    tree.flush().await.expect("flush");
    tree.compact_until_settled().await.expect("compacts");
    compactions += tree.compactions();
    prop_assert!(compactions > 0, "no compaction ran");
    check_everything(&tree, &model, now).await?;
    // Every SST the tree holds was written through to the store under its epoch's name.
    for id in tree.live_ssts() {
        let path = Path::from(format!("shard/{}", id.object_name()));
        prop_assert!(store.head(&path).await.is_ok(), "{} is in the store", path);
        prop_assert!(id.writer_epoch <= owner.writer_epoch);
    }
    // Every retained checkpoint still opens and reads back exactly its model (GC kept it).
    for (base, base_model) in &checkpoints[checkpoints.len().saturating_sub(RETAINED)..] {
        let reader = LsmTree::open(
            files.clone(),
            root.clone(),
            base,
            u64::MAX,
            settings.clone(),
            shared.clone(),
        )
        .expect("opens");
        check_everything(&reader, base_model, now).await?;
    }
    Ok(())
}

impl ManualClock {
    fn now_ms_for_test(&self) -> u64 {
        crate::clock::Clock::now_ms(self)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tree_agrees_with_a_btreemap_model_on_the_in_memory_store(
        ops in proptest::collection::vec(op(), 1..150),
        caches in 0u8..3,
    ) {
        block_on(run(Arc::new(InMemory::new()), caches, ops))?;
    }

    #[test]
    fn tree_agrees_with_a_btreemap_model_on_the_local_filesystem_store(
        ops in proptest::collection::vec(op(), 1..150),
        caches in 0u8..3,
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = LocalFileSystem::new_with_prefix(dir.path()).expect("local store");
        block_on(run(Arc::new(store), caches, ops))?;
    }
}

fn memory_files(store: &Arc<dyn ObjectStore>) -> SstFiles {
    files(store.clone(), 0)
}

#[test]
fn flushes_happen_and_reads_span_memtable_and_ssts() {
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let settings = small_settings();
        let tree = LsmTree::new(memory_files(&store), Path::from("s"), 1, settings, clock);
        for i in 0u32..100 {
            let w = StateWrite {
                key: i.to_be_bytes().to_vec(),
                value: Some(Bytes::from(format!("v{i}"))),
                expires_at_ms: None,
            };
            tree.apply(vec![w]).await.expect("apply");
        }
        assert!(
            tree.live_ssts().len() >= 3,
            "{:?} SSTs per level",
            tree.level_counts()
        );
        assert!(tree.compactions() > 0, "flushes went on to compactions");
        for i in 0u32..100 {
            let got = tree.get(&i.to_be_bytes()).await.expect("get");
            assert_eq!(got, Some(Bytes::from(format!("v{i}"))));
        }
        let all = tree.scan(b"", None, 1000).await.expect("scan");
        assert_eq!(all.len(), 100);
    });
}

/// Write, flush, record a checkpoint manifest, then open the tree at that manifest as a new
/// owner: opening reads no SST, the first read fetches them, and the contents are equal.
#[test]
fn a_tree_reopened_from_a_checkpoint_manifest_reads_lazily_and_sees_everything() {
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let settings = small_settings();
        let manifests = ManifestStore::new(store.clone(), Path::from("s"));
        let claim = manifests
            .claim("writer-a", None, &[])
            .await
            .expect("claims");
        let tree = LsmTree::new(
            memory_files(&store),
            Path::from("s"),
            claim.writer_epoch,
            settings.clone(),
            clock.clone(),
        );
        for i in 0u32..60 {
            let w = StateWrite {
                key: i.to_be_bytes().to_vec(),
                value: (i % 7 != 0).then(|| Bytes::from(format!("v{i}"))),
                expires_at_ms: None,
            };
            tree.apply(vec![w]).await.expect("apply");
        }
        tree.flush().await.expect("flush");
        let checkpoint = claim.next_checkpoint(
            tree.levels(),
            [("offset.0".to_owned(), "60".to_owned())].into(),
        );
        manifests.commit(&checkpoint).await.expect("commits");

        let b = manifests
            .claim("writer-b", Some(&checkpoint), &[])
            .await
            .expect("b claims");
        let reopened = LsmTree::open(
            memory_files(&store),
            Path::from("s"),
            &b,
            b.writer_epoch,
            settings,
            clock,
        )
        .expect("opens");
        assert_eq!(reopened.l0_ssts(), tree.l0_ssts());
        assert_eq!(reopened.loaded_ssts(), 0, "opening reads nothing");
        for i in 0u32..60 {
            let want = (i % 7 != 0).then(|| Bytes::from(format!("v{i}")));
            assert_eq!(
                reopened.get(&i.to_be_bytes()).await.expect("get"),
                want,
                "key {i}"
            );
        }
        assert_eq!(reopened.loaded_ssts(), reopened.live_ssts().len());
        assert_eq!(
            reopened.scan(b"", None, 1000).await.expect("scan").len(),
            60 - 9
        );
    });
}

#[test]
fn a_missing_sst_named_by_the_manifest_is_corruption_not_an_outage() {
    use crate::state::StateError;
    use crate::state::manifest::SstRef;
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let manifest = Manifest {
            version: ManifestVersion(2),
            parent: Some(ManifestVersion(1)),
            kind: ManifestKind::Claim,
            writer_epoch: 2,
            writer_token: "b".into(),
            levels: vec![vec![SstRef {
                writer_epoch: 1,
                seq: 0,
                size_bytes: 1000,
                first_key: b"a".to_vec(),
                last_key: b"z".to_vec(),
            }]],
            metadata: Default::default(),
            rejected: Vec::new(),
        };
        let tree = LsmTree::open(
            memory_files(&store),
            Path::from("s"),
            &manifest,
            2,
            LsmSettings::default(),
            clock,
        )
        .expect("opens without reading");
        let err = tree.get(b"k").await.expect_err("the SST is missing");
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
    });
}

/// A fresh bucket on the S3-compatible server of `deploy/local/s3.sh`
/// (`WEIR_S3_ENDPOINT`, default `http://127.0.0.1:9000`).
fn s3_bucket_store() -> Arc<dyn ObjectStore> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let endpoint =
        std::env::var("WEIR_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:9000".into());
    let bucket = format!("weir-lsm-{}-{}", std::process::id(), next_bucket());
    let created = block_on(async {
        reqwest::Client::new()
            .put(format!("{endpoint}/{bucket}"))
            .send()
            .await
    });
    match created {
        Ok(r) if r.status().is_success() => {}
        other => panic!("CreateBucket on {endpoint} failed ({other:?}); is deploy/local/s3.sh up?"),
    }
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .build()
        .expect("an S3 client builds");
    Arc::new(store)
}

fn next_bucket() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

proptest! {
    // The S3 server answers one request at a time; fewer, shorter cases.
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// The same model test against a real S3-compatible server: range GETs, create-only PUTs,
    /// LIST and DELETE (GC) over HTTP.
    #[test]
    fn tree_agrees_with_a_btreemap_model_on_the_s3_server(
        ops in proptest::collection::vec(op(), 1..80),
        caches in 0u8..3,
    ) {
        let store = s3_bucket_store();
        block_on(run(store, caches, ops))?;
    }
}

mod compaction_race;
