use super::*;
use crate::checkpoints::verify::verify_shard;
use crate::clock::{ManualClock, SharedClock};
use crate::ids::{Offset, Partition};
use crate::state::checkpoint::InputOffsets;
use crate::state::configured::ConfiguredShard;
use crate::state::lsm::backend::LsmBackend;
use crate::state::lsm::cache::BlockCaches;
use crate::state::memory::MemoryBackend;
use crate::state::test_support::block_on;
use crate::state::{Shard, ShardId, StateBackend, StateWrite};
use bytes::Bytes;
use object_store::memory::InMemory;

const P3: Partition = Partition(3);

fn write(key: u32, value: u32) -> StateWrite {
    StateWrite {
        key: key.to_be_bytes().to_vec(),
        value: Some(Bytes::from(format!("{value:0100}"))),
        expires_at_ms: None,
    }
}

fn offsets(next: i64) -> InputOffsets {
    let mut offsets = InputOffsets::new();
    offsets.advance("in", Offset(next - 1));
    offsets
}

async fn value<S: Shard>(shard: &S, key: u32) -> Option<u32> {
    let got = shard.get(&key.to_be_bytes()).await.expect("reads")?;
    Some(
        std::str::from_utf8(&got)
            .expect("text")
            .parse()
            .expect("a number"),
    )
}

/// Both backends: a savepoint taken after the first checkpoint, restored into another
/// pipeline's shard and back into its own (a reset, above every version there), opens at
/// the savepoint's values and offsets — after more checkpoints overwrote every key, and
/// after the savepoint and the source shard are deleted.
#[test]
fn a_restored_savepoint_opens_at_its_values_and_offsets_and_needs_nothing_it_came_from() {
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        for backend in ["lsm", "memory"] {
            let prefix = Path::from(format!("{backend}/state"));
            let lsm = LsmBackend::new(
                store.clone(),
                prefix.clone(),
                Arc::new(BlockCaches::none()),
                crate::state::lsm::tests::small_settings(),
                clock.clone(),
            );
            let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock.clone());
            let id = |pipeline: &str| ShardId {
                pipeline: pipeline.into(),
                partition: P3,
            };
            let source_root = id("t.a").root_under(&prefix);
            let saved_root = savepoint_shard_root(&Path::from(format!("{backend}/sp")), P3);
            // Round 1 (values 1) is saved; rounds 2 and 3 overwrite every key.
            let source = match backend {
                "lsm" => {
                    ConfiguredShard::Lsm(Box::new(lsm.open_shard(&id("t.a")).await.expect("opens")))
                }
                _ => ConfiguredShard::Memory(Box::new(
                    memory.open_shard(&id("t.a")).await.expect("opens"),
                )),
            };
            let taken =
                three_rounds_saving_the_first(&store, source, &source_root, &saved_root).await;
            let taken = taken.expect("a decided checkpoint to save");
            let next = BTreeMap::from([("in".to_owned(), Offset(60))]);
            assert_eq!(taken.offsets, next);
            assert!(taken.objects >= 1 && taken.bytes > 0, "{taken:?}");
            assert!(
                verify_shard(&store, &saved_root, true)
                    .await
                    .expect("reads")[0]
                    .restorable
            );
            // Nothing newer than what it saved: not yet.
            let newest = newest_decided(
                &ManifestStore::new(store.clone(), source_root.clone()),
                None,
            )
            .await
            .expect("reads")
            .expect("one")
            .version;
            assert!(
                capture_shard(&store, &source_root, &saved_root, P3, Some(newest), None)
                    .await
                    .expect("reads")
                    .is_none()
            );

            // Into another pipeline, then back into its own shard (a reset).
            let other_root = id("t.b").root_under(&prefix);
            let (first, reset) =
                restore_elsewhere_then_reset(&store, &saved_root, &other_root, &source_root).await;
            // The savepoint and then the source's older state go; both still open at 1.
            delete(&store, &Path::from(format!("{backend}/sp")))
                .await
                .expect("deletes");
            for (pipeline, version) in [("t.b", first), ("t.a", reset)] {
                let (values, recovered) =
                    values_and_offsets(&lsm, &memory, backend, &id(pipeline)).await;
                assert!(
                    values.iter().all(|v| *v == Some(1)),
                    "{backend} {pipeline}: {values:?}"
                );
                assert_eq!(recovered, Some(offsets(60)), "{backend} {pipeline}");
                let checks = verify_shard(&store, &id(pipeline).root_under(&prefix), true)
                    .await
                    .expect("reads");
                assert!(
                    checks.iter().any(|c| c.version == version && c.restorable),
                    "{checks:?}"
                );
            }
            // The source pipeline is deleted: the restored one does not need it.
            delete(&store, &source_root).await.expect("deletes");
            let reopened = lsm_or_memory_value(&lsm, &memory, backend, &id("t.b")).await;
            assert_eq!(reopened, Some(1), "{backend}");
        }
    });
}

/// Restores the savepoint shard at `saved_root` into another pipeline's shard (`other_root`,
/// at version 1) and then back into its source (`source_root`, a reset: above every version
/// there); returns both versions.
async fn restore_elsewhere_then_reset(
    store: &Arc<dyn ObjectStore>,
    saved_root: &Path,
    other_root: &Path,
    source_root: &Path,
) -> (u64, u64) {
    let (first, _) = restore_shard(store, saved_root, other_root, "restore")
        .await
        .expect("restores");
    assert_eq!(first, 1);
    let source_top = *ManifestStore::new(store.clone(), source_root.clone())
        .versions()
        .await
        .expect("lists")
        .last()
        .expect("versions");
    let (reset, _) = restore_shard(store, saved_root, source_root, "reset")
        .await
        .expect("resets");
    assert_eq!(reset, source_top.0 + 1, "checkpoint ids stay monotonic");
    (first.0, reset.0)
}

/// Three rounds of writes to every key of `source` (at `source_root`), each checkpointed; the
/// first checkpoint is captured into a savepoint shard at `saved_root`, which is returned.
async fn three_rounds_saving_the_first(
    store: &Arc<dyn ObjectStore>,
    source: ConfiguredShard,
    source_root: &Path,
    saved_root: &Path,
) -> Option<SavepointShard> {
    let mut taken = None;
    for round in 1..=3u32 {
        source
            .apply((0..60).map(|k| write(k, round)).collect())
            .await
            .expect("applies");
        source
            .checkpoint(&offsets(i64::from(round) * 60), DecidedBy::Manifest)
            .await
            .expect("checkpoints");
        if round == 1 {
            taken = capture_shard(store, source_root, saved_root, P3, None, None)
                .await
                .expect("captures");
        }
    }
    taken
}

/// The values of keys 0..60 of shard `id` opened on `backend`, and its recovered offsets.
async fn values_and_offsets(
    lsm: &LsmBackend,
    memory: &MemoryBackend,
    backend: &str,
    id: &ShardId,
) -> (Vec<Option<u32>>, Option<InputOffsets>) {
    let shard = match backend {
        "lsm" => ConfiguredShard::Lsm(Box::new(lsm.open_shard(id).await.expect("opens"))),
        _ => ConfiguredShard::Memory(Box::new(memory.open_shard(id).await.expect("opens"))),
    };
    let mut values = Vec::new();
    for k in 0..60 {
        values.push(value(&shard, k).await);
    }
    (values, shard.recovered_offsets().expect("decodes"))
}

async fn lsm_or_memory_value(
    lsm: &LsmBackend,
    memory: &MemoryBackend,
    backend: &str,
    id: &ShardId,
) -> Option<u32> {
    match backend {
        "lsm" => value(&lsm.open_shard(id).await.expect("opens"), 7).await,
        _ => value(&memory.open_shard(id).await.expect("opens"), 7).await,
    }
}

/// Two attempts to take one savepoint copy into data directories of their own: the one
/// that fails (and deletes what it copied) leaves the other's restorable.
/// A savepoint taken mid-switch: its descriptor says `lsm`, but a partition still holds the
/// `memory` checkpoint; the export's header names what the checkpoint is.
#[test]
fn an_export_names_the_backend_of_the_checkpoint_not_of_the_descriptor() {
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let prefix = Path::from("state");
        let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock.clone());
        let id = ShardId {
            pipeline: "t.a".into(),
            partition: Partition(0),
        };
        let shard = memory.open_shard(&id).await.expect("opens");
        let encoded = |k: u32| StateWrite {
            key: crate::state::key::value_key(format!("k{k}").as_bytes(), "count"),
            value: Some(Bytes::from("1")),
            expires_at_ms: None,
        };
        shard
            .apply((0..5).map(encoded).collect())
            .await
            .expect("applies");
        shard
            .checkpoint(&offsets(5), DecidedBy::Manifest)
            .await
            .expect("checkpoints");
        let dir = SavepointDir::new(&Path::from("sp/mid-switch"), "d0");
        capture_shard(
            &store,
            &id.root_under(&prefix),
            &dir.shard(Partition(0)),
            Partition(0),
            None,
            None,
        )
        .await
        .expect("captures")
        .expect("a decided checkpoint");
        export_shard(&store, &dir, ("lsm", Partition(0)), &clock)
            .await
            .expect("exports")
            .expect("a new export");
        let exported = store
            .get(&dir.export(Partition(0)))
            .await
            .expect("stored")
            .bytes()
            .await
            .expect("reads");
        let header: crate::checkpoints::export::ExportHeader = serde_json::from_slice(
            exported
                .split(|b| *b == b'\n')
                .next()
                .expect("a first line"),
        )
        .expect("a header");
        assert_eq!(header.source_backend, "memory");
    });
}

#[test]
fn a_failed_attempt_deletes_only_its_own_copies() {
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let prefix = Path::from("state");
        let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock);
        let id = ShardId {
            pipeline: "t.a".into(),
            partition: Partition(0),
        };
        let shard = memory.open_shard(&id).await.expect("opens");
        shard.apply(vec![write(1, 1)]).await.expect("applies");
        shard
            .checkpoint(&offsets(1), DecidedBy::Manifest)
            .await
            .expect("checkpoints");
        let root = savepoint_root(&Path::from("sp"), "race");
        let (winner, loser) = (
            SavepointDir::new(&root, "a1"),
            SavepointDir::new(&root, "a2"),
        );
        for dir in [&winner, &loser] {
            capture_shard(
                &store,
                &id.root_under(&prefix),
                &dir.shard(Partition(0)),
                Partition(0),
                None,
                None,
            )
            .await
            .expect("captures")
            .expect("a checkpoint");
        }
        delete(&store, &loser.data).await.expect("deletes");
        let checks = verify_shard(&store, &winner.shard(Partition(0)), true)
            .await
            .expect("reads");
        assert!(checks[0].restorable, "{checks:?}");
        assert!(
            verify_shard(&store, &loser.shard(Partition(0)), true)
                .await
                .expect("reads")
                .is_empty()
        );
    });
}

/// A transaction-decided checkpoint is saved only once a later version names it as its
/// parent or Kafka's committed offsets name it (its transaction committed); until then
/// the one before it is.
#[test]
fn an_undecided_transaction_checkpoint_is_not_saved() {
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let prefix = Path::from("state");
        let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock);
        let id = ShardId {
            pipeline: "t.a".into(),
            partition: Partition(0),
        };
        let root = id.root_under(&prefix);
        let shard = memory.open_shard(&id).await.expect("opens");
        let manifests = ManifestStore::new(store.clone(), root.clone());
        let mut versions = Vec::new();
        for round in 1..=2 {
            shard.apply(vec![write(1, round)]).await.expect("applies");
            let report = shard
                .checkpoint(&offsets(i64::from(round)), DecidedBy::Transaction)
                .await
                .expect("checkpoints")
                .expect("durable");
            versions.push(report.version);
            shard.checkpoint_decided(report.version);
        }
        let found = newest_decided(&manifests, None).await.expect("reads");
        assert_eq!(found.map(|m| m.version), Some(versions[0]));
        // Once Kafka's committed offsets name the newest, it is.
        let found = newest_decided(&manifests, Some(versions[1]))
            .await
            .expect("reads");
        assert_eq!(found.map(|m| m.version), Some(versions[1]));
    });
}

/// A reset of a pipeline of stages moves a restored shard's offsets from an old internal
/// topic onto the new one it seeded ([`with_offsets`]): the shard opens at the savepoint's
/// values with the new offsets, at the version above the restored one, on both backends.
#[test]
fn a_restored_checkpoint_with_its_offsets_moved_opens_at_its_values_and_the_new_offsets() {
    block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        for backend in ["lsm", "memory"] {
            let prefix = Path::from(format!("{backend}/state"));
            let lsm = LsmBackend::new(
                store.clone(),
                prefix.clone(),
                Arc::new(BlockCaches::none()),
                crate::state::lsm::tests::small_settings(),
                clock.clone(),
            );
            let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock.clone());
            let id = |pipeline: &str| ShardId {
                pipeline: pipeline.into(),
                partition: P3,
            };
            let source = match backend {
                "lsm" => {
                    ConfiguredShard::Lsm(Box::new(lsm.open_shard(&id("t.a")).await.expect("opens")))
                }
                _ => ConfiguredShard::Memory(Box::new(
                    memory.open_shard(&id("t.a")).await.expect("opens"),
                )),
            };
            let saved_root = savepoint_shard_root(&Path::from(format!("{backend}/sp")), P3);
            let source_root = id("t.a").root_under(&prefix);
            three_rounds_saving_the_first(&store, source, &source_root, &saved_root)
                .await
                .expect("a decided checkpoint to save");
            let target = id("t.b").root_under(&prefix);
            let (restored, _) = restore_shard(&store, &saved_root, &target, "reset")
                .await
                .expect("restores");
            let moved = with_offsets(&store, &target, restored, |offsets| {
                assert_eq!(offsets.remove("in"), Some(Offset(60)));
                offsets.insert("in.g1".to_owned(), Offset(7));
            })
            .await
            .expect("commits");
            assert_eq!(moved, ManifestVersion(restored.0 + 1));
            let (values, recovered) = values_and_offsets(&lsm, &memory, backend, &id("t.b")).await;
            assert!(
                values.iter().all(|v| *v == Some(1)),
                "{backend}: {values:?}"
            );
            let mut want = InputOffsets::new();
            want.advance("in.g1", Offset(6));
            assert_eq!(recovered, Some(want), "{backend}");
        }
    });
}
