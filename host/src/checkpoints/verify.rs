//! `weir pipeline verify`: which stored checkpoints of a pipeline's shards could be restored,
//! checked against the store rather than assumed (issue 20's disaster recovery). For every
//! manifest version of every shard: the manifest decodes (magic, format, checksum, version);
//! a checkpoint's objects are all present at the size it recorded (both backends: the `lsm`
//! backend's SSTs, the `memory` backend's snapshot); and, with `checksums`, every object is read
//! once and its checksums verified (each SST's blocks, footer and index; the snapshot's
//! CRC-32C). Read-only: nothing is claimed, written or deleted.
//!
//! Whether an exactly-once checkpoint is decided lives in Kafka's committed offsets, not in
//! the store: such a checkpoint is reported as `transaction`-decided, restorable or not.

use crate::ids::{ManifestVersion, Offset, Partition};
use crate::state::lsm::sst::reader::SstReader;
use crate::state::lsm::tree::SstId;
use crate::state::manifest::{Manifest, ManifestError, ManifestKind, ManifestStore};
use crate::state::snapshot;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What verification found for one manifest version of a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VersionCheck {
    /// The manifest version (the checkpoint id).
    pub version: ManifestVersion,
    /// `checkpoint`, or `claim` (an owner's claim of the shard: no state of its own).
    pub kind: String,
    /// What decides a checkpoint: `manifest` (at-least-once: it is decided) or `transaction`
    /// (exactly-once: decided when Kafka's committed offsets name it). `None` for a claim.
    pub decided_by: Option<String>,
    /// The input offsets it resumes from (topic → next offset).
    pub offsets: BTreeMap<String, Offset>,
    /// Objects it references (SSTs, or the snapshot).
    pub objects: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Whether it can be restored: it decodes, a later claim did not reject it, and every
    /// object it references is present and whole (and, when checked, its checksums hold).
    pub restorable: bool,
    /// Why it cannot be, when it cannot.
    pub problem: Option<String>,
}

/// What verification found for one shard: its versions, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ShardCheck {
    /// The stage whose shard it is, in a pipeline of stages (absent in a one-operator
    /// pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The input partition.
    pub partition: Partition,
    /// Every manifest version stored, newest first.
    pub versions: Vec<VersionCheck>,
}

impl ShardCheck {
    /// The newest restorable checkpoint, if any: what a new owner would open (at-least-once;
    /// exactly-once opens the one Kafka names, or an older one).
    pub fn newest_restorable(&self) -> Option<ManifestVersion> {
        self.versions
            .iter()
            .find(|v| v.restorable && v.kind == "checkpoint")
            .map(|v| v.version)
    }
}

/// Why verification could not finish: the store failed (retry), not what it found.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the pipeline's state from the object store")]
pub struct VerifyError(#[source] pub object_store::Error);

/// Verifies every shard of pipeline `pipeline` under the backend prefix `prefix` (the shards
/// `{prefix}/pipelines/{pipeline}/shards/{p:05}`), in partition order; with `checksums`, every
/// referenced object is read once (module docs).
///
/// # Errors
/// [`VerifyError`] when the store fails (what is missing or corrupt is reported, not an
/// error).
pub async fn verify_pipeline(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    pipeline: &str,
    checksums: bool,
) -> Result<Vec<ShardCheck>, VerifyError> {
    let partitions = shard_roots(store, prefix, pipeline)
        .await
        .map_err(VerifyError)?;
    let mut out = Vec::with_capacity(partitions.len());
    for (partition, root) in partitions {
        out.push(ShardCheck {
            stage: None,
            partition,
            versions: verify_shard(store, &root, checksums).await?,
        });
    }
    Ok(out)
}

/// The shards stored for pipeline `pipeline` under the backend prefix `prefix` (each shard's
/// partition and root, `{prefix}/pipelines/{pipeline}/shards/{p:05}`), in partition order.
///
/// # Errors
/// The store's, when listing fails.
pub async fn shard_roots(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    pipeline: &str,
) -> Result<Vec<(Partition, Path)>, object_store::Error> {
    let shards = if prefix.as_ref().is_empty() {
        Path::from(format!("pipelines/{pipeline}/shards"))
    } else {
        Path::from(format!("{prefix}/pipelines/{pipeline}/shards"))
    };
    let listed = store.list_with_delimiter(Some(&shards)).await?;
    let mut partitions: Vec<(Partition, Path)> = listed
        .common_prefixes
        .into_iter()
        .filter_map(|p| Some((p.filename()?.parse().ok()?, p)))
        .collect();
    partitions.sort_by_key(|(p, _)| *p);
    Ok(partitions)
}

/// Verifies every manifest version of the shard under `root`, newest first.
///
/// # Errors
/// [`VerifyError`] when the store fails.
pub async fn verify_shard(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    checksums: bool,
) -> Result<Vec<VersionCheck>, VerifyError> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let versions = manifests.versions().await.map_err(manifest_unavailable)?;
    // Every object of the shard, once: presence and size come from the listing.
    let present: HashMap<Path, u64> = store
        .list(Some(root))
        .map_ok(|m| (m.location, m.size))
        .try_collect()
        .await
        .map_err(VerifyError)?;
    let mut objects = Objects {
        store,
        present,
        checksums,
        verified: HashMap::new(),
    };
    let mut read: Vec<Manifest> = Vec::new();
    let mut checks = Vec::with_capacity(versions.len());
    for &version in versions.iter().rev() {
        let manifest = match manifests.read(version).await {
            Ok(m) => m,
            Err(ManifestError::Corrupt { reason, .. }) => {
                checks.push(unrestorable(
                    version,
                    format!("manifest is corrupt: {reason}"),
                ));
                continue;
            }
            Err(ManifestError::NotFound(_)) => continue, // deleted by GC meanwhile
            Err(other) => return Err(manifest_unavailable(other)),
        };
        let mut check = VersionCheck::of(version, &manifest);
        if manifest.kind == ManifestKind::Checkpoint {
            // A newer version (read before this one) that rejected it.
            let rejected = read.iter().find_map(|m| {
                m.rejected
                    .iter()
                    .find(|r| r.version == version)
                    .map(|r| r.reason.clone())
            });
            check.problem = match rejected {
                Some(reason) => Some(format!("rejected by a later owner: {reason}")),
                None => {
                    let problem = objects.problem(root, &manifest, &mut check).await?;
                    if problem.is_some() && collected(&manifests, version).await? {
                        // GC deleted the version while it was being checked (a running
                        // pipeline): what it referenced may be gone with it. It is no longer
                        // stored: not reported.
                        continue;
                    }
                    problem
                }
            };
            check.restorable = check.problem.is_none();
        }
        checks.push(check);
        read.push(manifest);
    }
    Ok(checks)
}

/// A manifest store's failure as a verify's: the store's error, or the manifest's wrapped.
fn manifest_unavailable(e: ManifestError) -> VerifyError {
    match e {
        ManifestError::Unavailable(source) => VerifyError(source),
        other => VerifyError(object_store::Error::Generic {
            store: "manifest",
            source: Box::new(other),
        }),
    }
}

impl VersionCheck {
    /// What manifest `version` says before its objects are checked: its kind, how its
    /// checkpoint was decided, its offsets; not restorable yet.
    fn of(version: ManifestVersion, manifest: &Manifest) -> Self {
        let checkpoint = manifest.kind == ManifestKind::Checkpoint;
        VersionCheck {
            version,
            kind: if checkpoint { "checkpoint" } else { "claim" }.to_owned(),
            decided_by: checkpoint.then(|| {
                match crate::state::checkpoint::decided_by(&manifest.metadata) {
                    crate::state::checkpoint::DecidedBy::Manifest => "manifest",
                    crate::state::checkpoint::DecidedBy::Transaction => "transaction",
                }
                .to_owned()
            }),
            offsets: crate::state::checkpoint::InputOffsets::from_metadata(&manifest.metadata)
                .map(|o| o.iter().map(|(t, next)| (t.to_owned(), next)).collect())
                .unwrap_or_default(),
            objects: 0,
            bytes: 0,
            restorable: false,
            problem: None,
        }
    }
}

/// The objects of a shard as one verify sees them: listed once, each checksummed at most
/// once however many versions reference it.
struct Objects<'a> {
    store: &'a Arc<dyn ObjectStore>,
    /// Every object of the shard and its size, from one listing.
    present: HashMap<Path, u64>,
    /// Read and check each object's checksums, besides its presence and size.
    checksums: bool,
    /// The checksums' outcome of each object read.
    verified: HashMap<Path, Result<(), ObjectProblem>>,
}

impl Objects<'_> {
    /// The first problem of the objects `manifest` (under `root`) references — missing, of
    /// another size, corrupt — if one has one; counts them and their bytes in `check`.
    async fn problem(
        &mut self,
        root: &Path,
        manifest: &Manifest,
        check: &mut VersionCheck,
    ) -> Result<Option<String>, VerifyError> {
        let objects = referenced(root, manifest);
        check.objects = objects.len();
        check.bytes = objects.iter().map(|(_, size, _)| size.unwrap_or(0)).sum();
        for (path, size, kind) in &objects {
            let problem = match (self.present.get(path), size) {
                (None, _) => Some(format!("{path} is missing")),
                (Some(found), Some(size)) if found != size => Some(format!(
                    "{path} has {found} bytes, the checkpoint recorded {size}"
                )),
                _ if !self.checksums => None,
                _ => {
                    if !self.verified.contains_key(path) {
                        let outcome = verify_object(self.store, path, *kind).await?;
                        self.verified.insert(path.clone(), outcome);
                    }
                    self.verified[path]
                        .as_ref()
                        .err()
                        .map(|e| format!("{path}: {e}"))
                }
            };
            if let Some(size) = self.present.get(path).filter(|_| size.is_none()) {
                check.bytes += size;
            }
            if problem.is_some() {
                return Ok(problem);
            }
        }
        Ok(None)
    }
}

/// Whether manifest `version` is gone from the store (GC deleted it).
async fn collected(
    manifests: &ManifestStore,
    version: ManifestVersion,
) -> Result<bool, VerifyError> {
    match manifests.read(version).await {
        Err(ManifestError::NotFound(_)) => Ok(true),
        Err(ManifestError::Unavailable(source)) => Err(VerifyError(source)),
        _ => Ok(false),
    }
}

/// A version no more is known of than that it cannot be restored, and why.
fn unrestorable(version: ManifestVersion, problem: String) -> VersionCheck {
    VersionCheck {
        version,
        kind: "checkpoint".to_owned(),
        decided_by: None,
        offsets: BTreeMap::new(),
        objects: 0,
        bytes: 0,
        restorable: false,
        problem: Some(problem),
    }
}

/// What an object is, for its checksums.
#[derive(Debug, Clone, Copy)]
enum ObjectKind {
    Sst,
    Snapshot,
}

/// The objects a checkpoint references: path, recorded size (SSTs record theirs) and kind.
fn referenced(root: &Path, manifest: &Manifest) -> Vec<(Path, Option<u64>, ObjectKind)> {
    let mut objects: Vec<(Path, Option<u64>, ObjectKind)> = manifest
        .levels
        .iter()
        .flatten()
        .map(|sst| {
            let id = SstId {
                writer_epoch: sst.writer_epoch,
                seq: sst.seq,
            };
            (
                Path::from(format!("{root}/{}", id.object_name())),
                Some(sst.size_bytes),
                ObjectKind::Sst,
            )
        })
        .collect();
    if let Some(name) = snapshot::snapshot_name(&manifest.metadata) {
        objects.push((
            Path::from(format!("{root}/{name}")),
            None,
            ObjectKind::Snapshot,
        ));
    }
    objects
}

/// What is wrong with an object a checkpoint references.
#[derive(Debug, thiserror::Error)]
enum ObjectProblem {
    /// Deleted between the listing and the read.
    #[error("missing")]
    Missing,
    #[error(transparent)]
    Sst(#[from] crate::state::lsm::sst::SstError),
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
}

/// Reads the object at `path` and checks its checksums; `Ok(Err(_))` says what is wrong with
/// it. An SST (at most the tree's target file size) is read whole; a snapshot (a partition's
/// whole state) is streamed through its CRC-32C, never held.
async fn verify_object(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    kind: ObjectKind,
) -> Result<Result<(), ObjectProblem>, VerifyError> {
    let got = match store.get(path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(Err(ObjectProblem::Missing)),
        Err(err) => return Err(VerifyError(err)),
    };
    Ok(match kind {
        ObjectKind::Sst => SstReader::open(got.bytes().await.map_err(VerifyError)?)
            .and_then(|reader| reader.verify_blocks())
            .map_err(ObjectProblem::from),
        ObjectKind::Snapshot => {
            let mut chunks = got.into_stream();
            let mut check = snapshot::StreamCheck::default();
            while let Some(chunk) = chunks.try_next().await.map_err(VerifyError)? {
                check.update(&chunk);
            }
            check.finish().map_err(ObjectProblem::from)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SharedClock};
    use crate::state::checkpoint::{DecidedBy, InputOffsets};
    use crate::state::lsm::backend::LsmBackend;
    use crate::state::lsm::cache::BlockCaches;
    use crate::state::memory::MemoryBackend;
    use crate::state::test_support::block_on;
    use crate::state::{Shard, ShardId, StateBackend, StateWrite};
    use bytes::Bytes;
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    fn write(i: u32) -> StateWrite {
        StateWrite {
            key: i.to_be_bytes().to_vec(),
            value: Some(Bytes::from(vec![b'v'; 100])),
            expires_at_ms: None,
        }
    }

    fn offsets(next: i64) -> InputOffsets {
        let mut offsets = InputOffsets::new();
        offsets.advance("in", Offset(next - 1));
        offsets
    }

    /// Two rounds of 50 writes to partition 0 of `t.p` on `lsm` and to partition 1 on
    /// `memory`, each round checkpointed; returns each partition's newest version.
    async fn two_checkpoints_of_each_backend(
        store: &Arc<dyn ObjectStore>,
        prefix: &Path,
        clock: SharedClock,
    ) -> [ManifestVersion; 2] {
        let id = |partition| ShardId {
            pipeline: "t.p".into(),
            partition: Partition(partition),
        };
        let lsm = LsmBackend::new(
            store.clone(),
            prefix.clone(),
            Arc::new(BlockCaches::none()),
            crate::state::lsm::tests::small_settings(),
            clock.clone(),
        );
        let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock);
        let a = lsm.open_shard(&id(0)).await.expect("opens");
        let b = memory.open_shard(&id(1)).await.expect("opens");
        let mut newest = [ManifestVersion::default(); 2];
        for round in 0..2u32 {
            let writes: Vec<_> = (round * 50..round * 50 + 50).map(write).collect();
            a.apply(writes.clone()).await.expect("applies");
            b.apply(writes).await.expect("applies");
            let at = offsets(i64::from(round + 1) * 50);
            for (i, report) in [
                a.checkpoint(&at, DecidedBy::Manifest).await,
                b.checkpoint(&at, DecidedBy::Manifest).await,
            ]
            .into_iter()
            .enumerate()
            {
                newest[i] = report.expect("checkpoints").expect("durable").version;
            }
        }
        newest
    }

    /// Deletes an SST only checkpoint `newest` of the `lsm` shard at `root` references (not
    /// the one before it); returns its id.
    async fn delete_newest_own_sst(
        store: &Arc<dyn ObjectStore>,
        root: &Path,
        newest: ManifestVersion,
    ) -> SstId {
        let manifests = ManifestStore::new(store.clone(), root.clone());
        let ids = |manifest: Manifest| -> std::collections::HashSet<SstId> {
            manifest.levels.iter().flatten().map(|r| r.id()).collect()
        };
        let older = ids(manifests.read(newest - 1).await.expect("reads"));
        let sst = ids(manifests.read(newest).await.expect("reads"))
            .into_iter()
            .find(|id| !older.contains(id))
            .expect("an SST only the newest checkpoint references");
        let path = Path::from(format!("{root}/{}", sst.object_name()));
        store.delete(&path).await.expect("deletes");
        sst
    }

    /// Flips a byte of the snapshot of checkpoint `version` of the `memory` shard at `root`.
    async fn flip_a_snapshot_byte(
        store: &Arc<dyn ObjectStore>,
        root: &Path,
        version: ManifestVersion,
    ) {
        let manifest = ManifestStore::new(store.clone(), root.clone())
            .read(version)
            .await
            .expect("reads");
        let snap = Path::from(format!(
            "{root}/{}",
            snapshot::snapshot_name(&manifest.metadata).expect("a snapshot")
        ));
        let mut bytes = store
            .get(&snap)
            .await
            .expect("gets")
            .bytes()
            .await
            .expect("reads")
            .to_vec();
        bytes[20] ^= 0xff;
        store
            .put(&snap, PutPayload::from(bytes))
            .await
            .expect("puts");
    }

    /// Two checkpoints of an `lsm` shard and two of a `memory` one, all restorable; then the
    /// newest `lsm` checkpoint loses an SST only it references, and a byte of the newest
    /// snapshot flips: each is named unrestorable with its object, the older ones still
    /// restore, and a check without checksums sees only the missing object.
    #[test]
    fn verify_names_the_checkpoints_that_lost_an_object_or_hold_a_corrupt_one() {
        block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let clock: SharedClock = Arc::new(ManualClock::new(0));
            let prefix = Path::from("state");
            let id = |partition| ShardId {
                pipeline: "t.p".into(),
                partition: Partition(partition),
            };
            let newest = two_checkpoints_of_each_backend(&store, &prefix, clock).await;
            let found = verify_pipeline(&store, &prefix, "t.p", true)
                .await
                .expect("reads");
            assert_eq!(found.len(), 2);
            for shard in &found {
                let checkpoints: Vec<&VersionCheck> = shard
                    .versions
                    .iter()
                    .filter(|v| v.kind == "checkpoint")
                    .collect();
                assert_eq!(checkpoints.len(), 2, "{shard:?}");
                assert!(checkpoints.iter().all(|c| c.restorable), "{shard:?}");
                let next = BTreeMap::from([("in".into(), Offset(100))]);
                assert_eq!(checkpoints[0].offsets, next);
                assert_eq!(checkpoints[0].decided_by.as_deref(), Some("manifest"));
                assert!(checkpoints[0].objects >= 1 && checkpoints[0].bytes > 0);
                assert_eq!(
                    shard.newest_restorable(),
                    Some(newest[shard.partition.0 as usize])
                );
            }

            // The newest lsm checkpoint's own SST goes; a byte of the newest snapshot flips.
            let sst = delete_newest_own_sst(&store, &id(0).root_under(&prefix), newest[0]).await;
            flip_a_snapshot_byte(&store, &id(1).root_under(&prefix), newest[1]).await;

            let found = verify_pipeline(&store, &prefix, "t.p", true)
                .await
                .expect("reads");
            let newest_of = |shard: &ShardCheck| -> VersionCheck {
                shard
                    .versions
                    .iter()
                    .find(|v| v.version == newest[shard.partition.0 as usize])
                    .cloned()
                    .expect("listed")
            };
            let lost = newest_of(&found[0]);
            assert!(!lost.restorable);
            assert!(
                lost.problem
                    .as_deref()
                    .is_some_and(|p| p.contains(&sst.object_name()) && p.contains("missing")),
                "{lost:?}"
            );
            let corrupt = newest_of(&found[1]);
            assert!(!corrupt.restorable);
            assert!(
                corrupt
                    .problem
                    .as_deref()
                    .is_some_and(|p| p.contains(".snap")),
                "{corrupt:?}"
            );
            for shard in &found {
                assert!(
                    shard
                        .newest_restorable()
                        .is_some_and(|v| v < newest[shard.partition.0 as usize]),
                    "the older checkpoint still restores: {shard:?}"
                );
            }
            let quick = verify_pipeline(&store, &prefix, "t.p", false)
                .await
                .expect("reads");
            assert!(
                !newest_of(&quick[0]).restorable,
                "a missing object shows without reading"
            );
            assert!(
                newest_of(&quick[1]).restorable,
                "a flipped byte shows only with checksums"
            );
        });
    }
}
