//! Reads and writes of a tree: a point lookup (the memtables, then level 0 newest first, then
//! the one SST of each sorted level whose range holds the key), and the [`Shard`] interface
//! over them — a write goes to the memtable, which is frozen for a flush once full.

use super::*;

impl Inner {
    pub(super) async fn index_of(&self, sst: &OpenSst) -> Result<Arc<SstIndex>, StateError> {
        sst.index
            .get_or_try_init(|| async {
                self.files
                    .open_index(&sst.path, sst.meta.size_bytes)
                    .await
                    .map(Arc::new)
                    .map_err(|e| self.fetch_error(sst.meta.id(), Arc::new(e)))
            })
            .await
            .cloned()
    }

    pub(super) async fn sst_get(
        &self,
        sst: &OpenSst,
        key: &[u8],
    ) -> Result<Option<Entry>, StateError> {
        let index = self.index_of(sst).await?;
        let Some(handle) = index.block_for(key) else {
            return Ok(None);
        };
        let block = self
            .files
            .read_block(&sst.path, handle)
            .await
            .map_err(|e| self.fetch_error(sst.meta.id(), e))?;
        find_in_block(block, key).map_err(|e| self.corrupt_in(sst.meta.id(), e))
    }

    pub(super) async fn lookup(&self, key: &[u8]) -> Result<Option<Entry>, StateError> {
        let version = {
            let levels = self.read();
            if let Some(e) = levels.memtable.get(key) {
                return Ok(Some(e.clone()));
            }
            for m in levels.immutables.iter().rev() {
                if let Some(e) = m.get(key) {
                    return Ok(Some(e.clone()));
                }
            }
            levels.version.clone()
        };
        for sst in version.levels[0].iter().rev() {
            if sst.covers(key)
                && let Some(e) = self.sst_get(sst, key).await?
            {
                return Ok(Some(e));
            }
        }
        for level in &version.levels[1..] {
            let i = level.partition_point(|s| s.meta.last_key.as_slice() < key);
            if let Some(sst) = level.get(i)
                && sst.covers(key)
                && let Some(e) = self.sst_get(sst, key).await?
            {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// Whether `entry` is a value that has not expired at `now_ms`.
    pub(super) fn live_entry(&self, entry: &Entry, now_ms: u64) -> bool {
        matches!(entry, Entry::Put { expires_at_ms, .. } if expires_at_ms.is_none_or(|at| now_ms < at))
    }

    pub(super) fn live(&self, entry: Entry, now_ms: u64) -> Option<Bytes> {
        match entry {
            Entry::Put {
                value,
                expires_at_ms,
            } if expires_at_ms.is_none_or(|at| now_ms < at) => Some(value),
            _ => None,
        }
    }
}

impl Shard for LsmTree {
    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        let now_ms = self.inner.clock.now_ms();
        Ok(self
            .inner
            .lookup(key)
            .await?
            .and_then(|e| self.inner.live(e, now_ms)))
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, StateError> {
        let now_ms = self.inner.clock.now_ms();
        let found =
            futures::future::try_join_all(keys.iter().map(|k| self.inner.lookup(k))).await?;
        Ok(found
            .into_iter()
            .map(|e| e.and_then(|e| self.inner.live(e, now_ms)))
            .collect())
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StateError> {
        self.scan_into(prefix, start_after, limit, Vec::new()).await
    }

    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        let inner = &*self.inner;
        // Make room first, so that a refusal happens before anything is inserted: with the
        // immutable memtables at their limit, this write waits for a flush (and is refused if
        // it fails). Otherwise flushes run in the background.
        if inner.read().immutables.len() >= inner.settings.immutable_memtables_max
            && let Err(err) = inner.flush_immutables().await
            && inner.read().immutables.len() >= inner.settings.immutable_memtables_max
        {
            return Err(err);
        }
        inner.backpressure().await?;
        let (frozen, memtable_bytes) = {
            let mut levels = inner.write();
            for w in writes {
                let entry = match w.value {
                    Some(value) => Entry::Put {
                        value,
                        expires_at_ms: w.expires_at_ms,
                    },
                    None => Entry::Tombstone,
                };
                levels.memtable.insert(w.key, entry);
            }
            if levels.memtable.bytes() >= inner.settings.memtable_bytes_max {
                let frozen = Arc::new(std::mem::take(&mut levels.memtable));
                levels.immutables.push(frozen);
                (true, 0)
            } else {
                (false, levels.memtable.bytes())
            }
        };
        metrics::gauge!("weir_lsm_memtable_bytes", "shard" => inner.label.clone())
            .set(memtable_bytes as f64);
        if frozen {
            inner.flush_wanted.notify_one();
        }
        Ok(())
    }
}
