//! Which manifest versions of a shard GC keeps: one rule for both backends
//! (docs/checkpoints.md, "Taking a checkpoint" step 6).
//!
//! Walking from the newest version down, the last `retained` *usable* checkpoints are counted:
//! decided (a manifest-decided checkpoint; a transaction-decided one that the owner knows is
//! decided or that a later version names as its parent) and not rejected by a later version.
//! Claims, prepared but undecided checkpoints, rejected versions and versions that do not
//! decode do not count. Every version from the oldest counted one upwards is kept, as are
//! `pinned` versions and, while the owner's scrub runs, the versions in `keep` (those stored
//! when it claimed the shard). The
//! versions below are deleted — corrupt and rejected ones too, but only there: deleting the
//! newest version would free its number for a zombie's create-only write (SCENARIOS.md S4).
//! With fewer than `retained` usable checkpoints nothing is deleted.

use super::{Manifest, ManifestError, ManifestKind, ManifestStore};
use crate::state::checkpoint::{DecidedBy, decided_by};
use std::collections::{BTreeSet, HashSet};

/// What GC keeps and deletes.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    /// The kept versions that decode, newest first, then the pinned ones below them: what
    /// they reference must stay.
    pub manifests: Vec<Manifest>,
    /// The versions to delete, ascending.
    pub delete: Vec<u64>,
}

/// Plans GC of the shard of `manifests` (module docs). `decided` is the checkpoint the owner
/// knows to be decided (exactly-once: the one Kafka's committed offsets name).
///
/// # Errors
/// [`ManifestError::Unavailable`] when listing or reading fails: GC tries again after the
/// next checkpoint.
pub(crate) async fn retained_versions(
    manifests: &ManifestStore,
    retained: usize,
    pinned: &BTreeSet<u64>,
    keep: Option<std::ops::RangeInclusive<u64>>,
    decided: Option<u64>,
) -> Result<Kept, ManifestError> {
    let retained = retained.max(1);
    let versions = manifests.versions().await?;
    let mut kept = Kept::default();
    let mut rejected: HashSet<u64> = HashSet::new();
    let mut parents: HashSet<u64> = HashSet::new();
    let mut counted = 0;
    let mut floor = None;
    for &version in versions.iter().rev() {
        if rejected.contains(&version) {
            continue;
        }
        let manifest = match manifests.read(version).await {
            Ok(m) => m,
            Err(ManifestError::NotFound(_) | ManifestError::Corrupt { .. }) => continue,
            Err(other) => return Err(other),
        };
        rejected.extend(manifest.rejected.iter().map(|r| r.version));
        parents.extend(manifest.parent);
        let usable = manifest.kind == ManifestKind::Checkpoint
            && (decided_by(&manifest.metadata) == DecidedBy::Manifest
                || decided == Some(version)
                || parents.contains(&version));
        kept.manifests.push(manifest);
        if usable {
            counted += 1;
            if counted == retained {
                floor = Some(version);
                break;
            }
        }
    }
    let Some(floor) = floor else {
        return Ok(kept); // not enough checkpoints yet: nothing is old enough
    };
    let protected = |v: u64| pinned.contains(&v) || keep.as_ref().is_some_and(|r| r.contains(&v));
    for &version in versions.iter().filter(|v| **v < floor) {
        if !protected(version) {
            kept.delete.push(version);
            continue;
        }
        match manifests.read(version).await {
            Ok(m) => kept.manifests.push(m),
            Err(ManifestError::NotFound(_) | ManifestError::Corrupt { .. }) => {}
            Err(other) => return Err(other),
        }
    }
    Ok(kept)
}
