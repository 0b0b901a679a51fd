//! The manifest of a shard's LSM tree: immutable, numbered versions written create-only, and
//! the commit protocol that fences zombie writers (issue 3, step 3).
//!
//! # Object layout
//! `{root}/manifest/{version:020}.manifest`, each:
//! `b"WEIRMAN1" | u32 LE format version | u32 LE crc32c of the body | body` where the body is
//! the JSON of [`Manifest`] (our own type, versioned by [`FORMAT_VERSION`] and frozen by a
//! snapshot test). Versions are never overwritten.
//!
//! # Commit (docs/checkpoints.md, "Taking a checkpoint" step 5)
//! 1. PUT version `v` create-only (`PutMode::Create`).
//! 2. `object_store` reports both 412 (someone created it) and 409 (a concurrent operation,
//!    nothing written) as `AlreadyExists`, and an acknowledgement can be lost: on
//!    `AlreadyExists` or any other error, read `v` back — absent: retry (bounded); our writer
//!    token: committed; anyone else's: fenced.
//! 3. After a commit, list the versions above `v`: one written by a higher writer epoch means
//!    another owner claimed the shard (possibly in a slot GC freed), so this writer is fenced
//!    even though its own PUT succeeded (SlateDB#352).
//!
//! A *claim* (a new owner taking the shard) is a version with the next writer epoch, written
//! above every existing version, whose SSTs are those of the checkpoint it starts from.

use crate::ids::ManifestVersion;
use crate::state::lsm::tree::SstId;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

mod recovery;
mod retention;
#[cfg(test)]
mod tests;
mod tokens;

pub use recovery::KnownCorruption;
pub(crate) use recovery::{CandidateCheck, Checked, find_checkpoint};
pub(crate) use retention::{BackgroundGc, retained_versions, sweep};
pub use retention::{Protected, RetentionPolicy};
pub use tokens::{conversion_token, converted_from};

/// The writer tokens of one process's claims: unique per process (its id and start time),
/// and per claim within it, so that two claims of one process (a partition reassigned while
/// its old shard lives) never share a token. Both backends claim with these.
#[derive(Debug, Clone)]
pub struct WriterTokens {
    process: String,
    claims: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl WriterTokens {
    /// Tokens `weir-{pid}-{start ns, hex}-{claim}`.
    pub fn new() -> Self {
        let nanos = crate::clock::wall_now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            process: format!("weir-{}-{nanos:x}", std::process::id()),
            claims: Default::default(),
        }
    }

    /// The token of the next claim.
    pub fn next(&self) -> String {
        let claim = self
            .claims
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}-{claim}", self.process)
    }
}

impl Default for WriterTokens {
    fn default() -> Self {
        Self::new()
    }
}

/// Magic at the start of every manifest object.
pub const MAGIC: &[u8; 8] = b"WEIRMAN1";
/// Manifest format version.
pub const FORMAT_VERSION: u32 = 2;
/// Attempts of one commit when the store answers ambiguously and the version is still absent.
pub const COMMIT_ATTEMPTS_MAX: usize = 5;

/// Why a version was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ManifestKind {
    /// A new owner claimed the shard (bumping the writer epoch); not a checkpoint.
    Claim,
    /// A checkpoint: the state together with the input offsets in `metadata`.
    Checkpoint,
}

/// One manifest version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// This version's number.
    pub version: ManifestVersion,
    /// The version this one was derived from.
    pub parent: Option<ManifestVersion>,
    /// Claim or checkpoint.
    pub kind: ManifestKind,
    /// The fencing token: bumped by every claim.
    pub writer_epoch: u64,
    /// Identifies the writer process that claimed the epoch (random per claim).
    pub writer_token: String,
    /// SSTs per level, level 0 first; within L0 oldest first.
    pub levels: Vec<Vec<SstRef>>,
    /// Caller-supplied pairs, opaque here (the input offsets of a checkpoint).
    pub metadata: BTreeMap<String, String>,
    /// Checkpoint versions an owner found unusable and recovered past, with why: written by
    /// the claim that fell back and carried by every later version of its writer (and by the
    /// next claims, while the version exists), so that recovery and GC skip them without
    /// reading them again (docs/checkpoints.md, "Corruption").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedVersion>,
}

/// A checkpoint version recovery fell back past.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedVersion {
    /// The version.
    pub version: ManifestVersion,
    /// Why it cannot be used, one line.
    pub reason: String,
}

/// An SST referenced by a manifest, with what a reader needs to route a key to it without
/// reading it: its size and key range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SstRef {
    /// Writer epoch in the SST's name.
    pub writer_epoch: u64,
    /// Sequence number in the SST's name.
    pub seq: u64,
    /// Length of the object, bytes.
    pub size_bytes: u64,
    /// The smallest key in the SST (hex in the JSON body).
    #[serde(with = "hex_bytes")]
    pub first_key: Vec<u8>,
    /// The largest key in the SST (hex in the JSON body).
    #[serde(with = "hex_bytes")]
    pub last_key: Vec<u8>,
}

impl SstRef {
    /// The SST's name.
    pub fn id(&self) -> SstId {
        SstId {
            writer_epoch: self.writer_epoch,
            seq: self.seq,
        }
    }
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        hex::decode(text.as_bytes()).map_err(serde::de::Error::custom)
    }
}

/// Why a manifest operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Another writer owns the shard: stop writing.
    #[error("fenced: another writer owns the shard. version={version} our_epoch={our_epoch}")]
    Fenced {
        /// The version that showed it.
        version: ManifestVersion,
        /// Our writer epoch.
        our_epoch: u64,
    },
    /// The version does not exist.
    #[error("manifest version not found. version={0}")]
    NotFound(u64),
    /// The object is not a valid manifest (magic, version, checksum, JSON).
    #[error("manifest is corrupt. version={version}: {reason}")]
    Corrupt {
        /// The version.
        version: ManifestVersion,
        /// What is wrong.
        reason: String,
    },
    /// The store failed or kept answering ambiguously; retry later.
    #[error("object store unavailable for the manifest")]
    Unavailable(#[source] object_store::Error),
    /// Commits kept being refused while the version stayed absent.
    #[error("manifest commit gave up after {0} ambiguous attempts")]
    Ambiguous(usize),
}

impl Manifest {
    /// A checkpoint with no parent, written into a shard from outside its history — a restore
    /// from a savepoint, an import of the portable format: at `version` by the writer
    /// (`writer_epoch`, `writer_token`) that makes it, with `levels` (none for the `memory`
    /// backend) and the input offsets (and the snapshot's name) in `metadata`.
    pub fn fresh_checkpoint(
        (version, writer_epoch, writer_token): (u64, u64, &str),
        levels: Vec<Vec<SstRef>>,
        metadata: BTreeMap<String, String>,
    ) -> Manifest {
        Manifest {
            version: ManifestVersion(version),
            parent: None,
            kind: ManifestKind::Checkpoint,
            writer_epoch,
            writer_token: writer_token.to_owned(),
            levels,
            metadata,
            rejected: Vec::new(),
        }
    }

    /// The checkpoint that follows this version, by the same writer: version + 1, this one as
    /// parent, with `levels` and the input offsets (or other caller pairs) in `metadata`.
    pub fn next_checkpoint(
        &self,
        levels: Vec<Vec<SstRef>>,
        metadata: BTreeMap<String, String>,
    ) -> Manifest {
        Manifest {
            version: self.version + 1,
            parent: Some(self.version),
            kind: ManifestKind::Checkpoint,
            writer_epoch: self.writer_epoch,
            writer_token: self.writer_token.clone(),
            levels,
            metadata,
            rejected: self.rejected.clone(),
        }
    }

    /// Whether this version records `version` as rejected.
    pub fn rejects(&self, version: ManifestVersion) -> bool {
        self.rejected.iter().any(|r| r.version == version)
    }

    /// Encodes the manifest object: magic, format version, checksum, JSON body.
    pub fn encode(&self) -> Bytes {
        let body = serde_json::to_vec(self).expect("a manifest of plain fields serialises");
        let mut out = Vec::with_capacity(16 + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        Bytes::from(out)
    }

    /// Decodes a manifest object read at `version` and checks it names that version.
    ///
    /// # Errors
    /// [`ManifestError::Corrupt`] for a bad magic, format version, checksum, body, or a body
    /// naming another version.
    pub fn decode(version: ManifestVersion, bytes: &[u8]) -> Result<Self, ManifestError> {
        let corrupt = |reason: String| ManifestError::Corrupt { version, reason };
        if bytes.len() < 16 || &bytes[0..8] != MAGIC {
            return Err(corrupt("bad magic or truncated".into()));
        }
        let format = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if format != FORMAT_VERSION {
            return Err(corrupt(format!("unsupported format version {format}")));
        }
        let expected = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        let actual = crc32c::crc32c(&bytes[16..]);
        if expected != actual {
            return Err(corrupt(format!(
                "checksum mismatch: stored {expected:#010x}, computed {actual:#010x}"
            )));
        }
        let manifest: Manifest =
            serde_json::from_slice(&bytes[16..]).map_err(|e| corrupt(format!("body: {e}")))?;
        if manifest.version != version {
            return Err(corrupt(format!("body names version {}", manifest.version)));
        }
        Ok(manifest)
    }
}

/// The manifest versions of one shard in an object store.
#[derive(Debug, Clone)]
pub struct ManifestStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
}

/// The version a manifest object's `location` names (`…/manifest/{version:020}.manifest`).
fn version_of(location: &Path) -> Option<ManifestVersion> {
    location.filename()?.strip_suffix(".manifest")?.parse().ok()
}

impl ManifestError {
    /// As a state error of the shard under `root`: a corrupt manifest stays corrupt, anything
    /// else is an outage to retry.
    pub fn into_state_error(self, root: &Path) -> crate::state::StateError {
        let shard = root.to_string();
        match self {
            ManifestError::Corrupt { .. } => crate::state::StateError::corrupt(shard, self),
            other => crate::state::StateError::Unavailable {
                shard,
                source: Box::new(other),
            },
        }
    }
}

impl ManifestStore {
    /// Manifests under `{root}/manifest/`.
    pub fn new(store: Arc<dyn ObjectStore>, root: Path) -> Self {
        Self { store, root }
    }

    /// Where the shard lives.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, version: ManifestVersion) -> Path {
        Path::from(format!("{}/manifest/{version:020}.manifest", self.root))
    }

    /// Every version present, ascending.
    ///
    /// # Errors
    /// [`ManifestError::Unavailable`] when listing fails.
    pub async fn versions(&self) -> Result<Vec<ManifestVersion>, ManifestError> {
        let prefix = Path::from(format!("{}/manifest", self.root));
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(ManifestError::Unavailable)?;
        let mut versions: Vec<ManifestVersion> = metas
            .iter()
            .filter_map(|m| version_of(&m.location))
            .collect();
        versions.sort_unstable();
        Ok(versions)
    }

    /// The versions present above `version`, ascending: one LIST that starts after it (S3's
    /// `start-after`), so that a writer's check for newer owners does not read the whole
    /// history.
    ///
    /// # Errors
    /// [`ManifestError::Unavailable`] when listing fails.
    pub async fn versions_above(
        &self,
        version: ManifestVersion,
    ) -> Result<Vec<ManifestVersion>, ManifestError> {
        let prefix = Path::from(format!("{}/manifest", self.root));
        let metas: Vec<_> = self
            .store
            .list_with_offset(Some(&prefix), &self.path(version))
            .try_collect()
            .await
            .map_err(ManifestError::Unavailable)?;
        let mut versions: Vec<ManifestVersion> = metas
            .iter()
            .filter_map(|m| version_of(&m.location))
            .filter(|v| *v > version)
            .collect();
        versions.sort_unstable();
        Ok(versions)
    }

    /// Reads one version.
    ///
    /// # Errors
    /// [`ManifestError::NotFound`], [`ManifestError::Corrupt`] or
    /// [`ManifestError::Unavailable`].
    pub async fn read(&self, version: ManifestVersion) -> Result<Manifest, ManifestError> {
        match self.store.get(&self.path(version)).await {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(ManifestError::Unavailable)?;
                Manifest::decode(version, &bytes)
            }
            Err(object_store::Error::NotFound { .. }) => Err(ManifestError::NotFound(version.0)),
            Err(e) => Err(ManifestError::Unavailable(e)),
        }
    }

    /// Deletes `versions` in bulk ([`retention::delete_objects`]: GC of versions older than
    /// every retained checkpoint).
    ///
    /// # Errors
    /// [`ManifestError::Unavailable`]; deleting an absent version succeeds.
    pub async fn delete_many(&self, versions: &[ManifestVersion]) -> Result<usize, ManifestError> {
        let paths = versions.iter().map(|v| self.path(*v)).collect();
        retention::delete_objects(&self.store, paths)
            .await
            .map_err(ManifestError::Unavailable)
    }

    /// Deletes one version (GC of versions older than every retained checkpoint).
    ///
    /// # Errors
    /// [`ManifestError::Unavailable`]; deleting an absent version succeeds.
    pub async fn delete(&self, version: ManifestVersion) -> Result<(), ManifestError> {
        match self.store.delete(&self.path(version)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(ManifestError::Unavailable(e)),
        }
    }

    /// Commits `manifest` at its version create-only, then checks no higher epoch claimed the
    /// shard. See the module docs for the protocol.
    ///
    /// # Errors
    /// [`ManifestError::Fenced`] when another writer owns the version or a later one;
    /// [`ManifestError::Unavailable`] / [`ManifestError::Ambiguous`] when the outcome could not
    /// be learned (retry later: the version may or may not exist, and reading it back decides).
    pub async fn commit(&self, manifest: &Manifest) -> Result<(), ManifestError> {
        let path = self.path(manifest.version);
        let bytes = manifest.encode();
        let mut last_error = None;
        for _ in 0..COMMIT_ATTEMPTS_MAX {
            let opts = PutOptions::from(PutMode::Create);
            match self
                .store
                .put_opts(&path, PutPayload::from(bytes.clone()), opts)
                .await
            {
                Ok(_) => {
                    return self.check_not_fenced(manifest).await;
                }
                Err(err) => {
                    // 409, 412, a timeout or a lost acknowledgement: what is stored decides.
                    match self.read(manifest.version).await {
                        Ok(stored) if stored.writer_token == manifest.writer_token => {
                            return self.check_not_fenced(manifest).await;
                        }
                        Ok(_) => {
                            return Err(ManifestError::Fenced {
                                version: manifest.version,
                                our_epoch: manifest.writer_epoch,
                            });
                        }
                        Err(ManifestError::NotFound(_)) => last_error = Some(err),
                        Err(other) => return Err(other),
                    }
                }
            }
        }
        Err(match last_error {
            Some(err) if !matches!(err, object_store::Error::AlreadyExists { .. }) => {
                ManifestError::Unavailable(err)
            }
            _ => ManifestError::Ambiguous(COMMIT_ATTEMPTS_MAX),
        })
    }

    /// Fails with [`ManifestError::Fenced`] when a version above `ours` carries a higher
    /// writer epoch.
    async fn check_not_fenced(&self, ours: &Manifest) -> Result<(), ManifestError> {
        for version in self.versions_above(ours.version).await? {
            let fenced = match self.read(version).await {
                Ok(later) => later.writer_epoch > ours.writer_epoch,
                // Only a newer owner writes above our version; one whose write we cannot read
                // is still a newer owner.
                Err(ManifestError::Corrupt { .. }) => true,
                Err(ManifestError::NotFound(_)) => false,
                Err(other) => return Err(other),
            };
            if fenced {
                return Err(ManifestError::Fenced {
                    version,
                    our_epoch: ours.writer_epoch,
                });
            }
        }
        Ok(())
    }

    /// The writer epoch of the newest version that decodes, skipping corrupt ones above it: a
    /// corrupt version was written by a writer whose own (older, readable) claim carries its
    /// epoch, so the claim that follows still fences it.
    async fn newest_readable_epoch(
        &self,
        versions: &[ManifestVersion],
    ) -> Result<u64, ManifestError> {
        for &version in versions.iter().rev() {
            match self.read(version).await {
                Ok(m) => return Ok(m.writer_epoch),
                Err(ManifestError::Corrupt { .. } | ManifestError::NotFound(_)) => continue,
                Err(other) => return Err(other),
            }
        }
        Ok(0)
    }

    /// Claims the shard for `writer_token`: writes a [`ManifestKind::Claim`] version above
    /// every existing one with the next writer epoch, starting from `base` (the checkpoint to
    /// resume from, or none for a new shard) and recording `rejected` (the versions recovery
    /// fell back past; those no longer stored are left out). Retries when another claimer wins
    /// a slot first.
    ///
    /// # Errors
    /// [`ManifestError::Unavailable`], [`ManifestError::Corrupt`] for an unreadable newest
    /// version, or [`ManifestError::Fenced`] when other claimers keep winning.
    pub async fn claim(
        &self,
        writer_token: &str,
        base: Option<&Manifest>,
        rejected: &[RejectedVersion],
    ) -> Result<Manifest, ManifestError> {
        self.claim_above(writer_token, base, rejected, None).await
    }

    /// [`ManifestStore::claim`], with the claim's version also above `floor`: the version
    /// Kafka's committed offsets name (exactly-once) when it is not stored, as after a restore
    /// from a replica of the store that lacks it (docs/checkpoints.md, "Disaster recovery").
    /// The new owner's versions then never reuse the number the committed offsets name, so a
    /// checkpoint of its own is never taken for the one Kafka decided.
    ///
    /// # Errors
    /// As [`ManifestStore::claim`].
    pub async fn claim_above(
        &self,
        writer_token: &str,
        base: Option<&Manifest>,
        rejected: &[RejectedVersion],
        floor: Option<ManifestVersion>,
    ) -> Result<Manifest, ManifestError> {
        let versions = self.versions().await?;
        self.claim_listed(versions, writer_token, base, rejected, floor)
            .await
    }

    /// [`ManifestStore::claim_above`] from `versions`, the shard's versions as the caller's own
    /// LIST saw them (an open lists once for recovery and claim); listed again only when
    /// another claimer wins the slot.
    ///
    /// # Errors
    /// As [`ManifestStore::claim`].
    pub async fn claim_listed(
        &self,
        mut versions: Vec<ManifestVersion>,
        writer_token: &str,
        base: Option<&Manifest>,
        rejected: &[RejectedVersion],
        floor: Option<ManifestVersion>,
    ) -> Result<Manifest, ManifestError> {
        let mut last = None;
        for attempt in 0..COMMIT_ATTEMPTS_MAX {
            if attempt > 0 {
                versions = self.versions().await?;
            }
            let top = versions.last().copied().max(floor);
            let top_epoch = self.newest_readable_epoch(&versions).await?;
            let claim = Manifest {
                version: top.map_or(ManifestVersion(1), |v| v + 1),
                parent: base.map(|b| b.version),
                kind: ManifestKind::Claim,
                writer_epoch: top_epoch + 1,
                writer_token: writer_token.to_owned(),
                levels: base.map(|b| b.levels.clone()).unwrap_or_default(),
                metadata: base.map(|b| b.metadata.clone()).unwrap_or_default(),
                rejected: rejected
                    .iter()
                    .filter(|r| versions.binary_search(&r.version).is_ok())
                    .cloned()
                    .collect(),
            };
            match self.commit(&claim).await {
                Ok(()) => return Ok(claim),
                Err(fenced @ ManifestError::Fenced { .. }) => last = Some(fenced),
                Err(other) => return Err(other),
            }
        }
        Err(last.unwrap_or(ManifestError::Ambiguous(COMMIT_ATTEMPTS_MAX)))
    }
}
