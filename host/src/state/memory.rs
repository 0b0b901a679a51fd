//! The `memory` state backend: one hash map per shard in RAM, as Flink's HashMapStateBackend,
//! with the keys also kept in order so that map states are prefix scans ([`Entries`]).
//!
//! Durable only with checkpoint storage (`state.memory.url`): then each checkpoint writes the
//! whole map as one snapshot object and commits it with a manifest ([`super::snapshot`]), and
//! a shard opens from its newest checkpoint. Without it, dropping the shard drops its state and
//! a restarted pipeline rebuilds it from the consumer group's start position.
//! Expired entries (TTL) read as absent; they are dropped only when overwritten or deleted
//! (the memory backend has no compaction; the LSM backend drops them in compaction).

use super::checkpoint::{CheckpointError, CheckpointReport, DecidedBy, InputOffsets};
use super::manifest::{ManifestError, RetentionPolicy, WriterTokens};
use super::snapshot::{self, SnapshotShard};
use super::{Recovery, Shard, ShardId, StateBackend, StateError, StateQuota, StateWrite};
use crate::clock::SharedClock;
use crate::runtime::batch::ENTRY_OVERHEAD_BYTES;
use bytes::Bytes;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::{Arc, RwLock};

/// Creates [`MemoryShard`]s.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    clock: SharedClock,
    storage: Option<CheckpointStorage>,
    /// Each shard's byte quota ([`Shard::quota`]), if any.
    shard_bytes_max: Option<u64>,
}

/// Where a durable memory backend keeps its snapshots.
#[derive(Debug, Clone)]
struct CheckpointStorage {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    tokens: WriterTokens,
    retention: RetentionPolicy,
}

impl MemoryBackend {
    /// A backend whose TTLs are measured on `clock`, keeping no checkpoint.
    pub fn new(clock: SharedClock) -> Self {
        Self {
            clock,
            storage: None,
            shard_bytes_max: None,
        }
    }

    /// The same, each shard holding at most `bytes` (keys, values and
    /// [`ENTRY_OVERHEAD_BYTES`] per entry): the runtime fails a record whose writes would
    /// pass it ([`Shard::quota`]). `weir serve` gives each partition of a `memory` pipeline
    /// its share of the pipeline's `state_bytes_max`.
    pub fn with_shard_bytes_max(mut self, bytes: u64) -> Self {
        self.shard_bytes_max = Some(bytes);
        self
    }

    /// A backend that checkpoints full snapshots to `store` under `prefix` (shard `p` of
    /// pipeline `x` under `{prefix}/pipelines/{x}/shards/{p:05}`, as the `lsm` backend).
    pub fn durable(store: Arc<dyn ObjectStore>, prefix: Path, clock: SharedClock) -> Self {
        Self {
            clock,
            storage: Some(CheckpointStorage {
                store,
                prefix,
                tokens: WriterTokens::new(),
                retention: RetentionPolicy::default(),
            }),
            shard_bytes_max: None,
        }
    }

    async fn open(&self, id: &ShardId, recovery: &Recovery) -> Result<MemoryShard, StateError> {
        let Some(storage) = &self.storage else {
            return Ok(MemoryShard {
                clock: self.clock.clone(),
                entries: RwLock::new(Entries::default()),
                quota: self
                    .shard_bytes_max
                    .map(|max| Arc::new(StateQuota::new(max))),
                snapshots: None,
            });
        };
        let root = id.root_under(&storage.prefix);
        let versions = crate::state::lsm::backend::listed_versions(&storage.store, &root).await?;
        // A checkpoint the `lsm` backend wrote (the pipeline switched backends) is converted
        // first.
        let converted = crate::state::convert::convert_foreign(
            &storage.store,
            &root,
            (recovery, &versions),
            (crate::state::export::ImportInto::Memory, "memory"),
            &self.clock,
        )
        .await?;
        let versions = match converted {
            Some(_) => crate::state::lsm::backend::listed_versions(&storage.store, &root).await?,
            None => versions,
        };
        let (snapshots, entries) = SnapshotShard::open(
            storage.store.clone(),
            root,
            (&storage.tokens.next(), versions),
            recovery,
            storage.retention.clone(),
            self.clock.clone(),
        )
        .await?;
        let mut restored = Entries::default();
        let now_ms = self.clock.now_ms();
        for (key, (value, expires_at_ms)) in entries {
            // Expired since the snapshot: it would read as absent; it is not kept.
            if expires_at_ms.is_some_and(|at| now_ms >= at) {
                continue;
            }
            restored.put(
                key,
                Entry {
                    value,
                    expires_at_ms,
                },
            );
        }
        Ok(MemoryShard {
            clock: self.clock.clone(),
            quota: self.shard_bytes_max.map(|max| {
                let quota = StateQuota::new(max);
                quota.set_used_bytes(restored.bytes);
                Arc::new(quota)
            }),
            entries: RwLock::new(restored),
            snapshots: Some(snapshots),
        })
    }
}

impl StateBackend for MemoryBackend {
    type Shard = MemoryShard;

    async fn open_shard(&self, id: &ShardId) -> Result<MemoryShard, StateError> {
        self.open(id, &Recovery::default()).await
    }

    async fn open_shard_at(
        &self,
        id: &ShardId,
        recovery: &Recovery,
    ) -> Result<MemoryShard, StateError> {
        self.open(id, recovery).await
    }
}

#[derive(Debug, Clone)]
struct Entry {
    value: Bytes,
    expires_at_ms: Option<u64>,
}

impl Entry {
    fn live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|at| now_ms < at)
    }
}

/// A shard's entries: a hash map for point reads and writes, and the same keys in order for
/// scans and snapshots. A write to an existing key touches only the hash map; a new or deleted
/// key also the order. Chosen by measurement (docs/bench.md, "The `memory` backend's map"):
/// against one `BTreeMap`, whose lookups, inserts and key comparisons were ~20 % of a keyed
/// counter's CPU, the keyed counter took 15 % less CPU per event (median of 10 alternating
/// runs each). A new key costs an insert in both; a key updated in place only the hash map.
#[derive(Debug, Default)]
struct Entries {
    map: foldhash::HashMap<Bytes, Entry>,
    /// The keys of `map` (sharing their bytes), in order.
    order: BTreeSet<Bytes>,
    /// Keys, values and [`ENTRY_OVERHEAD_BYTES`] per entry, over `map`.
    bytes: u64,
}

impl Entries {
    fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.map.get(key)
    }

    fn put(&mut self, key: Vec<u8>, entry: Entry) {
        if let Some(existing) = self.map.get_mut(key.as_slice()) {
            self.bytes =
                (self.bytes + entry.value.len() as u64).saturating_sub(existing.value.len() as u64);
            *existing = entry;
            return;
        }
        self.bytes += ENTRY_OVERHEAD_BYTES + (key.len() + entry.value.len()) as u64;
        let key = Bytes::from(key);
        self.order.insert(key.clone());
        self.map.insert(key, entry);
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(removed) = self.map.remove(key) {
            self.bytes = self
                .bytes
                .saturating_sub(ENTRY_OVERHEAD_BYTES + (key.len() + removed.value.len()) as u64);
            self.order.remove(key);
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    /// Entries from `lower` on, in key order.
    fn range<'a>(&'a self, lower: Bound<&[u8]>) -> impl Iterator<Item = (&'a Bytes, &'a Entry)> {
        self.order
            .range::<[u8], _>((lower, Bound::Unbounded))
            .filter_map(|k| self.map.get(k).map(|e| (k, e)))
    }
}

/// One shard's state ([`Entries`]). Readers share a lock; `apply` takes it exclusively.
#[derive(Debug)]
pub struct MemoryShard {
    clock: SharedClock,
    entries: RwLock<Entries>,
    /// The quota of [`Shard::quota`], told `entries.bytes` after each `apply`.
    quota: Option<Arc<StateQuota>>,
    /// Checkpoint storage and this owner's claim, when durable.
    snapshots: Option<SnapshotShard>,
}

impl MemoryShard {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Entries> {
        // A poisoned lock means a panic while applying a batch; the map itself is still a valid
        // map (`apply` inserts one entry at a time), so reading on is sound.
        self.entries.read().unwrap_or_else(|e| e.into_inner())
    }

    fn lookup(map: &Entries, key: &[u8], now_ms: u64) -> Option<Bytes> {
        map.get(key)
            .filter(|e| e.live(now_ms))
            .map(|e| e.value.clone())
    }

    /// Number of stored entries, expired ones included; for tests and metrics.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether the shard holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shard for MemoryShard {
    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        let now_ms = self.clock.now_ms();
        Ok(Self::lookup(&self.read(), key, now_ms))
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, StateError> {
        let now_ms = self.clock.now_ms();
        let map = self.read();
        Ok(keys.iter().map(|k| Self::lookup(&map, k, now_ms)).collect())
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StateError> {
        let now_ms = self.clock.now_ms();
        let map = self.read();
        let lower = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        Ok(map
            .range(lower)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, e)| e.live(now_ms))
            .take(limit)
            .map(|(k, e)| (k.to_vec(), e.value.clone()))
            .collect())
    }

    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        let mut map = self.entries.write().unwrap_or_else(|e| e.into_inner());
        for write in writes {
            match write.value {
                Some(value) => map.put(
                    write.key,
                    Entry {
                        value,
                        expires_at_ms: write.expires_at_ms,
                    },
                ),
                None => map.remove(&write.key),
            }
        }
        if let Some(quota) = &self.quota {
            quota.set_used_bytes(map.bytes);
        }
        Ok(())
    }

    fn quota(&self) -> Option<Arc<StateQuota>> {
        self.quota.clone()
    }

    fn stored_value_len(&self, key: &[u8]) -> Option<u64> {
        self.read().get(key).map(|e| e.value.len() as u64)
    }

    fn opened_from(&self) -> Option<u64> {
        self.snapshots
            .as_ref()
            .and_then(SnapshotShard::recovered_version)
    }

    async fn next_checkpoint_version(&self) -> Option<u64> {
        match &self.snapshots {
            Some(snapshots) => Some(snapshots.next_version().await),
            None => None,
        }
    }

    fn checkpoint_decided(&self, version: u64) {
        if let Some(snapshots) = &self.snapshots {
            snapshots.decided(version);
        }
    }

    async fn settle(&self, max: std::time::Duration) {
        if let Some(snapshots) = &self.snapshots {
            snapshots.settle(max).await;
        }
    }

    fn recovered_offsets(&self) -> Result<Option<InputOffsets>, StateError> {
        let Some(snapshots) = &self.snapshots else {
            return Ok(None);
        };
        let Some(metadata) = snapshots.recovered_metadata() else {
            return Ok(None);
        };
        InputOffsets::from_metadata(metadata)
            .map(Some)
            .map_err(|reason| StateError::corrupt(snapshots.root().to_string(), reason))
    }

    async fn checkpoint(
        &self,
        offsets: &InputOffsets,
        decided_by: DecidedBy,
    ) -> Result<Option<CheckpointReport>, CheckpointError> {
        let Some(snapshots) = &self.snapshots else {
            return Ok(None);
        };
        // Expired entries go first (they read as absent; kept, they would hold their share of
        // a quota for good): a pass over the map, as the snapshot's encoding is anyway.
        {
            let now_ms = self.clock.now_ms();
            let mut map = self.entries.write().unwrap_or_else(|e| e.into_inner());
            let expired: Vec<Bytes> = map
                .map
                .iter()
                .filter(|(_, e)| !e.live(now_ms))
                .map(|(k, _)| k.clone())
                .collect();
            for key in &expired {
                map.remove(key);
            }
            if let Some(quota) = &self.quota {
                quota.set_used_bytes(map.bytes);
            }
        }
        let object = {
            let map = self.read();
            let ordered = map.order.iter().filter_map(|k| {
                let e = map.map.get(k)?;
                Some((&k[..], &e.value, e.expires_at_ms))
            });
            snapshot::encode(ExactLen(ordered, map.len()))
        };
        let bytes = object.len() as u64;
        let metadata = super::checkpoint::checkpoint_metadata(offsets, decided_by);
        match snapshots.commit(object, metadata).await {
            Ok(version) => Ok(Some(CheckpointReport {
                version,
                state_bytes: bytes,
                uploaded_bytes: bytes,
            })),
            Err(ManifestError::Fenced { .. }) => Err(CheckpointError::Fenced {
                shard: snapshots.root().to_string(),
            }),
            Err(other) => Err(CheckpointError::State(StateError::Unavailable {
                shard: snapshots.root().to_string(),
                source: Box::new(other),
            })),
        }
    }
}

/// An iterator whose length is known (every ordered key is in the map).
struct ExactLen<I>(I, usize);

impl<I: Iterator> Iterator for ExactLen<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let item = self.0.next()?;
        self.1 = self.1.saturating_sub(1);
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.1, Some(self.1))
    }
}

impl<I: Iterator> ExactSizeIterator for ExactLen<I> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn shard(clock: ManualClock) -> MemoryShard {
        let backend = MemoryBackend::new(Arc::new(clock));
        let id = ShardId {
            pipeline: "p".into(),
            partition: 0,
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
            let id = ShardId { pipeline: "p".into(), partition: 0 };
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
            committed: version,
            ..Recovery::default()
        }
    }

    fn id() -> ShardId {
        ShardId {
            pipeline: "p".into(),
            partition: 2,
        }
    }

    fn offsets(next: i64) -> InputOffsets {
        let mut offsets = InputOffsets::new();
        offsets.advance("in", next - 1);
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
                .open_shard_at(&id(), &committed(Some(second.version)))
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
                .open_shard_at(&id(), &committed(Some(first.version)))
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
}
