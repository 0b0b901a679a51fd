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
use crate::ids::ManifestVersion;
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
        let versions = match &recovery.listed {
            Some(versions) => versions.clone(),
            None => crate::state::lsm::backend::listed_versions(&storage.store, &root).await?,
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

    fn stored(&self, id: &ShardId) -> Option<crate::state::stored::StoredShard> {
        let storage = self.storage.as_ref()?;
        Some(crate::state::stored::StoredShard {
            store: storage.store.clone(),
            root: id.root_under(&storage.prefix),
            format: crate::state::stored::CheckpointFormat::Memory,
            clock: self.clock.clone(),
        })
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

    fn opened_from(&self) -> Option<ManifestVersion> {
        self.snapshots
            .as_ref()
            .and_then(SnapshotShard::recovered_version)
    }

    fn resumed_from(&self) -> Option<ManifestVersion> {
        self.snapshots
            .as_ref()
            .and_then(SnapshotShard::resumed_from)
    }

    async fn next_checkpoint_version(&self) -> Option<ManifestVersion> {
        match &self.snapshots {
            Some(snapshots) => Some(snapshots.next_version().await),
            None => None,
        }
    }

    fn checkpoint_decided(&self, version: ManifestVersion) {
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
                version: ManifestVersion(version),
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
mod tests;
