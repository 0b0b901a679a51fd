//! [`LsmShard`]: a shard of the `lsm` backend as its owner holds it — the tree, the claim it
//! was opened under, and the two halves of the checkpoint protocol that live in the state layer
//! (docs/checkpoints.md, "Taking a checkpoint" steps 3, 5 and 6, and "Recovery" steps 3 and 4):
//!
//! - [`recover`]: find the checkpoint to resume from with the walk both backends share
//!   ([`find_checkpoint`]): the newest usable one; an older retained one only past *provable*
//!   corruption, never past a transient error. This backend's check of a candidate is cheap
//!   and flat in state size — one LIST of the shard's SSTs: every SST it names must exist
//!   with the size its manifest records, and its levels must be well formed. Blocks are
//!   verified when read, and by the scrub.
//! - [`LsmShard::commit_checkpoint`]: flush the memtable, commit the next manifest version
//!   create-only with the caller's metadata (the input offsets), then start collecting garbage
//!   in the background (off the checkpoint's critical path: the partition is paused only for
//!   the flush and the manifest). A tree in which compaction or the scrub found corruption
//!   never checkpoints again: the shard must fall back.
//! - **GC** ([`collect_garbage`]) runs in the background after the claim and after every
//!   checkpoint, so that history is collected even when every run of the shard's owners is
//!   short (SCENARIOS.md S18: a process killed a second after its first checkpoint); closing
//!   the shard waits a little for the pass running ([`LsmShard::settle`]).
//! - the **scrub**: after opening from a checkpoint, a background task reads every block of
//!   the SSTs that checkpoint handed on, throttled, bypassing the caches. Until it has read
//!   them all once, GC keeps the recovered checkpoint and the retained ones before it: later
//!   checkpoints keep referencing those SSTs, and without the older checkpoints, corruption
//!   found late would leave nothing to fall back to.
//!
//! The pipeline drives both through [`Shard::checkpoint`] and [`Shard::recovered_offsets`];
//! docs/checkpoints.md is the whole protocol, step by step.

use super::gc::{LiveWriter, collect_garbage};
use super::tree::{LsmTree, SstId, check_levels};
use crate::clock::SharedClock;
use crate::ids::ManifestVersion;
use crate::state::checkpoint::{self, CheckpointReport, DecidedBy, InputOffsets};
use crate::state::manifest::{
    BackgroundGc, CandidateCheck, Checked, Manifest, ManifestError, ManifestStore, Protected,
    RetentionPolicy, find_checkpoint,
};
use crate::state::{Recovery, Shard, StateError, StateWrite};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Why a checkpoint did not commit.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The memtable could not be flushed, or the tree holds corruption that compaction or the
    /// scrub found; nothing was committed.
    #[error("checkpoint flush failed")]
    Flush(#[source] StateError),
    /// The manifest commit failed or was fenced ([`ManifestError::Fenced`]: another owner
    /// holds the shard; stop writing it).
    #[error("checkpoint commit failed")]
    Commit(#[source] ManifestError),
}

impl CheckpointError {
    /// Whether another writer owns the shard now.
    pub fn is_fenced(&self) -> bool {
        matches!(self, CheckpointError::Commit(ManifestError::Fenced { .. }))
    }
}

/// What [`LsmShard::checkpoint`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The committed manifest version.
    pub version: ManifestVersion,
    /// SSTs the checkpoint references.
    pub ssts: usize,
    /// Bytes of those SSTs.
    pub bytes: u64,
    /// Bytes of the SSTs it references that the previous version written by this owner (its
    /// claim or last checkpoint) did not: what this checkpoint interval uploaded.
    pub uploaded_bytes: u64,
}

/// How the scrub reads: the pace and the largest read.
#[derive(Debug, Clone)]
pub struct ScrubSettings {
    /// Bytes read per second at most (0: no scrub; GC then keeps the versions of the claim
    /// for as long as the shard is open).
    pub bytes_per_second: u64,
    /// Largest range read at once, bytes (consecutive blocks are read together up to it).
    pub read_bytes_max: u64,
}

impl Default for ScrubSettings {
    fn default() -> Self {
        Self {
            bytes_per_second: 16 << 20,
            read_bytes_max: 4 << 20,
        }
    }
}

/// A shard of the `lsm` backend, owned by this process under one claim.
#[derive(Debug)]
pub struct LsmShard {
    tree: LsmTree,
    store: Arc<dyn ObjectStore>,
    root: Path,
    manifests: ManifestStore,
    /// The newest version this owner wrote (its claim, then each checkpoint).
    last: tokio::sync::Mutex<Manifest>,
    /// The checkpoint the shard was recovered from.
    recovered: Option<Manifest>,
    retention: RetentionPolicy,
    clock: SharedClock,
    /// The background GC started by the last checkpoint.
    gc: BackgroundGc,
    /// The checkpoint recovery would use now (the one resumed from, then each decided one):
    /// GC never deletes it, even when newer prepared but undecided versions outnumber the
    /// retained count (exactly-once mode, where a Kafka transaction decides).
    decided: std::sync::Mutex<Option<ManifestVersion>>,
    /// Set when the scrub has read every block of the recovered SSTs.
    scrubbed: Arc<AtomicBool>,
    scrub: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for LsmShard {
    fn drop(&mut self) {
        if let Some(scrub) = &self.scrub {
            scrub.abort();
        }
    }
}

impl LsmShard {
    /// A shard owning `tree` under `claim`, recovered from `recovered`; GC keeps the retained
    /// checkpoints up to `recovered` until the scrub (started here, at `scrub`'s pace, when
    /// `recovered` names SSTs) has read its SSTs. Starts a GC pass (module docs).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tree: LsmTree,
        store: Arc<dyn ObjectStore>,
        root: Path,
        claim: Manifest,
        recovered: Option<Manifest>,
        retention: RetentionPolicy,
        scrub: &ScrubSettings,
        clock: SharedClock,
    ) -> Self {
        let scrubbed = Arc::new(AtomicBool::new(false));
        let handed_on: Vec<_> = recovered
            .iter()
            .flat_map(|m| m.levels.iter().flatten().cloned())
            .collect();
        let scrub = if handed_on.is_empty() {
            scrubbed.store(true, Ordering::Relaxed);
            None
        } else if scrub.bytes_per_second == 0 {
            None
        } else {
            let (tree, done, settings) = (tree.scrubber(), scrubbed.clone(), scrub.clone());
            Some(tokio::spawn(async move {
                if tree.scrub(handed_on, &settings).await {
                    done.store(true, Ordering::Relaxed);
                }
            }))
        };
        let shard = Self {
            manifests: ManifestStore::new(store.clone(), root.clone()),
            tree,
            store,
            root,
            last: tokio::sync::Mutex::new(claim),
            retention,
            clock,
            gc: BackgroundGc::default(),
            decided: std::sync::Mutex::new(recovered.as_ref().map(|m| m.version)),
            recovered,
            scrubbed,
            scrub,
        };
        shard.start_gc(&BTreeSet::new(), shard.clock.now_ms());
        shard
    }

    /// Starts a GC pass in the background (docs/checkpoints.md, checkpoint step 6), unless
    /// one runs: what `pinned`, the last decided checkpoint, the scrub and the live tree
    /// protect now.
    fn start_gc(&self, pinned: &BTreeSet<ManifestVersion>, now_ms: u64) {
        let decided = *self.decided.lock().unwrap_or_else(|e| e.into_inner());
        let protected = Protected {
            scrubbing_from: self
                .recovered
                .as_ref()
                .map(|m| m.version)
                .filter(|_| !self.scrubbed()),
            ..Protected::decided(decided, pinned)
        };
        let live = LiveWriter::of(&self.tree, &self.retention);
        let (store, root, policy) = (
            self.store.clone(),
            self.root.clone(),
            self.retention.clone(),
        );
        let interval = policy.gc_interval;
        self.gc.start(&self.root, (now_ms, interval), async move {
            collect_garbage(&store, &root, &live, &protected, &policy, now_ms).await
        });
    }

    /// Waits up to `max` for the GC pass running, if any: what a closing owner does, so that
    /// an owner that lives only a few seconds still completes its passes (module docs). A pass
    /// cut short is simply repeated by the next owner.
    pub async fn gc_settled_within(&self, max: std::time::Duration) {
        if tokio::time::timeout(max, self.gc.settled()).await.is_err() {
            tracing::debug!(shard = %self.root, "GC still running at close; the next owner repeats it");
        }
    }

    /// The tree.
    pub fn tree(&self) -> &LsmTree {
        &self.tree
    }

    /// Whether the scrub has read every block of the SSTs the shard was recovered with.
    pub fn scrubbed(&self) -> bool {
        self.scrubbed.load(Ordering::Relaxed)
    }

    /// Waits for the scrub to end (it has read everything, or found corruption).
    pub async fn scrub_settled(&mut self) {
        if let Some(scrub) = self.scrub.take() {
            let _ = scrub.await;
        }
    }

    /// The caller metadata (input offsets) of the checkpoint this shard resumed from; empty for
    /// a new shard.
    pub fn recovered_metadata(&self) -> BTreeMap<String, String> {
        self.recovered
            .as_ref()
            .map(|m| m.metadata.clone())
            .unwrap_or_default()
    }

    /// The version of the checkpoint this shard resumed from.
    pub fn recovered_version(&self) -> Option<ManifestVersion> {
        self.recovered.as_ref().map(|m| m.version)
    }

    /// Checkpoints the shard: flushes the memtable (SSTs flushed earlier are already in the
    /// store), commits the next manifest version create-only with `metadata`, then runs GC
    /// (retaining the last `retained_checkpoints`, and `pinned` versions; `pinned` is empty
    /// from the pipeline, savepoints pin by copying). The caller must not apply writes
    /// concurrently, so that `metadata` describes exactly the state written.
    ///
    /// # Errors
    /// [`CheckpointError`]; after [`CheckpointError::is_fenced`] the shard must be closed; a
    /// [`CheckpointError::Flush`] of a corrupt state means it must fall back.
    pub async fn commit_checkpoint(
        &self,
        metadata: BTreeMap<String, String>,
        pinned: &BTreeSet<ManifestVersion>,
        now_ms: u64,
    ) -> Result<CheckpointInfo, CheckpointError> {
        let mut last = self.last.lock().await;
        // A tree holding an SST found corrupt must not be checkpointed: its state is not what
        // the input made it.
        if let Some(corruption) = self.tree.corruption() {
            return Err(CheckpointError::Flush(corruption));
        }
        self.tree.flush().await.map_err(CheckpointError::Flush)?;
        let seq = self.tree.next_seq();
        let levels = self.tree.levels();
        let checkpoint = last.next_checkpoint(levels, metadata);
        // docs/checkpoints.md step 4: the SSTs are uploaded, the manifest is not written yet.
        fail::fail_point!("checkpoint-before-manifest", |_| crate::fail_points::crash(
            "checkpoint-before-manifest"
        ));
        self.manifests
            .commit(&checkpoint)
            .await
            .map_err(CheckpointError::Commit)?;
        self.tree.checkpoint_committed(seq);
        let previous: HashSet<SstId> = last.levels.iter().flatten().map(|r| r.id()).collect();
        let refs = checkpoint.levels.iter().flatten();
        let (ssts, bytes, uploaded_bytes) = refs.fold((0, 0, 0), |(n, b, u), r| {
            let new = if previous.contains(&r.id()) {
                0
            } else {
                r.size_bytes
            };
            (n + 1, b + r.size_bytes, u + new)
        });
        *last = checkpoint;
        // docs/checkpoints.md, checkpoint step 6.
        self.start_gc(pinned, now_ms);
        Ok(CheckpointInfo {
            version: last.version,
            ssts,
            bytes,
            uploaded_bytes,
        })
    }

    /// Waits for the GC pass the last checkpoint started, if any.
    pub async fn gc_settled(&self) {
        self.gc.settled().await;
    }
}

/// What recovery found for the `lsm` backend: the checkpoint to open from, and the versions to
/// record as rejected.
#[derive(Debug)]
pub struct Recovered {
    /// The checkpoint to resume from; `None`: start empty.
    pub checkpoint: Option<Manifest>,
    /// Versions recovery fell back past (or newer versions listed), for the claim.
    pub rejected: Vec<crate::state::manifest::RejectedVersion>,
    /// The version Kafka's committed offsets name (exactly-once), which the claim goes above
    /// even when it is not stored ([`ManifestStore::claim_above`]).
    pub committed: Option<ManifestVersion>,
}

/// Finds the checkpoint to resume the shard under `root` from (module docs) among `versions`
/// (its manifest versions, as the open listed them), given `recovery` (the version Kafka's
/// committed offsets name, what the last owner found corrupt). Claims do not count.
///
/// # Errors
/// [`StateError::Unavailable`] on any transient store error (never a reason to fall back);
/// [`StateError::Corrupt`] when checkpoints exist but none is usable.
pub async fn recover(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    recovery: &Recovery,
    versions: Vec<ManifestVersion>,
) -> Result<Recovered, StateError> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let mut check = SstCheck {
        store,
        root,
        stored: None,
        headed: HashMap::new(),
    };
    let found = find_checkpoint(&manifests, versions, recovery, &mut check).await?;
    Ok(Recovered {
        checkpoint: found.checkpoint.map(|(m, ())| m),
        rejected: found.rejected,
        committed: recovery.committed,
    })
}

/// Recovery's check of a candidate: well-formed levels, and every SST it names stored with
/// the size it records.
///
/// A candidate naming at most [`SST_HEADS_MAX`] SSTs is checked with a HEAD of each (at once):
/// the open then costs what the checkpoint holds, not what the shard's directory holds — after
/// a storm of short runs, hundreds of compacted-away SSTs wait out GC's grace period there, and
/// listing them all made each open slower than the last (S18). A larger one is checked against
/// one LIST of the directory, fewer requests than its HEADs.
struct SstCheck<'a> {
    store: &'a Arc<dyn ObjectStore>,
    root: &'a Path,
    /// Every SST under the shard and its size: one LIST, made for the first candidate that
    /// needs it and reused for older ones.
    stored: Option<HashMap<SstId, u64>>,
    /// SSTs a HEAD asked about: their size, `None` when not stored.
    headed: HashMap<SstId, Option<u64>>,
}

/// The most SSTs a candidate may name to be checked by HEADs rather than a LIST.
const SST_HEADS_MAX: usize = 32;

impl CandidateCheck for SstCheck<'_> {
    type Product = ();

    fn objects(&self, manifest: &Manifest) -> Vec<String> {
        manifest
            .levels
            .iter()
            .flatten()
            .map(|r| r.id().object_name())
            .collect()
    }

    async fn check(&mut self, candidate: &Manifest) -> Result<Checked<()>, StateError> {
        let unavailable = |root: &Path, e: object_store::Error| StateError::Unavailable {
            shard: root.to_string(),
            source: Box::new(e),
        };
        let ids: Vec<SstId> = candidate.levels.iter().flatten().map(|r| r.id()).collect();
        if self.stored.is_none() && ids.len() <= SST_HEADS_MAX {
            let asking: Vec<SstId> = ids
                .iter()
                .filter(|id| !self.headed.contains_key(id))
                .copied()
                .collect();
            let (store, root) = (self.store, self.root);
            let answers = futures::future::join_all(asking.iter().map(|id| {
                let path = Path::from(format!("{root}/{}", id.object_name()));
                async move { store.head(&path).await }
            }))
            .await;
            for (id, answer) in asking.into_iter().zip(answers) {
                let size = match answer {
                    Ok(meta) => Some(meta.size),
                    Err(object_store::Error::NotFound { .. }) => None,
                    Err(e) => return Err(unavailable(self.root, e)),
                };
                self.headed.insert(id, size);
            }
            let stored: HashMap<SstId, u64> = ids
                .iter()
                .filter_map(|id| Some((*id, (*self.headed.get(id)?)?)))
                .collect();
            return Ok(check_checkpoint(candidate, &stored));
        }
        let stored = match &mut self.stored {
            Some(stored) => stored,
            empty => {
                let listed = list_ssts(self.store, self.root)
                    .await
                    .map_err(|e| unavailable(self.root, e))?;
                empty.insert(listed)
            }
        };
        Ok(check_checkpoint(candidate, stored))
    }
}

/// Whether `manifest` has well-formed levels and every SST it names is in `stored` (every SST
/// under the shard and its size) with the size it records.
fn check_checkpoint(manifest: &Manifest, stored: &HashMap<SstId, u64>) -> Checked<()> {
    // Its state is a snapshot this backend cannot read: opening it would open empty. The open
    // converts the newest such checkpoint first (`checkpoints::convert`); one met here is older.
    if crate::state::snapshot::snapshot_name(&manifest.metadata).is_some() {
        return Checked::Invalid(
            "written by the memory backend (its state is a snapshot), not converted".to_owned(),
        );
    }
    if let Err(problem) = check_levels(&manifest.levels) {
        return Checked::Invalid(problem.to_string());
    }
    let refs: Vec<_> = manifest.levels.iter().flatten().collect();
    let missing: Vec<_> = refs
        .iter()
        .filter(|r| !stored.contains_key(&r.id()))
        .collect();
    if let Some(first) = missing.first() {
        return Checked::Invalid(format!(
            "{} SSTs it names are missing, first {}",
            missing.len(),
            first.id().object_name()
        ));
    }
    if let Some(r) = refs
        .iter()
        .find(|r| stored.get(&r.id()) != Some(&r.size_bytes))
    {
        return Checked::Invalid(format!(
            "SST {} is {} bytes, its manifest records {}",
            r.id().object_name(),
            stored.get(&r.id()).copied().unwrap_or_default(),
            r.size_bytes
        ));
    }
    Checked::Valid(())
}

/// The SSTs present under `root` with their sizes (one LIST).
async fn list_ssts(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
) -> Result<HashMap<SstId, u64>, object_store::Error> {
    let prefix = Path::from(format!("{root}/sst"));
    let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
    Ok(objects
        .iter()
        .filter_map(|m| {
            let id = m.location.filename().and_then(SstId::parse_file_name)?;
            Some((id, m.size))
        })
        .collect())
}

impl Shard for LsmShard {
    fn checkpoint_decided(&self, version: ManifestVersion) {
        *self.decided.lock().unwrap_or_else(|e| e.into_inner()) = Some(version);
    }

    async fn settle(&self, max: std::time::Duration) {
        self.gc_settled_within(max).await;
    }

    fn opened_from(&self) -> Option<ManifestVersion> {
        self.recovered_version()
    }

    fn resumed_from(&self) -> Option<ManifestVersion> {
        self.recovered
            .as_ref()
            .map(|m| crate::state::manifest::converted_from(&m.writer_token).unwrap_or(m.version))
    }

    async fn next_checkpoint_version(&self) -> Option<ManifestVersion> {
        Some(self.last.lock().await.version + 1)
    }

    fn corruption(&self) -> Option<StateError> {
        self.tree.corruption()
    }

    fn recovered_offsets(&self) -> Result<Option<InputOffsets>, StateError> {
        let Some(recovered) = &self.recovered else {
            return Ok(None);
        };
        InputOffsets::from_metadata(&recovered.metadata)
            .map(Some)
            .map_err(|reason| StateError::corrupt(self.root.to_string(), reason))
    }

    async fn checkpoint(
        &self,
        offsets: &InputOffsets,
        decided_by: DecidedBy,
    ) -> Result<Option<CheckpointReport>, checkpoint::CheckpointError> {
        let now_ms = self.clock.now_ms();
        let metadata = checkpoint::checkpoint_metadata(offsets, decided_by);
        match self
            .commit_checkpoint(metadata, &BTreeSet::new(), now_ms)
            .await
        {
            Ok(info) => Ok(Some(CheckpointReport {
                version: info.version,
                state_bytes: info.bytes,
                uploaded_bytes: info.uploaded_bytes,
            })),
            Err(err) if err.is_fenced() => Err(checkpoint::CheckpointError::Fenced {
                shard: self.root.to_string(),
            }),
            Err(CheckpointError::Flush(err)) => Err(checkpoint::CheckpointError::State(err)),
            Err(CheckpointError::Commit(err)) => Err(checkpoint::CheckpointError::State(
                err.into_state_error(&self.root),
            )),
        }
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        self.tree.get(key).await
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, StateError> {
        self.tree.get_many(keys).await
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StateError> {
        self.tree.scan(prefix, start_after, limit).await
    }

    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        self.tree.apply(writes).await
    }
}

#[cfg(test)]
#[path = "shard_tests.rs"]
mod tests;
