//! A shard as the tools beside the backends see it (`crate::checkpoints`): where its
//! checkpoints are stored and in which backend's format ([`StoredShard`]), and what either
//! backend knows of the other's checkpoints in a shard both wrote after a switch — which
//! backend wrote one ([`checkpoint_backend`]), and the other's objects swept once no kept
//! checkpoint names them ([`sweep_other_backend`]).

use super::lsm::tree::LsmSettings;
use super::manifest::{Manifest, ManifestError, RetentionPolicy, sweep};
use super::snapshot;
use crate::clock::SharedClock;
use object_store::ObjectStore;
use object_store::path::Path;
use std::sync::Arc;

/// A backend's checkpoint format, as an import writes one (`crate::checkpoints::export`).
#[derive(Debug, Clone)]
pub enum CheckpointFormat {
    /// SSTs written in key order into the level that would hold them, with `settings`' block
    /// and file sizes (a bulk load: nothing goes through a memtable).
    Lsm(LsmSettings),
    /// One snapshot.
    Memory,
}

impl CheckpointFormat {
    /// The backend's name, as `state.backend` and [`checkpoint_backend`] say it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Lsm(_) => "lsm",
            Self::Memory => "memory",
        }
    }
}

/// Where a shard's checkpoints are stored, in which format, and the clock its backend measures
/// TTLs on ([`super::StateBackend::stored`]).
#[derive(Debug, Clone)]
pub struct StoredShard {
    /// The object store.
    pub store: Arc<dyn ObjectStore>,
    /// The shard's root in it (`{prefix}/{pipeline}/{partition:05}`).
    pub root: Path,
    /// The backend's checkpoint format.
    pub format: CheckpointFormat,
    /// The backend's clock.
    pub clock: SharedClock,
}

/// The backend that wrote checkpoint `manifest`: `memory` when it names a snapshot, else `lsm`.
pub fn checkpoint_backend(manifest: &Manifest) -> &'static str {
    if snapshot::snapshot_name(&manifest.metadata).is_some() {
        "memory"
    } else {
        "lsm"
    }
}

/// Deletes the objects of the backend that is not `own` (`lsm`'s SSTs, `memory`'s snapshots)
/// under the shard `root` that none of the `kept` versions references and that are past
/// `policy`'s grace at `now_ms`: what a switch left behind once the old backend's checkpoints
/// are gone. Each backend's GC runs it after its own sweep. The number deleted.
///
/// # Errors
/// [`ManifestError::Unavailable`] when listing or deleting fails.
pub async fn sweep_other_backend(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    kept: &[Manifest],
    own: &str,
    (policy, now_ms): (&RetentionPolicy, u64),
) -> Result<usize, ManifestError> {
    let (dir, referenced): (&str, std::collections::HashSet<String>) = if own == "lsm" {
        let named = kept
            .iter()
            .filter_map(|m| snapshot::snapshot_name(&m.metadata))
            .map(|name| format!("{root}/{name}"))
            .collect();
        ("snapshot", named)
    } else {
        let named = kept
            .iter()
            .flat_map(|m| m.levels.iter().flatten())
            .map(|r| format!("{root}/{}", r.id().object_name()))
            .collect();
        ("sst", named)
    };
    let prefix = Path::from(format!("{root}/{dir}"));
    let swept = sweep(store, &prefix, (policy, now_ms), |location| {
        Some(referenced.contains(location.as_ref()))
    })
    .await?;
    Ok(swept.deleted)
}
