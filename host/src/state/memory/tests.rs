use super::*;
use crate::clock::ManualClock;
use crate::ids::{Offset, Partition};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

fn shard(clock: ManualClock) -> MemoryShard {
    let backend = MemoryBackend::new(Arc::new(clock));
    let id = ShardId {
        pipeline: "p".into(),
        partition: Partition(0),
    };
    futures::executor::block_on(backend.open_shard(&id)).expect("memory shards always open")
}

fn put(key: &[u8], value: &[u8], expires_at_ms: Option<u64>) -> StateWrite {
    StateWrite {
        key: key.to_vec(),
        value: Some(Bytes::copy_from_slice(value)),
        expires_at_ms,
    }
}

#[test]
fn expired_entries_read_as_absent() {
    let clock = ManualClock::new(1_000);
    let s = shard(clock.clone());
    futures::executor::block_on(async {
        s.apply(vec![put(b"a", b"1", Some(1_500)), put(b"b", b"2", None)])
            .await
            .expect("apply");
        assert_eq!(
            s.get(b"a").await.expect("get"),
            Some(Bytes::from_static(b"1"))
        );
        clock.advance_ms(500);
        assert_eq!(s.get(b"a").await.expect("get"), None);
        assert_eq!(
            s.get(b"b").await.expect("get"),
            Some(Bytes::from_static(b"2"))
        );
        let all = s.scan(b"", None, 10).await.expect("scan");
        assert_eq!(all, vec![(b"b".to_vec(), Bytes::from_static(b"2"))]);
    });
}

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    Scan(Vec<u8>, Option<Vec<u8>>, usize),
    Get(Vec<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    let key = proptest::collection::vec(0u8..4, 0..4);
    prop_oneof![
        (key.clone(), proptest::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(k, v)| Op::Put(k, v)),
        key.clone().prop_map(Op::Delete),
        (key.clone(), proptest::option::of(key.clone()), 0usize..5)
            .prop_map(|(p, a, l)| Op::Scan(p, a, l)),
        key.prop_map(Op::Get),
    ]
}

proptest! {
    /// Gets and prefix scans agree with a `BTreeMap` model after any sequence of writes,
    /// and the quota's count of bytes is the model's keys, values and overheads throughout.
    #[test]
    fn memory_shard_agrees_with_btreemap_model(ops in proptest::collection::vec(op(), 1..64)) {
        let id = ShardId { pipeline: "p".into(), partition: Partition(0) };
        let s = futures::executor::block_on(
            MemoryBackend::new(Arc::new(ManualClock::new(0)))
                .with_shard_bytes_max(u64::MAX)
                .open_shard(&id),
        )
        .expect("memory shards always open");
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        futures::executor::block_on(async {
            for op in ops {
                let bytes: u64 = model
                    .iter()
                    .map(|(k, v)| ENTRY_OVERHEAD_BYTES + (k.len() + v.len()) as u64)
                    .sum();
                prop_assert_eq!(s.quota().map(|q| q.used_bytes()), Some(bytes));
                match op {
                    Op::Put(k, v) => {
                        s.apply(vec![put(&k, &v, None)]).await.expect("apply");
                        model.insert(k, v);
                    }
                    Op::Delete(k) => {
                        s.apply(vec![StateWrite { key: k.clone(), value: None, expires_at_ms: None }])
                            .await.expect("apply");
                        model.remove(&k);
                    }
                    Op::Get(k) => {
                        let got = s.get(&k).await.expect("get").map(|b| b.to_vec());
                        prop_assert_eq!(got, model.get(&k).cloned());
                    }
                    Op::Scan(prefix, after, limit) => {
                        let got: Vec<(Vec<u8>, Vec<u8>)> = s
                            .scan(&prefix, after.as_deref(), limit).await.expect("scan")
                            .into_iter().map(|(k, v)| (k, v.to_vec())).collect();
                        let want: Vec<(Vec<u8>, Vec<u8>)> = model
                            .iter()
                            .filter(|(k, _)| k.starts_with(&prefix))
                            .filter(|(k, _)| after.as_ref().is_none_or(|a| k.as_slice() > a.as_slice()))
                            .take(limit)
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                }
            }
            Ok(())
        })?;
    }
}

fn durable(store: &Arc<object_store::memory::InMemory>) -> MemoryBackend {
    MemoryBackend::durable(
        store.clone(),
        Path::from("w"),
        Arc::new(ManualClock::new(1_000)),
    )
}

fn committed(version: Option<u64>) -> Recovery {
    Recovery {
        committed: version.map(ManifestVersion),
        ..Recovery::default()
    }
}

fn id() -> ShardId {
    ShardId {
        pipeline: "p".into(),
        partition: Partition(2),
    }
}

fn offsets(next: i64) -> InputOffsets {
    let mut offsets = InputOffsets::new();
    offsets.advance("in", Offset(next - 1));
    offsets
}

/// Expired entries leave the map (and the quota's count) at the next checkpoint, and are
/// not in its snapshot; nor is one that expires between a snapshot and its restore.
#[test]
fn expired_entries_are_dropped_at_checkpoints_and_restores() {
    crate::state::test_support::block_on(async {
        let store = Arc::new(object_store::memory::InMemory::new());
        let clock = ManualClock::new(1_000);
        let backend = || {
            MemoryBackend::durable(store.clone(), Path::from("w"), Arc::new(clock.clone()))
                .with_shard_bytes_max(1 << 20)
        };
        let a = backend().open_shard(&id()).await.expect("opens");
        a.apply(vec![
            put(b"gone", b"x", Some(1_500)),
            put(b"later", b"y", Some(3_000)),
            put(b"kept", b"z", None),
        ])
        .await
        .expect("applies");
        clock.advance_ms(1_000); // `gone` expired
        let report = a.checkpoint(&offsets(1), DecidedBy::Manifest).await;
        report.expect("checkpoints").expect("durable");
        assert_eq!(a.len(), 2, "`gone` left the map");
        assert_eq!(
            a.quota().map(|q| q.used_bytes()),
            Some(2 * ENTRY_OVERHEAD_BYTES + 5 + 4 + 2),
            "and the quota's count"
        );
        clock.advance_ms(1_000); // `later` expired too
        let b = backend().open_shard(&id()).await.expect("opens");
        assert_eq!(b.len(), 1, "only `kept` restored");
        assert_eq!(
            b.get(b"kept").await.expect("reads"),
            Some(Bytes::from_static(b"z"))
        );
    });
}

#[test]
fn a_durable_shard_resumes_from_its_decided_snapshot_and_fences_the_previous_owner() {
    crate::state::test_support::block_on(async {
        let store = Arc::new(object_store::memory::InMemory::new());
        let a = durable(&store).open_shard(&id()).await.expect("opens");
        assert_eq!(a.recovered_offsets().expect("decodes"), None, "new");
        a.apply(vec![put(b"k", b"v1", None), put(b"t", b"ttl", Some(9_000))])
            .await
            .expect("apply");
        let (ten, twenty) = (offsets(10), offsets(20));
        let first = a.checkpoint(&ten, DecidedBy::Transaction).await;
        let first = first.expect("checkpoint").expect("durable");
        a.apply(vec![put(b"k", b"v2", None)]).await.expect("apply");
        let second = a.checkpoint(&twenty, DecidedBy::Transaction).await;
        let second = second.expect("checkpoint").expect("durable");
        a.apply(vec![put(b"k", b"late", None)])
            .await
            .expect("apply");

        // Kafka names the second: it is decided.
        let b = durable(&store)
            .with_shard_bytes_max(1 << 20)
            .open_shard_at(&id(), &committed(Some(second.version.0)))
            .await
            .expect("b opens");
        assert_eq!(
            b.quota().map(|q| q.used_bytes()),
            Some(2 * ENTRY_OVERHEAD_BYTES + (1 + 2) + (1 + 3)),
            "a restored shard counts what it restored"
        );
        assert_eq!(b.recovered_offsets().expect("decodes"), Some(offsets(20)));
        assert_eq!(
            b.get(b"k").await.expect("get"),
            Some(Bytes::from_static(b"v2"))
        );
        assert_eq!(
            b.get(b"t").await.expect("get"),
            Some(Bytes::from_static(b"ttl")),
            "expiry kept"
        );
        let err = a
            .checkpoint(&offsets(30), DecidedBy::Transaction)
            .await
            .expect_err("b's claim fenced a");
        assert!(err.is_fenced(), "{err:?}");

        // Kafka names the first: the second was only prepared.
        let c = durable(&store)
            .open_shard_at(&id(), &committed(Some(first.version.0)))
            .await
            .expect("opens");
        assert_eq!(c.recovered_offsets().expect("decodes"), Some(offsets(10)));
        assert_eq!(
            c.get(b"k").await.expect("get"),
            Some(Bytes::from_static(b"v1"))
        );
        // Kafka names none: nothing is decided.
        let d = durable(&store)
            .open_shard_at(&id(), &committed(None))
            .await
            .expect("opens empty");
        assert!(d.is_empty());
    });
}

#[test]
fn a_corrupt_newest_snapshot_falls_back_to_the_previous_checkpoint() {
    use object_store::ObjectStoreExt;
    crate::state::test_support::block_on(async {
        let store = Arc::new(object_store::memory::InMemory::new());
        let a = durable(&store).open_shard(&id()).await.expect("opens");
        a.apply(vec![put(b"k", b"old", None)]).await.expect("apply");
        a.checkpoint(&offsets(5), DecidedBy::Manifest)
            .await
            .expect("checkpoint");
        a.apply(vec![put(b"k", b"new", None)]).await.expect("apply");
        a.checkpoint(&offsets(9), DecidedBy::Manifest)
            .await
            .expect("checkpoint");
        let snapshots: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(
            store.list(Some(&Path::from("w/pipelines/p/shards/00002/snapshot"))),
        )
        .await
        .expect("list");
        let newest = snapshots
            .iter()
            .map(|m| m.location.clone())
            .max()
            .expect("two snapshots");
        let bytes = store
            .get(&newest)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        let mut bad = bytes.to_vec();
        bad[10] ^= 1;
        store
            .put(&newest, object_store::PutPayload::from(bad))
            .await
            .expect("put");
        let b = durable(&store).open_shard(&id()).await.expect("falls back");
        assert_eq!(b.recovered_offsets().expect("decodes"), Some(offsets(5)));
        assert_eq!(
            b.get(b"k").await.expect("get"),
            Some(Bytes::from_static(b"old"))
        );
    });
}
