//! Where an SST's bytes come from: [`SstFiles`] reads SST metadata and data blocks through two
//! cache tiers shared by every shard of a host, then the object store.
//!
//! ```text
//! read_block ─▶ memory block cache (moka, weighed in bytes, holds opened blocks)
//!            ─▶ local disk cache (bounded bytes, sealed blocks re-verified on read,
//!               evicting deletes the file)
//!            ─▶ object store: one range GET of the block
//! ```
//! Concurrent misses of one block share a single fetch (moka's `try_get_with`). Either tier may
//! be sized 0, which turns it off. Metadata (footer, filter, index) is read with one range GET
//! of the file's last [`TAIL_READ_BYTES`] (a second one when it is larger) and is held by the
//! tree for as long as the SST is live, so it is not in these caches.
//!
//! Metrics: `weir_lsm_cache_hits_total` / `weir_lsm_cache_misses_total` by `tier`
//! (`memory`, `disk`), with the run's labels once [`BlockCaches::labelled`]; object-store
//! requests are counted by the run's store ([`crate::state::hooked_store::Metering`]).

use super::sst::SstError;
use super::sst::format::BlockHandle;
use super::sst::reader::{SstIndex, TAIL_READ_BYTES, open_block};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Sizes of the cache tiers.
#[derive(Debug, Clone, Default)]
pub struct CacheSettings {
    /// Memory block cache capacity, bytes of opened (decompressed) blocks; 0 turns it off
    /// (as RocksDB's `block_cache` size).
    pub block_cache_bytes: u64,
    /// Local disk cache capacity, bytes of sealed blocks; 0 turns it off.
    pub disk_cache_bytes: u64,
    /// Directory under which the disk cache makes its own fresh subdirectory (removed when the
    /// caches are dropped); the system temporary directory when `None`.
    pub disk_cache_dir: Option<PathBuf>,
}

/// Why a block or SST metadata could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The object does not exist: a manifest names an SST that is gone.
    #[error("sst object is missing. path=`{path}`")]
    Missing {
        /// The object path.
        path: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// The store failed: retry later.
    #[error("object store read failed. path=`{path}`")]
    Store {
        /// The object path.
        path: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// The bytes fail verification.
    #[error("sst is corrupt. path=`{path}`")]
    Corrupt {
        /// The object path.
        path: String,
        /// What failed.
        #[source]
        source: SstError,
    },
}

impl FetchError {
    /// A failed read of `path`: a missing object is [`FetchError::Missing`], anything else
    /// [`FetchError::Store`].
    fn of_read(path: &str, source: object_store::Error) -> Self {
        let path = path.to_owned();
        match source {
            object_store::Error::NotFound { .. } => FetchError::Missing { path, source },
            source => FetchError::Store { path, source },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BlockKey {
    sst: Arc<str>,
    offset: u64,
}

/// One block in the disk cache; its file is deleted when the entry leaves the cache.
#[derive(Debug)]
struct DiskEntry {
    file: PathBuf,
    len: u32,
}

/// Disk-tier block writes that may be in flight at once. A block fetched while this many are
/// still being written is not kept on disk (only in the memory tier, when there is one and it
/// admits the block): when misses come faster
/// than the disk and the tier's bookkeeping absorb them, caching every block piled up one
/// blocking task per block, each waiting for the cache's write queue with short sleeps, and the
/// host's reads slowed down with them (`weir bench-big-state`, docs/lsm.md). As Foyer's and
/// CacheLib's admission control, a cache under pressure admits less rather than falling behind.
pub const DISK_WRITES_IN_FLIGHT_MAX: u64 = 16;

#[derive(Debug)]
struct DiskCache {
    /// Owns the directory: removed with everything in it when the cache is dropped.
    dir: tempfile::TempDir,
    /// Held locked while the cache lives, so that no other cache deletes the directory
    /// ([`super::cache_dir`]).
    _lock: std::fs::File,
    entries: moka::sync::Cache<BlockKey, Arc<DiskEntry>>,
    next_file: AtomicU64,
    /// Block writes started and not yet registered (at most [`DISK_WRITES_IN_FLIGHT_MAX`]).
    writes_pending: AtomicU64,
    /// Blocks not kept because [`DISK_WRITES_IN_FLIGHT_MAX`] writes were in flight.
    writes_skipped: AtomicU64,
    writes_done: tokio::sync::Notify,
}

impl DiskCache {
    fn new(capacity_bytes: u64, parent: Option<&std::path::Path>) -> std::io::Result<Self> {
        let parent = parent.map_or_else(std::env::temp_dir, std::path::Path::to_path_buf);
        let (dir, lock) = super::cache_dir::create(&parent)?;
        let entries = moka::sync::Cache::builder()
            .max_capacity(capacity_bytes)
            .weigher(|_key, entry: &Arc<DiskEntry>| entry.len)
            .eviction_listener(|_key, entry: Arc<DiskEntry>, _cause| {
                // Every insert has a file of its own, so whatever the cause, this file is
                // no longer referenced. A failed delete only leaks until the directory goes.
                let _ = std::fs::remove_file(&entry.file);
            })
            .build();
        Ok(Self {
            dir,
            _lock: lock,
            entries,
            next_file: AtomicU64::new(0),
            writes_pending: AtomicU64::new(0),
            writes_skipped: AtomicU64::new(0),
            writes_done: tokio::sync::Notify::new(),
        })
    }

    async fn get(&self, key: &BlockKey) -> Option<Bytes> {
        let entry = self.entries.get(key)?;
        match tokio::fs::read(&entry.file).await {
            Ok(bytes) => Some(Bytes::from(bytes)),
            Err(_) => {
                self.entries.invalidate(key);
                None
            }
        }
    }

    /// Takes one of the [`DISK_WRITES_IN_FLIGHT_MAX`] write slots; `false` (and counted as
    /// skipped) when all are taken.
    fn admit(&self) -> bool {
        let admitted = self
            .writes_pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < DISK_WRITES_IN_FLIGHT_MAX).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.writes_skipped.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// Writes the block's file and registers it in one blocking task, off the read's path
    /// (the read does not wait for it), which runs to the end even when the read that asked
    /// is cancelled: no file is ever left unregistered. Not kept at all when
    /// [`DISK_WRITES_IN_FLIGHT_MAX`] writes are in flight ([`Self::admit`]).
    fn insert(self: &Arc<Self>, key: BlockKey, sealed: &Bytes) {
        if !self.admit() {
            return;
        }
        let n = self.next_file.fetch_add(1, Ordering::Relaxed);
        let file = self.dir.path().join(format!("{n:016x}.block"));
        let (cache, sealed) = (self.clone(), sealed.clone());
        drop(tokio::task::spawn_blocking(move || {
            match std::fs::write(&file, &sealed) {
                Ok(()) => {
                    let len = u32::try_from(sealed.len()).unwrap_or(u32::MAX);
                    cache.entries.insert(key, Arc::new(DiskEntry { file, len }));
                }
                Err(error) => {
                    tracing::warn!(%error, file = %file.display(), "disk cache write failed; block not cached");
                    let _ = std::fs::remove_file(&file);
                }
            }
            cache.writes_pending.fetch_sub(1, Ordering::SeqCst);
            cache.writes_done.notify_waiters();
        }));
    }

    async fn wait_for_writes(&self) {
        loop {
            let done = self.writes_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.writes_pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            done.await;
        }
    }

    fn invalidate(&self, key: &BlockKey) {
        self.entries.invalidate(key);
    }
}

/// Hits and misses per tier since the caches were built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Block reads the memory tier served.
    pub memory_hits: u64,
    /// Block reads the memory tier did not hold (when it is on).
    pub memory_misses: u64,
    /// Block reads the disk tier served.
    pub disk_hits: u64,
    /// Block reads the disk tier did not hold (when it is on).
    pub disk_misses: u64,
    /// Range GETs of data blocks from the object store.
    pub block_gets: u64,
    /// Blocks the disk tier did not keep because [`DISK_WRITES_IN_FLIGHT_MAX`] writes were in
    /// flight.
    pub disk_writes_skipped: u64,
}

/// One count, kept here (for [`BlockCaches::stats`]) and exported (once labelled).
#[derive(Debug)]
struct Tally {
    total: AtomicU64,
    exported: metrics::Counter,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            total: AtomicU64::new(0),
            exported: metrics::Counter::noop(),
        }
    }
}

impl Tally {
    fn add(&self) {
        self.total.fetch_add(1, Ordering::Relaxed);
        self.exported.increment(1);
    }

    fn get(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
struct Counters {
    memory_hits: Tally,
    memory_misses: Tally,
    disk_hits: Tally,
    disk_misses: Tally,
    block_gets: AtomicU64,
}

/// The cache tiers of one host, shared by its shards.
#[derive(Debug)]
pub struct BlockCaches {
    memory: Option<moka::future::Cache<BlockKey, Bytes>>,
    disk: Option<Arc<DiskCache>>,
    counters: Counters,
}

impl BlockCaches {
    /// Builds the tiers `settings` sizes.
    ///
    /// # Errors
    /// When the disk cache directory cannot be created.
    pub fn new(settings: &CacheSettings) -> std::io::Result<Self> {
        let memory = (settings.block_cache_bytes > 0).then(|| {
            moka::future::Cache::builder()
                .max_capacity(settings.block_cache_bytes)
                .weigher(|key: &BlockKey, block: &Bytes| {
                    u32::try_from(block.len() + key.sst.len() + 64).unwrap_or(u32::MAX)
                })
                .build()
        });
        let disk = if settings.disk_cache_bytes > 0 {
            Some(Arc::new(DiskCache::new(
                settings.disk_cache_bytes,
                settings.disk_cache_dir.as_deref(),
            )?))
        } else {
            None
        };
        Ok(Self {
            memory,
            disk,
            counters: Counters::default(),
        })
    }

    /// These caches with their hits and misses exported under `metrics`' labels (the
    /// caches of one pipeline run): `weir_lsm_cache_hits_total{tier}`,
    /// `weir_lsm_cache_misses_total{tier}`.
    pub fn labelled(mut self, metrics: &crate::telemetry::RunMetrics) -> Self {
        let c = &mut self.counters;
        for (tally, name, tier) in [
            (&mut c.memory_hits, "weir_lsm_cache_hits_total", "memory"),
            (
                &mut c.memory_misses,
                "weir_lsm_cache_misses_total",
                "memory",
            ),
            (&mut c.disk_hits, "weir_lsm_cache_hits_total", "disk"),
            (&mut c.disk_misses, "weir_lsm_cache_misses_total", "disk"),
        ] {
            tally.exported = metrics.counter(name, &[("tier", tier)]);
        }
        self
    }

    /// No caching at all.
    pub fn none() -> Self {
        Self {
            memory: None,
            disk: None,
            counters: Counters::default(),
        }
    }

    /// Hits and misses so far.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            memory_hits: c.memory_hits.get(),
            memory_misses: c.memory_misses.get(),
            disk_hits: c.disk_hits.get(),
            disk_misses: c.disk_misses.get(),
            block_gets: c.block_gets.load(Ordering::Relaxed),
            disk_writes_skipped: self
                .disk
                .as_ref()
                .map_or(0, |d| d.writes_skipped.load(Ordering::Relaxed)),
        }
    }

    /// Bytes held by the memory tier and the disk tier (after pending evictions run).
    pub fn weighted_bytes(&self) -> (u64, u64) {
        if let Some(disk) = &self.disk {
            disk.entries.run_pending_tasks();
        }
        (
            self.memory.as_ref().map_or(0, |m| m.weighted_size()),
            self.disk.as_ref().map_or(0, |d| d.entries.weighted_size()),
        )
    }

    /// Waits until every block write the disk tier has started is registered (or failed).
    pub async fn wait_for_disk_writes(&self) {
        if let Some(disk) = &self.disk {
            disk.wait_for_writes().await;
        }
    }

    /// Files currently in the disk tier's directory.
    pub fn disk_files(&self) -> usize {
        self.disk.as_ref().map_or(0, |d| {
            d.entries.run_pending_tasks();
            std::fs::read_dir(d.dir.path()).map_or(0, |rd| rd.count())
        })
    }
}

/// Reads SST objects of one store through the host's [`BlockCaches`].
#[derive(Debug, Clone)]
pub struct SstFiles {
    store: Arc<dyn ObjectStore>,
    caches: Arc<BlockCaches>,
}

impl SstFiles {
    /// Reads from `store` through `caches`.
    pub fn new(store: Arc<dyn ObjectStore>, caches: Arc<BlockCaches>) -> Self {
        Self { store, caches }
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    async fn get_range(
        &self,
        path: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, FetchError> {
        let location = Path::from(path);
        let got = self
            .store
            .get_range(&location, range)
            .await
            .map_err(|source| FetchError::of_read(path, source))?;
        Ok(got)
    }

    /// Reads the whole object at `path` (one GET).
    ///
    /// # Errors
    /// [`FetchError::Missing`] or [`FetchError::Store`].
    pub async fn get_whole(&self, path: &str) -> Result<Bytes, FetchError> {
        let location = Path::from(path);
        let result = async { self.store.get(&location).await?.bytes().await }.await;
        let bytes = result.map_err(|source| FetchError::of_read(path, source))?;
        Ok(bytes)
    }

    /// Reads and verifies the metadata of the SST at `path`, `file_len` bytes long: one range
    /// GET of the tail, and a second when the filter and index are larger than the tail.
    /// Metadata that fails verification is read once more before it is called corrupt (a
    /// flipped bit on the way is not damage in the store).
    ///
    /// # Errors
    /// [`FetchError`] of the reads, or [`FetchError::Corrupt`].
    pub async fn open_index(&self, path: &str, file_len: u64) -> Result<SstIndex, FetchError> {
        match self.open_index_once(path, file_len).await {
            Err(FetchError::Corrupt { source, .. }) => {
                tracing::warn!(sst = path, error = %source, "SST metadata failed verification; reading it again from the store");
                self.open_index_once(path, file_len).await
            }
            other => other,
        }
    }

    async fn open_index_once(&self, path: &str, file_len: u64) -> Result<SstIndex, FetchError> {
        let corrupt = |source| FetchError::Corrupt {
            path: path.to_owned(),
            source,
        };
        let tail_start = file_len.saturating_sub(TAIL_READ_BYTES);
        let tail = self.get_range(path, tail_start..file_len).await?;
        if tail.len() as u64 != file_len - tail_start {
            return Err(corrupt(SstError::malformed(format!(
                "object is shorter than the {file_len} bytes its manifest records"
            ))));
        }
        let footer = SstIndex::footer(&tail).map_err(corrupt)?;
        let metadata_start = SstIndex::metadata_start(&footer);
        if metadata_start >= tail_start {
            return SstIndex::open(tail, tail_start).map_err(corrupt);
        }
        let head = self.get_range(path, metadata_start..tail_start).await?;
        let mut joined = Vec::with_capacity(head.len() + tail.len());
        joined.extend_from_slice(&head);
        joined.extend_from_slice(&tail);
        SstIndex::open(Bytes::from(joined), metadata_start).map_err(corrupt)
    }

    /// Reads the bytes `range` of the SST at `path` from the store, bypassing the caches (the
    /// scrub, which must not evict hot blocks with cold ones).
    ///
    /// # Errors
    /// [`FetchError::Missing`] or [`FetchError::Store`].
    pub async fn read_range_uncached(
        &self,
        path: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, FetchError> {
        self.get_range(path, range).await
    }

    /// The opened (verified, decompressed) data block at `handle` of the SST at `sst`.
    ///
    /// # Errors
    /// [`FetchError`]; a block whose disk-cache copy fails verification is fetched again.
    pub async fn read_block(
        &self,
        sst: &Arc<str>,
        handle: BlockHandle,
    ) -> Result<Bytes, Arc<FetchError>> {
        let key = BlockKey {
            sst: sst.clone(),
            offset: handle.offset,
        };
        match &self.caches.memory {
            None => self
                .read_block_uncached(&key, handle)
                .await
                .map_err(Arc::new),
            Some(memory) => {
                if let Some(block) = memory.get(&key).await {
                    self.caches.counters.memory_hits.add();
                    return Ok(block);
                }
                memory
                    .try_get_with(key.clone(), async {
                        self.caches.counters.memory_misses.add();
                        self.read_block_uncached(&key, handle).await
                    })
                    .await
            }
        }
    }

    async fn read_block_uncached(
        &self,
        key: &BlockKey,
        handle: BlockHandle,
    ) -> Result<Bytes, FetchError> {
        if let Some(disk) = &self.caches.disk {
            if let Some(sealed) = disk.get(key).await {
                if let Ok(block) = open_block(&sealed) {
                    self.caches.counters.disk_hits.add();
                    return Ok(block);
                }
                tracing::warn!(sst = %key.sst, offset = key.offset, "disk cache block failed verification; refetching");
                disk.invalidate(key);
            }
            self.caches.counters.disk_misses.add();
        }
        self.caches
            .counters
            .block_gets
            .fetch_add(1, Ordering::Relaxed);
        let end = handle.offset + u64::from(handle.len);
        let mut sealed = self.get_range(&key.sst, handle.offset..end).await?;
        let block = match open_block(&sealed) {
            Ok(block) => block,
            Err(error) => {
                // Read once more from the store before calling it corrupt: damage in transit
                // is not damage in the store.
                tracing::warn!(sst = %key.sst, offset = key.offset, %error, "block failed verification; reading it again from the store");
                sealed = self.get_range(&key.sst, handle.offset..end).await?;
                open_block(&sealed).map_err(|source| FetchError::Corrupt {
                    path: key.sst.to_string(),
                    source,
                })?
            }
        };
        if let Some(disk) = &self.caches.disk {
            disk.insert(key.clone(), &sealed);
        }
        Ok(block)
    }

    /// Puts an opened block into the memory tier (used to warm the cache with blocks just
    /// flushed, as RocksDB's `prepopulate_block_cache = kFlushOnly`).
    pub async fn prepopulate(&self, sst: &Arc<str>, handle: BlockHandle, block: Bytes) {
        if let Some(memory) = &self.caches.memory {
            let key = BlockKey {
                sst: sst.clone(),
                offset: handle.offset,
            };
            memory.insert(key, block).await;
        }
    }

    /// The caches this reads through.
    pub fn caches(&self) -> &Arc<BlockCaches> {
        &self.caches
    }

    /// Whether the memory tier is on.
    pub fn has_memory_cache(&self) -> bool {
        self.caches.memory.is_some()
    }
}

#[cfg(test)]
mod admission_tests {
    use super::*;

    #[test]
    fn the_disk_tier_admits_at_most_its_bound_of_writes_in_flight() -> std::io::Result<()> {
        let parent = tempfile::tempdir()?;
        let disk = DiskCache::new(1 << 20, Some(parent.path()))?;
        for _ in 0..DISK_WRITES_IN_FLIGHT_MAX {
            assert!(disk.admit());
        }
        assert!(!disk.admit(), "a write past the bound is not admitted");
        assert_eq!(disk.writes_skipped.load(Ordering::Relaxed), 1);
        // One write registered: its slot is free again.
        disk.writes_pending.fetch_sub(1, Ordering::SeqCst);
        assert!(disk.admit());
        assert_eq!(
            disk.writes_pending.load(Ordering::SeqCst),
            DISK_WRITES_IN_FLIGHT_MAX
        );
        Ok(())
    }
}
