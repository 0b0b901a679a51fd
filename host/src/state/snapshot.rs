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

use super::manifest::{
    BackgroundGc, CandidateCheck, Checked, Manifest, ManifestError, ManifestStore, Protected,
    RetentionPolicy, find_checkpoint, retained_versions, sweep,
};
use super::{Recovery, StateError};
use crate::clock::SharedClock;
use crate::ids::ManifestVersion;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Manifest metadata key naming the snapshot object.
pub(crate) const SNAPSHOT_KEY: &str = "snapshot";

/// The snapshot object a checkpoint's manifest metadata names (relative to its shard), if any:
/// `None` for an `lsm` checkpoint.
pub fn snapshot_name(metadata: &BTreeMap<String, String>) -> Option<&str> {
    metadata.get(SNAPSHOT_KEY).map(String::as_str)
}

mod format;
pub use format::{SnapshotEntries, SnapshotError, StreamCheck, decode, encode};

/// Where a shard's snapshots and manifests live, and the claim this owner holds.
#[derive(Debug)]
pub struct SnapshotShard {
    store: Arc<dyn ObjectStore>,
    root: Path,
    manifests: ManifestStore,
    /// The newest version this owner wrote (its claim, then each checkpoint).
    last: tokio::sync::Mutex<Manifest>,
    recovered: Option<Manifest>,
    /// The checkpoint recovery would use now (the one resumed from, then each decided one):
    /// GC keeps it whatever the number of newer prepared versions (exactly-once).
    decided: std::sync::Mutex<Option<ManifestVersion>>,
    retention: RetentionPolicy,
    /// GC's time: a snapshot's age is measured on it.
    clock: SharedClock,
    gc: BackgroundGc,
}

impl SnapshotShard {
    /// Recovers the shard under `root` — the newest decided checkpoint whose manifest and
    /// snapshot are intact and that `recovery` does not rule out, falling back past provable
    /// corruption with an audit line ([`find_checkpoint`], shared with the `lsm` backend) —
    /// and claims it under `token`, recording the versions it fell back past (`versions`: the
    /// shard's manifest versions as the open listed them). Its GC keeps what `retention` says,
    /// measuring ages on `clock`, and runs once in the background after the claim (so that
    /// owners that each live a few seconds still collect history: SCENARIOS.md S18). Returns
    /// the shard and the recovered entries.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] on any transient store error (never a fallback);
    /// [`StateError::Corrupt`] when checkpoints exist but none is intact.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        root: Path,
        (token, versions): (&str, Vec<ManifestVersion>),
        recovery: &Recovery,
        retention: RetentionPolicy,
        clock: SharedClock,
    ) -> Result<(Self, SnapshotEntries), StateError> {
        let manifests = ManifestStore::new(store.clone(), root.clone());
        let mut check = SnapshotCheck {
            store: &store,
            root: &root,
        };
        let found = find_checkpoint(&manifests, versions.clone(), recovery, &mut check).await?;
        let (recovered, entries) = match found.checkpoint {
            Some((manifest, entries)) => (Some(manifest), entries),
            None => (None, SnapshotEntries::new()),
        };
        let claim = manifests
            .claim_listed(
                versions,
                token,
                recovered.as_ref(),
                &found.rejected,
                recovery.committed,
            )
            .await
            .map_err(|e| e.into_state_error(&root))?;
        tracing::info!(shard = %root, version = claim.version.0, writer_epoch = claim.writer_epoch, from_checkpoint = ?recovered.as_ref().map(|m| m.version), entries = entries.len(), "claimed shard (memory, from snapshot)");
        let shard = Self {
            store,
            root,
            manifests,
            last: tokio::sync::Mutex::new(claim),
            decided: std::sync::Mutex::new(recovered.as_ref().map(|m| m.version)),
            recovered,
            retention,
            clock,
            gc: BackgroundGc::default(),
        };
        shard.start_gc();
        Ok((shard, entries))
    }

    /// Starts a GC pass in the background unless one runs, keeping the last decided
    /// checkpoint.
    fn start_gc(&self) {
        let decided = *self.decided.lock().unwrap_or_else(|e| e.into_inner());
        let protected = Protected::decided(decided, &BTreeSet::new());
        let (store, root, policy) = (
            self.store.clone(),
            self.root.clone(),
            self.retention.clone(),
        );
        let now_ms = self.clock.now_ms();
        let interval = policy.gc_interval;
        self.gc.start(&self.root, (now_ms, interval), async move {
            collect_garbage(&store, &root, &protected, &policy, now_ms).await
        });
    }

    /// Waits up to `max` for the GC pass running, if any (a closing owner: SCENARIOS.md S18);
    /// a pass cut short is repeated by the next owner.
    pub async fn settle(&self, max: std::time::Duration) {
        if tokio::time::timeout(max, self.gc.settled()).await.is_err() {
            tracing::debug!(shard = %self.root, "GC still running at close; the next owner repeats it");
        }
    }

    /// Where the shard lives in the store.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The caller metadata (input offsets) of the checkpoint the shard resumed from.
    pub fn recovered_metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.recovered.as_ref().map(|m| &m.metadata)
    }

    /// The version of the checkpoint the shard resumed from.
    pub fn recovered_version(&self) -> Option<ManifestVersion> {
        self.recovered.as_ref().map(|m| m.version)
    }

    /// [`crate::state::Shard::resumed_from`].
    pub fn resumed_from(&self) -> Option<ManifestVersion> {
        self.recovered
            .as_ref()
            .map(|m| crate::state::manifest::converted_from(&m.writer_token).unwrap_or(m.version))
    }

    /// Records that checkpoint `version` is decided: GC keeps it.
    pub fn decided(&self, version: ManifestVersion) {
        *self.decided.lock().unwrap_or_else(|e| e.into_inner()) = Some(version);
    }

    /// The version the next [`SnapshotShard::commit`] takes when it succeeds.
    pub async fn next_version(&self) -> ManifestVersion {
        self.last.lock().await.version + 1
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
        self.start_gc();
        Ok(version.0)
    }

    /// Waits for the GC pass the last checkpoint started, if any.
    pub async fn gc_settled(&self) {
        self.gc.settled().await;
    }
}

/// Recovery's check of a candidate: the snapshot it names reads and decodes.
struct SnapshotCheck<'a> {
    store: &'a Arc<dyn ObjectStore>,
    root: &'a Path,
}

impl CandidateCheck for SnapshotCheck<'_> {
    type Product = SnapshotEntries;

    fn objects(&self, manifest: &Manifest) -> Vec<String> {
        manifest
            .metadata
            .get(SNAPSHOT_KEY)
            .cloned()
            .into_iter()
            .collect()
    }

    async fn check(
        &mut self,
        candidate: &Manifest,
    ) -> Result<Checked<SnapshotEntries>, StateError> {
        read_snapshot(self.store, self.root, candidate).await
    }
}

/// Reads and decodes the snapshot checkpoint `manifest` names.
async fn read_snapshot(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    manifest: &Manifest,
) -> Result<Checked<SnapshotEntries>, StateError> {
    let Some(name) = manifest.metadata.get(SNAPSHOT_KEY) else {
        // The open converts the newest `lsm` checkpoint first (`checkpoints::convert`); one met
        // here is older.
        return Ok(Checked::Invalid(
            "names no snapshot (written by the lsm backend, not converted)".to_owned(),
        ));
    };
    let unavailable = |source: object_store::Error| StateError::Unavailable {
        shard: root.to_string(),
        source: Box::new(source),
    };
    match store.get(&Path::from(format!("{root}/{name}"))).await {
        Ok(object) => {
            let bytes = object.bytes().await.map_err(unavailable)?;
            Ok(match decode(&bytes) {
                Ok(entries) => Checked::Valid(entries),
                Err(reason) => Checked::Invalid(format!("snapshot `{name}` is corrupt: {reason}")),
            })
        }
        Err(object_store::Error::NotFound { .. }) => {
            Ok(Checked::Invalid(format!("snapshot `{name}` is missing")))
        }
        Err(other) => Err(unavailable(other)),
    }
}

/// What a snapshot GC pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotGcReport {
    /// Manifest versions deleted.
    pub manifests_deleted: usize,
    /// Snapshot objects deleted.
    pub snapshots_deleted: usize,
    /// SSTs of the `lsm` backend (before a switch) no kept version references.
    pub ssts_deleted: usize,
}

/// Keeps what [`retained_versions`] keeps under `policy` (the rule the `lsm` backend's GC
/// shares) and what `protected` names: deletes the other manifest versions, then the snapshots
/// no kept manifest names that are older than the policy's grace period at `now_ms`.
async fn collect_garbage(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    protected: &Protected,
    policy: &RetentionPolicy,
    now_ms: u64,
) -> Result<SnapshotGcReport, ManifestError> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let kept = retained_versions(&manifests, policy, protected, now_ms).await?;
    let mut report = SnapshotGcReport::default();
    let named: BTreeSet<String> = kept
        .manifests
        .iter()
        .filter_map(|m| m.metadata.get(SNAPSHOT_KEY))
        .map(|name| format!("{root}/{name}"))
        .collect();
    report.manifests_deleted = manifests.delete_many(&kept.delete).await?;
    let prefix = Path::from(format!("{root}/snapshot"));
    report.snapshots_deleted = sweep(store, &prefix, (policy, now_ms), |location| {
        Some(named.contains(location.as_ref()))
    })
    .await?
    .deleted;
    // What a switch from the `lsm` backend left (docs/api.md "Switching backends").
    report.ssts_deleted = crate::state::stored::sweep_other_backend(
        store,
        root,
        &kept.manifests,
        "memory",
        (policy, now_ms),
    )
    .await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Offset;
    use crate::state::checkpoint::{DecidedBy, InputOffsets, checkpoint_metadata};
    use futures::TryStreamExt;
    use object_store::memory::InMemory;

    #[test]
    fn a_snapshot_round_trips_and_any_flipped_byte_is_caught_whole_or_streamed() {
        let entries: SnapshotEntries = [
            (b"a".to_vec(), (Bytes::from_static(b"1"), None)),
            (b"b".to_vec(), (Bytes::from_static(b""), Some(42))),
        ]
        .into();
        let object = encode(entries.iter().map(|(k, (v, e))| (k.as_slice(), v, *e)));
        assert_eq!(decode(&object).expect("decodes"), entries);
        for i in 0..object.len() {
            let mut bad = object.to_vec();
            bad[i] ^= 0x40;
            assert!(decode(&Bytes::from(bad)).is_err(), "byte {i} flipped");
        }
        assert!(decode(&object.slice(..object.len() - 1)).is_err());

        // Streamed in chunks of any size, the check agrees with `decode`.
        let streamed = |bytes: &[u8], chunk: usize| {
            let mut check = StreamCheck::default();
            for part in bytes.chunks(chunk) {
                check.update(part);
            }
            check.finish()
        };
        for chunk in [1, 3, 5, 8, object.len()] {
            assert_eq!(streamed(&object, chunk), Ok(()), "chunks of {chunk}");
            for i in 0..object.len() {
                let mut bad = object.to_vec();
                bad[i] ^= 0x40;
                assert!(
                    streamed(&bad, chunk).is_err(),
                    "byte {i} flipped, chunks of {chunk}"
                );
            }
            assert!(streamed(&object[..object.len() - 1], chunk).is_err());
        }
    }

    fn root() -> Path {
        Path::from("w/pipelines/p/shards/00000")
    }

    async fn open(store: &Arc<InMemory>, committed: Option<ManifestVersion>) -> SnapshotShard {
        let recovery = Recovery {
            committed,
            ..Recovery::default()
        };
        static OWNERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let token = format!(
            "owner-{}",
            OWNERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let store: Arc<dyn ObjectStore> = store.clone();
        let versions = ManifestStore::new(store.clone(), root())
            .versions()
            .await
            .expect("lists");
        SnapshotShard::open(
            store,
            root(),
            (&token, versions),
            &recovery,
            RetentionPolicy::default(),
            clock(),
        )
        .await
        .expect("opens")
        .0
    }

    fn clock() -> SharedClock {
        Arc::new(crate::clock::ManualClock::new(1_000))
    }

    /// One GC pass over the test shard, `decided` pinned, at the end of time (no grace).
    async fn gc(store: &Arc<InMemory>, decided: Option<ManifestVersion>) -> SnapshotGcReport {
        collect_garbage(
            &(store.clone() as Arc<dyn ObjectStore>),
            &root(),
            &Protected::decided(decided, &BTreeSet::new()),
            &RetentionPolicy::default(),
            u64::MAX,
        )
        .await
        .expect("GC")
    }

    async fn commit(shard: &SnapshotShard, decided_by: DecidedBy, next: i64) -> ManifestVersion {
        let mut offsets = InputOffsets::new();
        offsets.advance("in", Offset(next - 1));
        let entries: SnapshotEntries =
            [(b"k".to_vec(), (Bytes::from(next.to_string()), None))].into();
        let object = encode(entries.iter().map(|(k, (v, e))| (k.as_slice(), v, *e)));
        ManifestVersion(
            shard
                .commit(object, checkpoint_metadata(&offsets, decided_by))
                .await
                .expect("commits"),
        )
    }

    #[test]
    fn snapshot_gc_counts_only_decided_checkpoints_and_keeps_the_decided_one() {
        crate::state::test_support::block_on(async {
            let store = Arc::new(InMemory::new());
            let first = open(&store, None).await;
            let decided = commit(&first, DecidedBy::Transaction, 10).await;
            // Five owners in turn each prepare a checkpoint whose transaction never commits,
            // then the next reopens from the decided one.
            for round in 0..5 {
                let owner = open(&store, Some(decided)).await;
                assert_eq!(owner.recovered_version(), Some(decided));
                commit(&owner, DecidedBy::Transaction, 20 + round).await;
            }
            gc(&store, Some(decided)).await;
            let after = open(&store, Some(decided)).await;
            assert_eq!(
                after.recovered_version(),
                Some(decided),
                "prepared checkpoints did not push the decided one out"
            );
        });
    }

    #[test]
    fn snapshots_no_kept_version_names_are_deleted_only_past_the_grace_period() {
        crate::state::test_support::block_on(async {
            let store = Arc::new(InMemory::new());
            let a = open(&store, None).await;
            let mut newest = ManifestVersion::default();
            for next in 10..15 {
                newest = commit(&a, DecidedBy::Manifest, next).await;
            }
            // The shard's own passes measure age on its clock, stopped at 1 s after the epoch:
            // every snapshot is younger than that, so they delete manifests only.
            a.gc_settled().await;
            let policy = RetentionPolicy::default();
            let written_ms = u64::try_from(
                crate::clock::wall_now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("after 1970")
                    .as_millis(),
            )
            .expect("fits");
            let pass = async |now_ms| {
                collect_garbage(
                    &(store.clone() as Arc<dyn ObjectStore>),
                    &root(),
                    &Protected::decided(Some(ManifestVersion(newest.0)), &BTreeSet::new()),
                    &policy,
                    now_ms,
                )
                .await
                .expect("GC")
            };
            let snapshots = async || {
                let prefix = Path::from(format!("{}/snapshot", root()));
                store
                    .list(Some(&prefix))
                    .try_collect::<Vec<_>>()
                    .await
                    .expect("list")
                    .len()
            };
            assert_eq!(snapshots().await, 5);
            let within = pass(written_ms).await;
            assert_eq!(within.snapshots_deleted, 0, "{within:?}");
            assert_eq!(snapshots().await, 5);
            let past = pass(written_ms + 601_000).await;
            assert_eq!(past.snapshots_deleted, 2, "{past:?}");
            assert_eq!(
                snapshots().await,
                3,
                "the retained checkpoints' snapshots stay"
            );
            let left = ManifestStore::new(store.clone(), root())
                .versions()
                .await
                .expect("versions");
            assert_eq!(left, vec![newest - 2, newest - 1, newest]);
        });
    }

    #[test]
    fn snapshot_gc_keeps_the_pinned_decided_checkpoint_below_the_retained_ones() {
        crate::state::test_support::block_on(async {
            let store = Arc::new(InMemory::new());
            let a = open(&store, None).await;
            let pinned = commit(&a, DecidedBy::Manifest, 10).await;
            let mut newest = pinned;
            for next in 11..15 {
                newest = commit(&a, DecidedBy::Manifest, next).await;
            }
            gc(&store, Some(pinned)).await;
            let left = ManifestStore::new(store.clone(), root())
                .versions()
                .await
                .expect("versions");
            assert_eq!(
                left,
                vec![pinned, newest - 2, newest - 1, newest],
                "{left:?}"
            );
            let recovery = Recovery {
                committed: None,
                known_corruption: crate::state::KnownCorruption {
                    versions: [pinned + 1].into(),
                    reason: "test".into(),
                    ..Default::default()
                },
                listed: None,
            };
            // Its snapshot was kept with it: it still opens.
            let versions = ManifestStore::new(store.clone(), root())
                .versions()
                .await
                .expect("lists");
            let (opened, entries) = SnapshotShard::open(
                store.clone(),
                root(),
                ("reader", versions),
                &recovery,
                RetentionPolicy::default(),
                clock(),
            )
            .await
            .expect("opens the pinned checkpoint");
            assert_eq!(opened.recovered_version(), Some(pinned));
            assert_eq!(entries[&b"k".to_vec()].0, Bytes::from("10"));
        });
    }

    #[test]
    fn snapshot_gc_goes_on_after_a_fallback_past_a_corrupt_manifest() {
        crate::state::test_support::block_on(async {
            let store = Arc::new(InMemory::new());
            let a = open(&store, None).await;
            for next in [10, 11] {
                commit(&a, DecidedBy::Manifest, next).await;
            }
            let newest = commit(&a, DecidedBy::Manifest, 12).await;
            let path = Path::from(format!("{}/manifest/{newest:020}.manifest", root()));
            store
                .put(&path, PutPayload::from_static(b"WEIRMAN1 torn"))
                .await
                .expect("overwrite");
            let b = open(&store, None).await;
            assert_eq!(b.recovered_version(), Some(newest - 1));
            let manifests = ManifestStore::new(store.clone(), root());
            for next in 20..23 {
                let version = commit(&b, DecidedBy::Manifest, next).await;
                gc(&store, Some(version)).await;
                if next < 22 {
                    let left = manifests.versions().await.expect("versions");
                    assert!(left.contains(&newest), "kept while above the retained ones");
                }
            }
            let left = manifests.versions().await.expect("versions");
            assert!(!left.contains(&newest), "{left:?}");
            assert_eq!(left.len(), 3, "{left:?}");
        });
    }
}
