//! A tree's corruption (module docs of `lsm`, "Corruption"): found by a read, a compaction or
//! the background scrub ([`Scrubber`]), confirmed by reading the SST again, then kept until
//! the shard is reopened — a tree that found it never checkpoints again.

use super::{Inner, OpenSst, SstId};
use crate::state::StateError;
use crate::state::lsm::cache::{FetchError, SstFiles};
use crate::state::lsm::sst::{SstError, SstReader};
use std::sync::Arc;

/// What the scrub ([`super::scrub`]) reads a tree's SSTs through.
#[derive(Debug, Clone)]
pub struct Scrubber {
    pub(super) inner: std::sync::Weak<Inner>,
}

impl Scrubber {
    /// The tree's files, label and SST paths, while the tree lives.
    pub(in crate::state::lsm) fn files(&self) -> Option<SstFiles> {
        self.inner.upgrade().map(|i| i.files.clone())
    }

    /// The object path of SST `id` (`None` once the tree is gone).
    pub(in crate::state::lsm) fn sst_path(&self, id: SstId) -> Option<Arc<str>> {
        self.inner.upgrade().map(|i| i.sst_path(id))
    }

    /// Whether SST `id` is still in the tree's current version (compaction may have replaced
    /// it, reading all of it on the way).
    pub(in crate::state::lsm) fn is_live(&self, id: SstId) -> bool {
        self.inner.upgrade().is_some_and(|i| {
            i.read()
                .version
                .levels
                .iter()
                .flatten()
                .any(|s| s.meta.id() == id)
        })
    }

    /// The tree's label (its shard).
    pub(in crate::state::lsm) fn label(&self) -> String {
        self.inner
            .upgrade()
            .map(|i| i.label.clone())
            .unwrap_or_default()
    }

    /// Records corruption found in SST `id`: the tree never checkpoints again.
    pub(in crate::state::lsm) fn report(
        &self,
        id: SstId,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Option<StateError> {
        let inner = self.inner.upgrade()?;
        let error = inner.corrupt_in(id, source);
        inner.report_corruption(&error);
        Some(error)
    }
}

/// Corruption found in the background, kept until the shard is reopened.
#[derive(Debug, Clone)]
pub(super) struct FoundCorruption {
    pub(super) object: Option<String>,
    pub(super) reason: String,
}

impl Inner {
    pub(super) fn corrupt(&self, source: SstError) -> StateError {
        StateError::corrupt(self.label.clone(), source)
    }

    pub(super) fn corrupt_msg(&self, message: &str) -> StateError {
        StateError::corrupt(self.label.clone(), message.to_owned())
    }

    /// A corruption found in `sst`: the shard's next open falls back past every checkpoint
    /// that references it.
    pub(super) fn corrupt_in(
        &self,
        sst: SstId,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StateError {
        StateError::Corrupt {
            shard: self.label.clone(),
            object: Some(sst.object_name()),
            source: source.into(),
        }
    }

    /// Records corruption found off the read path (compaction, the scrub).
    pub(super) fn report_corruption(&self, error: &StateError) {
        let StateError::Corrupt { object, source, .. } = error else {
            return;
        };
        let mut slot = self.corruption.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert_with(|| FoundCorruption {
            object: object.clone(),
            reason: crate::error::Chain(&**source).to_string(),
        });
    }

    /// The corruption compaction or the scrub found, as an error of this shard.
    pub(super) fn found_corruption(&self) -> Option<StateError> {
        let slot = self.corruption.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().map(|found| StateError::Corrupt {
            shard: self.label.clone(),
            object: found.object.clone(),
            source: found.reason.clone().into(),
        })
    }

    /// `sst` failed verification as compaction read it: reads it whole once more from the
    /// store and verifies every block. Still failing: corruption of `sst`; passing now: the
    /// first read was damaged on the way, an outage (compaction tries again).
    pub(super) async fn confirm_corrupt(&self, sst: &OpenSst) -> StateError {
        let id = sst.meta.id();
        let file = match self.files.get_whole(&sst.path).await {
            Ok(file) => file,
            Err(e) => return self.fetch_error(id, Arc::new(e)),
        };
        match SstReader::open(file).and_then(|r| r.verify_blocks()) {
            Err(e) => self.corrupt_in(id, e),
            Ok(()) => StateError::Unavailable {
                shard: self.label.clone(),
                source: format!(
                    "{} failed verification once and passed when read again",
                    id.object_name()
                )
                .into(),
            },
        }
    }

    /// A failed read of `sst`. A missing SST that a manifest references is corruption, not an
    /// outage.
    pub(super) fn fetch_error(&self, sst: SstId, error: Arc<FetchError>) -> StateError {
        match &*error {
            FetchError::Store { .. } => StateError::Unavailable {
                shard: self.label.clone(),
                source: Box::new(error),
            },
            FetchError::Missing { .. } | FetchError::Corrupt { .. } => self.corrupt_in(sst, error),
        }
    }
}
