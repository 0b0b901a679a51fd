//! Savepoints (issue 20): a named copy of one committed checkpoint per shard of a pipeline,
//! with its input offsets, that the pipeline's GC never touches, and from which a pipeline
//! can be created or to which it can be reset (as Flink's savepoints, which are full copies
//! too).
//!
//! # Layout
//! A savepoint lives beside the shards it was taken from, under the pipeline's state prefix,
//! so it is deleted with the pipeline (a pipeline created from it holds its own copy):
//! - a pipeline of stages: `{root}/{name}/{data}/stages/{stage}/shards/…` per stage, as below,
//!   and `{root}/{name}/{data}/edges/…`, the records in flight on its internal topics
//!   ([`in_flight`]);
//! - `{root}/{name}/{data}/shards/{partition:05}/manifest/{version:020}.manifest` — the
//!   checkpoint's manifest, unchanged, the only version there (`{data}`: one directory per
//!   attempt to take the savepoint, [`SavepointDescriptor::data`]);
//! - `{root}/{name}/{data}/shards/{partition:05}/sst/…` or `…/snapshot/…` — the objects it
//!   references, under their names in the shard;
//! - `{root}/{name}/savepoint.json` — the [`SavepointDescriptor`], written last and create-only:
//!   a savepoint without one is incomplete and is not listed;
//! - `{root}/{name}/exports/{partition:05}.jsonl` — its export in the portable format, once
//!   made.
//!
//! Each savepoint shard is a shard of its own: [`crate::checkpoints::verify::verify_shard`] checks it.
//!
//! # Taking one ([`capture_shard`])
//! Copies the shard's newest *decided* checkpoint ([`newest_decided`]): manifest-decided, or
//! transaction-decided and named as parent by a later version (a writer goes on from a
//! checkpoint, and a claim starts from one, only once it is decided). The copy is server-side
//! (`copy`: no byte passes through the host on S3). GC may delete an object of that
//! checkpoint while it is copied (three newer checkpoints were decided meanwhile): the copy
//! then starts again from the then-newest one.
//!
//! # Restoring one ([`restore_shard`])
//! Copies the savepoint shard's objects into the target shard under new names — writer epoch
//! `E` above every epoch in the target shard (its versions' and its objects' names), so they
//! can collide with nothing there, and with nothing a later owner (epoch `E + 1` and up)
//! writes — and commits one manifest version above every version in the target shard: a
//! manifest-decided checkpoint at the savepoint's offsets. Recovery opens it like any other
//! checkpoint (the newest decided one), and the checkpoint ids (manifest versions) stay
//! monotonic, since sinks use them as commit ids. Nothing references the savepoint afterwards:
//! deleting it, or its pipeline, leaves the restored shard whole.

use crate::ids::{ManifestVersion, Offset, Partition};
use crate::state::checkpoint::{DecidedBy, InputOffsets, checkpoint_metadata, decided_by};
use crate::state::lsm::tree::SstId;
use crate::state::manifest::{Manifest, ManifestError, ManifestKind, ManifestStore};
use crate::state::snapshot;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// The descriptor's file name in a savepoint's directory.
pub const DESCRIPTOR: &str = "savepoint.json";
/// The descriptor's format version.
pub const FORMAT_VERSION: u32 = 1;
/// Attempts of one shard's copy when GC deletes what it copies.
const CAPTURE_ATTEMPTS_MAX: usize = 5;

/// What a savepoint holds: written last, so that one exists only once every shard is copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SavepointDescriptor {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// The savepoint's name, unique per pipeline.
    pub name: String,
    /// The directory under the savepoint's root that holds its shards: each attempt to take
    /// it copies into one of its own, so that attempts racing for a name, or one that fails,
    /// never touch the winner's objects. Empty: the root itself.
    #[serde(default)]
    pub data: String,
    /// The pipeline it was taken from.
    pub pipeline: String,
    /// That pipeline's uid.
    pub pipeline_uid: String,
    /// Its state backend (`lsm` or `memory`): the backend a pipeline restored from it uses.
    pub state_backend: String,
    /// Its input topics (the tenant's names), in the pipeline's order.
    pub input_topics: Vec<String>,
    /// The operator and version it ran.
    pub operator: String,
    /// See `operator`.
    pub operator_version: u64,
    /// When it was taken, ms since the Unix epoch.
    pub created_ms: u64,
    /// One checkpoint per input partition, in partition order.
    pub shards: Vec<SavepointShard>,
    /// Bytes of every shard's objects (and of the in-flight records, for a pipeline of
    /// stages).
    pub bytes: u64,
    /// A pipeline of stages' stages, each with its shards (`shards` is then empty, and
    /// `operator` too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<SavepointStage>,
    /// A pipeline of stages' edges through internal topics, with what was in flight on them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edges: Vec<SavepointEdge>,
}

/// One stage of a pipeline of stages in a savepoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SavepointStage {
    /// The stage.
    pub name: String,
    /// The operator and version it ran.
    pub operator: String,
    /// See `operator`.
    pub operator_version: u64,
    /// The topics of the tenant's it reads (not its edges).
    pub input_topics: Vec<String>,
    /// One checkpoint per partition, in partition order: its offsets name the tenant's topics
    /// and the edges' topics of the pipeline it was taken of.
    pub shards: Vec<SavepointShard>,
}

/// One edge of a pipeline of stages in a savepoint: the internal topic from `stage`'s
/// `output`, and the records in flight on each of its partitions when it was taken
/// ([`in_flight`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SavepointEdge {
    /// The writing stage.
    pub stage: String,
    /// Its output.
    pub output: String,
    /// The topic's name then, without the tenant's prefix.
    pub topic: String,
    /// Per partition, in partition order.
    pub partitions: Vec<SavepointEdgePartition>,
}

/// What was in flight on one partition of an edge: its records from the lowest offset a
/// reading stage's saved checkpoint names to the partition's end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SavepointEdgePartition {
    /// The partition.
    pub partition: i32,
    /// The first offset saved, and the partition's end.
    pub from: Offset,
    /// See `from`.
    pub end: Offset,
    /// Records saved (committed ones: a transaction's markers and aborted records take
    /// offsets too), in [`in_flight`] chunks `0..chunks`.
    pub records: u64,
    /// See `records`.
    pub chunks: u32,
    /// Their bytes in the savepoint.
    pub bytes: u64,
    /// Per reading stage, where it starts in the partition seeded with these records: how many
    /// of them its saved checkpoint had read.
    pub starts: BTreeMap<String, u64>,
}

/// One shard's checkpoint in a savepoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SavepointShard {
    /// The input partition.
    pub partition: Partition,
    /// The checkpoint's manifest version in the pipeline's shard.
    pub version: ManifestVersion,
    /// Its input offsets (topic → next offset).
    pub offsets: BTreeMap<String, Offset>,
    /// Objects it references (SSTs, or the snapshot).
    pub objects: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Why a savepoint operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SavepointError {
    /// The store failed: retry.
    #[error("object store unavailable for the savepoint")]
    Unavailable(#[source] object_store::Error),
    /// What is stored cannot be used, and why (a corrupt manifest, a savepoint shard without
    /// its checkpoint, objects GC kept deleting).
    #[error("{0}")]
    Unusable(String),
}

impl From<ManifestError> for SavepointError {
    fn from(e: ManifestError) -> Self {
        match e {
            ManifestError::Unavailable(source) => SavepointError::Unavailable(source),
            other => SavepointError::Unusable(crate::error::Chain(&other).to_string()),
        }
    }
}

/// The root of the savepoint `name` under `savepoints` (the pipeline's savepoint root).
pub fn savepoint_root(savepoints: &Path, name: &str) -> Path {
    Path::from(format!("{savepoints}/{name}"))
}

/// The root of partition `partition`'s shard in the savepoint data directory `data`.
pub fn savepoint_shard_root(data: &Path, partition: Partition) -> Path {
    Path::from(format!("{data}/shards/{partition:05}"))
}

/// Where one savepoint's objects are.
#[derive(Debug, Clone)]
pub struct SavepointDir {
    /// Its root: the descriptor, the exports.
    pub root: Path,
    /// Its data directory: the shards ([`SavepointDescriptor::data`]).
    pub data: Path,
}

impl SavepointDir {
    /// The savepoint at `root` whose descriptor names data directory `data`.
    pub fn new(root: &Path, data: &str) -> Self {
        let data = if data.is_empty() {
            root.clone()
        } else {
            Path::from(format!("{root}/{data}"))
        };
        Self {
            root: root.clone(),
            data,
        }
    }

    /// Partition `partition`'s shard.
    pub fn shard(&self, partition: Partition) -> Path {
        savepoint_shard_root(&self.data, partition)
    }

    /// Partition `partition`'s export in the portable format, once made.
    pub fn export(&self, partition: Partition) -> Path {
        Path::from(format!("{}/exports/{partition:05}.jsonl", self.root))
    }

    /// Stage `stage`'s part, in a savepoint of a pipeline of stages: its shards under
    /// `{data}/stages/{stage}/`, its exports under `{root}/stages/{stage}/`.
    pub fn stage(&self, stage: &str) -> SavepointDir {
        SavepointDir {
            root: Path::from(format!("{}/stages/{stage}", self.root)),
            data: Path::from(format!("{}/stages/{stage}", self.data)),
        }
    }
}

/// A random number for the names of objects a restore or an import writes, so that two
/// racing for one shard (one is fenced at its commit) never write the same name.
pub fn nonce() -> u32 {
    rand::random()
}

/// The first SST sequence number a restore or an import with `nonce` uses: the top bit set,
/// so that none is a sequence number a writer counting from 0 ever reaches.
pub fn seq_base(nonce: u32) -> u64 {
    (1 << 63) | (u64::from(nonce) << 24)
}

/// The objects `manifest` references, relative to its shard's root.
fn referenced(manifest: &Manifest) -> Vec<String> {
    let mut objects: Vec<String> = manifest
        .levels
        .iter()
        .flatten()
        .map(|sst| sst.id().object_name())
        .collect();
    objects.extend(snapshot::snapshot_name(&manifest.metadata).map(str::to_owned));
    objects
}

/// The shard's newest decided checkpoint (module docs) that a newer version does not reject,
/// if any. `committed` is the version the consumer group's committed offsets name, when known
/// (exactly-once): that one is decided too.
///
/// # Errors
/// [`SavepointError::Unavailable`].
pub async fn newest_decided(
    manifests: &ManifestStore,
    committed: Option<ManifestVersion>,
) -> Result<Option<Manifest>, SavepointError> {
    let versions = manifests.versions().await?;
    newest_decided_in(manifests, &versions, committed).await
}

/// [`newest_decided`] among `versions`, the shard's versions as the caller listed them.
///
/// # Errors
/// [`SavepointError::Unavailable`].
pub async fn newest_decided_in(
    manifests: &ManifestStore,
    versions: &[ManifestVersion],
    committed: Option<ManifestVersion>,
) -> Result<Option<Manifest>, SavepointError> {
    let mut rejected = HashSet::new();
    let mut parents = HashSet::new();
    for &version in versions.iter().rev() {
        if rejected.contains(&version) {
            continue; // a later owner fell back past it: not read again
        }
        let manifest = match manifests.read(version).await {
            Ok(m) => m,
            Err(ManifestError::NotFound(_) | ManifestError::Corrupt { .. }) => continue,
            Err(other) => return Err(other.into()),
        };
        let usable = manifest.kind == ManifestKind::Checkpoint
            && (decided_by(&manifest.metadata) == DecidedBy::Manifest
                || committed == Some(version)
                || parents.contains(&version));
        rejected.extend(manifest.rejected.iter().map(|r| r.version));
        parents.extend(manifest.parent);
        if usable {
            return Ok(Some(manifest));
        }
    }
    Ok(None)
}

/// Copies the newest decided checkpoint of the shard under `shard_root` into the savepoint
/// shard `target` (module docs; `committed` as in [`newest_decided`]), if it is newer than
/// `after`; `Ok(None)` when it is not (or the shard has none): the caller waits for the next
/// checkpoint.
///
/// # Errors
/// [`SavepointError::Unavailable`]; [`SavepointError::Unusable`] when GC kept deleting what
/// was being copied.
pub async fn capture_shard(
    store: &Arc<dyn ObjectStore>,
    shard_root: &Path,
    target: &Path,
    partition: Partition,
    after: Option<ManifestVersion>,
    committed: Option<ManifestVersion>,
) -> Result<Option<SavepointShard>, SavepointError> {
    let manifests = ManifestStore::new(store.clone(), shard_root.clone());
    for _ in 0..CAPTURE_ATTEMPTS_MAX {
        let Some(manifest) = newest_decided(&manifests, committed).await? else {
            return Ok(None);
        };
        if after.is_some_and(|after| manifest.version <= after) {
            return Ok(None);
        }
        let objects = referenced(&manifest);
        let mut bytes = 0;
        let mut lost = false;
        for name in &objects {
            let from = Path::from(format!("{shard_root}/{name}"));
            let to = Path::from(format!("{target}/{name}"));
            match copy(store, &from, &to).await? {
                Some(size) => bytes += size,
                None => {
                    lost = true; // GC deleted it: three newer checkpoints exist now
                    break;
                }
            }
        }
        if lost {
            continue;
        }
        put_manifest(store, target, &manifest).await?;
        return Ok(Some(SavepointShard {
            partition,
            version: manifest.version,
            offsets: InputOffsets::from_metadata(&manifest.metadata)
                .map_err(|e| SavepointError::Unusable(e.to_string()))?
                .iter()
                .map(|(topic, next)| (topic.to_owned(), next))
                .collect(),
            objects: objects.len(),
            bytes,
        }));
    }
    Err(SavepointError::Unusable(format!(
        "GC deleted the checkpoint being copied {CAPTURE_ATTEMPTS_MAX} times in a row. shard=`{shard_root}`"
    )))
}

/// Copies `from` to `to` server-side; its size, or `None` when `from` is absent.
async fn copy(
    store: &Arc<dyn ObjectStore>,
    from: &Path,
    to: &Path,
) -> Result<Option<u64>, SavepointError> {
    match store.copy(from, to).await {
        Ok(()) => {}
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(SavepointError::Unavailable(e)),
    }
    match store.head(to).await {
        Ok(meta) => Ok(Some(meta.size)),
        Err(e) => Err(SavepointError::Unavailable(e)),
    }
}

/// Writes `manifest` as the only version of the savepoint shard `target`.
async fn put_manifest(
    store: &Arc<dyn ObjectStore>,
    target: &Path,
    manifest: &Manifest,
) -> Result<(), SavepointError> {
    let path = Path::from(format!(
        "{target}/manifest/{:020}.manifest",
        manifest.version
    ));
    store
        .put(&path, PutPayload::from(manifest.encode()))
        .await
        .map_err(SavepointError::Unavailable)?;
    Ok(())
}

/// The checkpoint stored in the savepoint shard `savepoint_shard`.
///
/// # Errors
/// [`SavepointError::Unavailable`]; [`SavepointError::Unusable`] when it holds none.
pub async fn saved_checkpoint(
    store: &Arc<dyn ObjectStore>,
    savepoint_shard: &Path,
) -> Result<Manifest, SavepointError> {
    let manifests = ManifestStore::new(store.clone(), savepoint_shard.clone());
    let versions = manifests.versions().await?;
    let Some(&version) = versions.last() else {
        return Err(SavepointError::Unusable(format!(
            "the savepoint holds no checkpoint under `{savepoint_shard}`"
        )));
    };
    Ok(manifests.read(version).await?)
}

/// Writes the descriptor of the savepoint at `root`, create-only: `Ok(false)` when one of
/// that name exists already.
///
/// # Errors
/// [`SavepointError::Unavailable`].
pub async fn put_descriptor(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    descriptor: &SavepointDescriptor,
) -> Result<bool, SavepointError> {
    let path = Path::from(format!("{root}/{DESCRIPTOR}"));
    let body = serde_json::to_vec_pretty(descriptor).expect("plain fields serialise");
    match store
        .put_opts(
            &path,
            PutPayload::from(body),
            PutOptions::from(PutMode::Create),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(SavepointError::Unavailable(e)),
    }
}

/// The descriptor of the savepoint at `root`; `None` when there is none (no such savepoint,
/// or one still being taken).
///
/// # Errors
/// [`SavepointError::Unavailable`]; [`SavepointError::Unusable`] for a descriptor that does
/// not decode.
pub async fn descriptor(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
) -> Result<Option<SavepointDescriptor>, SavepointError> {
    let path = Path::from(format!("{root}/{DESCRIPTOR}"));
    let bytes = match store.get(&path).await {
        Ok(got) => got.bytes().await.map_err(SavepointError::Unavailable)?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(SavepointError::Unavailable(e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| SavepointError::Unusable(format!("`{path}` does not decode: {e}")))
}

/// Every complete savepoint under `savepoints`, oldest first.
///
/// # Errors
/// As [`descriptor`].
pub async fn list(
    store: &Arc<dyn ObjectStore>,
    savepoints: &Path,
) -> Result<Vec<SavepointDescriptor>, SavepointError> {
    let listed = store
        .list_with_delimiter(Some(savepoints))
        .await
        .map_err(SavepointError::Unavailable)?;
    let mut out = Vec::new();
    for root in listed.common_prefixes {
        if let Some(found) = descriptor(store, &root).await? {
            out.push(found);
        }
    }
    out.sort_by(|a, b| (a.created_ms, &a.name).cmp(&(b.created_ms, &b.name)));
    Ok(out)
}

/// Deletes everything under `root` (a savepoint, or what an unfinished one left), its
/// descriptor first, so that it is never listed half deleted.
///
/// # Errors
/// [`SavepointError::Unavailable`].
pub async fn delete(store: &Arc<dyn ObjectStore>, root: &Path) -> Result<(), SavepointError> {
    let path = Path::from(format!("{root}/{DESCRIPTOR}"));
    match store.delete(&path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(SavepointError::Unavailable(e)),
    }
    let objects: Vec<Path> = store
        .list(Some(root))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(SavepointError::Unavailable)?;
    for object in objects {
        match store.delete(&object).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(SavepointError::Unavailable(e)),
        }
    }
    Ok(())
}

pub mod in_flight;
mod restore;
pub use restore::{export_shard, next_slot, restore_shard, restore_shard_converted, with_offsets};

#[cfg(test)]
mod tests;
