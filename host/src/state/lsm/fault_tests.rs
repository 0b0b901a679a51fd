//! The tree and GC under a faulty object store: failed and half-done flushes, lost
//! acknowledgements, failed reads, compaction that cannot run (write stalls), and GC's
//! promises — it never deletes what a retained checkpoint, the live tree or a newer writer
//! references, and it does delete the orphans of interrupted flushes.

use super::cache::{BlockCaches, CacheSettings, SstFiles};
use super::gc::{LiveWriter, collect_garbage};
use super::tree::{LsmSettings, LsmTree, SstId};
use crate::clock::{ManualClock, SharedClock};
use crate::ids::ManifestVersion;
use crate::state::faulty_store::{Fault, FaultyStore};
use crate::state::manifest::{Manifest, ManifestStore};
use crate::state::manifest::{Protected, RetentionPolicy};
use crate::state::test_support::block_on;
use crate::state::{Shard, StateError, StateWrite};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

fn settings() -> LsmSettings {
    super::tests::small_settings()
}

struct Fixture {
    faulty: Arc<FaultyStore>,
    store: Arc<dyn ObjectStore>,
    files: SstFiles,
    manifests: ManifestStore,
    clock: SharedClock,
}

fn fixture() -> Fixture {
    let faulty = Arc::new(FaultyStore::default());
    let store: Arc<dyn ObjectStore> = faulty.clone();
    Fixture {
        files: SstFiles::new(store.clone(), Arc::new(BlockCaches::none())),
        manifests: ManifestStore::new(store.clone(), Path::from("s")),
        faulty,
        store,
        clock: Arc::new(ManualClock::new(0)),
    }
}

/// A new tree of writer `epoch` in the fixture's store.
fn new_tree(f: &Fixture, epoch: u64, settings: LsmSettings) -> LsmTree {
    LsmTree::new(
        f.files.clone(),
        Path::from("s"),
        epoch,
        settings,
        f.clock.clone(),
    )
}

/// The tree recorded in `manifest`, opened for writer `epoch`.
fn open_at(f: &Fixture, manifest: &Manifest, epoch: u64) -> LsmTree {
    LsmTree::open(
        f.files.clone(),
        Path::from("s"),
        manifest,
        epoch,
        settings(),
        f.clock.clone(),
    )
    .expect("opens")
}

/// One GC pass over the fixture's shard.
async fn run_gc(
    f: &Fixture,
    live: &LsmTree,
    pinned: &BTreeSet<ManifestVersion>,
    gc: &RetentionPolicy,
    now_ms: u64,
) -> super::gc::GcReport {
    collect_garbage(
        &f.store,
        &Path::from("s"),
        &LiveWriter::of(live, gc),
        &Protected {
            pinned: pinned.clone(),
            ..Protected::default()
        },
        gc,
        now_ms,
    )
    .await
    .expect("gc")
}

/// Asserts that every key of `keys` reads back the value [`write`] gave it.
async fn assert_reads_back(tree: &LsmTree, keys: std::ops::Range<u32>) {
    for i in keys {
        assert_eq!(
            tree.get(&i.to_be_bytes()).await.expect("get"),
            write(i).value,
            "key {i}"
        );
    }
}

fn write(i: u32) -> StateWrite {
    StateWrite {
        key: i.to_be_bytes().to_vec(),
        value: Some(Bytes::from(format!("value-{i}"))),
        expires_at_ms: None,
    }
}

async fn sst_objects(store: &Arc<dyn ObjectStore>) -> HashSet<SstId> {
    store
        .list(Some(&Path::from("s/sst")))
        .try_collect::<Vec<_>>()
        .await
        .expect("lists")
        .iter()
        .filter_map(|m| m.location.filename().and_then(SstId::parse_file_name))
        .collect()
}

async fn checkpoint(f: &Fixture, tree: &LsmTree, parent: &Manifest) -> Manifest {
    tree.flush().await.expect("flush");
    let seq = tree.next_seq();
    let manifest = parent.next_checkpoint(tree.levels(), Default::default());
    f.manifests.commit(&manifest).await.expect("commits");
    tree.checkpoint_committed(seq);
    manifest
}

fn gc_now(grace: Duration) -> (RetentionPolicy, u64) {
    let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock) + 1;
    (
        RetentionPolicy {
            retained_checkpoints: 3,
            grace,
            ..RetentionPolicy::default()
        },
        now,
    )
}

#[test]
fn an_interrupted_flush_leaves_only_orphans_that_gc_later_removes() {
    block_on(async {
        let f = fixture();
        let claim = f.manifests.claim("a", None, &[]).await.expect("claims");
        // No compaction here: every SST not in the tree is then an orphan of a failed flush.
        let no_compaction = LsmSettings {
            l0_compaction_trigger: 100,
            l0_slowdown_trigger: 200,
            l0_stop_trigger: 300,
            ..settings()
        };
        let tree = new_tree(&f, claim.writer_epoch, no_compaction);
        // The first SST upload is written but its acknowledgement is lost; the second fails
        // outright. Both flushes are retried under fresh names; a write that finds the
        // immutable memtables full meanwhile is refused whole and retried, as a worker does.
        f.faulty.inject_on("/sst/", Fault::LostAck);
        f.faulty.inject_on("/sst/", Fault::PutFails);
        let mut refusals = 0;
        for i in 0..40 {
            while let Err(err) = tree.apply(vec![write(i)]).await {
                assert!(matches!(err, StateError::Unavailable { .. }), "{err}");
                refusals += 1;
                assert!(refusals <= 2, "one refusal per injected fault at most");
            }
        }
        let cp = checkpoint(&f, &tree, &claim).await;
        let live: HashSet<SstId> = tree.live_ssts().into_iter().collect();
        let stored = sst_objects(&f.store).await;
        let orphans: Vec<&SstId> = stored.difference(&live).collect();
        assert_eq!(
            orphans.len(),
            1,
            "the lost-ack upload is the only orphan: {orphans:?}"
        );

        let (gc, now) = gc_now(Duration::ZERO);
        let report = run_gc(&f, &tree, &BTreeSet::new(), &gc, now).await;
        assert_eq!(report.ssts_deleted, 1);
        assert_eq!(sst_objects(&f.store).await, live, "only the orphan went");
        let reopened = open_at(&f, &cp, 9);
        assert_reads_back(&reopened, 0u32..40).await;
    });
}

#[test]
fn gc_never_deletes_an_sst_that_a_retained_checkpoint_or_the_live_tree_references() {
    block_on(async {
        let f = fixture();
        let claim = f.manifests.claim("a", None, &[]).await.expect("claims");
        let tree = new_tree(&f, claim.writer_epoch, settings());
        let mut checkpoints = Vec::new();
        let mut parent = claim;
        for round in 0..6u32 {
            for i in 0..30 {
                tree.apply(vec![write(round * 7 + i)]).await.expect("apply");
            }
            tree.compact_until_settled().await.expect("compacts");
            parent = checkpoint(&f, &tree, &parent).await;
            checkpoints.push(parent.clone());
        }
        // More writes after the last checkpoint: flushed, not yet in any manifest.
        for i in 1000..1040 {
            tree.apply(vec![write(i)]).await.expect("apply");
        }
        tree.flush().await.expect("flush");
        assert!(tree.compactions() > 0);

        let pinned: BTreeSet<ManifestVersion> = [checkpoints[0].version].into();
        let (gc, now) = gc_now(Duration::from_secs(600));
        let young = run_gc(&f, &tree, &pinned, &gc, now).await;
        assert_eq!(
            young.ssts_deleted, 0,
            "no SST is older than the grace period"
        );
        // Claim + checkpoints 1..=6; kept: the pinned first one and the last three.
        assert_eq!(young.manifests_deleted, 3, "{young:?}");
        assert_eq!(
            f.manifests.versions().await.expect("versions"),
            vec![
                checkpoints[0].version,
                checkpoints[3].version,
                checkpoints[4].version,
                checkpoints[5].version
            ]
        );
        let (gc, now) = gc_now(Duration::ZERO);
        let report = run_gc(&f, &tree, &pinned, &gc, now).await;
        assert!(
            report.ssts_deleted > 0,
            "compacted-away SSTs went: {report:?}"
        );
        let stored = sst_objects(&f.store).await;
        for id in tree.live_ssts() {
            assert!(stored.contains(&id), "live {id:?} deleted");
        }
        for cp in [
            &checkpoints[0],
            &checkpoints[3],
            &checkpoints[4],
            &checkpoints[5],
        ] {
            for r in cp.levels.iter().flatten() {
                assert!(
                    stored.contains(&r.id()),
                    "{:?} of version {} deleted",
                    r.id(),
                    cp.version
                );
            }
            let reader = open_at(&f, cp, 99);
            reader
                .scan(b"", None, usize::MAX)
                .await
                .expect("every block of a kept checkpoint reads");
        }
    });
}

#[test]
fn gc_by_a_zombie_keeps_what_the_newer_writer_wrote() {
    block_on(async {
        let f = fixture();
        let claim_a = f.manifests.claim("a", None, &[]).await.expect("a claims");
        let zombie = new_tree(&f, claim_a.writer_epoch, settings());
        let claim_b = f.manifests.claim("b", None, &[]).await.expect("b claims");
        let owner = new_tree(&f, claim_b.writer_epoch, settings());
        for i in 0..40 {
            owner.apply(vec![write(i)]).await.expect("apply");
        }
        owner.flush().await.expect("flush");
        let (gc, now) = gc_now(Duration::ZERO);
        run_gc(&f, &zombie, &BTreeSet::new(), &gc, now).await;
        let stored = sst_objects(&f.store).await;
        for id in owner.live_ssts() {
            assert!(
                stored.contains(&id),
                "the zombie's GC deleted the owner's {id:?}"
            );
        }
    });
}

#[test]
fn a_failed_block_read_is_an_outage_and_the_retry_reads_the_value() {
    block_on(async {
        let f = fixture();
        let claim = f.manifests.claim("a", None, &[]).await.expect("claims");
        let tree = new_tree(&f, claim.writer_epoch, settings());
        for i in 0..40 {
            tree.apply(vec![write(i)]).await.expect("apply");
        }
        let cp = checkpoint(&f, &tree, &claim).await;
        let reopened = open_at(&f, &cp, 2);
        f.faulty.set_latency(Duration::from_millis(5));
        f.faulty.inject_on("/sst/", Fault::GetFails);
        let err = reopened
            .get(&3u32.to_be_bytes())
            .await
            .expect_err("the GET fails");
        assert!(matches!(err, StateError::Unavailable { .. }), "{err}");
        assert_eq!(
            reopened.get(&3u32.to_be_bytes()).await.expect("retry"),
            write(3).value
        );
        let keys: Vec<Vec<u8>> = (0u32..40).map(|i| i.to_be_bytes().to_vec()).collect();
        let values = reopened
            .get_many(&keys)
            .await
            .expect("slow reads still read");
        assert_eq!(values, (0..40).map(|i| write(i).value).collect::<Vec<_>>());
    });
}

#[test]
fn a_flush_that_keeps_failing_refuses_writes_without_applying_any() {
    block_on(async {
        let f = fixture();
        let tree = new_tree(&f, 1, settings());
        for _ in 0..100 {
            f.faulty.inject_on("/sst/", Fault::PutFails);
        }
        let mut refused = None;
        for i in 0..200 {
            if let Err(err) = tree.apply(vec![write(i)]).await {
                refused = Some((i, err));
                break;
            }
        }
        let (i, err) = refused.expect("writes are refused once the immutable memtables are full");
        assert!(matches!(err, StateError::Unavailable { .. }), "{err}");
        assert_eq!(
            tree.get(&i.to_be_bytes()).await.expect("get"),
            None,
            "the refused write is not applied"
        );
        assert_eq!(
            tree.get(&(i - 1).to_be_bytes()).await.expect("get"),
            write(i - 1).value
        );
    });
}

#[test]
fn writes_stall_at_the_l0_stop_trigger_until_compaction_catches_up() {
    block_on(async {
        let f = fixture();
        let stalling = LsmSettings {
            l0_compaction_trigger: 2,
            l0_slowdown_trigger: 3,
            l0_stop_trigger: 4,
            stall_timeout: Duration::from_secs(2),
            ..settings()
        };
        let tree = new_tree(&f, 1, stalling);
        // Compaction reads its inputs whole; make every such read fail for a while.
        for _ in 0..1000 {
            f.faulty.inject_on("/sst/", Fault::GetFails);
        }
        let mut stalled = None;
        for i in 0..400 {
            if let Err(err) = tree.apply(vec![write(i)]).await {
                stalled = Some(i);
                assert!(err.to_string().contains("unavailable"), "{err}");
                break;
            }
        }
        let i = stalled.expect("writes stall once L0 reaches its stop trigger");
        assert_eq!(tree.level_counts()[0], 4);
        // The store recovers: the stalled write goes through once compaction catches up.
        while f.faulty.take_any() {}
        tree.apply(vec![write(i)])
            .await
            .expect("the write goes through after compaction");
        assert!(tree.level_counts()[0] < 4);
        assert_eq!(
            tree.get(&i.to_be_bytes()).await.expect("get"),
            write(i).value
        );
    });
}

#[test]
fn the_disk_cache_stays_within_its_bytes_and_serves_repeated_reads() {
    block_on(async {
        let f = fixture();
        let caches = Arc::new(
            BlockCaches::new(&CacheSettings {
                block_cache_bytes: 0,
                disk_cache_bytes: 4 << 10,
                disk_cache_dir: None,
            })
            .expect("caches"),
        );
        let files = SstFiles::new(f.store.clone(), caches.clone());
        let claim = f.manifests.claim("a", None, &[]).await.expect("claims");
        let tree = LsmTree::new(
            files.clone(),
            Path::from("s"),
            claim.writer_epoch,
            settings(),
            f.clock.clone(),
        );
        for i in 0..400 {
            tree.apply(vec![write(i)]).await.expect("apply");
        }
        let cp = checkpoint(&f, &tree, &claim).await;
        let reopened = LsmTree::open(files, Path::from("s"), &cp, 2, settings(), f.clock.clone())
            .expect("opens");
        assert_reads_back(&reopened, 0u32..400).await;
        caches.wait_for_disk_writes().await;
        let (_, disk_bytes) = caches.weighted_bytes();
        assert!(disk_bytes <= 4 << 10, "{disk_bytes} bytes on disk");
        assert!(
            caches.disk_files() > 0 && caches.disk_files() < 400 / 2,
            "{} files",
            caches.disk_files()
        );
        // Read the last key once more: the disk tier admits by frequency (moka's TinyLFU), so a
        // block seen once may lose its place to those already there; seen twice, it is admitted.
        assert_eq!(
            reopened.get(&399u32.to_be_bytes()).await.expect("get"),
            write(399).value
        );
        caches.wait_for_disk_writes().await;
        // Its blocks are on disk now: reading it again needs no GET (an injected GET failure
        // would show).
        f.faulty.inject_on("/sst/", Fault::GetFails);
        assert_eq!(
            reopened.get(&399u32.to_be_bytes()).await.expect("get"),
            write(399).value
        );
        assert_eq!(
            reopened.get(&399u32.to_be_bytes()).await.expect("disk hit"),
            write(399).value
        );
    });
}

#[test]
fn gc_keeps_what_compaction_retired_within_the_grace_period_for_readers_of_older_versions() {
    block_on(async {
        let f = fixture();
        let manual = ManualClock::new(0);
        let clock: SharedClock = Arc::new(manual.clone());
        let claim = f.manifests.claim("a", None, &[]).await.expect("claims");
        let tree = LsmTree::new(
            f.files.clone(),
            Path::from("s"),
            claim.writer_epoch,
            settings(),
            clock,
        );
        let before: HashSet<SstId> = {
            for i in 0..30 {
                tree.apply(vec![write(i)]).await.expect("apply");
            }
            tree.flush().await.expect("flush");
            tree.live_ssts().into_iter().collect()
        };
        for i in 30..60 {
            tree.apply(vec![write(i)]).await.expect("apply");
        }
        tree.flush().await.expect("flush");
        tree.compact_until_settled().await.expect("compacts");
        checkpoint(&f, &tree, &claim).await;
        let retired: Vec<SstId> = before
            .iter()
            .filter(|id| !tree.live_ssts().contains(id))
            .copied()
            .collect();
        assert!(
            !retired.is_empty(),
            "compaction retired some of the first SSTs"
        );
        // An hour from now by the store's clock every object is older than the grace period,
        // but the tree retired these only now (by its clock): a reader may still use them.
        let gc = RetentionPolicy {
            retained_checkpoints: 3,
            grace: Duration::from_secs(600),
            ..RetentionPolicy::default()
        };
        let later = crate::clock::Clock::now_ms(&crate::clock::SystemClock) + 3_600_000;
        run_gc(&f, &tree, &BTreeSet::new(), &gc, later).await;
        let stored = sst_objects(&f.store).await;
        assert!(
            retired.iter().all(|id| stored.contains(id)),
            "retired SSTs kept within the grace period"
        );
        manual.advance_ms(601_000);
        run_gc(&f, &tree, &BTreeSet::new(), &gc, later).await;
        let stored = sst_objects(&f.store).await;
        assert!(
            retired.iter().all(|id| !stored.contains(id)),
            "and deleted after it"
        );
    });
}

#[test]
fn corruption_found_by_compaction_stops_it_and_stalled_writes_report_corruption() {
    block_on(async {
        let f = fixture();
        let stalling = LsmSettings {
            memtable_bytes_max: 1 << 20,
            l0_compaction_trigger: 3,
            l0_slowdown_trigger: 3,
            l0_stop_trigger: 3,
            stall_timeout: Duration::from_secs(30),
            ..settings()
        };
        let tree = new_tree(&f, 1, stalling);
        // Two L0 SSTs (explicit flushes only), then damage the first in the store.
        for round in 0..2 {
            for i in 0..20 {
                tree.apply(vec![write(round * 100 + i)])
                    .await
                    .expect("apply");
            }
            tree.flush().await.expect("flush");
        }
        assert_eq!(tree.level_counts()[0], 2);
        let first = tree.l0_ssts()[0];
        let path = Path::from(format!("s/{}", first.object_name()));
        let garbage = object_store::PutPayload::from_static(&[7u8; 100]);
        object_store::ObjectStoreExt::put(&f.faulty.inner, &path, garbage)
            .await
            .expect("overwrites");
        // The third SST triggers a compaction, which reads the damaged one whole.
        tree.apply(vec![write(500)]).await.expect("apply");
        tree.flush().await.expect("flush");
        let err = tree
            .apply(vec![write(501)])
            .await
            .expect_err("L0 is at its stop trigger and compaction has stopped");
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
        assert_eq!(
            tree.get(&501u32.to_be_bytes()).await.expect("get"),
            None,
            "not applied"
        );
    });
}
