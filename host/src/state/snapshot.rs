//! Full snapshots for the `memory` backend (as Flink's HashMapStateBackend writes to its
//! checkpoint storage): each checkpoint writes the shard's whole map as one object and commits
//! it with a manifest version of the same kind the `lsm` backend uses — create-only, with the
//! writer epoch and token, and the input offsets in its metadata — so claims, fencing and
//! recovery follow docs/checkpoints.md unchanged. The manifest names its snapshot in the
//! metadata key `snapshot`; its SST levels are empty.
//!
//! Snapshot object, `{shard}/snapshot/{epoch:010}-{version:020}.snap`:
//! `WEIRSNP1` · entry count (u64 LE) · per entry: key length (u32 LE), key, value length
//! (u32 LE), value, expiry ms (u64 LE, `u64::MAX` for none) · CRC-32C (LE) of all before it.

use super::StateError;
use super::manifest::{
    Manifest, ManifestError, ManifestKind, ManifestStore, RecoveryRead, audit_fallback,
    audit_missing_committed,
};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"WEIRSNP1";
const NO_EXPIRY: u64 = u64::MAX;
/// Manifest metadata key naming the snapshot object.
const SNAPSHOT_KEY: &str = "snapshot";
/// Checkpoints kept (claims do not count), as the `lsm` backend's GC.
const RETAINED_CHECKPOINTS: usize = 3;
/// A snapshot no kept manifest names is deleted only once older than this (a writer may be
/// about to commit it).
const GRACE_MS: u64 = 600_000;

/// One entry of a snapshot: key → (value, expiry ms).
pub type SnapshotEntries = BTreeMap<Vec<u8>, (Bytes, Option<u64>)>;

/// Encodes `entries` as a snapshot object.
pub fn encode<'a>(
    entries: impl ExactSizeIterator<Item = (&'a Vec<u8>, &'a Bytes, Option<u64>)>,
) -> Bytes {
    let mut out = BytesMut::new();
    out.put_slice(MAGIC);
    out.put_u64_le(entries.len() as u64);
    for (key, value, expires_at_ms) in entries {
        out.put_u32_le(key.len() as u32);
        out.put_slice(key);
        out.put_u32_le(value.len() as u32);
        out.put_slice(value);
        out.put_u64_le(expires_at_ms.unwrap_or(NO_EXPIRY));
    }
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out.freeze()
}

/// Decodes a snapshot object.
///
/// # Errors
/// What is wrong: magic, checksum or a truncated entry.
pub fn decode(object: &Bytes) -> Result<SnapshotEntries, String> {
    if object.len() < MAGIC.len() + 8 + 4 || &object[..MAGIC.len()] != MAGIC {
        return Err("not a snapshot (magic)".into());
    }
    let (body, trailer) = object.split_at(object.len() - 4);
    let stored = u32::from_le_bytes(trailer.try_into().map_err(|_| "short trailer")?);
    if crc32c::crc32c(body) != stored {
        return Err("snapshot checksum mismatch".into());
    }
    let mut buf = object.slice(MAGIC.len()..object.len() - 4);
    let count = buf.get_u64_le();
    let mut entries = BTreeMap::new();
    for _ in 0..count {
        let key = take(&mut buf)?;
        let value = take(&mut buf)?;
        if buf.remaining() < 8 {
            return Err("truncated entry".into());
        }
        let expires = buf.get_u64_le();
        entries.insert(
            key.to_vec(),
            (value, (expires != NO_EXPIRY).then_some(expires)),
        );
    }
    if buf.has_remaining() {
        return Err("bytes after the last entry".into());
    }
    Ok(entries)
}

fn take(buf: &mut Bytes) -> Result<Bytes, String> {
    if buf.remaining() < 4 {
        return Err("truncated entry".into());
    }
    let len = buf.get_u32_le() as usize;
    if buf.remaining() < len {
        return Err("truncated entry".into());
    }
    Ok(buf.split_to(len))
}

/// Where a shard's snapshots and manifests live, and the claim this owner holds.
#[derive(Debug)]
pub struct SnapshotShard {
    store: Arc<dyn ObjectStore>,
    root: Path,
    manifests: ManifestStore,
    /// The newest version this owner wrote (its claim, then each checkpoint).
    last: tokio::sync::Mutex<Manifest>,
    recovered: Option<Manifest>,
}

impl SnapshotShard {
    /// Recovers the shard under `root` — the newest decided checkpoint
    /// ([`is_decided`], `committed` being the version the committed Kafka offsets name) whose
    /// manifest and snapshot are intact, falling back past provable corruption with an audit
    /// line — and claims it under `token`. Returns the shard and the recovered entries.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] on any transient store error (never a fallback);
    /// [`StateError::Corrupt`] when checkpoints exist but none is intact.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        root: Path,
        token: &str,
        committed: Option<u64>,
    ) -> Result<(Self, SnapshotEntries), StateError> {
        let manifests = ManifestStore::new(store.clone(), root.clone());
        let (recovered, entries) = recover(&store, &manifests, &root, committed).await?;
        let claim = manifests
            .claim(token, recovered.as_ref())
            .await
            .map_err(|e| e.into_state_error(&root))?;
        tracing::info!(shard = %root, version = claim.version, writer_epoch = claim.writer_epoch, from_checkpoint = ?recovered.as_ref().map(|m| m.version), entries = entries.len(), "claimed shard (memory, from snapshot)");
        Ok((
            Self {
                store,
                root,
                manifests,
                last: tokio::sync::Mutex::new(claim),
                recovered,
            },
            entries,
        ))
    }

    /// Where the shard lives in the store.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The caller metadata (input offsets) of the checkpoint the shard resumed from.
    pub fn recovered_metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.recovered.as_ref().map(|m| &m.metadata)
    }

    /// Writes `snapshot` and commits the next manifest version naming it, with `metadata`;
    /// then collects garbage in the background. Returns the version.
    ///
    /// # Errors
    /// [`ManifestError::Fenced`] when another owner claimed the shard; other errors leave
    /// the previous checkpoint current.
    pub async fn commit(
        &self,
        snapshot: Bytes,
        mut metadata: BTreeMap<String, String>,
    ) -> Result<u64, ManifestError> {
        let mut last = self.last.lock().await;
        let version = last.version + 1;
        let name = format!("snapshot/{:010}-{version:020}.snap", last.writer_epoch);
        self.store
            .put(
                &Path::from(format!("{}/{name}", self.root)),
                PutPayload::from(snapshot),
            )
            .await
            .map_err(ManifestError::Unavailable)?;
        metadata.insert(SNAPSHOT_KEY.to_owned(), name);
        let checkpoint = last.next_checkpoint(Vec::new(), metadata);
        self.manifests.commit(&checkpoint).await?;
        *last = checkpoint;
        let (store, root) = (self.store.clone(), self.root.clone());
        tokio::spawn(async move {
            if let Err(error) = collect_garbage(&store, &root).await {
                tracing::warn!(shard = %root, %error, "snapshot GC failed; it runs again after the next checkpoint");
            }
        });
        Ok(version)
    }
}

async fn recover(
    store: &Arc<dyn ObjectStore>,
    manifests: &ManifestStore,
    root: &Path,
    committed: Option<u64>,
) -> Result<(Option<Manifest>, SnapshotEntries), StateError> {
    let unavailable = |source: Box<dyn std::error::Error + Send + Sync>| StateError::Unavailable {
        shard: root.to_string(),
        source,
    };
    let versions = manifests
        .versions()
        .await
        .map_err(|e| unavailable(Box::new(e)))?;
    let mut corrupt_seen = audit_missing_committed(root, &versions, committed);
    for &version in versions.iter().rev() {
        let manifest = match manifests
            .read_for_recovery(version, committed)
            .await
            .map_err(|e| unavailable(Box::new(e)))?
        {
            RecoveryRead::Decided(m) => m,
            RecoveryRead::Skip => continue,
            RecoveryRead::Corrupt => {
                corrupt_seen += 1;
                continue;
            }
        };
        let why = match manifest.metadata.get(SNAPSHOT_KEY) {
            None => "names no snapshot".to_owned(),
            Some(name) => match store.get(&Path::from(format!("{root}/{name}"))).await {
                Ok(object) => {
                    let bytes = object.bytes().await.map_err(|e| unavailable(Box::new(e)))?;
                    match decode(&bytes) {
                        Ok(entries) => return Ok((Some(manifest), entries)),
                        Err(reason) => format!("snapshot `{name}` is corrupt: {reason}"),
                    }
                }
                Err(object_store::Error::NotFound { .. }) => {
                    format!("snapshot `{name}` is missing")
                }
                Err(other) => return Err(unavailable(Box::new(other))),
            },
        };
        audit_fallback(root, version, &why);
        corrupt_seen += 1;
    }
    if corrupt_seen > 0 {
        return Err(StateError::Corrupt {
            shard: root.to_string(),
            source: format!(
                "{corrupt_seen} checkpoint version(s) are corrupt and no valid checkpoint is left"
            )
            .into(),
        });
    }
    Ok((None, SnapshotEntries::new()))
}

/// Keeps the last [`RETAINED_CHECKPOINTS`] checkpoints: deletes older manifest versions, then
/// snapshots that no remaining manifest names and that are older than the grace period.
async fn collect_garbage(store: &Arc<dyn ObjectStore>, root: &Path) -> Result<(), ManifestError> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let versions = manifests.versions().await?;
    let mut kept = BTreeSet::new();
    let mut named = BTreeSet::new();
    let mut checkpoints = 0;
    for &version in versions.iter().rev() {
        kept.insert(version);
        let manifest = manifests.read(version).await?;
        if let Some(name) = manifest.metadata.get(SNAPSHOT_KEY) {
            named.insert(format!("{root}/{name}"));
        }
        if manifest.kind == ManifestKind::Checkpoint {
            checkpoints += 1;
            if checkpoints >= RETAINED_CHECKPOINTS {
                break;
            }
        }
    }
    if checkpoints < RETAINED_CHECKPOINTS {
        return Ok(()); // nothing is old enough yet
    }
    for &version in versions.iter().filter(|v| !kept.contains(v)) {
        manifests.delete(version).await?;
    }
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
    )
    .unwrap_or(u64::MAX);
    let prefix = Path::from(format!("{root}/snapshot"));
    let objects: Vec<_> = store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(ManifestError::Unavailable)?;
    for object in objects {
        let modified_ms = u64::try_from(object.last_modified.timestamp_millis()).unwrap_or(0);
        if named.contains(object.location.as_ref()) || modified_ms + GRACE_MS > now_ms {
            continue;
        }
        match store.delete(&object.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(ManifestError::Unavailable(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_round_trips_and_any_flipped_byte_is_caught() {
        let entries: SnapshotEntries = [
            (b"a".to_vec(), (Bytes::from_static(b"1"), None)),
            (b"b".to_vec(), (Bytes::from_static(b""), Some(42))),
        ]
        .into();
        let object = encode(entries.iter().map(|(k, (v, e))| (k, v, *e)));
        assert_eq!(decode(&object).expect("decodes"), entries);
        for i in 0..object.len() {
            let mut bad = object.to_vec();
            bad[i] ^= 0x40;
            assert!(decode(&Bytes::from(bad)).is_err(), "byte {i} flipped");
        }
        assert!(decode(&object.slice(..object.len() - 1)).is_err());
    }
}
