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
//! - the **scrub**: after opening from a checkpoint, a background task reads every block of
//!   the SSTs that checkpoint handed on, throttled, bypassing the caches. Until it has read
//!   them all once, GC keeps every manifest version that existed when the shard was claimed
//!   (the recovered checkpoint and the retained ones before it): later checkpoints keep
//!   referencing those SSTs, and without the older checkpoints, corruption found late would
//!   leave nothing to fall back to.
//!
//! The pipeline drives both through [`Shard::checkpoint`] and [`Shard::recovered_offsets`];
//! docs/checkpoints.md is the whole protocol, step by step.

use super::gc::{LiveWriter, collect_garbage};
use super::tree::{LsmTree, SstId, check_levels};
use crate::clock::SharedClock;
use crate::state::checkpoint::{self, CheckpointReport, DecidedBy, InputOffsets};
use crate::state::manifest::{
    BackgroundGc, CandidateCheck, Checked, Manifest, ManifestError, ManifestStore, Protected,
    RetentionPolicy, find_checkpoint,
};
use crate::state::{Recovery, Shard, StateError, StateWrite};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::path::Path;
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
    pub version: u64,
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
    decided: std::sync::Mutex<Option<u64>>,
    /// The manifest versions stored at the claim (the oldest to the claim): GC keeps them
    /// until the scrub has read the recovered SSTs once (module docs).
    keep: Option<std::ops::RangeInclusive<u64>>,
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
    /// A shard owning `tree` under `claim`, recovered from `recovered`; GC keeps the versions
    /// from `oldest_version` to the claim until the scrub (started here, at `scrub`'s pace,
    /// when `recovered` names SSTs) has read them.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tree: LsmTree,
        store: Arc<dyn ObjectStore>,
        root: Path,
        claim: Manifest,
        recovered: Option<Manifest>,
        oldest_version: Option<u64>,
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
        let keep = oldest_version.map(|oldest| oldest..=claim.version);
        Self {
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
            keep,
            scrubbed,
            scrub,
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
    pub fn recovered_version(&self) -> Option<u64> {
        self.recovered.as_ref().map(|m| m.version)
    }

    /// Checkpoints the shard: flushes the memtable (SSTs flushed earlier are already in the
    /// store), commits the next manifest version create-only with `metadata`, then runs GC
    /// (retaining the last `retained_checkpoints`, and `pinned` versions). The caller must
    /// not apply writes concurrently, so that `metadata` describes exactly the state written.
    ///
    /// # Errors
    /// [`CheckpointError`]; after [`CheckpointError::is_fenced`] the shard must be closed; a
    /// [`CheckpointError::Flush`] of a corrupt state means it must fall back.
    pub async fn commit_checkpoint(
        &self,
        metadata: BTreeMap<String, String>,
        pinned: &BTreeSet<u64>,
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
        let decided = *self.decided.lock().unwrap_or_else(|e| e.into_inner());
        let protected = Protected {
            keep: self.keep.clone().filter(|_| !self.scrubbed()),
            ..Protected::decided(decided, pinned)
        };
        let live = LiveWriter::of(&self.tree, &self.retention);
        let (store, root, policy) = (
            self.store.clone(),
            self.root.clone(),
            self.retention.clone(),
        );
        // docs/checkpoints.md, checkpoint step 6.
        self.gc.start(&self.root, async move {
            collect_garbage(&store, &root, &live, &protected, &policy, now_ms).await
        });
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

/// What recovery found for the `lsm` backend: the checkpoint to open from, the versions to
/// record as rejected, and the oldest version stored (what GC keeps until the scrub is done).
#[derive(Debug)]
pub struct Recovered {
    /// The checkpoint to resume from; `None`: start empty.
    pub checkpoint: Option<Manifest>,
    /// Versions recovery fell back past (or newer versions listed), for the claim.
    pub rejected: Vec<crate::state::manifest::RejectedVersion>,
    /// The oldest manifest version stored: GC keeps the versions from it to the claim until
    /// the scrub has read what the checkpoint hands on.
    pub oldest_version: Option<u64>,
}

/// Finds the checkpoint to resume the shard under `root` from (module docs), given
/// `recovery` (the version Kafka's committed offsets name, what the last owner found
/// corrupt). Claims do not count.
///
/// # Errors
/// [`StateError::Unavailable`] on any transient store error (never a reason to fall back);
/// [`StateError::Corrupt`] when checkpoints exist but none is usable.
pub async fn recover(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    recovery: &Recovery,
) -> Result<Recovered, StateError> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let mut check = SstCheck {
        store,
        root,
        stored: None,
    };
    let found = find_checkpoint(&manifests, recovery, &mut check).await?;
    Ok(Recovered {
        checkpoint: found.checkpoint.map(|(m, ())| m),
        rejected: found.rejected,
        oldest_version: found.oldest_version,
    })
}

/// Recovery's check of a candidate: well-formed levels, and every SST it names stored with
/// the size it records.
struct SstCheck<'a> {
    store: &'a Arc<dyn ObjectStore>,
    root: &'a Path,
    /// Every SST under the shard and its size: one LIST, made for the first candidate and
    /// reused for older ones.
    stored: Option<HashMap<SstId, u64>>,
}

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
        let stored = match &mut self.stored {
            Some(stored) => stored,
            empty => {
                let listed = list_ssts(self.store, self.root).await.map_err(|e| {
                    StateError::Unavailable {
                        shard: self.root.to_string(),
                        source: Box::new(e),
                    }
                })?;
                empty.insert(listed)
            }
        };
        Ok(check_checkpoint(candidate, stored))
    }
}

/// Whether `manifest` has well-formed levels and every SST it names is in `stored` (every SST
/// under the shard and its size) with the size it records.
fn check_checkpoint(manifest: &Manifest, stored: &HashMap<SstId, u64>) -> Checked<()> {
    if let Err(problem) = check_levels(&manifest.levels) {
        return Checked::Invalid(problem);
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
    fn checkpoint_decided(&self, version: u64) {
        *self.decided.lock().unwrap_or_else(|e| e.into_inner()) = Some(version);
    }

    fn opened_from(&self) -> Option<u64> {
        self.recovered_version()
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
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SharedClock};
    use crate::state::faulty_store::{Fault, FaultyStore};
    use crate::state::lsm::backend::LsmBackend;
    use crate::state::lsm::cache::BlockCaches;
    use crate::state::test_support::{block_on, observed};
    use crate::state::{ShardId, StateBackend};
    use object_store::{ObjectStoreExt, PutPayload};

    fn backend(store: &Arc<FaultyStore>) -> LsmBackend {
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        LsmBackend::new(
            store.clone(),
            Path::from("p"),
            Arc::new(BlockCaches::none()),
            crate::state::lsm::tests::small_settings(),
            clock,
        )
    }

    fn id() -> ShardId {
        ShardId {
            pipeline: "counts".into(),
            partition: 3,
        }
    }

    fn write(i: u32, value: &str) -> StateWrite {
        StateWrite {
            key: i.to_be_bytes().to_vec(),
            value: Some(Bytes::from(value.to_owned())),
            expires_at_ms: None,
        }
    }

    fn offsets(offset: u64) -> BTreeMap<String, String> {
        [("counts-in/3".to_owned(), offset.to_string())].into()
    }

    /// Writes keys `from..to` with `value` and checkpoints with offset `to`.
    async fn write_and_checkpoint(shard: &LsmShard, from: u32, to: u32, value: &str) -> u64 {
        for i in from..to {
            shard.apply(vec![write(i, value)]).await.expect("apply");
        }
        shard
            .commit_checkpoint(offsets(u64::from(to)), &BTreeSet::new(), 0)
            .await
            .expect("checkpoint")
            .version
    }

    #[test]
    fn the_next_owner_resumes_from_the_checkpoint_with_its_offsets_and_fences_the_old_one() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("a opens");
            assert_eq!(a.recovered_metadata(), BTreeMap::new(), "a new shard");
            write_and_checkpoint(&a, 0, 40, "a").await;
            // Written after the checkpoint: not part of what the next owner sees.
            a.apply(vec![write(1000, "late")]).await.expect("apply");

            let b = backend(&store).open_shard(&id()).await.expect("b opens");
            assert_eq!(b.recovered_metadata(), offsets(40));
            for i in 0..40u32 {
                assert_eq!(
                    b.get(&i.to_be_bytes()).await.expect("get"),
                    Some(Bytes::from("a"))
                );
            }
            assert_eq!(b.get(&1000u32.to_be_bytes()).await.expect("get"), None);
            let err = a
                .commit_checkpoint(offsets(41), &BTreeSet::new(), 0)
                .await
                .expect_err("a was fenced by b's claim");
            assert!(err.is_fenced(), "{err:?}");
        });
    }

    #[test]
    fn a_corrupt_newest_checkpoint_falls_back_to_the_previous_one() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            write_and_checkpoint(&a, 0, 20, "old").await;
            let newest = write_and_checkpoint(&a, 0, 30, "new").await;
            let path = Path::from(format!(
                "p/pipelines/counts/shards/00003/manifest/{newest:020}.manifest"
            ));
            store
                .inner
                .put(&path, PutPayload::from_static(b"WEIRMAN1 but then garbage"))
                .await
                .expect("overwrite");
            let b = backend(&store).open_shard(&id()).await.expect("b opens");
            assert_eq!(b.recovered_metadata(), offsets(20));
            assert_eq!(
                b.get(&5u32.to_be_bytes()).await.expect("get"),
                Some(Bytes::from("old"))
            );
            assert_eq!(b.get(&25u32.to_be_bytes()).await.expect("get"), None);
        });
    }

    #[test]
    fn a_checkpoint_naming_a_missing_sst_falls_back_to_the_previous_one() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            write_and_checkpoint(&a, 0, 20, "old").await;
            let before: HashSet<SstId> = a.tree().live_ssts().into_iter().collect();
            write_and_checkpoint(&a, 100, 120, "new").await;
            let only_newest = a
                .tree()
                .live_ssts()
                .into_iter()
                .find(|id| !before.contains(id))
                .expect("the second checkpoint flushed a new SST");
            let path = Path::from(format!(
                "p/pipelines/counts/shards/00003/{}",
                only_newest.object_name()
            ));
            store.inner.delete(&path).await.expect("delete");
            let b = backend(&store).open_shard(&id()).await.expect("b opens");
            assert_eq!(b.recovered_metadata(), offsets(20));
        });
    }

    #[test]
    fn a_transient_error_reading_checkpoints_is_retried_not_a_fallback() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            write_and_checkpoint(&a, 0, 20, "old").await;
            write_and_checkpoint(&a, 0, 30, "new").await;
            store.inject_on("/manifest/", Fault::GetFails);
            let err = backend(&store)
                .open_shard(&id())
                .await
                .expect_err("the read failed");
            assert!(matches!(err, StateError::Unavailable { .. }), "{err}");
            let b = backend(&store)
                .open_shard(&id())
                .await
                .expect("the retry opens");
            assert_eq!(
                b.recovered_metadata(),
                offsets(30),
                "the newest, not a fallback"
            );
        });
    }

    #[test]
    fn checkpoints_keep_the_last_three_and_gc_the_older_manifests() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            let mut versions = Vec::new();
            for round in 0..5 {
                versions.push(write_and_checkpoint(&a, 0, 10 + round, "v").await);
                a.gc_settled().await;
            }
            let left =
                ManifestStore::new(store.clone(), Path::from("p/pipelines/counts/shards/00003"))
                    .versions()
                    .await
                    .expect("versions");
            assert_eq!(left, versions[2..].to_vec());
        });
    }

    /// The SSTs of the newest checkpoint that no older checkpoint of `shard` names.
    fn only_in_newest(shard: &LsmShard, before: &HashSet<SstId>) -> Vec<SstId> {
        shard
            .tree()
            .live_ssts()
            .into_iter()
            .filter(|id| !before.contains(id))
            .collect()
    }

    /// Flips 8 bytes of the object at `path`, keeping its size (so that opening, which checks
    /// sizes, does not notice).
    async fn flip_bytes(store: &FaultyStore, path: &Path, at: usize) {
        let mut bytes = store
            .inner
            .get(path)
            .await
            .expect("stored")
            .bytes()
            .await
            .expect("read")
            .to_vec();
        for b in &mut bytes[at..at + 8] {
            *b ^= 0xff;
        }
        store
            .inner
            .put(path, PutPayload::from(bytes))
            .await
            .expect("rewritten");
    }

    fn sst_path(id: SstId) -> Path {
        Path::from(format!(
            "p/pipelines/counts/shards/00003/{}",
            id.object_name()
        ))
    }

    fn manifests(store: &Arc<FaultyStore>) -> ManifestStore {
        ManifestStore::new(store.clone(), Path::from("p/pipelines/counts/shards/00003"))
    }

    #[test]
    fn a_flipped_byte_in_an_sst_of_the_newest_checkpoint_makes_the_shard_fall_back_with_its_offsets()
     {
        let store = Arc::new(FaultyStore::default());
        let (known, newest) = block_on(async {
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            write_and_checkpoint(&a, 0, 20, "old").await;
            let before: HashSet<SstId> = a.tree().live_ssts().into_iter().collect();
            let newest = write_and_checkpoint(&a, 100, 120, "new").await;
            for id in only_in_newest(&a, &before) {
                flip_bytes(&store, &sst_path(id), 4).await;
            }
            // The next owner opens the newest checkpoint (its SSTs are all there, at their
            // sizes); the first read of a damaged block finds the corruption, twice.
            let b = backend(&store).open_shard(&id()).await.expect("opens");
            assert_eq!(b.recovered_metadata(), offsets(120));
            let mut found = None;
            for i in 100..120u32 {
                if let Err(error) = b.get(&i.to_be_bytes()).await {
                    found = Some(error);
                    break;
                }
            }
            let error = found.expect("a read meets the flipped bytes");
            let StateError::Corrupt { object, .. } = &error else {
                panic!("corruption, not {error}");
            };
            let object = object.clone().expect("the SST is named");
            assert!(object.starts_with("sst/"), "{object}");
            let mut known = crate::state::KnownCorruption::default();
            known.add(&error, b.opened_from());
            (known, newest)
        });
        let (c, seen) = observed(|| {
            block_on(async {
                let recovery = Recovery {
                    committed: None,
                    known_corruption: known.clone(),
                };
                backend(&store)
                    .open_shard_at(&id(), &recovery)
                    .await
                    .expect("falls back")
            })
        });
        assert_eq!(
            c.recovered_metadata(),
            offsets(20),
            "the previous checkpoint, with its offsets"
        );
        assert_eq!(seen.audit_lines.len(), 1, "{:?}", seen.audit_lines);
        assert!(
            seen.audit_lines[0].contains(&format!("version={newest}"))
                && seen.audit_lines[0].contains("found corrupt"),
            "{:?}",
            seen.audit_lines
        );
        assert_eq!(seen.counter("weir_checkpoint_fallbacks_total"), 1.0);
        block_on(async {
            assert_eq!(
                c.get(&5u32.to_be_bytes()).await.expect("get"),
                Some(Bytes::from("old"))
            );
            assert_eq!(c.get(&105u32.to_be_bytes()).await.expect("get"), None);
            // The claim records the rejected version: a later open skips it without reading
            // it (a read of it would fail here) and knowing nothing of the corruption.
            let versions = manifests(&store).versions().await.expect("versions");
            let claim = manifests(&store)
                .read(*versions.last().expect("c's claim is the newest"))
                .await
                .expect("the claim");
            assert!(claim.rejects(newest), "{:?}", claim.rejected);
            store.inject_on(
                Box::leak(format!("/{newest:020}.manifest").into_boxed_str()),
                Fault::GetFails,
            );
            let d = backend(&store).open_shard(&id()).await.expect("opens");
            assert_eq!(d.recovered_metadata(), offsets(20));
            assert!(store.take_any(), "the rejected version was never read");
        });
    }

    #[test]
    fn with_no_usable_checkpoint_left_the_open_fails_as_corrupt_and_claims_nothing() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            let only = write_and_checkpoint(&a, 0, 20, "old").await;
            let before = manifests(&store).versions().await.expect("versions");
            let recovery = Recovery {
                committed: None,
                known_corruption: crate::state::KnownCorruption {
                    versions: [only].into(),
                    reason: "checksum mismatch".into(),
                    ..Default::default()
                },
            };
            let err = backend(&store)
                .open_shard_at(&id(), &recovery)
                .await
                .expect_err("nothing to fall back to");
            assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
            assert!(err.to_string().contains("corrupt"), "{err}");
            assert_eq!(
                manifests(&store).versions().await.expect("versions"),
                before,
                "no claim was written"
            );
        });
    }

    #[test]
    fn gc_goes_on_after_a_fallback_and_deletes_the_corrupt_version_only_below_the_retained_ones() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            write_and_checkpoint(&a, 0, 10, "v").await;
            write_and_checkpoint(&a, 0, 11, "v").await;
            let newest = write_and_checkpoint(&a, 0, 12, "v").await;
            let path = Path::from(format!(
                "p/pipelines/counts/shards/00003/manifest/{newest:020}.manifest"
            ));
            store
                .inner
                .put(&path, PutPayload::from_static(b"WEIRMAN1 torn"))
                .await
                .expect("overwrite");
            let b = backend(&store).open_shard(&id()).await.expect("falls back");
            assert_eq!(b.recovered_metadata(), offsets(11));
            let gc = RetentionPolicy {
                grace: std::time::Duration::ZERO,
                ..RetentionPolicy::default()
            };
            let mut left = Vec::new();
            for round in 0..3u32 {
                let version = write_and_checkpoint(&b, 0, 20 + round, "w").await;
                b.gc_settled().await;
                let report = collect_garbage(
                    &(store.clone() as Arc<dyn ObjectStore>),
                    &Path::from("p/pipelines/counts/shards/00003"),
                    &LiveWriter::of(b.tree(), &gc),
                    &Protected {
                        decided: Some(version),
                        ..Protected::default()
                    },
                    &gc,
                    u64::MAX,
                )
                .await;
                assert!(report.is_ok(), "GC fails no more: {report:?}");
                left = manifests(&store).versions().await.expect("versions");
                if round < 2 {
                    assert!(left.contains(&newest), "kept while above the retained ones");
                }
            }
            assert!(!left.contains(&newest), "deleted once below them: {left:?}");
            assert_eq!(left.len(), 3, "the last three checkpoints: {left:?}");
        });
    }

    #[test]
    fn corruption_the_scrub_finds_in_a_cold_sst_stops_the_next_checkpoint() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            write_and_checkpoint(&a, 0, 40, "cold").await;
            let ssts = a.tree().live_ssts();
            flip_bytes(&store, &sst_path(ssts[0]), 4).await;
            let mut b = backend(&store).open_shard(&id()).await.expect("opens");
            b.scrub_settled().await;
            assert!(!b.scrubbed(), "the scrub found the damage");
            let found = b.tree().corruption().expect("recorded in the tree");
            let StateError::Corrupt { object, .. } = &found else {
                panic!("{found}");
            };
            assert_eq!(object.as_deref(), Some(ssts[0].object_name().as_str()));
            let err = b
                .commit_checkpoint(offsets(41), &BTreeSet::new(), 0)
                .await
                .expect_err("a corrupt tree never checkpoints");
            assert!(matches!(
                err,
                CheckpointError::Flush(StateError::Corrupt { .. })
            ));
        });
    }

    #[test]
    fn until_the_scrub_has_read_the_recovered_ssts_gc_keeps_every_version_of_the_claim() {
        block_on(async {
            let store = Arc::new(FaultyStore::default());
            let a = backend(&store).open_shard(&id()).await.expect("opens");
            for round in 0..3 {
                write_and_checkpoint(&a, 0, 10 + round, "v").await;
                a.gc_settled().await;
            }
            let at_claim = manifests(&store).versions().await.expect("versions");
            let scrubless = backend(&store).with_scrub(ScrubSettings {
                bytes_per_second: 0,
                ..ScrubSettings::default()
            });
            let b = scrubless.open_shard(&id()).await.expect("opens");
            for round in 0..4 {
                write_and_checkpoint(&b, 0, 20 + round, "w").await;
                b.gc_settled().await;
            }
            let left = manifests(&store).versions().await.expect("versions");
            for version in &at_claim {
                assert!(left.contains(version), "{version} kept: {left:?}");
            }
            // Scrubbed: the next GC keeps only the last three checkpoints.
            let mut c = backend(&store).open_shard(&id()).await.expect("opens");
            c.scrub_settled().await;
            assert!(c.scrubbed());
            for round in 0..3 {
                let version = write_and_checkpoint(&c, 0, 30 + round, "x").await;
                // As the worker does once a checkpoint is decided: the pin moves on.
                c.checkpoint_decided(version);
                c.gc_settled().await;
            }
            let left = manifests(&store).versions().await.expect("versions");
            assert_eq!(left.len(), 3, "{left:?}");
        });
    }
}
