//! The tree against a `BTreeMap` model, on the in-memory and the local-filesystem object store,
//! with a memtable of a few hundred bytes so that flushes really happen.

use super::tree::{LsmSettings, LsmTree};
use crate::clock::{ManualClock, SharedClock};
use crate::state::manifest::{Manifest, ManifestKind, ManifestStore};
use crate::state::{Shard, StateWrite};
use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>, Vec<u8>, Option<u64>),
    Delete(Vec<u8>),
    Get(Vec<u8>),
    Scan(Vec<u8>, Option<Vec<u8>>, usize),
    Flush,
    Advance(u64),
    /// Flush, commit a checkpoint manifest, and reopen the tree at it as a new owner.
    Reopen,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..4, 0..5)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key(), proptest::collection::vec(any::<u8>(), 0..24), proptest::option::of(1u64..50))
            .prop_map(|(k, v, ttl)| Op::Put(k, v, ttl)),
        1 => key().prop_map(Op::Delete),
        2 => key().prop_map(Op::Get),
        2 => (key(), proptest::option::of(key()), 0usize..6).prop_map(|(p, a, l)| Op::Scan(p, a, l)),
        1 => Just(Op::Flush),
        1 => (1u64..30).prop_map(Op::Advance),
        1 => Just(Op::Reopen),
    ]
}

/// A memtable of a few hundred bytes and 64-byte blocks, so that flushes and multi-block SSTs
/// happen within a few writes.
fn small_settings() -> LsmSettings {
    LsmSettings {
        memtable_bytes_max: 400,
        block_size_bytes: 64,
        ..LsmSettings::default()
    }
}

/// The model: key → (value, expiry).
type Model = BTreeMap<Vec<u8>, (Vec<u8>, Option<u64>)>;

fn live(model: &Model, now: u64) -> impl Iterator<Item = (&Vec<u8>, &Vec<u8>)> {
    model
        .iter()
        .filter(move |(_, (_, at))| at.is_none_or(|at| now < at))
        .map(|(k, (v, _))| (k, v))
}

async fn run(store: Arc<dyn ObjectStore>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(1_000);
    let shared: SharedClock = Arc::new(clock.clone());
    let settings = small_settings();
    let manifests = ManifestStore::new(store.clone(), Path::from("shard"));
    let mut owner = manifests.claim("owner-0", None).await.expect("claims");
    let mut tree = LsmTree::new(
        store.clone(),
        Path::from("shard"),
        owner.writer_epoch,
        settings.clone(),
        shared.clone(),
    );
    let mut model = Model::new();
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
            Op::Advance(ms) => clock.advance_ms(ms),
            Op::Reopen => {
                tree.flush().await.expect("flush");
                let checkpoint = Manifest {
                    version: owner.version + 1,
                    parent: Some(owner.version),
                    kind: ManifestKind::Checkpoint,
                    writer_epoch: owner.writer_epoch,
                    writer_token: owner.writer_token.clone(),
                    levels: tree.levels(),
                    metadata: Default::default(),
                };
                manifests.commit(&checkpoint).await.expect("commits");
                let token = format!("owner-{}", owner.writer_epoch);
                owner = manifests
                    .claim(&token, Some(&checkpoint))
                    .await
                    .expect("claims");
                tree = LsmTree::open(
                    store.clone(),
                    Path::from("shard"),
                    &owner,
                    owner.writer_epoch,
                    settings.clone(),
                    shared.clone(),
                )
                .expect("opens");
            }
        }
    }
    // Every SST the tree holds was written through to the store under its epoch's name.
    for id in tree.l0_ssts() {
        let path = Path::from(format!("shard/{}", id.object_name()));
        prop_assert!(store.head(&path).await.is_ok(), "{} is in the store", path);
        prop_assert!(id.writer_epoch <= owner.writer_epoch);
    }
    Ok(())
}

impl ManualClock {
    fn now_ms_for_test(&self) -> u64 {
        crate::clock::Clock::now_ms(self)
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
        .block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tree_agrees_with_a_btreemap_model_on_the_in_memory_store(ops in proptest::collection::vec(op(), 1..120)) {
        block_on(run(Arc::new(InMemory::new()), ops))?;
    }

    #[test]
    fn tree_agrees_with_a_btreemap_model_on_the_local_filesystem_store(ops in proptest::collection::vec(op(), 1..120)) {
        let dir = std::env::temp_dir().join(format!("weir-lsm-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let store = LocalFileSystem::new_with_prefix(&dir).expect("local store");
        let result = block_on(run(Arc::new(store), ops));
        let _ = std::fs::remove_dir_all(&dir);
        result?;
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn flushes_happen_and_reads_span_memtable_and_ssts() {
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let settings = small_settings();
        let tree = LsmTree::new(store, Path::from("s"), 1, settings, clock);
        for i in 0u32..100 {
            let w = StateWrite {
                key: i.to_be_bytes().to_vec(),
                value: Some(Bytes::from(format!("v{i}"))),
                expires_at_ms: None,
            };
            tree.apply(vec![w]).await.expect("apply");
        }
        assert!(tree.l0_ssts().len() >= 5, "{} SSTs", tree.l0_ssts().len());
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
        let claim = manifests.claim("writer-a", None).await.expect("claims");
        let tree = LsmTree::new(
            store.clone(),
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
        let checkpoint = Manifest {
            version: claim.version + 1,
            parent: Some(claim.version),
            kind: ManifestKind::Checkpoint,
            writer_epoch: claim.writer_epoch,
            writer_token: claim.writer_token.clone(),
            levels: tree.levels(),
            metadata: [("offset.0".to_owned(), "60".to_owned())].into(),
        };
        manifests.commit(&checkpoint).await.expect("commits");

        let b = manifests
            .claim("writer-b", Some(&checkpoint))
            .await
            .expect("b claims");
        let reopened = LsmTree::open(store, Path::from("s"), &b, b.writer_epoch, settings, clock)
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
        assert_eq!(reopened.loaded_ssts(), reopened.l0_ssts().len());
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
            version: 2,
            parent: Some(1),
            kind: ManifestKind::Claim,
            writer_epoch: 2,
            writer_token: "b".into(),
            levels: vec![vec![SstRef {
                writer_epoch: 1,
                seq: 0,
            }]],
            metadata: Default::default(),
        };
        let tree = LsmTree::open(
            store,
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
