//! Restoring a savepoint shard into a pipeline's shard (module docs of `savepoint`,
//! "Restoring one"): copied on the same backend ([`restore_shard`]), or through the portable
//! format onto the other ([`export_shard`], [`restore_shard_converted`]), above every version
//! of the target ([`next_slot`]).

use super::*;
use crate::ids::{ManifestVersion, Partition};

/// Restores the savepoint shard `savepoint_shard` into the shard under `target` (a new
/// pipeline's, or a stopped one's being reset): copies its objects under new names and commits
/// a manifest-decided checkpoint above every version there (module docs). Returns that
/// version and the bytes copied. `writer_token` names the restore in the manifest.
///
/// # Errors
/// [`SavepointError::Unavailable`]; [`SavepointError::Unusable`] when the savepoint lost an
/// object or the commit was fenced (another writer wrote the target shard meanwhile: is the
/// pipeline stopped?).
pub async fn restore_shard(
    store: &Arc<dyn ObjectStore>,
    savepoint_shard: &Path,
    target: &Path,
    writer_token: &str,
) -> Result<(ManifestVersion, u64), SavepointError> {
    let saved = saved_checkpoint(store, savepoint_shard).await?;
    let (version, epoch) = next_slot(store, target, saved.writer_epoch).await?;
    let manifests = ManifestStore::new(store.clone(), target.clone());
    let mut bytes = 0;
    let mut levels = saved.levels.clone();
    let nonce = nonce();
    let mut seq = seq_base(nonce);
    for sst in levels.iter_mut().flatten() {
        seq += 1;
        let renamed = SstId {
            writer_epoch: epoch,
            seq,
        };
        bytes += copy_saved(
            store,
            savepoint_shard,
            &sst.id().object_name(),
            target,
            &renamed.object_name(),
        )
        .await?;
        (sst.writer_epoch, sst.seq) = (epoch, seq);
    }
    let offsets = InputOffsets::from_metadata(&saved.metadata)
        .map_err(|e| SavepointError::Unusable(e.to_string()))?;
    // Manifest-decided whatever decided the saved one: it is decided once written.
    let mut metadata = checkpoint_metadata(&offsets, DecidedBy::Manifest);
    if let Some(name) = snapshot::snapshot_name(&saved.metadata) {
        let renamed = format!("snapshot/{epoch:010}-{version:020}-{nonce:08x}.snap");
        bytes += copy_saved(store, savepoint_shard, name, target, &renamed).await?;
        metadata.insert(snapshot::SNAPSHOT_KEY.to_owned(), renamed);
    }
    let manifest = Manifest::fresh_checkpoint((version.0, epoch, writer_token), levels, metadata);
    manifests.commit(&manifest).await?;
    Ok((ManifestVersion(version.0), bytes))
}

/// The version and writer epoch a restore into the shard under `target` writes: above every
/// version there, and above every epoch of its versions, of its objects' names and
/// `at_least` (the restored checkpoint's own).
///
/// # Errors
/// [`SavepointError::Unavailable`].
pub async fn next_slot(
    store: &Arc<dyn ObjectStore>,
    target: &Path,
    at_least: u64,
) -> Result<(ManifestVersion, u64), SavepointError> {
    let manifests = ManifestStore::new(store.clone(), target.clone());
    let versions = manifests.versions().await?;
    let mut epoch = 0;
    for &version in &versions {
        match manifests.read(version).await {
            Ok(m) => epoch = epoch.max(m.writer_epoch),
            Err(ManifestError::NotFound(_) | ManifestError::Corrupt { .. }) => {}
            Err(other) => return Err(other.into()),
        }
    }
    let names: Vec<_> = store
        .list(Some(target))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(SavepointError::Unavailable)?;
    for name in &names {
        if let Some(id) = name.filename().and_then(SstId::parse_file_name) {
            epoch = epoch.max(id.writer_epoch);
        }
        if let Some(e) = name.filename().and_then(snapshot_epoch) {
            epoch = epoch.max(e);
        }
    }
    Ok((
        versions.last().map_or(ManifestVersion(1), |v| *v + 1),
        epoch.max(at_least) + 1,
    ))
}

/// Exports partition `partition` of the savepoint in `dir` (taken on backend `backend`) to
/// [`SavepointDir::export`], unless it is there already; what the export holds. Its header
/// names the backend that wrote the checkpoint itself, which differs from `backend` for a
/// partition a switch had not converted when the savepoint was taken.
///
/// # Errors
/// [`SavepointError::Unavailable`]; [`SavepointError::Unusable`] when the savepoint's
/// checkpoint cannot be read.
pub async fn export_shard(
    store: &Arc<dyn ObjectStore>,
    dir: &SavepointDir,
    (backend, partition): (&str, Partition),
    clock: &crate::clock::SharedClock,
) -> Result<Option<crate::checkpoints::export::ExportSummary>, SavepointError> {
    let path = dir.export(partition);
    match store.head(&path).await {
        Ok(_) => return Ok(None),
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(SavepointError::Unavailable(e)),
    }
    let shard = dir.shard(partition);
    let saved = saved_checkpoint(store, &shard).await?;
    // The kind of the checkpoint itself: a savepoint taken while a backend switch was under
    // way may hold a partition not converted yet, whatever its descriptor says.
    let held = crate::state::stored::checkpoint_backend(&saved);
    if held != backend {
        tracing::info!(
            partition = partition.0,
            descriptor = backend,
            held,
            "savepoint partition holds the other backend's checkpoint"
        );
    }
    // Written under a temporary name and copied into place: an export is whole or absent.
    let partial = Path::from(format!("{path}.partial-{:08x}", nonce()));
    let summary = crate::checkpoints::export::export_checkpoint(
        store,
        (&shard, &saved),
        (held, partition),
        &partial,
        clock,
    )
    .await
    .map_err(export_error)?;
    store
        .copy(&partial, &path)
        .await
        .map_err(SavepointError::Unavailable)?;
    let _ = store.delete(&partial).await;
    Ok(Some(summary))
}

fn export_error(e: crate::checkpoints::export::ExportError) -> SavepointError {
    match e {
        crate::checkpoints::export::ExportError::Unavailable(source) => {
            SavepointError::Unavailable(source)
        }
        other => SavepointError::Unusable(crate::error::Chain(&other).to_string()),
    }
}

/// Restores partition `partition` of the savepoint in `dir` (taken on backend `backend`)
/// into the shard under `target` on the *other* backend `into`, through the portable format:
/// exports it (once), then imports the export as a checkpoint above every version there (as
/// [`restore_shard`] does). Returns that version and the export's bytes.
///
/// # Errors
/// As [`restore_shard`].
pub async fn restore_shard_converted(
    store: &Arc<dyn ObjectStore>,
    dir: &SavepointDir,
    (backend, partition): (&str, Partition),
    (target, into, writer_token): (&Path, crate::state::stored::CheckpointFormat, &str),
    clock: &crate::clock::SharedClock,
) -> Result<(ManifestVersion, u64), SavepointError> {
    export_shard(store, dir, (backend, partition), clock).await?;
    let saved = saved_checkpoint(store, &dir.shard(partition)).await?;
    let (version, epoch) = next_slot(store, target, saved.writer_epoch).await?;
    let imported = crate::checkpoints::export::import_checkpoint(
        store,
        &dir.export(partition),
        target,
        into,
        (version.0, epoch, writer_token),
    )
    .await
    .map_err(export_error)?;
    Ok((version, imported.bytes))
}

/// The writer epoch in a snapshot's file name (`{epoch:010}-{version:020}.snap`).
fn snapshot_epoch(file: &str) -> Option<u64> {
    file.strip_suffix(".snap")?.split_once('-')?.0.parse().ok()
}

/// Copies object `name` of the savepoint shard to `renamed` in `target`; its size.
async fn copy_saved(
    store: &Arc<dyn ObjectStore>,
    savepoint_shard: &Path,
    name: &str,
    target: &Path,
    renamed: &str,
) -> Result<u64, SavepointError> {
    let from = Path::from(format!("{savepoint_shard}/{name}"));
    let to = Path::from(format!("{target}/{renamed}"));
    copy(store, &from, &to).await?.ok_or_else(|| {
        SavepointError::Unusable(format!("the savepoint lost an object: `{from}` is missing"))
    })
}

/// Commits, above checkpoint `version` that a restore just wrote into the shard under
/// `target`, the same checkpoint with its input offsets changed by `change` (a reset of a
/// pipeline of stages moves a downstream shard's offsets from the old internal topics to the
/// new ones it seeded). Returns the new version.
///
/// # Errors
/// As [`restore_shard`].
pub async fn with_offsets(
    store: &Arc<dyn ObjectStore>,
    target: &Path,
    version: ManifestVersion,
    change: impl FnOnce(&mut BTreeMap<String, Offset>),
) -> Result<ManifestVersion, SavepointError> {
    let manifests = ManifestStore::new(store.clone(), target.clone());
    let restored = manifests.read(version).await?;
    let offsets = InputOffsets::from_metadata(&restored.metadata)
        .map_err(|e| SavepointError::Unusable(e.to_string()))?;
    let mut changed: BTreeMap<String, Offset> =
        offsets.iter().map(|(t, o)| (t.to_owned(), o)).collect();
    change(&mut changed);
    let mut metadata: BTreeMap<String, String> = restored
        .metadata
        .iter()
        .filter(|(k, _)| !offsets.to_metadata().contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut next = InputOffsets::new();
    for (topic, offset) in &changed {
        next.advance(topic, *offset - 1);
    }
    metadata.extend(next.to_metadata());
    let manifest = Manifest::fresh_checkpoint(
        (version.0 + 1, restored.writer_epoch, &restored.writer_token),
        restored.levels.clone(),
        metadata,
    );
    manifests.commit(&manifest).await?;
    Ok(ManifestVersion(version.0 + 1))
}
