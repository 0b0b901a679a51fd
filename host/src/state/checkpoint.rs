//! What a shard checkpoint records and reports, independent of the backend: the input offsets
//! the state reflects ([`InputOffsets`]), what a checkpoint did ([`CheckpointReport`]) and why
//! one did not commit ([`CheckpointError`]). The protocol itself is docs/checkpoints.md.

use super::StateError;
use crate::ids::{ManifestVersion, Offset};
use std::collections::BTreeMap;

/// Prefix of the manifest metadata keys that hold input offsets: `offset/{topic}` → decimal.
const OFFSET_KEY_PREFIX: &str = "offset/";

/// The input position a shard's state reflects: for each input topic, the offset of the next
/// record to read from the shard's partition (Kafka's committed-offset convention: last
/// processed + 1). A topic that is absent has had no record processed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputOffsets(BTreeMap<String, Offset>);

impl InputOffsets {
    /// No offsets: nothing processed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that the record at `offset` of `topic` was processed (the next to read is
    /// `offset + 1`). Offsets only move forward.
    pub fn advance(&mut self, topic: &str, offset: Offset) {
        let next = offset + 1;
        match self.0.get_mut(topic) {
            Some(current) => *current = (*current).max(next),
            None => {
                self.0.insert(topic.to_owned(), next);
            }
        }
    }

    /// Records that everything of `topic` before `next` is reflected (a table loaded up to
    /// its end). Offsets only move forward.
    pub fn advance_to(&mut self, topic: &str, next: Offset) {
        match self.0.get_mut(topic) {
            Some(current) => *current = (*current).max(next),
            None => {
                self.0.insert(topic.to_owned(), next);
            }
        }
    }

    /// The next offset to read from `topic`, if any record of it was processed.
    pub fn next(&self, topic: &str) -> Option<Offset> {
        self.0.get(topic).copied()
    }

    /// `(topic, next offset)` pairs in topic order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Offset)> {
        self.0.iter().map(|(t, o)| (t.as_str(), *o))
    }

    /// Whether no offset is recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The offsets as manifest metadata pairs (`offset/{topic}` → decimal).
    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(t, o)| (format!("{OFFSET_KEY_PREFIX}{t}"), o.to_string()))
            .collect()
    }

    /// Reads the offsets back from manifest metadata; other keys are ignored.
    ///
    /// # Errors
    /// [`BadOffset`] naming the key whose value is not a decimal `i64`.
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Result<Self, BadOffset> {
        let mut offsets = BTreeMap::new();
        for (k, v) in metadata {
            if let Some(topic) = k.strip_prefix(OFFSET_KEY_PREFIX) {
                let offset = v.parse::<Offset>().map_err(|_| BadOffset {
                    key: k.clone(),
                    value: v.clone(),
                })?;
                offsets.insert(topic.to_owned(), offset);
            }
        }
        Ok(Self(offsets))
    }
}

/// Manifest metadata that should hold an input offset and does not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata `{key}` is not an offset: `{value}`")]
pub struct BadOffset {
    /// The metadata key (`offset/{topic}`).
    pub key: String,
    /// Its value.
    pub value: String,
}

/// Manifest metadata key saying what decides the checkpoint: `manifest` or `transaction`.
const DECIDED_BY_KEY: &str = "decided_by";

/// What makes a checkpoint version the one recovery resumes from (docs/checkpoints.md,
/// "Delivery guarantees").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// At-least-once: writing the manifest decides it.
    Manifest,
    /// Exactly-once: only the Kafka transaction that names it in the committed offsets'
    /// metadata decides it; until then it is prepared.
    Transaction,
}

impl DecidedBy {
    fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Manifest => "manifest",
            DecidedBy::Transaction => "transaction",
        }
    }
}

/// The manifest metadata of a checkpoint: the offsets and what decides it.
pub fn checkpoint_metadata(
    offsets: &InputOffsets,
    decided_by: DecidedBy,
) -> BTreeMap<String, String> {
    let mut metadata = offsets.to_metadata();
    metadata.insert(DECIDED_BY_KEY.to_owned(), decided_by.as_str().to_owned());
    metadata
}

/// What decides the checkpoint whose manifest carries `metadata` (written before the key
/// existed: the manifest, as at-least-once was all there was then).
pub fn decided_by(metadata: &BTreeMap<String, String>) -> DecidedBy {
    match metadata.get(DECIDED_BY_KEY).map(String::as_str) {
        Some("transaction") => DecidedBy::Transaction,
        _ => DecidedBy::Manifest,
    }
}

/// Whether checkpoint `version` with `metadata` is decided, given the version the committed
/// Kafka offsets name (`committed`, exactly-once): a manifest-decided checkpoint always is
/// (whatever mode the pipeline runs in now — switching modes keeps state), a
/// transaction-decided one only when Kafka names it. Recovery resumes from the newest decided
/// checkpoint.
pub fn is_decided(
    version: ManifestVersion,
    metadata: &BTreeMap<String, String>,
    committed: Option<ManifestVersion>,
) -> bool {
    match metadata.get(DECIDED_BY_KEY).map(String::as_str) {
        Some("transaction") => committed == Some(version),
        // `manifest`, or written before the key existed (at-least-once only then).
        _ => true,
    }
}

/// Prefix of the committed Kafka offsets' metadata that names a shard's checkpoint in
/// exactly-once mode: `weir.manifest={version}`.
const MANIFEST_METADATA_PREFIX: &str = "weir.manifest=";

/// The committed-offset metadata naming checkpoint `version` (exactly-once mode).
pub fn manifest_metadata(version: ManifestVersion) -> String {
    format!("{MANIFEST_METADATA_PREFIX}{version}")
}

/// The checkpoint version named by committed-offset metadata, if it names one.
pub fn parse_manifest_metadata(metadata: &str) -> Option<ManifestVersion> {
    metadata
        .strip_prefix(MANIFEST_METADATA_PREFIX)?
        .parse()
        .ok()
}

/// What one committed checkpoint did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointReport {
    /// The committed version (the manifest version for `lsm`).
    pub version: ManifestVersion,
    /// Bytes of state the checkpoint references.
    pub state_bytes: u64,
    /// Bytes this checkpoint added to the store since the previous one: SSTs flushed or
    /// compacted since then (for `lsm`), the snapshot (for a full-snapshot backend).
    pub uploaded_bytes: u64,
}

/// Why a checkpoint did not commit. Nothing is half-committed: the previous checkpoint stays
/// the one recovery uses.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The store failed (flush, upload or manifest write): try again at the next interval.
    #[error("checkpoint failed; the previous checkpoint stays current")]
    State(#[source] StateError),
    /// Another owner claimed the shard (a newer writer epoch): this owner must stop writing it
    /// and close it. Nothing it wrote after its last checkpoint is reachable from a manifest.
    #[error("checkpoint refused: the shard was claimed by another owner. shard=`{shard}`")]
    Fenced {
        /// The shard, as its store prefix.
        shard: String,
    },
}

impl CheckpointError {
    /// Whether another owner holds the shard now.
    pub fn is_fenced(&self) -> bool {
        matches!(self, CheckpointError::Fenced { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_transaction_checkpoint_counts_only_when_kafka_names_it() {
        let offsets = InputOffsets::new();
        let prepared = checkpoint_metadata(&offsets, DecidedBy::Transaction);
        assert!(!is_decided(ManifestVersion(7), &prepared, None));
        assert!(!is_decided(
            ManifestVersion(7),
            &prepared,
            Some(ManifestVersion(6))
        ));
        assert!(is_decided(
            ManifestVersion(7),
            &prepared,
            Some(ManifestVersion(7))
        ));
        let written = checkpoint_metadata(&offsets, DecidedBy::Manifest);
        assert!(is_decided(ManifestVersion(7), &written, None));
        assert!(is_decided(
            ManifestVersion(7),
            &written,
            Some(ManifestVersion(3))
        ));
    }

    #[test]
    fn manifest_metadata_round_trips_and_ignores_other_metadata() {
        assert_eq!(
            parse_manifest_metadata(&manifest_metadata(ManifestVersion(17))),
            Some(ManifestVersion(17))
        );
        assert_eq!(parse_manifest_metadata(""), None);
        assert_eq!(parse_manifest_metadata("weir.manifest=x"), None);
    }

    #[test]
    fn offsets_round_trip_through_metadata_and_only_move_forward() {
        let mut offsets = InputOffsets::new();
        offsets.advance("flights", Offset(41));
        offsets.advance("flights", Offset(7));
        offsets.advance("other.topic", Offset(0));
        assert_eq!(offsets.next("flights"), Some(Offset(42)));
        let mut metadata = offsets.to_metadata();
        assert_eq!(metadata["offset/other.topic"], "1");
        metadata.insert("unrelated".into(), "x".into());
        assert_eq!(
            InputOffsets::from_metadata(&metadata).expect("decodes"),
            offsets
        );
        metadata.insert("offset/bad".into(), "x".into());
        assert!(InputOffsets::from_metadata(&metadata).is_err());
    }
}
