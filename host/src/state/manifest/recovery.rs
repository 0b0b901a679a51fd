//! Recovery's walk over a shard's manifest versions, one rule for both backends
//! (docs/checkpoints.md, "Recovery" step 3, and "Corruption"): the newest *decided* checkpoint
//! that is not known to be unusable and that the backend's check accepts; older ones only past
//! *provable* corruption, never past a transient error.
//!
//! What makes a version unusable, and how it is found:
//! - its manifest does not decode (checksum, format);
//! - a newer version lists it as rejected (an earlier recovery fell back past it): skipped
//!   without reading it again;
//! - it references an object the shard's last owner found corrupt while running it
//!   ([`KnownCorruption`]: a block that failed its checksum twice, compaction, the scrub);
//! - the backend's check refuses it (an SST missing or of the wrong size; a snapshot that does
//!   not decode).
//!
//! Each is logged as an `audit = true` line and counted in `weir_checkpoint_fallbacks_total`,
//! and returned in [`Found::rejected`] for the claim to record durably.
//!
//! Decided (docs/checkpoints.md, "Delivery guarantees"): a manifest-decided checkpoint always; a
//! transaction-decided one when Kafka's committed offsets name it, or — after a fallback past
//! the named one — when it is older than that and a later version names it as its parent (a
//! writer goes on from a checkpoint, and a claim starts from one, only once it is decided).

use super::{Manifest, ManifestError, ManifestKind, ManifestStore, RejectedVersion};
use crate::ids::ManifestVersion;
use crate::state::checkpoint::{DecidedBy, InputOffsets, decided_by, is_decided};
use crate::state::{Recovery, StateError};
use object_store::path::Path;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Corruption the owner of a shard found while running it (a read, compaction or the scrub),
/// handed to the shard's next open so that recovery falls back past it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownCorruption {
    /// Objects found corrupt, named relative to the shard's root (`sst/{epoch}-{seq}.sst`):
    /// checkpoints that reference one are unusable.
    pub objects: BTreeSet<String>,
    /// Checkpoint versions found unusable as a whole (corruption no single object was blamed
    /// for, in the checkpoint the shard was opened from): these and every later checkpoint
    /// (their writers went on from them) are unusable.
    pub versions: BTreeSet<ManifestVersion>,
    /// What was found, one line (the first report).
    pub reason: String,
}

impl KnownCorruption {
    /// Adds what `error` says (a [`StateError::Corrupt`]; anything else is ignored), blaming
    /// `opened_from` — the checkpoint the shard was opened from — when no object is named.
    pub fn add(&mut self, error: &StateError, opened_from: Option<ManifestVersion>) {
        let StateError::Corrupt { object, source, .. } = error else {
            return;
        };
        match object {
            Some(object) => {
                self.objects.insert(object.clone());
            }
            None => self.versions.extend(opened_from),
        }
        if self.reason.is_empty() {
            self.reason = one_line(&format!("{source}"));
        }
    }

    /// Whether nothing is known.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.versions.is_empty()
    }
}

/// A backend's verdict on a candidate checkpoint.
#[derive(Debug)]
pub(crate) enum Checked<T> {
    /// Usable; what checking it produced (the snapshot's entries, nothing).
    Valid(T),
    /// Provably unusable, and why.
    Invalid(String),
}

/// What recovery found.
#[derive(Debug)]
pub(crate) struct Found<T> {
    /// The checkpoint to resume from with its check's product; `None`: start empty (there was
    /// never a decided checkpoint).
    pub checkpoint: Option<(Manifest, T)>,
    /// The versions to record as rejected in the claim: those newer versions listed, and those
    /// this walk found unusable.
    pub rejected: Vec<RejectedVersion>,
}

/// A backend's check of a candidate checkpoint during recovery: it reads what the backend needs
/// to trust the candidate (the `lsm` backend lists its SSTs once, the `memory` backend reads
/// the snapshot) and says [`Checked::Valid`] with what it read, or [`Checked::Invalid`] with
/// why.
pub(crate) trait CandidateCheck {
    /// What checking a valid candidate produced (the snapshot's entries; nothing).
    type Product;

    /// What `manifest` references, named as in [`KnownCorruption::objects`].
    fn objects(&self, manifest: &Manifest) -> Vec<String>;

    /// Checks `candidate`.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] on a transient store error (never a reason to fall back).
    fn check(
        &mut self,
        candidate: &Manifest,
    ) -> impl Future<Output = Result<Checked<Self::Product>, StateError>> + Send;
}

/// Recovery of the shard of `manifests` (module docs), one loop for both backends: walks its
/// versions newest first and returns the first candidate checkpoint that `check` accepts,
/// falling back past each it refuses.
///
/// # Errors
/// [`StateError::Unavailable`] on a transient store error, `check`'s included (never a reason
/// to fall back); [`StateError::Corrupt`] when checkpoints exist but none is usable.
pub(crate) async fn find_checkpoint<C: CandidateCheck>(
    manifests: &ManifestStore,
    versions: Vec<ManifestVersion>,
    recovery: &Recovery,
    check: &mut C,
) -> Result<Found<C::Product>, StateError> {
    let mut walk = Walk::start(
        manifests,
        versions,
        recovery.committed,
        &recovery.known_corruption,
    );
    loop {
        let Some(candidate) = walk.next_candidate(|m| check.objects(m)).await? else {
            return walk.finish();
        };
        match check.check(&candidate).await? {
            Checked::Valid(product) => return Ok(walk.found(candidate, product)),
            Checked::Invalid(reason) => walk.reject(candidate.version, reason),
        }
    }
}

/// Recovery's walk over the versions of one shard, newest first (module docs). The backend
/// checks each candidate [`Walk::next_candidate`] yields and says [`Walk::found`] or
/// [`Walk::reject`]; [`Walk::finish`] ends a walk that found nothing.
#[derive(Debug)]
struct Walk<'a> {
    manifests: &'a ManifestStore,
    committed: Option<ManifestVersion>,
    known: &'a KnownCorruption,
    /// Versions still to look at, oldest first (popped from the back).
    versions: Vec<ManifestVersion>,
    rejected: BTreeMap<u64, String>,
    /// Versions some later version names as its parent.
    parents: HashSet<ManifestVersion>,
    unusable: usize,
}

impl<'a> Walk<'a> {
    /// A walk over `versions` (the shard's, ascending, as the open listed them). `committed` is
    /// the version Kafka's committed offsets name (exactly-once), `known` what the last owner
    /// found corrupt.
    pub fn start(
        manifests: &'a ManifestStore,
        versions: Vec<ManifestVersion>,
        committed: Option<ManifestVersion>,
        known: &'a KnownCorruption,
    ) -> Self {
        let mut unusable = 0;
        if let Some(c) = committed
            && versions.binary_search(&c).is_err()
        {
            audit_fallback(manifests.root(), c, &"the committed checkpoint is missing");
            unusable += 1;
        }
        Self {
            manifests,
            committed,
            known,
            versions,
            rejected: BTreeMap::new(),
            parents: HashSet::new(),
            unusable,
        }
    }

    /// The next decided checkpoint, newest first, that no newer version rejected and that
    /// references none of the objects known to be corrupt (`objects`: what a manifest
    /// references, named as in [`KnownCorruption::objects`]); `None` when none is left.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] on a transient store error.
    pub async fn next_candidate(
        &mut self,
        objects: impl Fn(&Manifest) -> Vec<String>,
    ) -> Result<Option<Manifest>, StateError> {
        while let Some(version) = self.versions.pop() {
            if self.rejected.contains_key(&version.0) {
                // Listed by a newer version: skipped without reading it again.
                self.unusable += 1;
                continue;
            }
            let manifest = match self.manifests.read(version).await {
                Ok(m) => m,
                Err(ManifestError::NotFound(_)) => continue, // GC deleted it meanwhile
                Err(error @ ManifestError::Corrupt { .. }) => {
                    // A claim or a checkpoint, we cannot tell: it counts as unusable.
                    self.reject(version, one_line(&error.to_string()));
                    continue;
                }
                Err(other) => return Err(unavailable(self.manifests, other)),
            };
            for r in &manifest.rejected {
                self.rejected
                    .entry(r.version.0)
                    .or_insert_with(|| r.reason.clone());
            }
            self.parents.extend(manifest.parent);
            if manifest.kind != ManifestKind::Checkpoint
                || !decided(&manifest, self.committed, &self.parents)
            {
                continue;
            }
            if self
                .known
                .versions
                .first()
                .is_some_and(|first| version >= *first)
            {
                self.reject(version, self.known.reason.clone());
                continue;
            }
            if let Err(problem) = InputOffsets::from_metadata(&manifest.metadata) {
                self.reject(version, problem.to_string());
                continue;
            }
            if let Some(object) = objects(&manifest)
                .into_iter()
                .find(|o| self.known.objects.contains(o))
            {
                let reason = format!(
                    "it references `{object}`, found corrupt: {}",
                    self.known.reason
                );
                self.reject(version, reason);
                continue;
            }
            return Ok(Some(manifest));
        }
        Ok(None)
    }

    /// The backend found candidate `version` provably unusable: audited, counted, recorded.
    pub fn reject(&mut self, version: ManifestVersion, reason: String) {
        audit_fallback(self.manifests.root(), version, &reason);
        self.rejected.insert(version.0, reason);
        self.unusable += 1;
    }

    /// The walk's result with `checkpoint`, the candidate the backend accepted, and what
    /// checking it produced.
    pub fn found<T>(self, checkpoint: Manifest, product: T) -> Found<T> {
        Found {
            checkpoint: Some((checkpoint, product)),
            rejected: listed(self.rejected),
        }
    }

    /// Ends a walk that found no usable checkpoint: start empty if there never was one.
    ///
    /// # Errors
    /// [`StateError::Corrupt`] when there were decided checkpoints but none is usable.
    pub fn finish<T>(self) -> Result<Found<T>, StateError> {
        if self.unusable > 0 {
            let reasons: Vec<String> = self
                .rejected
                .iter()
                .rev()
                .take(3)
                .map(|(v, why)| format!("version {v}: {why}"))
                .collect();
            return Err(StateError::corrupt(
                self.manifests.root().to_string(),
                format!(
                    "no usable checkpoint is left ({} unusable; {})",
                    self.unusable,
                    reasons.join("; ")
                ),
            ));
        }
        Ok(Found {
            checkpoint: None,
            rejected: listed(self.rejected),
        })
    }
}

fn unavailable(manifests: &ManifestStore, e: ManifestError) -> StateError {
    StateError::Unavailable {
        shard: manifests.root().to_string(),
        source: Box::new(e),
    }
}

/// Whether checkpoint `manifest` is decided (module docs), `parents` holding the versions the
/// newer versions read so far name as their parent.
fn decided(
    manifest: &Manifest,
    committed: Option<ManifestVersion>,
    parents: &HashSet<ManifestVersion>,
) -> bool {
    let version = manifest.version;
    is_decided(version, &manifest.metadata, committed)
        || (decided_by(&manifest.metadata) == DecidedBy::Transaction
            && committed.is_some_and(|c| version < c)
            && parents.contains(&version.0))
}

fn listed(rejected: BTreeMap<u64, String>) -> Vec<RejectedVersion> {
    rejected
        .into_iter()
        .map(|(version, reason)| RejectedVersion {
            version: ManifestVersion(version),
            reason,
        })
        .collect()
}

/// The first line of `text`, at most 512 bytes.
fn one_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let mut end = line.len().min(512);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_owned()
}

/// Logs recovery falling back past a provably unusable checkpoint `version` of the shard under
/// `root` (an `audit = true` line, docs/checkpoints.md "Recovery" step 3) and counts it in
/// `weir_checkpoint_fallbacks_total`.
fn audit_fallback(root: &Path, version: ManifestVersion, problem: &dyn std::fmt::Display) {
    tracing::warn!(audit = true, shard = %root, version = version.0, %problem, "checkpoint unusable; falling back to an older one");
    metrics::counter!("weir_checkpoint_fallbacks_total").increment(1);
}
