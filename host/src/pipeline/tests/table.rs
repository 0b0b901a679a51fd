//! An Iceberg table whose commits lag (docs/iceberg.md): once a shard's pending list holds
//! `pending_checkpoints_max` checkpoints, its partition takes no more input; once the table
//! has them, it goes on and loses nothing. In real time: the SQLite catalog's calls run on
//! blocking threads, which paused time would jump past.

use super::*;
use crate::clock::SharedClock;
use crate::ids::Partition;
use crate::sink::iceberg::{
    ColumnSpec, ColumnType, Committer, Lakehouse, LakehouseSettings, TableOutput, TableSchema,
    TableTarget,
};
use crate::state::lsm::cache::BlockCaches;

/// `n` more records of partition 0 after the `from` already there (keys `k0`…`k19`).
fn produce(handle: &MemorySourceHandle, from: usize, n: usize) {
    for i in from..from + n {
        let key = format!("k{}", i % 20);
        handle.produce(TOPIC, 0, key.as_bytes(), b"v", i as i64);
    }
}

/// A pipeline over one partition (the `counter` guest) whose table's commits are the test's,
/// and what it has done once held.
struct Held {
    _dir: tempfile::TempDir,
    world: World,
    run: Run,
    committer: Committer,
    /// Records done when the partition paused.
    held_at: u64,
    /// Records produced: 220.
    produced: u64,
}

/// The table `counts` of tenant `t1` in a SQLite catalog under `dir`, at most two checkpoints
/// pending, and its committer, whose passes are the test's (an hour apart).
async fn table_target(
    world: &World,
    dir: &tempfile::TempDir,
    settings: &Settings,
    clock: &SharedClock,
) -> (Committer, TableTarget) {
    let lakehouse = Lakehouse::open(&LakehouseSettings {
        catalog_uri: Some(format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("catalog.db").display()
        )),
        warehouse: Some(format!("file://{}", dir.path().join("warehouse").display())),
        // The running committer makes its first pass only: commits here are the test's.
        commit_interval: Duration::from_secs(3600),
        pending_checkpoints_max: 2,
        ..LakehouseSettings::default()
    })
    .await
    .expect("the catalog opens");
    let column = |name: &str| ColumnSpec {
        name: name.into(),
        kind: ColumnType::Long,
        required: true,
    };
    let schema = TableSchema::new(&[column("count"), column("offset")]).expect("a schema");
    let committer = Committer {
        lakehouse: lakehouse.clone(),
        ident: Lakehouse::ident("t1", "counts"),
        uid: "u1".into(),
        store: world.store.clone(),
        shards: ShardId {
            pipeline: settings.pipeline.name.clone(),
            partition: Partition(0),
        }
        .shards_under(&"weir".into()),
        interval: Duration::from_secs(3600),
        clock: clock.clone(),
        group: None,
        orphan_grace: Duration::from_secs(3600),
    };
    let target = TableTarget {
        committer: committer.clone(),
        lakehouse: lakehouse.clone(),
        tenant: "t1".into(),
        table: "counts".into(),
        schema: Arc::new(schema),
        uid: "u1".into(),
        to_topic: true,
    };
    (committer, target)
}

/// Runs [`Held`]'s pipeline until its partition is held: two checkpoints' files wait for a
/// commit (the bound, `pending_checkpoints_max = 2`), 200 more records are queued and the
/// partition is paused.
async fn held() -> Held {
    let world = World::new(1, 0, "at_least_once");
    let dir = tempfile::tempdir().expect("temp dir");
    let settings = settings("at_least_once");
    let clock: SharedClock = Arc::new(SystemClock);
    let (committer, target) = table_target(&world, &dir, &settings, &clock).await;
    let output = TableOutput::new(world.output.clone(), Some(target));
    let (run, _) = start_with(
        settings,
        (world.source.clone(), output, world.store.clone()),
        ReadDelay::Fixed(Duration::ZERO),
        "weir_test_counter",
        clock,
    )
    .await;
    world.handle.assign(&[0]);

    // Two checkpoints with rows and no commit: the list is full. (The first ten records may
    // already be split over two checkpoints; then the next ten wait.)
    produce(&world.handle, 0, 10);
    until("the first records are checkpointed", || {
        run.stats.records_done() == 10 && run.stats.checkpoints.load(Ordering::Relaxed) >= 1
    })
    .await;
    produce(&world.handle, 10, 10);
    until("two checkpoints hold rows", || {
        run.stats.checkpoints.load(Ordering::Relaxed) >= 2
    })
    .await;
    // More input: none of it is taken, and the partition pauses once its queue is full.
    produce(&world.handle, 20, 200);
    let produced = 220;
    until("partition 0 is paused", || {
        world.handle.paused().contains(&0)
    })
    .await;
    let held_at = run.stats.records_done();
    Held {
        _dir: dir,
        world,
        run,
        committer,
        held_at,
        produced,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_table_commits_lag_takes_no_more_input_until_they_land() {
    let Held {
        _dir,
        world,
        run,
        committer,
        held_at,
        produced,
    } = held().await;
    assert!(held_at <= 20, "no record past the bound: {held_at}");
    let checkpoints = run.stats.checkpoints.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(600)).await; // three intervals, held
    assert_eq!(run.stats.records_done(), held_at, "still held");
    assert_eq!(
        run.stats.checkpoints.load(Ordering::Relaxed),
        checkpoints,
        "looking at the table writes nothing while nothing changes"
    );

    // The table takes the two checkpoints: the partition goes on, and every record is done.
    let caches = Arc::new(BlockCaches::none());
    let report = committer
        .commit_once(&caches, false)
        .await
        .expect("the commit lands");
    assert_eq!(report.rows, held_at, "{report:?}");
    until("every record is done", || {
        run.stats.records_done() == produced
    })
    .await;
    until("partition 0 is resumed", || {
        world.handle.paused().is_empty()
    })
    .await;
    run.stop().await.expect("clean stop");
    assert_eq!(
        outputs_of(&world.output, 0) as u64,
        produced,
        "each record once"
    );
    assert_counts_exact(&world.handle, &world.output, 0);
}

/// A held partition that is revoked closes (its queued records dropped, unprocessed), as any
/// other: before, a held worker never looked at its revocation and lingered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_partition_that_is_revoked_closes() {
    let Held {
        _dir,
        world,
        run,
        held_at,
        ..
    } = held().await;
    world.handle.revoke(&[0]);
    until("partition 0's shard is closed", || {
        run.stats.shards_closed.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!(
        run.stats.records_done(),
        held_at,
        "nothing more was processed"
    );
    run.stop().await.expect("clean stop");
}

/// A held partition hears the shutdown outside its queue (which it does not read while held):
/// the drain takes nothing more from it and ends cleanly, rather than waiting out
/// `shutdown_drain_max` for a worker that never looked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_partition_lets_the_drain_end_at_once() {
    let Held {
        _dir, run, held_at, ..
    } = held().await;
    let stats = run.stats.clone();
    run.stop()
        .await
        .expect("the drain ends cleanly, not timed out");
    assert_eq!(stats.records_done(), held_at, "nothing more was processed");
    assert_eq!(
        stats.closed_without_checkpoint.load(Ordering::Relaxed),
        0,
        "nothing was in flight: the state and its offsets agree, and the last checkpoint is taken"
    );
}
