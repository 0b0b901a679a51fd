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
mod scan;

use super::cache::{FetchError, SstFiles};
use super::memtable::Memtable;
use super::sst::reader::{find_in_block, open_block};
use super::sst::{Entry, SstBuilder, SstError, SstIndex, SstReader};
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

/// What the scrub ([`super::scrub`]) reads a tree's SSTs through.
#[derive(Debug, Clone)]
pub struct Scrubber {
    inner: std::sync::Weak<Inner>,
}

impl Scrubber {
    /// The tree's files, label and SST paths, while the tree lives.
    pub(super) fn files(&self) -> Option<SstFiles> {
        self.inner.upgrade().map(|i| i.files.clone())
    }

    /// The object path of SST `id` (`None` once the tree is gone).
    pub(super) fn sst_path(&self, id: SstId) -> Option<Arc<str>> {
        self.inner.upgrade().map(|i| i.sst_path(id))
    }

    /// Whether SST `id` is still in the tree's current version (compaction may have replaced
    /// it, reading all of it on the way).
    pub(super) fn is_live(&self, id: SstId) -> bool {
        self.inner.upgrade().is_some_and(|i| {
            i.read()
                .version
                .levels
                .iter()
                .flatten()
                .any(|s| s.meta.id() == id)
        })
    }

    /// The tree's label (its shard).
    pub(super) fn label(&self) -> String {
        self.inner
            .upgrade()
            .map(|i| i.label.clone())
            .unwrap_or_default()
    }

    /// Records corruption found in SST `id`: the tree never checkpoints again.
    pub(super) fn report(
        &self,
        id: SstId,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Option<StateError> {
        let inner = self.inner.upgrade()?;
        let error = inner.corrupt_in(id, source);
        inner.report_corruption(&error);
        Some(error)
    }
}

/// Corruption found in the background, kept until the shard is reopened.
#[derive(Debug, Clone)]
struct FoundCorruption {
    object: Option<String>,
    reason: String,
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

    fn corrupt(&self, source: SstError) -> StateError {
        StateError::corrupt(self.label.clone(), source)
    }

    fn corrupt_msg(&self, message: &str) -> StateError {
        StateError::corrupt(self.label.clone(), message.to_owned())
    }

    /// A corruption found in `sst`: the shard's next open falls back past every checkpoint
    /// that references it.
    fn corrupt_in(
        &self,
        sst: SstId,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StateError {
        StateError::Corrupt {
            shard: self.label.clone(),
            object: Some(sst.object_name()),
            source: source.into(),
        }
    }

    /// Records corruption found off the read path (compaction, the scrub).
    fn report_corruption(&self, error: &StateError) {
        let StateError::Corrupt { object, source, .. } = error else {
            return;
        };
        let mut slot = self.corruption.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert_with(|| FoundCorruption {
            object: object.clone(),
            reason: crate::error::Chain(&**source).to_string(),
        });
    }

    /// The corruption compaction or the scrub found, as an error of this shard.
    fn found_corruption(&self) -> Option<StateError> {
        let slot = self.corruption.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().map(|found| StateError::Corrupt {
            shard: self.label.clone(),
            object: found.object.clone(),
            source: found.reason.clone().into(),
        })
    }

    /// `sst` failed verification as compaction read it: reads it whole once more from the
    /// store and verifies every block. Still failing: corruption of `sst`; passing now: the
    /// first read was damaged on the way, an outage (compaction tries again).
    async fn confirm_corrupt(&self, sst: &OpenSst) -> StateError {
        let id = sst.meta.id();
        let file = match self.files.get_whole(&sst.path).await {
            Ok(file) => file,
            Err(e) => return self.fetch_error(id, Arc::new(e)),
        };
        match SstReader::open(file).and_then(|r| r.verify_blocks()) {
            Err(e) => self.corrupt_in(id, e),
            Ok(()) => StateError::Unavailable {
                shard: self.label.clone(),
                source: format!(
                    "{} failed verification once and passed when read again",
                    id.object_name()
                )
                .into(),
            },
        }
    }

    /// A failed read of `sst`. A missing SST that a manifest references is corruption, not an
    /// outage.
    fn fetch_error(&self, sst: SstId, error: Arc<FetchError>) -> StateError {
        match &*error {
            FetchError::Store { .. } => StateError::Unavailable {
                shard: self.label.clone(),
                source: Box::new(error),
            },
            FetchError::Missing { .. } | FetchError::Corrupt { .. } => self.corrupt_in(sst, error),
        }
    }

    /// A guard for the SSTs a flush or compaction writes until it installs them.
    fn unpublished(&self) -> Unpublished<'_> {
        Unpublished {
            inner: self,
            seqs: Vec::new(),
        }
    }

    /// Writes `file` as a new SST (create-only, fresh name, held in `pending` until its
    /// caller installs it) and returns it opened.
    async fn upload(
        &self,
        pending: &mut Unpublished<'_>,
        file: Bytes,
        first_key: Vec<u8>,
        last_key: Vec<u8>,
    ) -> Result<Arc<OpenSst>, StateError> {
        let index = SstIndex::open(file.clone(), 0).map_err(|e| self.corrupt(e))?;
        // A fresh name per attempt: an attempt whose acknowledgement was lost leaves an orphan
        // for GC instead of a name collision.
        let id = pending.fresh_id();
        let sst = self.lazy(SstRef {
            writer_epoch: id.writer_epoch,
            seq: id.seq,
            size_bytes: file.len() as u64,
            first_key,
            last_key,
        });
        self.files
            .store()
            .put_opts(
                &Path::from(&*sst.path),
                PutPayload::from(file.clone()),
                PutOptions::from(PutMode::Create),
            )
            .await
            .map_err(|e| self.unavailable(e))?;
        sst.index
            .set(Arc::new(index))
            .expect("a fresh OpenSst has no index yet");
        Ok(Arc::new(sst))
    }

    /// Flushes the immutable memtables oldest first; stops at the first failure.
    async fn flush_immutables(&self) -> Result<(), StateError> {
        let _one_flush_at_a_time = self.flushing.lock().await;
        loop {
            let Some(oldest) = self.read().immutables.first().cloned() else {
                return Ok(());
            };
            let (block_size, compress) = (self.settings.block_size_bytes, self.settings.compress);
            let memtable = oldest.clone();
            // Encoding and compressing up to `memtable_bytes_max` is CPU work: keep it off the
            // runtime's worker threads.
            let built = tokio::task::spawn_blocking(move || {
                let mut builder = SstBuilder::new(block_size, compress);
                for (key, entry) in memtable.iter() {
                    builder
                        .add(key, entry)
                        .expect("memtable iteration is in strictly increasing key order");
                }
                let (first, last) = builder
                    .key_range()
                    .map(|(f, l)| (f.to_vec(), l.to_vec()))
                    .expect("only non-empty memtables are frozen");
                (builder.finish(), first, last)
            })
            .await;
            let (file, first, last) =
                built.map_err(|e| self.corrupt_msg(&format!("building an SST failed: {e}")))?;
            let mut pending = self.unpublished();
            let sst = self.upload(&mut pending, file.clone(), first, last).await?;
            if self.settings.prepopulate_block_cache && self.files.has_memory_cache() {
                let index = sst.index.get().expect("uploaded SSTs carry their index");
                for (_, handle) in index.blocks() {
                    if let Ok(block) = open_block(&file.slice(handle.range())) {
                        // An uncompressed block is a slice of the whole file: copy it, so that
                        // the cache holds (and weighs) only the block.
                        let block = Bytes::copy_from_slice(&block);
                        self.files.prepopulate(&sst.path, *handle, block).await;
                    }
                }
            }
            let l0_files = {
                let mut levels = self.write();
                levels.immutables.retain(|m| !Arc::ptr_eq(m, &oldest));
                let mut version = (*levels.version).clone();
                version.levels[0].push(sst);
                levels.version = Arc::new(version);
                levels.version.levels[0].len()
            };
            metrics::counter!("weir_lsm_flushes_total").increment(1);
            metrics::gauge!("weir_lsm_l0_files", "shard" => self.label.clone())
                .set(l0_files as f64);
            self.compaction_wanted.notify_one();
        }
    }

    async fn index_of(&self, sst: &OpenSst) -> Result<Arc<SstIndex>, StateError> {
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

    async fn sst_get(&self, sst: &OpenSst, key: &[u8]) -> Result<Option<Entry>, StateError> {
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

    async fn lookup(&self, key: &[u8]) -> Result<Option<Entry>, StateError> {
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
    fn live_entry(&self, entry: &Entry, now_ms: u64) -> bool {
        matches!(entry, Entry::Put { expires_at_ms, .. } if expires_at_ms.is_none_or(|at| now_ms < at))
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

    /// Delays or stalls a write while L0 is over its limits.
    async fn backpressure(&self) -> Result<(), StateError> {
        let s = &self.settings;
        let l0 = self.read().version.levels[0].len();
        if l0 < s.l0_slowdown_trigger {
            return Ok(());
        }
        let started = crate::clock::monotonic_now();
        if l0 < s.l0_stop_trigger {
            let over = (l0 - s.l0_slowdown_trigger + 1) as u32;
            tokio::time::sleep(s.slowdown_delay * over).await;
        } else {
            self.compaction_wanted.notify_one();
            let deadline = started + s.stall_timeout;
            loop {
                let shrank = self.l0_shrank.notified();
                tokio::pin!(shrank);
                shrank.as_mut().enable();
                if self.read().version.levels[0].len() < s.l0_stop_trigger {
                    break;
                }
                if let Some(found) = self.found_corruption() {
                    return Err(found);
                }
                if tokio::time::timeout_at(deadline.into(), shrank)
                    .await
                    .is_err()
                {
                    record_stall(started);
                    return Err(StateError::Unavailable {
                        shard: self.label.clone(),
                        source: "writes stalled: L0 stayed at its stop trigger while compaction caught up".into(),
                    });
                }
            }
        }
        record_stall(started);
        Ok(())
    }
}

/// The SSTs a flush or compaction has given sequence numbers to and not installed yet; they
/// are released (installed, or orphans for GC) when it is dropped.
struct Unpublished<'a> {
    inner: &'a Inner,
    seqs: Vec<u64>,
}

impl Unpublished<'_> {
    /// A fresh SST id of this writer, held until the guard is dropped.
    fn fresh_id(&mut self) -> SstId {
        let mut unpublished = self
            .inner
            .unpublished
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let seq = self.inner.next_seq.fetch_add(1, Ordering::SeqCst);
        unpublished.insert(seq);
        self.seqs.push(seq);
        SstId {
            writer_epoch: self.inner.writer_epoch,
            seq,
        }
    }
}

impl Drop for Unpublished<'_> {
    fn drop(&mut self) {
        let mut unpublished = self
            .inner
            .unpublished
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for seq in &self.seqs {
            unpublished.remove(seq);
        }
    }
}

/// Adds the time since `started` to `weir_lsm_write_stall_micros_total`.
fn record_stall(started: Instant) {
    metrics::counter!("weir_lsm_write_stall_micros_total")
        .increment(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
}

/// The background flush loop: writes frozen memtables to SSTs as they appear; after a failure
/// it retries with backoff (100 ms doubling to 2 s) while the data stays readable in memory.
async fn flush_in_background(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        inner.flush_wanted.notified().await;
        while let Err(error) = inner.flush_immutables().await {
            tracing::warn!(shard = %inner.label, %error, "memtable flush failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        backoff = Duration::from_millis(100);
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
