//! [`LsmTree`]: one shard's LSM tree — write path (memtable → immutable memtable → SST written
//! through to object storage) and read path (memtable → immutable memtables → L0 newest first).
//!
//! Steps 2 and 4 of issue 3. A tree opened from a manifest reads nothing up front; each SST is
//! fetched whole on its first read. Not yet here: block and disk caches with one range GET per
//! data block, compaction, TTL dropping and GC, and the checkpoint wiring — so the tree is not
//! selectable in the config yet.
//!
//! Invariant: `apply` is atomic — it either inserts every write into the memtable or, when
//! flushing is failing and the immutable memtables are at their limit, inserts none and reports
//! the backend unavailable (the worker retries the batch). A failed flush keeps its immutable
//! memtable readable and is retried at the next `apply`.

use super::memtable::Memtable;
use super::sst::{Entry, SstBuilder, SstError, SstReader};
use crate::clock::SharedClock;
use crate::state::{Shard, StateError, StateWrite};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::iter::Peekable;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Settings of one tree.
#[derive(Debug, Clone)]
pub struct LsmSettings {
    /// Memtable size that triggers a flush, bytes (as RocksDB's `write_buffer_size`).
    pub memtable_bytes_max: usize,
    /// Immutable memtables that may wait for their flush before writes are refused.
    pub immutable_memtables_max: usize,
    /// Target raw size of a data block, bytes.
    pub block_size_bytes: usize,
    /// Compress data blocks with lz4.
    pub compress: bool,
}

impl Default for LsmSettings {
    fn default() -> Self {
        Self {
            memtable_bytes_max: 64 << 20,
            immutable_memtables_max: 2,
            block_size_bytes: super::sst::format::DEFAULT_BLOCK_SIZE_BYTES,
            compress: true,
        }
    }
}

/// Names an SST: the writer epoch that wrote it and a sequence number unique within the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SstId {
    /// The writer epoch (fencing token) of the writer.
    pub writer_epoch: u64,
    /// Sequence number within the epoch.
    pub seq: u64,
}

impl SstId {
    /// The object name: `sst/{epoch:020}-{seq:020}.sst`, so names sort by epoch then sequence
    /// and a dead writer's leftovers are recognisable by their epoch.
    pub fn object_name(&self) -> String {
        format!("sst/{:020}-{:020}.sst", self.writer_epoch, self.seq)
    }
}

/// An SST of the tree: opened when flushed, or lazily (one GET on first read) when the tree was
/// opened from a manifest.
#[derive(Debug)]
struct OpenSst {
    id: SstId,
    reader: tokio::sync::OnceCell<SstReader>,
}

impl OpenSst {
    fn loaded(id: SstId, reader: SstReader) -> Self {
        Self {
            id,
            reader: tokio::sync::OnceCell::new_with(Some(reader)),
        }
    }

    fn lazy(id: SstId) -> Self {
        Self {
            id,
            reader: tokio::sync::OnceCell::new(),
        }
    }
}

#[derive(Debug, Default)]
struct Levels {
    memtable: Memtable,
    /// Frozen memtables waiting for their flush, oldest first.
    immutables: Vec<Arc<Memtable>>,
    /// Flushed SSTs, oldest first.
    l0: Vec<Arc<OpenSst>>,
}

/// One shard's LSM tree on an object store.
#[derive(Debug)]
pub struct LsmTree {
    store: Arc<dyn ObjectStore>,
    root: Path,
    writer_epoch: u64,
    settings: LsmSettings,
    clock: SharedClock,
    label: String,
    levels: RwLock<Levels>,
    flushing: tokio::sync::Mutex<()>,
    next_seq: AtomicU64,
}

impl LsmTree {
    /// An empty tree writing SSTs under `root` of `store` as writer `writer_epoch`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        root: Path,
        writer_epoch: u64,
        settings: LsmSettings,
        clock: SharedClock,
    ) -> Self {
        let label = root.to_string();
        Self {
            store,
            root,
            writer_epoch,
            settings,
            clock,
            label,
            levels: RwLock::new(Levels::default()),
            flushing: tokio::sync::Mutex::new(()),
            next_seq: AtomicU64::new(0),
        }
    }

    /// Opens the tree recorded in `manifest` for writer `writer_epoch` (the epoch of the claim
    /// this writer made). Reads nothing from the store: each SST is fetched on its first read.
    /// Only level 0 exists so far; other levels in the manifest are refused.
    ///
    /// # Errors
    /// [`StateError::Corrupt`] when the manifest lists levels this version cannot read.
    pub fn open(
        store: Arc<dyn ObjectStore>,
        root: Path,
        manifest: &crate::state::manifest::Manifest,
        writer_epoch: u64,
        settings: LsmSettings,
        clock: SharedClock,
    ) -> Result<Self, StateError> {
        let tree = Self::new(store, root, writer_epoch, settings, clock);
        if manifest
            .levels
            .iter()
            .skip(1)
            .any(|level| !level.is_empty())
        {
            return Err(StateError::Corrupt {
                shard: tree.label.clone(),
                source: "manifest lists SSTs below level 0, which this version cannot read".into(),
            });
        }
        tree.write().l0 = manifest
            .levels
            .first()
            .into_iter()
            .flatten()
            .map(|r| {
                Arc::new(OpenSst::lazy(SstId {
                    writer_epoch: r.writer_epoch,
                    seq: r.seq,
                }))
            })
            .collect();
        Ok(tree)
    }

    /// The SSTs of level 0, oldest first.
    pub fn l0_ssts(&self) -> Vec<SstId> {
        self.read().l0.iter().map(|s| s.id).collect()
    }

    /// How many SSTs have been read into memory (flushed here or fetched on first read).
    pub fn loaded_ssts(&self) -> usize {
        self.read()
            .l0
            .iter()
            .filter(|s| s.reader.initialized())
            .count()
    }

    /// The levels to record in a checkpoint manifest: every SST flushed so far. Call after
    /// [`LsmTree::flush`] so that nothing is only in memory.
    pub fn levels(&self) -> Vec<Vec<crate::state::manifest::SstRef>> {
        vec![self.l0_ssts().into_iter().map(Into::into).collect()]
    }

    fn sst_path(&self, id: SstId) -> Path {
        Path::from(format!("{}/{}", self.root, id.object_name()))
    }

    /// Fetches every SST not yet in memory (one GET each).
    async fn load_all(&self) -> Result<(), StateError> {
        let pending: Vec<Arc<OpenSst>> = self
            .read()
            .l0
            .iter()
            .filter(|s| !s.reader.initialized())
            .cloned()
            .collect();
        for sst in pending {
            sst.reader
                .get_or_try_init(|| async {
                    let bytes = self
                        .store
                        .get(&self.sst_path(sst.id))
                        .await
                        .map_err(|e| self.fetch_error(e))?
                        .bytes()
                        .await
                        .map_err(|e| self.unavailable(e))?;
                    metrics::counter!("weir_object_store_get_bytes_total")
                        .increment(bytes.len() as u64);
                    SstReader::open(bytes).map_err(|e| self.corrupt(e))
                })
                .await?;
        }
        Ok(())
    }

    /// A missing SST that a manifest references is corruption, not an outage.
    fn fetch_error(&self, source: object_store::Error) -> StateError {
        match source {
            object_store::Error::NotFound { .. } => StateError::Corrupt {
                shard: self.label.clone(),
                source: Box::new(source),
            },
            other => self.unavailable(other),
        }
    }

    /// Freezes the memtable (if not empty) and flushes every immutable memtable.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when an SST cannot be written; the data stays readable.
    pub async fn flush(&self) -> Result<(), StateError> {
        {
            let mut levels = self.write();
            if !levels.memtable.is_empty() {
                let frozen = Arc::new(std::mem::take(&mut levels.memtable));
                levels.immutables.push(frozen);
            }
        }
        self.flush_immutables().await
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Levels> {
        // Levels are swapped whole under the lock, so a poisoned lock still guards a
        // consistent value.
        self.levels.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Levels> {
        self.levels.write().unwrap_or_else(|e| e.into_inner())
    }

    fn unavailable(&self, source: object_store::Error) -> StateError {
        StateError::Unavailable {
            shard: self.label.clone(),
            source: Box::new(source),
        }
    }

    fn corrupt(&self, source: SstError) -> StateError {
        StateError::Corrupt {
            shard: self.label.clone(),
            source: Box::new(source),
        }
    }

    /// Flushes the immutable memtables oldest first; stops at the first failure.
    async fn flush_immutables(&self) -> Result<(), StateError> {
        let _one_flush_at_a_time = self.flushing.lock().await;
        loop {
            let Some(oldest) = self.read().immutables.first().cloned() else {
                return Ok(());
            };
            let mut builder =
                SstBuilder::new(self.settings.block_size_bytes, self.settings.compress);
            for (key, entry) in oldest.iter() {
                builder
                    .add(key, entry)
                    .expect("memtable iteration is in strictly increasing key order");
            }
            let file = builder.finish();
            // A fresh name per attempt: an attempt whose acknowledgement was lost leaves an
            // orphan for GC instead of a name collision.
            let id = SstId {
                writer_epoch: self.writer_epoch,
                seq: self.next_seq.fetch_add(1, Ordering::SeqCst),
            };
            let path = self.sst_path(id);
            let opts = PutOptions::from(PutMode::Create);
            self.store
                .put_opts(&path, PutPayload::from(file.clone()), opts)
                .await
                .map_err(|e| self.unavailable(e))?;
            metrics::counter!("weir_object_store_put_bytes_total").increment(file.len() as u64);
            let reader = SstReader::open(file).map_err(|e| self.corrupt(e))?;
            let mut levels = self.write();
            levels.immutables.retain(|m| !Arc::ptr_eq(m, &oldest));
            levels.l0.push(Arc::new(OpenSst::loaded(id, reader)));
        }
    }

    fn live(&self, entry: Entry, now_ms: u64) -> Option<Bytes> {
        match entry {
            Entry::Put {
                value,
                expires_at_ms,
            } if expires_at_ms.is_none_or(|at| now_ms < at) => Some(value),
            _ => None,
        }
    }

    fn lookup(&self, key: &[u8]) -> Result<Option<Entry>, StateError> {
        let levels = self.read();
        if let Some(e) = levels.memtable.get(key) {
            return Ok(Some(e.clone()));
        }
        for m in levels.immutables.iter().rev() {
            if let Some(e) = m.get(key) {
                return Ok(Some(e.clone()));
            }
        }
        for sst in levels.l0.iter().rev() {
            let reader = sst
                .reader
                .get()
                .expect("load_all ran before the lookup and new SSTs arrive loaded");
            if let Some(e) = reader.get(key).map_err(|e| self.corrupt(e))? {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }
}

type Source<'a> = Peekable<Box<dyn Iterator<Item = Result<(Vec<u8>, Entry), SstError>> + 'a>>;

impl Shard for LsmTree {
    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        self.load_all().await?;
        let now_ms = self.clock.now_ms();
        Ok(self.lookup(key)?.and_then(|e| self.live(e, now_ms)))
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, StateError> {
        self.load_all().await?;
        let now_ms = self.clock.now_ms();
        keys.iter()
            .map(|k| Ok(self.lookup(k)?.and_then(|e| self.live(e, now_ms))))
            .collect()
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StateError> {
        self.load_all().await?;
        let now_ms = self.clock.now_ms();
        let start = match start_after {
            Some(after) if after >= prefix => after,
            _ => prefix,
        };
        let levels = self.read();
        // Sources newest first, so that on equal keys the first one wins.
        let mut sources: Vec<Source<'_>> = Vec::new();
        let mem: Box<dyn Iterator<Item = _>> = Box::new(
            levels
                .memtable
                .range_from(start)
                .map(|(k, e)| Ok((k.clone(), e.clone()))),
        );
        sources.push(mem.peekable());
        for m in levels.immutables.iter().rev() {
            let it: Box<dyn Iterator<Item = _>> =
                Box::new(m.range_from(start).map(|(k, e)| Ok((k.clone(), e.clone()))));
            sources.push(it.peekable());
        }
        for sst in levels.l0.iter().rev() {
            let reader = sst
                .reader
                .get()
                .expect("load_all ran before the scan and new SSTs arrive loaded");
            let it: Box<dyn Iterator<Item = _>> = Box::new(
                reader
                    .iter_from(start)
                    .map(|r| r.map(|(k, e)| (k.to_vec(), e))),
            );
            sources.push(it.peekable());
        }
        let mut out = Vec::new();
        while out.len() < limit {
            let mut min: Option<Vec<u8>> = None;
            for source in sources.iter_mut() {
                match source.peek() {
                    Some(Ok((k, _))) if min.as_ref().is_none_or(|m| k < m) => min = Some(k.clone()),
                    Some(Err(_)) => {
                        if let Some(Err(e)) = source.next() {
                            return Err(self.corrupt(e));
                        }
                    }
                    _ => {}
                }
            }
            let Some(key) = min else { break };
            if !key.starts_with(prefix) {
                break;
            }
            let mut newest: Option<Entry> = None;
            for source in sources.iter_mut() {
                if matches!(source.peek(), Some(Ok((k, _))) if *k == key)
                    && let Some(Ok((_, entry))) = source.next()
                    && newest.is_none()
                {
                    newest = Some(entry);
                }
            }
            if start_after.is_some_and(|after| key.as_slice() <= after) {
                continue;
            }
            if let Some(value) = newest.and_then(|e| self.live(e, now_ms)) {
                out.push((key, value));
            }
        }
        Ok(out)
    }

    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        // Make room first, so that a refusal happens before anything is inserted.
        if let Err(err) = self.flush_immutables().await
            && self.read().immutables.len() >= self.settings.immutable_memtables_max
        {
            return Err(err);
        }
        let frozen = {
            let mut levels = self.write();
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
            if levels.memtable.bytes() >= self.settings.memtable_bytes_max {
                let frozen = Arc::new(std::mem::take(&mut levels.memtable));
                levels.immutables.push(frozen);
                true
            } else {
                false
            }
        };
        if frozen && let Err(err) = self.flush_immutables().await {
            // The writes are in; the flush is retried at the next apply.
            tracing::warn!(shard = %self.label, error = %err, "memtable flush failed; will retry");
        }
        Ok(())
    }
}
