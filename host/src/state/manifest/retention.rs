//! What a shard's GC keeps: one policy and one rule for both backends (docs/checkpoints.md,
//! "Taking a checkpoint" step 6).
//!
//! Walking from the newest version down, the last `retained_checkpoints` *usable* checkpoints
//! are counted: decided (a manifest-decided checkpoint; a transaction-decided one that the
//! owner knows is decided or that a later version names as its parent) and not rejected by a
//! later version. Claims, prepared but undecided checkpoints, rejected versions and versions
//! that do not decode do not count. Every version from the oldest counted one upwards is kept,
//! as are the [`Protected`] ones — pinned versions (the decided checkpoint) and the versions
//! readers lease ([`crate::state::lease`]: a paged state query's). While the owner's scrub of
//! the SSTs it recovered runs, the walk goes on until it has also counted
//! `retained_checkpoints` usable checkpoints at or below the one the owner recovered from
//! (those to fall back to if the scrub finds one corrupt). The versions below are deleted — corrupt and rejected ones too, but only there: deleting the newest
//! version would free its number for a zombie's create-only write (SCENARIOS.md S4). With
//! fewer usable checkpoints than retained nothing is deleted.
//!
//! The data objects (the `lsm` backend's SSTs, the `memory` backend's snapshots) that no kept
//! version names go after the versions, and only once older than the policy's grace period
//! ([`RetentionPolicy::in_grace`]): a slow writer may be about to commit a version naming one.

use super::{Manifest, ManifestError, ManifestKind, ManifestStore};
use crate::ids::ManifestVersion;
use crate::state::checkpoint::{DecidedBy, decided_by};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How much of a shard's history GC keeps, for both backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Usable checkpoints to keep (as Flink's `state.checkpoints.num-retained`); at least 1.
    pub retained_checkpoints: usize,
    /// Objects younger than this are never deleted, referenced or not.
    pub grace: Duration,
    /// A checkpoint starts a pass only if the last one started at least this long ago in
    /// processing time (an open's first pass always runs). A pass lists the shard's
    /// directories and reads its kept manifests: one after every checkpoint made most of a
    /// shard's store requests at short checkpoint intervals (docs/checkpoints.md, step 6).
    pub gc_interval: Duration,
}

impl Default for RetentionPolicy {
    /// 3 checkpoints, 10 minutes' grace, a pass at most every 10 s (the default checkpoint
    /// interval: one per checkpoint there).
    fn default() -> Self {
        Self {
            retained_checkpoints: 3,
            grace: Duration::from_secs(600),
            gc_interval: Duration::from_secs(10),
        }
    }
}

impl RetentionPolicy {
    /// Whether an object last modified at `modified_ms` is still within the grace period at
    /// `now_ms` (both ms since the Unix epoch), so GC must leave it.
    pub fn in_grace(&self, modified_ms: u64, now_ms: u64) -> bool {
        let grace_ms = u64::try_from(self.grace.as_millis()).unwrap_or(u64::MAX);
        modified_ms.saturating_add(grace_ms) > now_ms
    }
}

/// The versions GC keeps besides the last retained checkpoints, as the owner knows them when
/// it starts a pass.
#[derive(Debug, Clone, Default)]
pub struct Protected {
    /// Versions kept whatever their age (the decided checkpoint, savepoints).
    pub pinned: BTreeSet<ManifestVersion>,
    /// While the owner's scrub of the SSTs it recovered runs: the checkpoint it recovered
    /// from. GC then also keeps `retained_checkpoints` usable checkpoints at or below it, and
    /// every version above the oldest of them (the checkpoints to fall back to if the scrub
    /// finds one corrupt).
    pub scrubbing_from: Option<ManifestVersion>,
    /// The checkpoint the owner knows to be decided (exactly-once: the one Kafka's committed
    /// offsets name); it is also pinned.
    pub decided: Option<ManifestVersion>,
}

impl Protected {
    /// `pinned` and the `decided` checkpoint (pinned too), no scrub running.
    pub fn decided(decided: Option<ManifestVersion>, pinned: &BTreeSet<ManifestVersion>) -> Self {
        let mut pinned = pinned.clone();
        pinned.extend(decided);
        Self {
            pinned,
            scrubbing_from: None,
            decided,
        }
    }
}

/// What GC keeps and deletes.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    /// The kept versions that decode, newest first, then the pinned ones below them: what
    /// they reference must stay.
    pub manifests: Vec<Manifest>,
    /// The versions to delete, ascending.
    pub delete: Vec<ManifestVersion>,
}

/// Plans GC of the shard of `manifests` under `policy`, keeping what `protected` names
/// (module docs).
///
/// # Errors
/// [`ManifestError::Unavailable`] when listing or reading fails: GC tries again after the
/// next checkpoint.
pub(crate) async fn retained_versions(
    manifests: &ManifestStore,
    policy: &RetentionPolicy,
    protected: &Protected,
    now_ms: u64,
) -> Result<Kept, ManifestError> {
    let retained = policy.retained_checkpoints.max(1);
    let decided = protected.decided;
    let versions = manifests.versions().await?;
    let mut kept = Kept::default();
    let mut rejected: HashSet<ManifestVersion> = HashSet::new();
    let mut parents: HashSet<ManifestVersion> = HashSet::new();
    let mut counted = 0;
    // Usable checkpoints at or below the one a running scrub recovered from.
    let mut counted_below = 0;
    let mut floor = None;
    for &version in versions.iter().rev() {
        if rejected.contains(&version.0) {
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
                || parents.contains(&version.0));
        kept.manifests.push(manifest);
        if usable {
            counted += 1;
            if protected.scrubbing_from.is_some_and(|r| version <= r) {
                counted_below += 1;
            }
            let below = protected.scrubbing_from.is_none() || counted_below >= retained;
            if counted >= retained && below {
                floor = Some(version);
                break;
            }
        }
    }
    let Some(floor) = floor else {
        return Ok(kept); // not enough checkpoints yet: nothing is old enough
    };
    // Read after the versions were listed: a lease written before that is seen here, and a
    // version leased later was among the retained ones when the reader took it.
    let leased = crate::state::lease::leased_versions(&manifests.store, &manifests.root, now_ms)
        .await
        .map_err(ManifestError::Unavailable)?;
    let protected = |v: u64| protected.pinned.contains(&v) || leased.contains(&v);
    for &version in versions.iter().filter(|v| **v < floor) {
        if !protected(version.0) {
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

/// What [`sweep`] did: objects deleted, and objects of its kind kept (named by a kept version,
/// or in the grace period).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Objects deleted.
    pub deleted: usize,
    /// Objects kept.
    pub kept: usize,
}

/// The sweep every GC pass ends with, for both backends' data objects (the `lsm` backend's
/// SSTs, the `memory` backend's snapshots, and what a switch of backend left of the other's):
/// lists the objects under `prefix` and deletes, in bulk ([`delete_objects`]), each that
/// `keep` says is of its kind (`Some`) and not kept (`Some(false)`), unless it was written
/// within `policy`'s grace at `now_ms` (it may belong to a checkpoint not committed yet). An
/// object `keep` does not know (`None`) is left alone and not counted.
///
/// # Errors
/// [`ManifestError::Unavailable`] when listing or deleting fails; a sweep that fails part-way
/// has deleted only objects it would delete again, and is simply repeated by the next pass.
pub(crate) async fn sweep(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    (policy, now_ms): (&RetentionPolicy, u64),
    keep: impl Fn(&Path) -> Option<bool>,
) -> Result<Swept, ManifestError> {
    let objects: Vec<_> = store
        .list(Some(prefix))
        .try_collect()
        .await
        .map_err(ManifestError::Unavailable)?;
    let mut swept = Swept::default();
    let mut unreferenced = Vec::new();
    for object in objects {
        let Some(kept) = keep(&object.location) else {
            continue;
        };
        let modified_ms = u64::try_from(object.last_modified.timestamp_millis()).unwrap_or(0);
        if kept || policy.in_grace(modified_ms, now_ms) {
            swept.kept += 1;
        } else {
            unreferenced.push(object.location);
        }
    }
    swept.deleted = delete_objects(store, unreferenced)
        .await
        .map_err(ManifestError::Unavailable)?;
    Ok(swept)
}

/// Deletes the objects at `paths` in bulk — `object_store`'s `delete_stream`: S3's
/// DeleteObjects, up to 1,000 objects a request, so that a pass over a long history is a few
/// requests, not one per object — an absent object counting as deleted. Returns how many were
/// deleted.
///
/// # Errors
/// The store's first error other than `NotFound`; the objects before it in `paths` may be
/// deleted, later ones may not (a pass can simply be repeated).
pub(crate) async fn delete_objects(
    store: &Arc<dyn ObjectStore>,
    paths: Vec<Path>,
) -> Result<usize, object_store::Error> {
    if paths.is_empty() {
        return Ok(0);
    }
    let n = paths.len();
    let mut results = store.delete_stream(futures::stream::iter(paths.into_iter().map(Ok)).boxed());
    while let Some(result) = results.next().await {
        match result {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(n)
}

/// The background GC pass of one shard's owner: at most one runs at a time, a pass asked for
/// while one runs or within [`RetentionPolicy::gc_interval`] of the last one's start is
/// skipped (a later checkpoint asks again), and a failed pass is logged and simply repeated by
/// the next.
#[derive(Debug, Default)]
pub(crate) struct BackgroundGc {
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// When the last pass started (processing time, ms since the Unix epoch); `None` before
    /// the first.
    last_started_ms: std::sync::Mutex<Option<u64>>,
}

impl BackgroundGc {
    /// Runs `pass` for the shard under `root` in the background, at `now_ms` (processing time),
    /// unless the previous pass is still running or started less than `interval` ago.
    pub fn start<R: std::fmt::Debug>(
        &self,
        root: &object_store::path::Path,
        (now_ms, interval): (u64, Duration),
        pass: impl Future<Output = Result<R, ManifestError>> + Send + 'static,
    ) {
        let mut slot = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|task| !task.is_finished()) {
            tracing::debug!(shard = %root, "GC still running; skipped this checkpoint's");
            return;
        }
        let mut last = self
            .last_started_ms
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        if last.is_some_and(|at| now_ms < at.saturating_add(interval_ms)) {
            return;
        }
        *last = Some(now_ms);
        let root = root.clone();
        *slot = Some(tokio::spawn(async move {
            match pass.await {
                Ok(report) => tracing::debug!(shard = %root, ?report, "GC done"),
                Err(error) => {
                    tracing::warn!(shard = %root, %error, "GC failed; it runs again after the next checkpoint")
                }
            }
        }));
    }

    /// Waits for the pass running now, if any.
    pub async fn settled(&self) {
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A checkpoint within `gc_interval` of the last pass's start starts none: at a 1-second
    /// checkpoint interval every pass listed the shard's directories again.
    #[tokio::test]
    async fn a_pass_starts_at_most_once_per_gc_interval_and_the_first_always() {
        let gc = BackgroundGc::default();
        let root = object_store::path::Path::from("weir/pipelines/p/shards/0");
        let passes = Arc::new(AtomicUsize::new(0));
        let interval = Duration::from_secs(10);
        for now_ms in [1_000, 2_000, 10_999, 11_000, 11_500, 30_000] {
            let passes = passes.clone();
            gc.start(&root, (now_ms, interval), async move {
                passes.fetch_add(1, Ordering::Relaxed);
                Ok::<_, ManifestError>(())
            });
            gc.settled().await;
        }
        // At 1 s (the first), 11 s and 30 s.
        assert_eq!(passes.load(Ordering::Relaxed), 3);
    }
}
