//! Stalls: a sink whose deliveries are refused, a state outage. Each pauses only its own
//! partition, and a revoke ends its retries.

use super::*;
use crate::ids::Partition;

#[tokio::test(start_paused = true)]
async fn a_stalled_sink_pauses_only_its_own_partition() {
    let world = World::new(2, 1000, "at_least_once");
    let (handle, output) = (&world.handle, &world.output);
    let run = world.start_refusing_partition_0().await;
    assert!(!handle.paused().contains(&1), "the other partition runs on");
    assert_eq!(
        outputs_of(output, 0),
        0,
        "nothing of partition 0 was delivered"
    );
    assert!(
        handle.position(TOPIC, 0) < 1000,
        "partition 0 stopped fetching while its sink refused deliveries"
    );
    output.refuse(0, false);
    until("partition 0 is done", || outputs_of(output, 0) == 1000).await;
    until("partition 0 is resumed", || handle.paused().is_empty()).await;
    run.stop().await.expect("clean stop");
    assert_eq!(run_count(output, 0), 1000);
    assert_counts_exact(handle, output, 0);
}

#[tokio::test(start_paused = true)]
async fn a_revoke_ends_the_retries_of_a_sink_whose_deliveries_are_refused() {
    let world = World::new(2, 1000, "at_least_once");
    let (handle, output) = (&world.handle, &world.output);
    let run = world.start_refusing_partition_0().await;
    // The sink retries for as long as the partition is assigned here; the revoke ends that,
    // and the worker closes without a checkpoint of what its sink could not deliver.
    handle.revoke(&[0]);
    until("partition 0's shard is closed", || {
        run.stats.shards_closed.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!(
        outputs_of(output, 0),
        0,
        "nothing of partition 0 was delivered"
    );
    assert!(
        !run.stats
            .checkpoint_history
            .lock()
            .expect("history")
            .iter()
            .any(|c| c.partition == Partition(0) && c.offsets.get(TOPIC).is_some_and(|o| o.0 > 0)),
        "no checkpoint of partition 0 covers records whose outputs were refused"
    );
    run.stop().await.expect("clean stop");
    assert_counts_exact(handle, output, 1);
}

#[tokio::test(start_paused = true)]
async fn a_state_outage_backs_off_pausing_only_its_partition_and_loses_nothing() {
    let world = World::new(2, 300, "at_least_once");
    let (handle, output) = (&world.handle, &world.output);
    let (run, backend) = world.start(ReadDelay::Fixed(Duration::ZERO)).await;
    backend.set_unavailable(0, true);
    handle.assign(&[0, 1]);
    until("partition 1 is done", || outputs_of(output, 1) == 300).await;
    until("partition 0 is paused", || handle.paused().contains(&0)).await;
    // Thirty seconds of outage: each waiting batch retries with a backoff (100 ms doubling to
    // 5 s), a dozen times each, instead of every 100 ms.
    let before = run.stats.outage_retries.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let retries = run.stats.outage_retries.load(Ordering::Relaxed) - before;
    assert!(
        (1..=60).contains(&retries),
        "30 s of outage retried {retries} times; backing off, a few batches retry a dozen times each"
    );
    assert_eq!(outputs_of(output, 0), 0);
    assert!(!handle.paused().contains(&1));
    backend.set_unavailable(0, false);
    until("partition 0 is done", || outputs_of(output, 0) == 300).await;
    run.stop().await.expect("clean stop");
    assert_eq!(run_count(output, 0), 300, "nothing lost, nothing twice");
    assert_counts_exact(handle, output, 0);
}

/// The last checkpoint of `partition` in `stats`' history: its offset of [`TOPIC`].
fn last_checkpointed(stats: &PipelineStats, partition: i32) -> Option<i64> {
    stats
        .checkpoint_history
        .lock()
        .expect("history")
        .iter()
        .rev()
        .find(|c| c.partition == Partition(partition))
        .map(|c| c.offsets[TOPIC].0)
}

#[tokio::test(start_paused = true)]
async fn a_drain_during_a_state_outage_ends_at_once_without_the_last_checkpoint() {
    let world = World::new(2, 1000, "at_least_once");
    let handle = &world.handle;
    let (run, _backend) = world.start_holding_partition_0_in_an_outage(&[0, 1]).await;
    // Long enough for the backoff to reach its longest step.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let checkpointed = last_checkpointed(&run.stats, 0).expect("a checkpoint before the outage");
    let stats = run.stats.clone();
    // Each waiting batch is tried once more at once, fails, and the worker ends: no backoff
    // step is waited out, nor `shutdown_drain_max`.
    tokio::time::timeout(Duration::from_millis(100), run.stop())
        .await
        .expect("the drain does not wait for the outage")
        .expect("the drain ends cleanly");
    assert_eq!(
        stats.closed_without_checkpoint.load(Ordering::Relaxed),
        1,
        "partition 0 ended without its last checkpoint"
    );
    assert_eq!(
        last_checkpointed(&stats, 0),
        Some(checkpointed),
        "no checkpoint of partition 0 covers records whose effects are not applied"
    );
    assert_eq!(
        handle.committed()[&(TOPIC.to_owned(), 0)].0,
        checkpointed,
        "the group's offset is the last checkpoint's"
    );
    assert_eq!(
        last_checkpointed(&stats, 1),
        Some(1000),
        "the other partition took its last checkpoint"
    );
}

#[tokio::test(start_paused = true)]
async fn a_revoke_cuts_a_backoff_short_and_closes_the_shard_with_its_last_checkpoint() {
    let world = World::new(2, 1000, "at_least_once");
    let (handle, output) = (&world.handle, &world.output);
    let (run, backend) = world.start_holding_partition_0_in_an_outage(&[0, 1]).await;
    // The backoff reaches its longest step (5 s); the outage ends during one, and the
    // partition is revoked.
    tokio::time::sleep(Duration::from_secs(20)).await;
    backend.set_unavailable(0, false);
    handle.revoke(&[0]);
    // The waiting batches run at once rather than at the end of their step, then the last
    // checkpoint.
    tokio::time::timeout(
        Duration::from_millis(100),
        until("partition 0's shard is closed", || {
            run.stats.shards_closed.load(Ordering::Relaxed) == 1
        }),
    )
    .await
    .expect("the revoke does not wait out the backoff");
    assert_eq!(
        run.stats.closed_without_checkpoint.load(Ordering::Relaxed),
        0
    );
    let checkpointed = last_checkpointed(&run.stats, 0).expect("the revoke's checkpoint");
    assert_eq!(
        outputs_per_offset(output, 0).len() as i64,
        checkpointed,
        "the revoke's checkpoint covers every record that ran"
    );
    // Assigned back, it resumes from that checkpoint: every record once, counts exact.
    handle.assign(&[0]);
    until("partition 0 is done", || outputs_of(output, 0) >= 1000).await;
    run.stop().await.expect("clean stop");
    assert_eq!(
        run_count(output, 0),
        1000,
        "every record of partition 0 once"
    );
    assert_counts_exact(handle, output, 0);
}
