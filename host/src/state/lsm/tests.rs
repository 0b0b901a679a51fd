//! The tree against a `BTreeMap` model, on the in-memory and the local-filesystem object store,
//! with a memtable of a few hundred bytes so that flushes really happen.

use super::tree::{LsmSettings, LsmTree};
use crate::clock::{ManualClock, SharedClock};
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
    ]
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
    let settings = LsmSettings {
        memtable_bytes_max: 400,
        block_size_bytes: 64,
        ..LsmSettings::default()
    };
    let tree = LsmTree::new(store.clone(), Path::from("shard"), 7, settings, shared);
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
        }
    }
    // Every SST the tree holds was written through to the store under its epoch's name.
    for id in tree.l0_ssts() {
        let path = Path::from(format!("shard/{}", id.object_name()));
        prop_assert!(store.head(&path).await.is_ok(), "{} is in the store", path);
        prop_assert_eq!(id.writer_epoch, 7);
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
        let settings = LsmSettings {
            memtable_bytes_max: 400,
            block_size_bytes: 64,
            ..LsmSettings::default()
        };
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
