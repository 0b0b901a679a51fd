//! Garbage collection of a shard's objects, run by the shard's owner (docs/checkpoints.md,
//! "Taking a checkpoint" step 6).
//!
//! Kept: the manifest versions [`retained_versions`] keeps — every version from the oldest of
//! the last `retained_checkpoints` usable checkpoints upwards (claims, undecided, rejected and
//! corrupt versions do not count towards the number; those above it are kept), pinned versions
//! and, while the owner's scrub runs, the versions stored at its claim — and every SST that
//! one of those or the live tree references. Never deleted besides: an SST compaction
//! retired from the live tree less than a grace period ago (a reader may still hold a version
//! naming it), an SST of a newer writer epoch than the live one (that writer owns the shard
//! now), an SST the live writer wrote at or after its last committed checkpoint (it may be in
//! flight to a manifest), and any object younger than the grace period (a slow writer may
//! still be about to reference it). Everything else under `sst/` — compacted-away inputs, the
//! orphans of interrupted flushes, a dead writer's leftovers (recognised by their older epoch)
//! — is deleted, after the manifests older than the kept ones, so that no surviving manifest
//! ever names a deleted SST.

use super::tree::{LsmTree, SstId};
use crate::state::manifest::{
    ManifestError, ManifestStore, Protected, RetentionPolicy, retained_versions, sweep,
};
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::HashSet;
use std::sync::Arc;

/// What a GC run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Manifest versions deleted.
    pub manifests_deleted: usize,
    /// SST objects deleted.
    pub ssts_deleted: usize,
    /// SST objects kept because something references or protects them.
    pub ssts_kept: usize,
    /// Snapshots of the `memory` backend (before a switch) no kept version names.
    pub snapshots_deleted: usize,
}

/// What GC must know of the shard's live writer, taken at one moment (so that GC can run in
/// the background while the writer goes on): SSTs it flushed after the snapshot have a higher
/// sequence number, or are younger than the grace period, and are protected either way.
#[derive(Debug, Clone)]
pub struct LiveWriter {
    /// The writer's epoch.
    pub writer_epoch: u64,
    /// Its SSTs with this epoch and a sequence number at or above this are not yet in a
    /// checkpoint.
    pub checkpoint_seq: u64,
    /// SSTs its current version references, and those compaction retired within the grace
    /// period (a reader may still hold a version naming them).
    pub referenced: HashSet<SstId>,
}

impl LiveWriter {
    /// The snapshot of `tree` now, with retirements younger than `policy.grace`.
    pub fn of(tree: &LsmTree, policy: &RetentionPolicy) -> Self {
        let grace_ms = u64::try_from(policy.grace.as_millis()).unwrap_or(u64::MAX);
        let mut referenced: HashSet<SstId> = tree.live_ssts().into_iter().collect();
        referenced.extend(tree.recently_retired(grace_ms));
        Self {
            writer_epoch: tree.writer_epoch(),
            checkpoint_seq: tree.checkpoint_seq(),
            referenced,
        }
    }
}

/// Runs one GC pass over the shard under `root`, whose live writer is `live`, under `policy`.
/// Which manifest versions stay is [`retained_versions`]' rule, shared with the `memory`
/// backend.
///
/// # Errors
/// [`ManifestError`] when listing, reading a kept manifest, or deleting fails; a run that
/// fails part-way has deleted only unreferenced objects and can simply be repeated.
pub async fn collect_garbage(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    live: &LiveWriter,
    protected: &Protected,
    policy: &RetentionPolicy,
    now_ms: u64,
) -> Result<GcReport, ManifestError> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let kept = retained_versions(&manifests, policy, protected, now_ms).await?;
    let mut referenced: HashSet<SstId> = kept
        .manifests
        .iter()
        .flat_map(|m| m.levels.iter().flatten().map(|r| r.id()))
        .collect();
    referenced.extend(live.referenced.iter().copied());

    let mut report = GcReport {
        manifests_deleted: manifests.delete_many(&kept.delete).await?,
        ..GcReport::default()
    };

    let prefix = Path::from(format!("{root}/sst"));
    let swept = sweep(store, &prefix, (policy, now_ms), |location| {
        let id = location.filename().and_then(SstId::parse_file_name)?;
        Some(
            referenced.contains(&id)
                || id.writer_epoch > live.writer_epoch
                || (id.writer_epoch == live.writer_epoch && id.seq >= live.checkpoint_seq),
        )
    })
    .await?;
    report.ssts_kept = swept.kept;
    report.ssts_deleted = swept.deleted;
    // What a switch from the `memory` backend left (docs/api.md "Switching backends").
    report.snapshots_deleted = crate::state::stored::sweep_other_backend(
        store,
        root,
        &kept.manifests,
        "lsm",
        (policy, now_ms),
    )
    .await?;
    metrics::counter!("weir_lsm_gc_deleted_total", "kind" => "sst")
        .increment(report.ssts_deleted as u64);
    metrics::counter!("weir_lsm_gc_deleted_total", "kind" => "manifest")
        .increment(report.manifests_deleted as u64);
    Ok(report)
}
