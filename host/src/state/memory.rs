//! The `memory` state backend: one ordered map per shard in RAM, as Flink's
//! HashMapStateBackend (but ordered, so map states are prefix scans).
//!
//! Not durable: dropping the shard drops its state. Until checkpoints exist, a pipeline that
//! restarts or loses a partition rebuilds it by re-reading the input from the beginning.
//! Expired entries (TTL) read as absent; they are dropped only when overwritten or deleted
//! (the memory backend has no compaction; the LSM backend drops them in compaction).

use super::{Shard, ShardId, StateBackend, StateError, StateWrite};
use crate::clock::SharedClock;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::RwLock;

/// Creates [`MemoryShard`]s.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    clock: SharedClock,
}

impl MemoryBackend {
    /// A backend whose TTLs are measured on `clock`.
    pub fn new(clock: SharedClock) -> Self {
        Self { clock }
    }
}

impl StateBackend for MemoryBackend {
    type Shard = MemoryShard;

    async fn open_shard(&self, _id: &ShardId) -> Result<MemoryShard, StateError> {
        Ok(MemoryShard {
            clock: self.clock.clone(),
            entries: RwLock::new(BTreeMap::new()),
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

/// One shard's state in an ordered map. Readers share a lock; `apply` takes it exclusively.
#[derive(Debug)]
pub struct MemoryShard {
    clock: SharedClock,
    entries: RwLock<BTreeMap<Vec<u8>, Entry>>,
}

impl MemoryShard {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Vec<u8>, Entry>> {
        // A poisoned lock means a panic while applying a batch; the map itself is still a valid
        // map (`apply` inserts one entry at a time), so reading on is sound.
        self.entries.read().unwrap_or_else(|e| e.into_inner())
    }

    fn lookup(map: &BTreeMap<Vec<u8>, Entry>, key: &[u8], now_ms: u64) -> Option<Bytes> {
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
            .range::<[u8], _>((lower, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, e)| e.live(now_ms))
            .take(limit)
            .map(|(k, e)| (k.clone(), e.value.clone()))
            .collect())
    }

    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        let mut map = self.entries.write().unwrap_or_else(|e| e.into_inner());
        for write in writes {
            match write.value {
                Some(value) => {
                    map.insert(
                        write.key,
                        Entry {
                            value,
                            expires_at_ms: write.expires_at_ms,
                        },
                    );
                }
                None => {
                    map.remove(&write.key);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;
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
        /// Gets and prefix scans agree with a `BTreeMap` model after any sequence of writes.
        #[test]
        fn memory_shard_agrees_with_btreemap_model(ops in proptest::collection::vec(op(), 1..64)) {
            let s = shard(ManualClock::new(0));
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            futures::executor::block_on(async {
                for op in ops {
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
}
