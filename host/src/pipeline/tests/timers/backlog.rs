//! Timers in bulk: a backlog of due timers against checkpoints (interleaved rounds), and the
//! count of pending timers across restarts.

use super::*;
use crate::ids::{Offset, Partition};

/// A backlog of due timers (every timer of 5,000 keys due at once, fired 16 per round) and a
/// checkpoint asked for while it fires: the checkpoint is taken after at most one more round,
/// not after the backlog. Asserted on what the checkpoint's commit published, not on time.
#[tokio::test(start_paused = true)]
async fn a_backlog_of_due_timers_delays_a_checkpoint_by_at_most_one_round() {
    const KEYS: usize = 5_000;
    const ROUND: u64 = 16;
    let clock = ManualClock::new(T0);
    let (world, run, _) = configured_world(&clock, &[TOPIC], "exactly_once", |s| {
        s.runtime.timer_batch_max = ROUND as usize;
        s.pipeline.checkpoint_interval = Duration::from_secs(60);
    })
    .await;
    for i in 0..KEYS {
        world.send(&format!("k{i}"), "timer:event:t:100", 1);
    }
    until("the timers are set", || {
        run.stats.records_ok.load(Ordering::Relaxed) == KEYS as u64
    })
    .await;
    world.send("x", "v", 1_000); // the watermark (999) passes every timer
    let fired = || run.stats.timers_fired.load(Ordering::Relaxed);
    while fired() < ROUND {
        tokio::task::yield_now().await;
    }
    let commits_before = world.output.log().commits.len();
    let fired_at_request = fired();
    run.requests.send_modify(|r| *r += 1);
    until("the backlog is fired", || fired() == KEYS as u64).await;
    run.stop().await.expect("clean stop");
    let log = world.output.log();
    // The timers' outputs the checkpoint published (the records' are not counted): those
    // fired when it was asked for, and at most the round then running.
    let published = log.outputs[..log.committed_outputs[commits_before]]
        .iter()
        .filter(|w| w.value.starts_with(b"{\"fired\""))
        .count() as u64;
    assert!(
        published <= fired_at_request + ROUND,
        "the checkpoint asked for after {fired_at_request} timers fired published {published} \
         timers' outputs: it waited for more than one round"
    );
    assert!(
        published < KEYS as u64,
        "it was taken in the middle of the backlog"
    );
    let fired_outputs = log
        .outputs
        .iter()
        .filter(|w| w.value.starts_with(b"{\"fired\""))
        .count();
    assert_eq!(fired_outputs, KEYS, "every timer fired once");
}

/// The timers pending in partition 0's shard, as its progress last recorded them.
fn timers_pending(stats: &PipelineStats) -> Option<u64> {
    stats
        .partitions
        .lock()
        .expect("progress lock")
        .get(&Partition(0))
        .and_then(|p| p.timers_pending)
}

/// The count of pending timers follows timers set, moved, cleared and fired, and a new run
/// starts from the count its checkpoint kept.
#[tokio::test(start_paused = true)]
async fn the_pending_timer_count_follows_sets_moves_clears_and_firings_across_a_restart() {
    let clock = ManualClock::new(T0);
    let (world, run) = timed_world(&clock, "at_least_once").await;
    world.send("a", "timer:event:t:100", 1);
    world.send("b", "timer:event:t:100", 1);
    world.send("b", "timer:event:t:200", 1); // moved
    world.send("c", "timer:event:t:5000", 1);
    world.send("c", "timer:clear:t", 1);
    world.send("d", "timer:event:t:5000", 1);
    world.send("d", "timer:clear:none", 1); // no such timer
    until("the records are processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 7
    })
    .await;
    run.requests.send_modify(|r| *r += 1);
    until("a checkpoint", || {
        run.stats.checkpoints.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert_eq!(timers_pending(&run.stats), Some(3), "a, b and d");
    run.stop().await.expect("clean stop");

    let (run, _) = world.start_timed(&clock).await;
    world.handle.assign(&[0]);
    world.send("e", "v", 1_000); // the watermark (999) passes a and b
    until("a and b fire", || {
        run.stats.timers_fired.load(Ordering::Relaxed) == 2
    })
    .await;
    run.requests.send_modify(|r| *r += 1);
    until("a checkpoint", || {
        run.stats.checkpoints.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert_eq!(timers_pending(&run.stats), Some(1), "d");
    run.stop().await.expect("clean stop");
}

/// A million timers due at once — restored from a checkpoint that keeps no count of them, the
/// watermark then passing all — and a checkpoint asked for while they fire, in rounds of 512:
/// the checkpoint is taken after at most one more round, not after the backlog (asserted on
/// what its commit published, not on time); the stop does not wait for the backlog either,
/// and the timers not fired are counted as pending.
#[tokio::test(start_paused = true)]
async fn a_million_due_timers_delay_a_checkpoint_by_at_most_one_round() {
    const TIMERS: u64 = 1_000_000;
    const ROUND: u64 = 512;
    let clock = ManualClock::new(T0);
    let world = World::empty(&[TOPIC], "exactly_once");
    // Partition 0's first record, and a checkpoint after it holding the timers (no per-key
    // entries: firing does not read them), decided by the transaction that committed it.
    world.send("x", "v", 1);
    let shared: SharedClock = Arc::new(clock.clone());
    let seeded = MemoryBackend::durable(world.store.clone(), "weir".into(), shared)
        .open_shard(&ShardId {
            pipeline: "counter".to_owned(),
            partition: Partition(0),
        })
        .await
        .expect("opens");
    let writes = (0..TIMERS)
        .map(|i| crate::state::StateWrite {
            key: crate::time::keys::time_index(
                crate::runtime::TimeDomain::EventTime,
                100,
                format!("k{i}").as_bytes(),
                "t",
            ),
            value: Some(bytes::Bytes::new()),
            expires_at_ms: None,
        })
        .collect();
    seeded.apply(writes).await.expect("applies");
    let mut offsets = crate::state::checkpoint::InputOffsets::new();
    offsets.advance(TOPIC, Offset(0));
    let report = seeded
        .checkpoint(&offsets, crate::state::checkpoint::DecidedBy::Transaction)
        .await
        .expect("checkpoints")
        .expect("a durable backend");
    world.handle.commit_transaction(0, &offsets, report.version);
    drop(seeded);

    let (run, _) = world
        .start_configured(&clock, |s| {
            s.runtime.timer_batch_max = ROUND as usize;
            s.pipeline.checkpoint_interval = Duration::from_secs(3600);
        })
        .await;
    world.handle.assign(&[0]);
    world.send("x", "v", 1_000); // the watermark (999) passes every timer
    let stats = run.stats.clone();
    let fired = || stats.timers_fired.load(Ordering::Relaxed);
    // The backlog never lets paused time move on its own: move it (the open's and the
    // loop's waits) and look between the worker's steps.
    while fired() < ROUND {
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    let commits_before = world.output.log().commits.len();
    let fired_at_request = fired();
    run.requests.send_modify(|r| *r += 1);
    while world.output.log().commits.len() == commits_before {
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    run.stop().await.expect("clean stop");
    let log = world.output.log();
    // The outputs then: the record's at offset 1 and one per timer fired.
    let published = log.committed_outputs[commits_before] as u64;
    assert!(
        published <= 1 + fired_at_request + ROUND,
        "the checkpoint asked for after {fired_at_request} timers fired published {published} \
         outputs: it waited for more than one round"
    );
    let fired_outputs = log
        .outputs
        .iter()
        .filter(|w| w.value.starts_with(b"{\"fired\""))
        .count() as u64;
    assert_eq!(fired_outputs, fired(), "each fired timer emitted once");
    assert!(
        fired() < TIMERS / 2,
        "the stop waited for the backlog: {} fired",
        fired()
    );
    assert_eq!(
        timers_pending(&stats),
        Some(TIMERS - fired()),
        "counted once by a scan, then followed"
    );
}
