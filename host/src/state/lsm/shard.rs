//! [`LsmShard`]: a shard of the `lsm` backend as its owner holds it — the tree, the claim it
//! was opened under, and the two halves of the checkpoint protocol that live in the state layer
//! (DESIGN.md, "Checkpoint protocol" steps 2, 3 and 5, and "Recovery" steps 2 and 3):
//!
//! - [`recover`]: find the checkpoint to resume from — the newest valid one; an older retained
//!   one only when the newer is *provably* corrupt (a checksum or format failure, or an SST it
//!   names is missing), never on a transient error, with an audit log line per fallback — and
//!   claim the shard from it.
//! - [`LsmShard::commit_checkpoint`]: flush the memtable, commit the next manifest version
//!   create-only with the caller's metadata (the input offsets), then start collecting garbage
//!   in the background (off the checkpoint's critical path: the partition is paused only for
//!   the flush and the manifest).
//!
//! The pipeline drives both through [`Shard::checkpoint`] and [`Shard::recovered_offsets`];
//! docs/checkpoints.md is the whole protocol, step by step.

use super::gc::{GcSettings, LiveWriter, collect_garbage};
use super::tree::{LsmTree, SstId};
use crate::clock::SharedClock;
use crate::state::checkpoint::{self, CheckpointReport, DecidedBy, InputOffsets};
use crate::state::manifest::{
    Manifest, ManifestError, ManifestStore, RecoveryRead, audit_fallback, audit_missing_committed,
};
use crate::state::{Shard, StateError, StateWrite};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

/// Why a checkpoint did not commit.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The memtable could not be flushed; nothing was committed. Retry later.
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
    gc: GcSettings,
    clock: SharedClock,
    /// The background GC started by the last checkpoint; at most one runs at a time.
    gc_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The checkpoint recovery would use now (the one resumed from, then each decided one):
    /// GC never deletes it, even when newer prepared but undecided versions outnumber the
    /// retained count (exactly-once mode, where a Kafka transaction decides).
    decided: std::sync::Mutex<Option<u64>>,
}

impl LsmShard {
    /// A shard owning `tree` under `claim`, recovered from `recovered`.
    pub fn new(
        tree: LsmTree,
        store: Arc<dyn ObjectStore>,
        root: Path,
        claim: Manifest,
        recovered: Option<Manifest>,
        gc: GcSettings,
        clock: SharedClock,
    ) -> Self {
        Self {
            manifests: ManifestStore::new(store.clone(), root.clone()),
            tree,
            store,
            root,
            last: tokio::sync::Mutex::new(claim),
            gc,
            clock,
            gc_task: std::sync::Mutex::new(None),
            decided: std::sync::Mutex::new(recovered.as_ref().map(|m| m.version)),
            recovered,
        }
    }

    /// The tree.
    pub fn tree(&self) -> &LsmTree {
        &self.tree
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
    /// [`CheckpointError`]; after [`CheckpointError::is_fenced`] the shard must be closed.
    pub async fn commit_checkpoint(
        &self,
        metadata: BTreeMap<String, String>,
        pinned: &BTreeSet<u64>,
        now_ms: u64,
    ) -> Result<CheckpointInfo, CheckpointError> {
        let mut last = self.last.lock().await;
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
        let mut pinned = pinned.clone();
        pinned.extend(*self.decided.lock().unwrap_or_else(|e| e.into_inner()));
        self.start_gc(pinned, now_ms);
        Ok(CheckpointInfo {
            version: last.version,
            ssts,
            bytes,
            uploaded_bytes,
        })
    }

    /// Starts a GC pass in the background (DESIGN.md checkpoint step 5) unless the previous
    /// one is still running; a failed pass is logged and the next checkpoint's runs again.
    fn start_gc(&self, pinned: BTreeSet<u64>, now_ms: u64) {
        let mut slot = self.gc_task.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|task| !task.is_finished()) {
            tracing::debug!(shard = %self.root, "GC still running; skipped this checkpoint's");
            return;
        }
        let live = LiveWriter::of(&self.tree, &self.gc);
        let (store, root, settings) = (self.store.clone(), self.root.clone(), self.gc.clone());
        *slot = Some(tokio::spawn(async move {
            match collect_garbage(&store, &root, &live, &pinned, &settings, now_ms).await {
                Ok(report) => tracing::debug!(shard = %root, ?report, "GC done"),
                Err(error) => {
                    tracing::warn!(shard = %root, %error, "GC failed; it runs again after the next checkpoint")
                }
            }
        }));
    }

    /// Waits for the GC pass the last checkpoint started, if any.
    pub async fn gc_settled(&self) {
        let task = self
            .gc_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// Finds the checkpoint to resume the shard under `root` from: the newest checkpoint version
/// that decodes and whose SSTs all exist, falling back to older ones only past provable
/// corruption (each fallback logged as an audit line). Claims do not count.
///
/// # Errors
/// [`StateError::Unavailable`] on any transient store error (never a reason to fall back);
/// [`StateError::Corrupt`] when checkpoints exist but none is valid.
pub async fn recover(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
) -> Result<Option<Manifest>, StateError> {
    recover_decided(store, root, None).await
}

/// As [`recover`], among the *decided* checkpoints ([`is_decided`]) given the version the
/// committed Kafka offsets name (`committed`): a checkpoint prepared for a transaction that
/// never committed is skipped. A missing `committed` version falls back like a corrupt one,
/// with an audit line.
///
/// # Errors
/// As [`recover`].
pub async fn recover_decided(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    committed: Option<u64>,
) -> Result<Option<Manifest>, StateError> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let label = root.to_string();
    let unavailable = |source: Box<dyn std::error::Error + Send + Sync>| StateError::Unavailable {
        shard: label.clone(),
        source,
    };
    let versions = manifests
        .versions()
        .await
        .map_err(|e| unavailable(Box::new(e)))?;
    let mut existing: Option<HashSet<SstId>> = None;
    let mut corrupt_seen = audit_missing_committed(root, &versions, committed);
    for &version in versions.iter().rev() {
        let manifest = match manifests
            .read_for_recovery(version, committed)
            .await
            .map_err(|e| unavailable(Box::new(e)))?
        {
            RecoveryRead::Decided(m) => m,
            RecoveryRead::Skip => continue,
            RecoveryRead::Corrupt => {
                corrupt_seen += 1;
                continue;
            }
        };
        if existing.is_none() {
            existing = Some(
                list_ssts(store, root)
                    .await
                    .map_err(|e| unavailable(Box::new(e)))?,
            );
        }
        let present = existing.as_ref().expect("listed above");
        let missing: Vec<SstId> = manifest
            .levels
            .iter()
            .flatten()
            .map(|r| r.id())
            .filter(|id| !present.contains(id))
            .collect();
        if missing.is_empty() {
            return Ok(Some(manifest));
        }
        let problem = format!(
            "{} SSTs it names are missing, first {}",
            missing.len(),
            missing[0].object_name()
        );
        audit_fallback(root, version, &problem);
        corrupt_seen += 1;
    }
    if corrupt_seen > 0 {
        return Err(StateError::Corrupt {
            shard: label,
            source: format!(
                "{corrupt_seen} manifest version(s) are corrupt and no valid checkpoint is left"
            )
            .into(),
        });
    }
    Ok(None)
}

/// The SSTs present under `root` (one LIST).
async fn list_ssts(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
) -> Result<HashSet<SstId>, object_store::Error> {
    let prefix = Path::from(format!("{root}/sst"));
    let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
    Ok(objects
        .iter()
        .filter_map(|m| m.location.filename().and_then(SstId::parse_file_name))
        .collect())
}

impl Shard for LsmShard {
    fn checkpoint_decided(&self, version: u64) {
        *self.decided.lock().unwrap_or_else(|e| e.into_inner()) = Some(version);
    }

    fn recovered_offsets(&self) -> Result<Option<InputOffsets>, StateError> {
        let Some(recovered) = &self.recovered else {
            return Ok(None);
        };
        InputOffsets::from_metadata(&recovered.metadata)
            .map(Some)
            .map_err(|reason| StateError::Corrupt {
                shard: self.root.to_string(),
                source: reason.into(),
            })
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
    use crate::state::test_support::block_on;
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
}
