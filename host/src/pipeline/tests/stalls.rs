//! Stalls: a sink whose deliveries are refused, a state outage. Each pauses only its own
//! partition, and a revoke ends its retries.

use super::*;

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
            .any(|c| c.partition == 0 && c.offsets.get(TOPIC).is_some_and(|o| *o > 0)),
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
