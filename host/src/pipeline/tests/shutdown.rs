//! The pipeline's shutdown and revokes: what it commits, how it takes a worker that ends on
//! its own while it is handed the last records, and what it reports after a revoke.

use super::*;
use crate::ids::Partition;

#[tokio::test(start_paused = true)]
async fn a_revoke_just_before_shutdown_commits_nothing_of_the_revoked_partition() {
    let world = World::new(2, 1000, "at_least_once");
    let handle = &world.handle;
    let (run, _) = world
        .start(ReadDelay::Fixed(Duration::from_millis(10)))
        .await;
    handle.assign(&[0, 1]);
    until("a checkpoint of each partition", || {
        run.stats.checkpoints.load(Ordering::Relaxed) >= 2
    })
    .await;
    // The revoke reaches the source, and the shutdown comes before the loop took it in.
    handle.revoke(&[0]);
    run.stop().await.expect("clean stop");
    // Partition 0's next owner commits what it recovers: a late commit of this host could
    // move the group backwards (SCENARIOS.md S1).
    let commits = handle.commits();
    let (last, _) = commits
        .iter()
        .rev()
        .find(|(_, wait)| *wait)
        .expect("shutdown commits synchronously");
    assert!(
        last.keys().all(|(_, partition)| *partition == Partition(1)),
        "the shutdown's commit names only partition 1: {last:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_partition_assigned_back_just_before_shutdown_commits_its_last_checkpoint() {
    let world = World::new(2, 1000, "at_least_once");
    let handle = &world.handle;
    let mut settings = settings("at_least_once");
    // No checkpoint on the interval: only the revoke's and the shutdown's commit the records.
    settings.pipeline.checkpoint_interval = Duration::from_secs(3600);
    let (run, _) = start(
        settings,
        world.source.clone(),
        world.output.clone(),
        world.store.clone(),
        ReadDelay::Fixed(Duration::from_millis(10)),
    )
    .await;
    handle.assign(&[0, 1]);
    until("every record processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2000
    })
    .await;
    // An eager rebalance gives partition 0 back to this host (revoked, then assigned), and the
    // shutdown comes before the loop took either in: the revoked worker's last checkpoint
    // reaches the group only through this host's reopen (SCENARIOS.md S17).
    handle.revoke(&[0]);
    handle.assign(&[0]);
    run.stop().await.expect("clean stop");
    let committed: BTreeMap<i32, i64> = handle
        .committed()
        .into_iter()
        .map(|((_, partition), (next, _))| (partition, next))
        .collect();
    assert_eq!(
        committed,
        BTreeMap::from([(0, 1000), (1, 1000)]),
        "after the clean stop the group's lag is 0"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_fenced_while_the_shutdown_hands_it_records_lets_the_shutdown_end_cleanly() {
    let world = World::new(1, 1000, "at_least_once");
    let handle = &world.handle;
    // A state outage holds partition 0's records. Meanwhile another host claims the shard
    // (its session outlived ours).
    let (run, backend) = world.start_holding_partition_0_in_an_outage(&[0]).await;
    let clock: SharedClock = Arc::new(SystemClock);
    let next_owner = MemoryBackend::durable(world.store.clone(), "weir".into(), clock)
        .open_shard(&ShardId {
            pipeline: "counter".to_owned(),
            partition: Partition(0),
        })
        .await
        .expect("the next owner claims the shard");
    // The shutdown starts handing the held records over and waits for room (a paused
    // partition's loop wakes every few milliseconds: 1 s of paused time is plenty). Then the
    // outage ends, and the worker's next checkpoint is refused: it ends with its queue.
    run.stop.send(()).expect("the run is running");
    tokio::time::sleep(Duration::from_secs(1)).await;
    backend.set_unavailable(0, false);
    run.task
        .await
        .expect("the run does not panic")
        .expect("a fenced worker ends its partition, not the shutdown");
    // The shutdown commits what was decided before the claim: where the next owner resumes.
    let recovered = next_owner
        .recovered_offsets()
        .expect("offsets")
        .expect("the next owner opened a checkpoint");
    let (committed, _) = handle.committed()[&(TOPIC.to_owned(), 0)].clone();
    assert_eq!(Some(committed), recovered.next(TOPIC).map(|p| p.0));
}

#[tokio::test(start_paused = true)]
async fn a_partition_revoked_after_its_worker_was_fenced_is_no_longer_reported() {
    let world = World::new(1, 1000, "at_least_once");
    // A state outage holds partition 0's records; another host claims the shard meanwhile,
    // and when the outage ends the worker's checkpoint is refused: the worker ends, fenced.
    let (run, backend) = world.start_holding_partition_0_in_an_outage(&[0]).await;
    let clock: SharedClock = Arc::new(SystemClock);
    let _next_owner = MemoryBackend::durable(world.store.clone(), "weir".into(), clock)
        .open_shard(&ShardId {
            pipeline: "counter".to_owned(),
            partition: Partition(0),
        })
        .await
        .expect("the next owner claims the shard");
    backend.set_unavailable(0, false);
    until("the worker's checkpoint is fenced", || {
        run.stats.checkpoints_fenced.load(Ordering::Relaxed) >= 1
    })
    .await;
    // (Paused time: this sleep ends once every task waits, the loop having taken the
    // worker's end in.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Then the group revokes the partition (our session expired): no worker of it is left
    // to close, and the host must stop naming it in its reports (the soak saw a partition
    // reported by two hosts for minutes).
    world.handle.revoke(&[0]);
    until("partition 0 is no longer reported here", || {
        !run.stats
            .partitions
            .lock()
            .expect("progress lock")
            .contains_key(&Partition(0))
    })
    .await;
    run.stop.send(()).expect("the run is running");
    run.task
        .await
        .expect("the run does not panic")
        .expect("a clean stop");
}
