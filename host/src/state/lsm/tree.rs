//! [`LsmTree`]: one shard's LSM tree.
//!
//! - **Write path:** memtable → immutable memtables → SSTs written through to object storage
//!   (create-only, fresh names) as soon as a memtable fills, not only at checkpoints. No WAL:
//!   the Kafka input, replayed from the checkpoint's offsets, is the log.
//! - **Read path:** memtable → immutable memtables → L0 newest first → L1, L2, … (one SST per
//!   level can hold a key, found by the key ranges the manifest records). An SST's metadata is
//!   read on its first use; data blocks come through [`SstFiles`]'s caches.
//! - **Compaction** (leveled, see [`super::compaction`]) runs in a background task; writes slow
//!   down when L0 reaches `l0_slowdown_trigger` SSTs and stall at `l0_stop_trigger` (refused as
//!   unavailable after `stall_timeout`, so the worker backs off and pauses the partition).
//!
//! A tree opened from a manifest reads nothing up front.
//!
//! Files: this one (the tree, its write and read paths, flushes), [`compactor`] (choosing,
//! merging and installing compactions, and their background loop), [`scan`] (a prefix scan's
//! passes and the sources they merge).
//!
//! Invariants: `apply` is atomic — it inserts every write into the memtable or none (refused
//! when flushing keeps failing with the immutable memtables at their limit, or on a stall).
//! Flushes run in a background task; `apply` waits for one only when `immutable_memtables_max`
//! frozen memtables are waiting. A failed flush keeps its immutable memtable readable and is
//! retried. The
//! SST set is swapped whole under a lock, so a reader sees one consistent version; SSTs a
//! compaction replaced stay in the store until GC (see [`super::gc`]) finds no reference.

mod compactor;
mod corruption;
mod flush;
mod read;
mod scan;

use corruption::FoundCorruption;
pub use corruption::Scrubber;
use flush::{Unpublished, flush_in_background};

use super::cache::SstFiles;
use super::memtable::Memtable;
use super::sst::reader::{find_in_block, open_block};
use super::sst::{Entry, SstBuilder, SstIndex};
use crate::clock::SharedClock;
use crate::state::manifest::{Manifest, SstRef};
use crate::state::{Shard, StateError, StateWrite};
use bytes::Bytes;
use object_store::path::Path;
use object_store::{PutMode, PutOptions, PutPayload};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

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
    /// Size at which a compaction output SST is cut, bytes (as RocksDB's
    /// `target_file_size_base`).
    pub target_file_bytes: u64,
    /// L0 SSTs that trigger an L0 → L1 compaction.
    pub l0_compaction_trigger: usize,
    /// L0 SSTs from which each `apply` is delayed by `slowdown_delay` per SST over the trigger
    /// (as RocksDB's `level0_slowdown_writes_trigger`).
    pub l0_slowdown_trigger: usize,
    /// L0 SSTs at which `apply` waits for compaction (as `level0_stop_writes_trigger`).
    pub l0_stop_trigger: usize,
    /// Delay per L0 SST over the slowdown trigger.
    pub slowdown_delay: Duration,
    /// How long a stalled `apply` waits before reporting the backend unavailable.
    pub stall_timeout: Duration,
    /// Target size of L1, bytes; level n holds `ratio^(n-1)` times that.
    pub level_base_bytes: u64,
    /// Size ratio between adjacent levels.
    pub level_size_ratio: u64,
    /// Number of levels, L0 included.
    pub levels_max: usize,
    /// Put the blocks of a freshly flushed SST into the memory block cache (as RocksDB's
    /// `prepopulate_block_cache = kFlushOnly`): recently written keys are the likely reads.
    pub prepopulate_block_cache: bool,
}

impl Default for LsmSettings {
    fn default() -> Self {
        Self {
            memtable_bytes_max: 64 << 20,
            immutable_memtables_max: 2,
            block_size_bytes: super::sst::format::DEFAULT_BLOCK_SIZE_BYTES,
            compress: true,
            target_file_bytes: 64 << 20,
            l0_compaction_trigger: 4,
            l0_slowdown_trigger: 8,
            l0_stop_trigger: 12,
            slowdown_delay: Duration::from_millis(1),
            stall_timeout: Duration::from_secs(10),
            level_base_bytes: 256 << 20,
            level_size_ratio: 10,
            levels_max: 7,
            prepopulate_block_cache: true,
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

    /// Parses an object file name made by [`SstId::object_name`].
    pub fn parse_file_name(name: &str) -> Option<Self> {
        let (epoch, seq) = name.strip_suffix(".sst")?.split_once('-')?;
        Some(Self {
            writer_epoch: epoch.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

/// Checks the levels a manifest records: every SST's key range in order, and every level below
/// L0 sorted with disjoint key ranges (else keys would be routed to the wrong SST).
///
/// # Errors
/// [`LevelsError`]: the first thing wrong.
pub fn check_levels(levels: &[Vec<SstRef>]) -> Result<(), LevelsError> {
    for (n, level) in levels.iter().enumerate() {
        if level.iter().any(|r| r.first_key > r.last_key) {
            return Err(LevelsError::KeyRange);
        }
        if n > 0 && level.windows(2).any(|w| w[0].last_key >= w[1].first_key) {
            return Err(LevelsError::Overlap { level: n });
        }
    }
    Ok(())
}

/// Why the levels a manifest records cannot be a tree's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LevelsError {
    /// An SST's first key is after its last.
    #[error("manifest records an SST whose first key is after its last")]
    KeyRange,
    /// A level below L0 is not sorted, or its SSTs' key ranges overlap.
    #[error("manifest level {level} is not sorted with disjoint key ranges")]
    Overlap {
        /// The level.
        level: usize,
    },
}

/// An SST of the tree with its metadata, read on first use.
#[derive(Debug)]
struct OpenSst {
    meta: SstRef,
    path: Arc<str>,
    index: tokio::sync::OnceCell<Arc<SstIndex>>,
}

impl OpenSst {
    fn covers(&self, key: &[u8]) -> bool {
        self.meta.first_key.as_slice() <= key && key <= self.meta.last_key.as_slice()
    }
}

/// The SSTs of the tree at one moment; replaced whole.
#[derive(Debug, Clone, Default)]
struct Version {
    /// `levels[0]` is L0, oldest first, overlapping; every other level is sorted by key with
    /// disjoint key ranges.
    levels: Vec<Vec<Arc<OpenSst>>>,
}

impl Version {
    fn level_bytes(&self, level: usize) -> u64 {
        self.levels[level].iter().map(|s| s.meta.size_bytes).sum()
    }
}

#[derive(Debug, Default)]
struct Levels {
    memtable: Memtable,
    /// Frozen memtables waiting for their flush, oldest first.
    immutables: Vec<Arc<Memtable>>,
    version: Arc<Version>,
    /// Per level, the last key of the last SST compacted out of it (round-robin choice).
    compact_pointer: Vec<Vec<u8>>,
}

#[derive(Debug)]
struct Inner {
    files: SstFiles,
    root: Path,
    writer_epoch: u64,
    settings: LsmSettings,
    clock: SharedClock,
    label: String,
    levels: RwLock<Levels>,
    flushing: tokio::sync::Mutex<()>,
    compacting: tokio::sync::Mutex<()>,
    next_seq: AtomicU64,
    /// Seqs of SSTs being written (flushed or compacted) and not yet installed in the version
    /// or abandoned: a checkpoint taken meanwhile does not hold them, so GC must not treat them
    /// as older than it ([`LsmTree::next_seq`]). Its lock also orders allocation against
    /// readers of `next_seq`.
    unpublished: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    /// Seq of this writer below which SSTs were recorded by a committed checkpoint.
    checkpoint_seq: AtomicU64,
    compaction_wanted: Notify,
    flush_wanted: Notify,
    l0_shrank: Notify,
    compactions: AtomicU64,
    /// SSTs compaction removed from the tree, with when (processing time, ms): readers holding
    /// an older version may still read them, so GC keeps them for its grace period.
    retired: std::sync::Mutex<Vec<(SstId, u64)>>,
    /// Set when compaction or the scrub found corruption: compaction stops, stalled writes
    /// and the next checkpoint report it (the shard must fall back).
    corruption: std::sync::Mutex<Option<FoundCorruption>>,
}

/// One shard's LSM tree on an object store. Dropping it stops its background compaction.
#[derive(Debug)]
pub struct LsmTree {
    inner: Arc<Inner>,
    compactor: tokio::task::JoinHandle<()>,
    flusher: tokio::task::JoinHandle<()>,
}

impl Drop for LsmTree {
    fn drop(&mut self) {
        self.compactor.abort();
        self.flusher.abort();
    }
}

impl LsmTree {
    /// An empty tree writing SSTs under `root` as writer `writer_epoch`. Must be called within
    /// a tokio runtime (it spawns the compaction task).
    pub fn new(
        files: SstFiles,
        root: Path,
        writer_epoch: u64,
        settings: LsmSettings,
        clock: SharedClock,
    ) -> Self {
        let levels_max = settings.levels_max.max(2);
        let label = root.to_string();
        let inner = Arc::new(Inner {
            files,
            root,
            writer_epoch,
            settings: LsmSettings {
                levels_max,
                ..settings
            },
            clock,
            label,
            levels: RwLock::new(Levels {
                version: Arc::new(Version {
                    levels: vec![Vec::new(); levels_max],
                }),
                compact_pointer: vec![Vec::new(); levels_max],
                ..Levels::default()
            }),
            flushing: tokio::sync::Mutex::new(()),
            compacting: tokio::sync::Mutex::new(()),
            next_seq: AtomicU64::new(0),
            unpublished: std::sync::Mutex::default(),
            checkpoint_seq: AtomicU64::new(0),
            compaction_wanted: Notify::new(),
            flush_wanted: Notify::new(),
            l0_shrank: Notify::new(),
            compactions: AtomicU64::new(0),
            retired: std::sync::Mutex::new(Vec::new()),
            corruption: std::sync::Mutex::new(None),
        });
        let compactor = tokio::spawn(compactor::compact_in_background(inner.clone()));
        let flusher = tokio::spawn(flush_in_background(inner.clone()));
        Self {
            inner,
            compactor,
            flusher,
        }
    }

    /// Opens the tree recorded in `manifest` for writer `writer_epoch` (the epoch of the claim
    /// this writer made). Reads nothing from the store: each SST's metadata is fetched on its
    /// first read, each data block when needed.
    ///
    /// # Errors
    /// [`StateError::Corrupt`] when a level below L0 is not sorted with disjoint key ranges.
    pub fn open(
        files: SstFiles,
        root: Path,
        manifest: &Manifest,
        writer_epoch: u64,
        settings: LsmSettings,
        clock: SharedClock,
    ) -> Result<Self, StateError> {
        let settings = LsmSettings {
            levels_max: settings.levels_max.max(manifest.levels.len()),
            ..settings
        };
        let tree = Self::new(files, root, writer_epoch, settings, clock);
        if let Err(problem) = check_levels(&manifest.levels) {
            return Err(tree.inner.corrupt_msg(&problem.to_string()));
        }
        let mut version = Version {
            levels: vec![Vec::new(); tree.inner.settings.levels_max],
        };
        for (n, level) in manifest.levels.iter().enumerate() {
            version.levels[n] = level
                .iter()
                .map(|r| Arc::new(tree.inner.lazy(r.clone())))
                .collect();
        }
        tree.inner.write().version = Arc::new(version);
        Ok(tree)
    }

    /// As [`Shard::scan`], with each entry's expiry (ms since the Unix epoch, `None`: none):
    /// what an export of the state keeps.
    ///
    /// # Errors
    /// As [`Shard::scan`].
    pub async fn scan_with_expiry(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes, Option<u64>)>, StateError> {
        self.scan_into(prefix, start_after, limit, Vec::new()).await
    }

    /// A scan (see [`Shard::scan`]) into `out`, in passes.
    async fn scan_into<O: scan::ScanOut>(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
        mut out: O,
    ) -> Result<O, StateError> {
        // One time for every pass: an entry's TTL is judged once.
        let now_ms = self.inner.clock.now_ms();
        // Where the last pass stopped: the key of a memtable it cut short (keys up to it done).
        let mut resume: Option<Bytes> = None;
        loop {
            let after = match (start_after, resume.as_deref()) {
                (Some(a), Some(r)) => Some(a.max(r)),
                (a, r) => a.or(r),
            };
            resume = self
                .scan_pass(prefix, after, limit, now_ms, &mut out)
                .await?;
            if resume.is_none() || out.len() >= limit {
                return Ok(out);
            }
        }
    }

    /// The SSTs of level 0, oldest first.
    pub fn l0_ssts(&self) -> Vec<SstId> {
        self.inner.read().version.levels[0]
            .iter()
            .map(|s| s.meta.id())
            .collect()
    }

    /// Number of SSTs per level, L0 first.
    pub fn level_counts(&self) -> Vec<usize> {
        self.inner
            .read()
            .version
            .levels
            .iter()
            .map(Vec::len)
            .collect()
    }

    /// Every SST of the current version.
    pub fn live_ssts(&self) -> Vec<SstId> {
        let levels = self.inner.read();
        levels
            .version
            .levels
            .iter()
            .flatten()
            .map(|s| s.meta.id())
            .collect()
    }

    /// How many SSTs have had their metadata read (flushed here or read on first use).
    pub fn loaded_ssts(&self) -> usize {
        self.inner
            .read()
            .version
            .levels
            .iter()
            .flatten()
            .filter(|s| s.index.initialized())
            .count()
    }

    /// The levels to record in a checkpoint manifest: every SST of the current version. Call
    /// after [`LsmTree::flush`] so that nothing is only in memory.
    pub fn levels(&self) -> Vec<Vec<SstRef>> {
        self.inner
            .read()
            .version
            .levels
            .iter()
            .map(|level| level.iter().map(|s| s.meta.clone()).collect())
            .collect()
    }

    /// This writer's epoch.
    pub fn writer_epoch(&self) -> u64 {
        self.inner.writer_epoch
    }

    /// The sequence number below which every SST of this writer is installed in the tree's
    /// version (or abandoned): the next SST's, or lower while a flush or compaction has written
    /// SSTs it has not installed yet. A checkpointer reads it before [`LsmTree::levels`] and
    /// hands it to [`LsmTree::checkpoint_committed`] after the commit, so that GC never takes
    /// an output still on its way into the version for one the checkpoint dropped.
    pub fn next_seq(&self) -> u64 {
        let unpublished = self
            .inner
            .unpublished
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let next = self.inner.next_seq.load(Ordering::SeqCst);
        unpublished.first().copied().unwrap_or(next).min(next)
    }

    /// Records that a checkpoint holding every SST of this writer below `seq` committed:
    /// GC may now treat this writer's older, unreferenced SSTs as garbage.
    pub fn checkpoint_committed(&self, seq: u64) {
        self.inner.checkpoint_seq.fetch_max(seq, Ordering::SeqCst);
    }

    /// This writer's SSTs with a sequence number at or above this were flushed or compacted
    /// since its last checkpoint; GC never deletes them.
    pub fn checkpoint_seq(&self) -> u64 {
        self.inner.checkpoint_seq.load(Ordering::SeqCst)
    }

    /// Freezes the memtable (if not empty) and flushes every immutable memtable.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when an SST cannot be written; the data stays readable.
    pub async fn flush(&self) -> Result<(), StateError> {
        {
            let mut levels = self.inner.write();
            if !levels.memtable.is_empty() {
                let frozen = Arc::new(std::mem::take(&mut levels.memtable));
                levels.immutables.push(frozen);
            }
        }
        self.inner.flush_immutables().await
    }

    /// SSTs compaction removed from the tree within the last `within_ms` (processing time):
    /// a reader may still hold a version that names them, so GC must keep them. Forgets older
    /// ones.
    pub fn recently_retired(&self, within_ms: u64) -> Vec<SstId> {
        let now = self.inner.clock.now_ms();
        let mut retired = self.inner.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|(_, at)| now.saturating_sub(*at) < within_ms);
        retired.iter().map(|(id, _)| *id).collect()
    }

    /// Compactions this tree has run (trivial moves included).
    pub fn compactions(&self) -> u64 {
        self.inner.compactions.load(Ordering::Relaxed)
    }

    /// A handle for the scrub ([`super::scrub`]), which reads the tree's SSTs in the
    /// background without keeping the tree alive.
    pub fn scrubber(&self) -> Scrubber {
        Scrubber {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Corruption that compaction or the scrub found in this tree's SSTs, if any: the shard
    /// must not checkpoint again and falls back at its next open.
    pub fn corruption(&self) -> Option<StateError> {
        self.inner.found_corruption()
    }

    /// Runs compactions until none is due (the background task does the same on its own);
    /// returns how many ran.
    ///
    /// # Errors
    /// [`StateError`] of a failed compaction; the tree is unchanged by it.
    pub async fn compact_until_settled(&self) -> Result<usize, StateError> {
        let mut ran = 0;
        while self.inner.compact_once().await? {
            ran += 1;
        }
        Ok(ran)
    }
}

impl Inner {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Levels> {
        // Levels are swapped whole under the lock, so a poisoned lock still guards a
        // consistent value.
        self.levels.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Levels> {
        self.levels.write().unwrap_or_else(|e| e.into_inner())
    }

    fn sst_path(&self, id: SstId) -> Arc<str> {
        Arc::from(format!("{}/{}", self.root, id.object_name()))
    }

    fn lazy(&self, meta: SstRef) -> OpenSst {
        OpenSst {
            path: self.sst_path(meta.id()),
            meta,
            index: tokio::sync::OnceCell::new(),
        }
    }

    fn unavailable(&self, source: object_store::Error) -> StateError {
        StateError::Unavailable {
            shard: self.label.clone(),
            source: Box::new(source),
        }
    }
}
