//! Tests of the `lsm` backend's shard (`shard.rs`): checkpoints, recovery past corruption, GC
//! beside the scrub, fencing.

use super::*;
use crate::clock::{ManualClock, SharedClock};
use crate::ids::{ManifestVersion, Partition};
use crate::state::faulty_store::{Fault, FaultyStore};
use crate::state::lsm::backend::LsmBackend;
use crate::state::lsm::cache::BlockCaches;
use crate::state::test_support::{block_on, observed};
use crate::state::{ShardId, StateBackend};
use object_store::{ObjectStoreExt, PutPayload};

fn backend(store: &Arc<FaultyStore>) -> LsmBackend {
    let clock: SharedClock = Arc::new(ManualClock::new(0));
    LsmBackend::new(
        store.clone(),
        Path::from("p"),
        Arc::new(BlockCaches::none()),
        crate::state::lsm::tests::small_settings(),
        clock,
    )
    // Its clock stands still: every checkpoint's GC pass runs, as 10 s apart.
    .with_retention(RetentionPolicy {
        gc_interval: std::time::Duration::ZERO,
        ..RetentionPolicy::default()
    })
}

fn id() -> ShardId {
    ShardId {
        pipeline: "counts".into(),
        partition: Partition(3),
    }
}

fn write(i: u32, value: &str) -> StateWrite {
    StateWrite {
        key: i.to_be_bytes().to_vec(),
        value: Some(Bytes::from(value.to_owned())),
        expires_at_ms: None,
    }
}

fn offsets(offset: u64) -> BTreeMap<String, String> {
    [("counts-in/3".to_owned(), offset.to_string())].into()
}

/// Writes keys `from..to` with `value` and checkpoints with offset `to`.
async fn write_and_checkpoint(
    shard: &LsmShard,
    from: u32,
    to: u32,
    value: &str,
) -> ManifestVersion {
    for i in from..to {
        shard.apply(vec![write(i, value)]).await.expect("apply");
    }
    ManifestVersion(
        (shard
            .commit_checkpoint(offsets(u64::from(to)), &BTreeSet::new(), 0)
            .await
            .expect("checkpoint")
            .version)
            .0,
    )
}

#[test]
fn the_next_owner_resumes_from_the_checkpoint_with_its_offsets_and_fences_the_old_one() {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("a opens");
        assert_eq!(a.recovered_metadata(), BTreeMap::new(), "a new shard");
        write_and_checkpoint(&a, 0, 40, "a").await;
        // Written after the checkpoint: not part of what the next owner sees.
        a.apply(vec![write(1000, "late")]).await.expect("apply");

        let b = backend(&store).open_shard(&id()).await.expect("b opens");
        assert_eq!(b.recovered_metadata(), offsets(40));
        for i in 0..40u32 {
            assert_eq!(
                b.get(&i.to_be_bytes()).await.expect("get"),
                Some(Bytes::from("a"))
            );
        }
        assert_eq!(b.get(&1000u32.to_be_bytes()).await.expect("get"), None);
        let err = a
            .commit_checkpoint(offsets(41), &BTreeSet::new(), 0)
            .await
            .expect_err("a was fenced by b's claim");
        assert!(err.is_fenced(), "{err:?}");
    });
}

#[test]
fn a_corrupt_newest_checkpoint_falls_back_to_the_previous_one() {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        write_and_checkpoint(&a, 0, 20, "old").await;
        let newest = write_and_checkpoint(&a, 0, 30, "new").await;
        let path = Path::from(format!(
            "p/pipelines/counts/shards/00003/manifest/{newest:020}.manifest"
        ));
        store
            .inner
            .put(&path, PutPayload::from_static(b"WEIRMAN1 but then garbage"))
            .await
            .expect("overwrite");
        let b = backend(&store).open_shard(&id()).await.expect("b opens");
        assert_eq!(b.recovered_metadata(), offsets(20));
        assert_eq!(
            b.get(&5u32.to_be_bytes()).await.expect("get"),
            Some(Bytes::from("old"))
        );
        assert_eq!(b.get(&25u32.to_be_bytes()).await.expect("get"), None);
    });
}

#[test]
fn a_checkpoint_naming_a_missing_sst_falls_back_to_the_previous_one() {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        write_and_checkpoint(&a, 0, 20, "old").await;
        let before: HashSet<SstId> = a.tree().live_ssts().into_iter().collect();
        write_and_checkpoint(&a, 100, 120, "new").await;
        let only_newest = a
            .tree()
            .live_ssts()
            .into_iter()
            .find(|id| !before.contains(id))
            .expect("the second checkpoint flushed a new SST");
        let path = Path::from(format!(
            "p/pipelines/counts/shards/00003/{}",
            only_newest.object_name()
        ));
        store.inner.delete(&path).await.expect("delete");
        let b = backend(&store).open_shard(&id()).await.expect("b opens");
        assert_eq!(b.recovered_metadata(), offsets(20));
    });
}

#[test]
fn a_transient_error_reading_checkpoints_is_retried_not_a_fallback() {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        write_and_checkpoint(&a, 0, 20, "old").await;
        write_and_checkpoint(&a, 0, 30, "new").await;
        store.inject_on("/manifest/", Fault::GetFails);
        let err = backend(&store)
            .open_shard(&id())
            .await
            .expect_err("the read failed");
        assert!(matches!(err, StateError::Unavailable { .. }), "{err}");
        let b = backend(&store)
            .open_shard(&id())
            .await
            .expect("the retry opens");
        assert_eq!(
            b.recovered_metadata(),
            offsets(30),
            "the newest, not a fallback"
        );
    });
}

#[test]
fn checkpoints_keep_the_last_three_and_gc_the_older_manifests() {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        let mut versions = Vec::new();
        for round in 0..5 {
            versions.push(write_and_checkpoint(&a, 0, 10 + round, "v").await);
            a.gc_settled().await;
        }
        let left = ManifestStore::new(store.clone(), Path::from("p/pipelines/counts/shards/00003"))
            .versions()
            .await
            .expect("versions");
        assert_eq!(left, versions[2..].to_vec());
    });
}

/// The SSTs of the newest checkpoint that no older checkpoint of `shard` names.
fn only_in_newest(shard: &LsmShard, before: &HashSet<SstId>) -> Vec<SstId> {
    shard
        .tree()
        .live_ssts()
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect()
}

/// Flips 8 bytes of the object at `path`, keeping its size (so that opening, which checks
/// sizes, does not notice).
async fn flip_bytes(store: &FaultyStore, path: &Path, at: usize) {
    let mut bytes = store
        .inner
        .get(path)
        .await
        .expect("stored")
        .bytes()
        .await
        .expect("read")
        .to_vec();
    for b in &mut bytes[at..at + 8] {
        *b ^= 0xff;
    }
    store
        .inner
        .put(path, PutPayload::from(bytes))
        .await
        .expect("rewritten");
}

fn sst_path(id: SstId) -> Path {
    Path::from(format!(
        "p/pipelines/counts/shards/00003/{}",
        id.object_name()
    ))
}

fn manifests(store: &Arc<FaultyStore>) -> ManifestStore {
    ManifestStore::new(store.clone(), Path::from("p/pipelines/counts/shards/00003"))
}

#[test]
fn a_flipped_byte_in_an_sst_of_the_newest_checkpoint_makes_the_shard_fall_back_with_its_offsets() {
    let store = Arc::new(FaultyStore::default());
    let (known, newest) = block_on(async {
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        write_and_checkpoint(&a, 0, 20, "old").await;
        let before: HashSet<SstId> = a.tree().live_ssts().into_iter().collect();
        let newest = write_and_checkpoint(&a, 100, 120, "new").await;
        for id in only_in_newest(&a, &before) {
            flip_bytes(&store, &sst_path(id), 4).await;
        }
        // The next owner opens the newest checkpoint (its SSTs are all there, at their
        // sizes); the first read of a damaged block finds the corruption, twice.
        let b = backend(&store).open_shard(&id()).await.expect("opens");
        assert_eq!(b.recovered_metadata(), offsets(120));
        let mut found = None;
        for i in 100..120u32 {
            if let Err(error) = b.get(&i.to_be_bytes()).await {
                found = Some(error);
                break;
            }
        }
        let error = found.expect("a read meets the flipped bytes");
        let StateError::Corrupt { object, .. } = &error else {
            panic!("corruption, not {error}");
        };
        let object = object.clone().expect("the SST is named");
        assert!(object.starts_with("sst/"), "{object}");
        let mut known = crate::state::KnownCorruption::default();
        known.add(&error, b.opened_from());
        (known, newest)
    });
    let (c, seen) = observed(|| {
        block_on(async {
            let recovery = Recovery {
                committed: None,
                known_corruption: known.clone(),
                listed: None,
            };
            backend(&store)
                .open_shard_at(&id(), &recovery)
                .await
                .expect("falls back")
        })
    });
    assert_eq!(
        c.recovered_metadata(),
        offsets(20),
        "the previous checkpoint, with its offsets"
    );
    assert_eq!(seen.audit_lines.len(), 1, "{:?}", seen.audit_lines);
    assert!(
        seen.audit_lines[0].contains(&format!("version={newest}"))
            && seen.audit_lines[0].contains("found corrupt"),
        "{:?}",
        seen.audit_lines
    );
    assert_eq!(seen.counter("weir_checkpoint_fallbacks_total"), 1.0);
    block_on(async {
        assert_eq!(
            c.get(&5u32.to_be_bytes()).await.expect("get"),
            Some(Bytes::from("old"))
        );
        assert_eq!(c.get(&105u32.to_be_bytes()).await.expect("get"), None);
        // The claim records the rejected version: a later open skips it without reading
        // it (a read of it would fail here) and knowing nothing of the corruption.
        let versions = manifests(&store).versions().await.expect("versions");
        let claim = manifests(&store)
            .read(*versions.last().expect("c's claim is the newest"))
            .await
            .expect("the claim");
        assert!(claim.rejects(newest), "{:?}", claim.rejected);
        store.inject_on(
            Box::leak(format!("/{newest:020}.manifest").into_boxed_str()),
            Fault::GetFails,
        );
        let d = backend(&store).open_shard(&id()).await.expect("opens");
        assert_eq!(d.recovered_metadata(), offsets(20));
        assert!(store.take_any(), "the rejected version was never read");
    });
}

#[test]
fn with_no_usable_checkpoint_left_the_open_fails_as_corrupt_and_claims_nothing() {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        let only = write_and_checkpoint(&a, 0, 20, "old").await;
        let before = manifests(&store).versions().await.expect("versions");
        let recovery = Recovery {
            committed: None,
            known_corruption: crate::state::KnownCorruption {
                versions: [only].into(),
                reason: "checksum mismatch".into(),
                ..Default::default()
            },
            listed: None,
        };
        let err = backend(&store)
            .open_shard_at(&id(), &recovery)
            .await
            .expect_err("nothing to fall back to");
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("corrupt"), "{err}");
        assert_eq!(
            manifests(&store).versions().await.expect("versions"),
            before,
            "no claim was written"
        );
    });
}

#[test]
fn gc_goes_on_after_a_fallback_and_deletes_the_corrupt_version_only_below_the_retained_ones() {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        write_and_checkpoint(&a, 0, 10, "v").await;
        write_and_checkpoint(&a, 0, 11, "v").await;
        let newest = write_and_checkpoint(&a, 0, 12, "v").await;
        let path = Path::from(format!(
            "p/pipelines/counts/shards/00003/manifest/{newest:020}.manifest"
        ));
        store
            .inner
            .put(&path, PutPayload::from_static(b"WEIRMAN1 torn"))
            .await
            .expect("overwrite");
        let b = backend(&store).open_shard(&id()).await.expect("falls back");
        assert_eq!(b.recovered_metadata(), offsets(11));
        let gc = RetentionPolicy {
            grace: std::time::Duration::ZERO,
            ..RetentionPolicy::default()
        };
        let mut left = Vec::new();
        for round in 0..3u32 {
            let version = write_and_checkpoint(&b, 0, 20 + round, "w").await;
            b.gc_settled().await;
            let report = collect_garbage(
                &(store.clone() as Arc<dyn ObjectStore>),
                &Path::from("p/pipelines/counts/shards/00003"),
                &LiveWriter::of(b.tree(), &gc),
                &Protected {
                    decided: Some(version),
                    ..Protected::default()
                },
                &gc,
                u64::MAX,
            )
            .await;
            assert!(report.is_ok(), "GC fails no more: {report:?}");
            left = manifests(&store).versions().await.expect("versions");
            if round < 2 {
                assert!(left.contains(&newest), "kept while above the retained ones");
            }
        }
        assert!(!left.contains(&newest), "deleted once below them: {left:?}");
        assert_eq!(left.len(), 3, "the last three checkpoints: {left:?}");
    });
}

#[test]
fn corruption_the_scrub_finds_in_a_cold_sst_stops_the_next_checkpoint() {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        write_and_checkpoint(&a, 0, 40, "cold").await;
        let ssts = a.tree().live_ssts();
        flip_bytes(&store, &sst_path(ssts[0]), 4).await;
        let mut b = backend(&store).open_shard(&id()).await.expect("opens");
        b.scrub_settled().await;
        assert!(!b.scrubbed(), "the scrub found the damage");
        let found = b.tree().corruption().expect("recorded in the tree");
        let StateError::Corrupt { object, .. } = &found else {
            panic!("{found}");
        };
        assert_eq!(object.as_deref(), Some(ssts[0].object_name().as_str()));
        let err = b
            .commit_checkpoint(offsets(41), &BTreeSet::new(), 0)
            .await
            .expect_err("a corrupt tree never checkpoints");
        assert!(matches!(
            err,
            CheckpointError::Flush(StateError::Corrupt { .. })
        ));
    });
}

#[test]
fn until_the_scrub_has_read_the_recovered_ssts_gc_keeps_the_retained_checkpoints_up_to_the_recovered_one()
 {
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        let a = backend(&store).open_shard(&id()).await.expect("opens");
        let mut recovered_from = Vec::new();
        for round in 0..3 {
            recovered_from.push(write_and_checkpoint(&a, 0, 10 + round, "v").await);
            a.gc_settled().await;
        }
        let scrubless = backend(&store).with_scrub(ScrubSettings {
            bytes_per_second: 0,
            ..ScrubSettings::default()
        });
        let b = scrubless.open_shard(&id()).await.expect("opens");
        for round in 0..4 {
            write_and_checkpoint(&b, 0, 20 + round, "w").await;
            b.gc_settled().await;
        }
        // The scrub never ran: what b recovered from and the retained checkpoints before it
        // are kept (b's own last three alone would be newer).
        let left = manifests(&store).versions().await.expect("versions");
        for version in &recovered_from {
            assert!(left.contains(version), "{version} kept: {left:?}");
        }
        // Scrubbed: the next GC keeps only the last three checkpoints.
        let mut c = backend(&store).open_shard(&id()).await.expect("opens");
        c.scrub_settled().await;
        assert!(c.scrubbed());
        for round in 0..3 {
            let version = write_and_checkpoint(&c, 0, 30 + round, "x").await;
            // As the worker does once a checkpoint is decided: the pin moves on.
            c.checkpoint_decided(version);
            c.gc_settled().await;
        }
        let left = manifests(&store).versions().await.expect("versions");
        assert_eq!(left.len(), 3, "{left:?}");
    });
}

/// One process's view of the store: counts the LISTs of the whole manifest directory it makes
/// and those of the SST directory before its claim (recovery's), and fails every request once
/// the process is killed, so that its background work (a GC pass) dies with it.
#[derive(Debug, Default)]
struct Process {
    killed: std::sync::atomic::AtomicBool,
    manifest_lists: std::sync::atomic::AtomicU64,
    claimed: std::sync::atomic::AtomicBool,
    sst_lists_before_claim: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl crate::state::hooked_store::RequestHook for Process {
    async fn before(
        &self,
        request: crate::state::hooked_store::Request,
        location: Option<&Path>,
    ) -> object_store::Result<()> {
        use std::sync::atomic::Ordering;
        if self.killed.load(Ordering::Relaxed) {
            return Err(object_store::Error::Generic {
                store: "test",
                source: "the process was killed".into(),
            });
        }
        let at = location.map(|l| l.as_ref()).unwrap_or_default();
        match request {
            crate::state::hooked_store::Request::List if at.ends_with("/manifest") => {
                self.manifest_lists.fetch_add(1, Ordering::Relaxed);
            }
            crate::state::hooked_store::Request::List
                if at.ends_with("/sst") && !self.claimed.load(Ordering::Relaxed) =>
            {
                self.sst_lists_before_claim.fetch_add(1, Ordering::Relaxed);
            }
            crate::state::hooked_store::Request::Put if at.contains("/manifest/") => {
                self.claimed.store(true, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(())
    }
}

#[test]
fn owners_that_each_live_for_one_checkpoint_keep_the_history_bounded_and_list_it_once_per_open() {
    use std::sync::atomic::Ordering;
    block_on(async {
        let store = Arc::new(FaultyStore::default());
        for run in 0..60u32 {
            let process = Arc::new(Process::default());
            let view: Arc<dyn ObjectStore> = Arc::new(
                crate::state::hooked_store::HookedStore::new(store.clone(), process.clone()),
            );
            let clock: SharedClock = Arc::new(ManualClock::new(0));
            let backend = LsmBackend::new(
                view,
                Path::from("p"),
                Arc::new(BlockCaches::none()),
                crate::state::lsm::tests::small_settings(),
                clock,
            );
            let shard = backend.open_shard(&id()).await.expect("opens");
            assert_eq!(
                process.manifest_lists.load(Ordering::Relaxed),
                1,
                "run {run}: the open lists the manifest directory once"
            );
            // Recovery asks for the checkpoint's few SSTs by name: the compacted-away ones
            // waiting out GC's grace period under the SST directory cost it nothing.
            assert_eq!(
                process.sst_lists_before_claim.load(Ordering::Relaxed),
                0,
                "run {run}: recovery lists the SST directory"
            );
            // The process lives long enough for the pass its claim started, and dies right
            // after its one checkpoint: that checkpoint's pass never runs.
            shard.gc_settled().await;
            write_and_checkpoint(&shard, 0, 100 + run, "v").await;
            process.killed.store(true, Ordering::Relaxed);
            drop(shard);
            let versions = manifests(&store).versions().await.expect("versions");
            // The three retained checkpoints, the claims between them, and this run's claim
            // and checkpoint.
            assert!(
                versions.len() <= 7,
                "run {run}: {} versions stored: {versions:?}",
                versions.len()
            );
        }
        // The last owner's state is what 60 short runs made.
        let shard = backend(&store).open_shard(&id()).await.expect("opens");
        assert_eq!(
            shard.get(&99u32.to_be_bytes()).await.expect("reads"),
            Some(Bytes::from("v"))
        );
        assert_eq!(shard.recovered_metadata(), offsets(159));
    });
}
