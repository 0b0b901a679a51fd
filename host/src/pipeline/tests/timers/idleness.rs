//! Idleness and `idle_advance`: an idle co-partitioned topic stops holding the watermark back,
//! a shard held back by Weir (an outage, a stalled consumer, records waiting for room in
//! flight) never goes idle.

use super::*;

#[tokio::test(start_paused = true)]
async fn an_idle_co_partitioned_topic_stops_holding_the_watermark_after_idle_timeout() {
    let clock = ManualClock::new(T0);
    let (world, run, _) = configured_world(&clock, &[TOPIC, "other"], "at_least_once", |s| {
        s.pipeline.idle_timeout = Some(Duration::from_secs(5));
    })
    .await;
    world.send("k", "timer:event:t:100", 10);
    world.send("k", "v", 200);
    until("the records are processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2
    })
    .await;
    // The clock stands still: `other` is not idle yet and holds the watermark back.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        fired(&world.output).is_empty(),
        "held back by the silent topic"
    );
    // Five seconds later `other` is idle; `in` has a record again, so it is not. The timer
    // fires on what `in` allowed so far (200 - 1): due timers run before the new record.
    clock.advance_ms(5_000);
    world.send("k", "v", 210);
    until("the timer fires", || !fired(&world.output).is_empty()).await;
    assert_eq!(fired(&world.output)[0]["watermark"], 199);
    run.stop().await.expect("clean stop");
}

/// A pipeline whose silent shard's watermark follows the clock after 1 s (`idle_advance`),
/// once a record that set an event-time timer 5 s after `T0` (returned) is processed.
async fn idle_advancing_with_a_timer(clock: &ManualClock) -> (World, Run, Arc<Backend>, i64) {
    let (world, run, backend) = configured_world(clock, &[TOPIC], "at_least_once", |s| {
        s.pipeline.idle_timeout = Some(Duration::from_secs(1));
        s.pipeline.idle_advance = true;
    })
    .await;
    let at = T0 as i64 + 5_000;
    world.send("k", &format!("timer:event:t:{at}"), T0 as i64);
    until("the record is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 1
    })
    .await;
    (world, run, backend, at)
}

#[tokio::test(start_paused = true)]
async fn a_shard_held_back_by_a_state_outage_never_goes_idle() {
    let clock = ManualClock::new(T0);
    let (world, run, backend, at) = idle_advancing_with_a_timer(&clock).await;
    backend.set_unavailable(0, true);
    world.send("k", "v", T0 as i64);
    until("the record backs off", || {
        run.stats.outage_retries.load(Ordering::Relaxed) >= 1
    })
    .await;
    clock.advance_ms(10_000);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        fired(&world.output).is_empty(),
        "a shard held back is not idle: its watermark stays"
    );
    backend.set_unavailable(0, false);
    until("the held record is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2
    })
    .await;
    assert!(fired(&world.output).is_empty(), "idle only from now on");
    clock.advance_ms(2_000);
    until("the silent shard's watermark follows the clock", || {
        !fired(&world.output).is_empty()
    })
    .await;
    let watermark = fired(&world.output)[0]["watermark"]
        .as_i64()
        .expect("a watermark");
    assert!(watermark >= at, "{watermark}");
    run.stop().await.expect("clean stop");
}

/// Records received by the worker and waiting for room in flight (behind slow state reads)
/// are Weir's to process, not a silent input: the shard does not go idle meanwhile, and
/// `idle_advance` does not turn them into late records. Before, only records still in the
/// queue counted, and a timers crash loop's final run found hours of flights late. (This test
/// also caught a worker that looped without yielding when a checkpoint fell due just after a
/// round started beside records: the round never finished.)
#[tokio::test(start_paused = true)]
async fn records_waiting_for_room_in_flight_keep_the_shard_from_going_idle() {
    let clock = ManualClock::new(T0);
    let (world, run) = slow_world(&clock, Duration::from_secs(1), |s| {
        s.pipeline.idle_timeout = Some(Duration::from_secs(1));
        s.pipeline.idle_advance = true;
        s.pipeline.in_flight_max = 1;
    })
    .await;
    let at = T0 as i64 + 5_000;
    world.send("k", &format!("timer:event:t:{at}"), T0 as i64);
    for i in 1..5 {
        world.send("k", "v", T0 as i64 + i);
    }
    until("the first record is admitted", || {
        run.stats.records_in.load(Ordering::Relaxed) >= 1
    })
    .await;
    // The others wait for room behind its state read while the clock passes `idle_timeout`.
    clock.advance_ms(10_000);
    until("every record is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 5
    })
    .await;
    assert_eq!(
        run.stats.late_records[LateRecords::Process.index()].load(Ordering::Relaxed),
        0,
        "no record was late"
    );
    assert!(
        fired(&world.output).is_empty(),
        "not idle while they waited"
    );
    clock.advance_ms(2_000);
    until(
        "idle once they are done: the watermark follows the clock",
        || !fired(&world.output).is_empty(),
    )
    .await;
    run.stop().await.expect("clean stop");
}

/// A consumer that stalls with records still before the partition's end (a slow broker, a busy
/// host) leaves the shard silent but not idle: `idle_advance` waits until it has caught up.
/// Before, a 2 s stall on a loaded machine closed every hour of a replay at once.
#[tokio::test(start_paused = true)]
async fn idle_advance_waits_for_a_stalled_consumer_to_catch_up() {
    let clock = ManualClock::new(T0);
    let (world, run, _, at) = idle_advancing_with_a_timer(&clock).await;
    world.handle.stall(0, true);
    world.send("k", "v", T0 as i64);
    clock.advance_ms(10_000);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        fired(&world.output).is_empty(),
        "a record waits before the partition's end: silent, not idle"
    );
    world.handle.stall(0, false);
    until("the waiting record is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2
    })
    .await;
    clock.advance_ms(2_000);
    until(
        "caught up and idle, the watermark follows the clock",
        || !fired(&world.output).is_empty(),
    )
    .await;
    let watermark = fired(&world.output)[0]["watermark"]
        .as_i64()
        .expect("a watermark");
    assert!(watermark >= at, "{watermark}");
    run.stop().await.expect("clean stop");
}
