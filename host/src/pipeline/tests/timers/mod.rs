//! Timers and watermarks through the whole pipeline (docs/time.md): the counter guest's timer
//! commands (`timer:event:NAME:AT`, `timer:processing:NAME:AT`, `timer:clear:NAME`) and the
//! `{"fired": …}` outputs of its `on_timer`, over the in-memory source and output in paused
//! time, with processing time from a manual clock.

use super::*;
use crate::clock::ManualClock;
use crate::config::LateRecords;
use crate::ids::Partition;
use crate::pipeline::ports::DeadLetterKind;

mod backlog;
mod edges;
mod idleness;
mod markers;

/// Epoch of the manual clock, ms.
const T0: u64 = 1_700_000_000_000;

/// The fired-timer outputs of partition 0, in output order, as JSON.
fn fired(output: &MemoryOutput) -> Vec<serde_json::Value> {
    output
        .log()
        .outputs
        .iter()
        .filter(|w| w.partition == Partition(0))
        .map(|w| serde_json::from_slice::<serde_json::Value>(&w.value).expect("counter JSON"))
        .filter(|v| v.get("fired").is_some())
        .collect()
}

/// A one-partition world with nothing in it yet, and a pipeline over it with processing time
/// from `clock`, partition 0 assigned.
async fn timed_world(clock: &ManualClock, delivery: &'static str) -> (World, Run) {
    let (world, run, _) = configured_world(clock, &[TOPIC], delivery, |_| {}).await;
    (world, run)
}

/// A one-partition world over `topics` (co-partitioned) with `delivery`, and a pipeline over
/// it whose settings `configure` changes, processing time from `clock`, partition 0 assigned.
async fn configured_world(
    clock: &ManualClock,
    topics: &[&str],
    delivery: &'static str,
    configure: impl FnOnce(&mut Settings),
) -> (World, Run, Arc<Backend>) {
    let world = World::empty(topics, delivery);
    let (run, backend) = world
        .start_configured(clock, |s| {
            s.pipeline.input_topics = topics.iter().map(|t| (*t).to_owned()).collect();
            configure(s);
        })
        .await;
    world.handle.assign(&[0]);
    (world, run, backend)
}

impl World {
    /// A world of one partition over `topics` (co-partitioned) with nothing in it yet.
    fn empty(topics: &[&str], delivery: &'static str) -> Self {
        let (source, handle) = MemorySource::new(topics);
        World {
            source,
            output: MemoryOutput::new(1 << 20, Some(handle.clone())),
            handle,
            store: Arc::new(InMemory::new()),
            delivery,
        }
    }

    /// A pipeline over this world (again, after a restart), processing time from `clock`.
    async fn start_timed(&self, clock: &ManualClock) -> (Run, Arc<Backend>) {
        self.start_configured(clock, |_| {}).await
    }

    /// As [`Self::start_timed`], with settings `configure` changes.
    async fn start_configured(
        &self,
        clock: &ManualClock,
        configure: impl FnOnce(&mut Settings),
    ) -> (Run, Arc<Backend>) {
        let mut settings = settings(self.delivery);
        configure(&mut settings);
        start_with(
            settings,
            (self.source.clone(), self.output.clone(), self.store.clone()),
            ReadDelay::Fixed(Duration::ZERO),
            "weir_test_counter",
            Arc::new(clock.clone()),
        )
        .await
    }

    fn send(&self, key: &str, value: &str, timestamp_ms: i64) {
        self.handle
            .produce(TOPIC, 0, key.as_bytes(), value.as_bytes(), timestamp_ms);
    }
}

#[tokio::test(start_paused = true)]
async fn a_processing_time_timer_fires_on_a_stream_gone_silent() {
    let clock = ManualClock::new(T0);
    let (world, run) = timed_world(&clock, "at_least_once").await;
    world.send("k", "v", 1);
    world.send("k", &format!("timer:processing:wake:{}", T0 + 60_000), 2);
    until("the records are processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2
    })
    .await;
    // No record arrives any more; a minute of paused time passes without the clock moving.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(fired(&world.output).is_empty(), "not due before its time");
    clock.advance_ms(60_000);
    until("the timer fires", || !fired(&world.output).is_empty()).await;
    let fired = fired(&world.output);
    assert_eq!(fired.len(), 1, "fires once: {fired:?}");
    assert_eq!(fired[0]["fired"], "wake");
    assert_eq!(fired[0]["domain"], "processing");
    assert_eq!(fired[0]["time"], T0 + 60_000);
    assert_eq!(fired[0]["now"], T0 + 60_000, "the clock at the call");
    assert_eq!(fired[0]["count"], 1, "it acts for its key's state");
    assert_eq!(run.stats.timers_fired.load(Ordering::Relaxed), 1);
    run.stop().await.expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn event_time_timers_fire_in_time_order_once_the_watermark_passes_them() {
    let clock = ManualClock::new(T0);
    let (world, run) = timed_world(&clock, "at_least_once").await;
    world.send("a", "timer:event:close:300", 10);
    world.send("b", "timer:event:close:100", 11);
    world.send("c", "timer:event:close:200", 12);
    world.send("d", "v", 150); // offset 3: the watermark (149) passes 100
    world.send("d", "v", 250); // offset 4: 249 passes 200
    until("the records are processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 5
    })
    .await;
    until("two timers fire", || fired(&world.output).len() == 2).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let times: Vec<i64> = fired(&world.output)
        .iter()
        .map(|f| f["time"].as_i64().expect("time"))
        .collect();
    assert_eq!(times, [100, 200], "300 is not due at watermark 249");
    world.send("d", "v", 301);
    until("the last timer fires", || fired(&world.output).len() == 3).await;
    let fired = fired(&world.output);
    let keys: Vec<&str> = fired
        .iter()
        .map(|f| f["fired"].as_str().expect("name"))
        .collect();
    assert_eq!(keys, ["close"; 3]);
    for f in &fired {
        assert!(
            f["watermark"].as_i64().expect("a watermark") >= f["time"].as_i64().expect("time"),
            "a timer fires only once the watermark reached it: {f}"
        );
        assert_eq!(f["domain"], "event");
    }
    // Each fire follows the output of the record whose timestamp let the watermark pass it.
    {
        let log = world.output.log();
        let position = |pred: &dyn Fn(&serde_json::Value) -> bool| {
            log.outputs
                .iter()
                .position(|w| pred(&serde_json::from_slice(&w.value).expect("JSON")))
                .expect("present")
        };
        assert!(position(&|v| v["offset"] == 3) < position(&|v| v["time"] == 100));
        assert!(position(&|v| v["offset"] == 4) < position(&|v| v["time"] == 200));
    }
    run.stop().await.expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn setting_a_timer_again_moves_it_and_clearing_removes_it() {
    let clock = ManualClock::new(T0);
    let (world, run) = timed_world(&clock, "at_least_once").await;
    world.send("k", "timer:event:t:500", 1);
    world.send("k", "timer:event:t:700", 2);
    world.send("k", "timer:event:u:600", 3);
    world.send("k", "timer:clear:u", 4);
    world.send("k", "timer:processing:t:1", 5); // moved again, and across domains
    world.send("k", "timer:event:t:800", 6); // and back
    world.send("x", "v", 1000);
    until("the records are processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 7
    })
    .await;
    until("a timer fires", || !fired(&world.output).is_empty()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let fired = fired(&world.output);
    assert_eq!(fired.len(), 1, "one timer per (key, name): {fired:?}");
    assert_eq!(
        (&fired[0]["fired"], &fired[0]["time"]),
        (&"t".into(), &800.into())
    );
    run.stop().await.expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn a_timer_that_traps_or_is_rejected_is_dead_lettered_and_loses_nothing_else() {
    let clock = ManualClock::new(T0);
    let (world, run) = timed_world(&clock, "at_least_once").await;
    world.send("a", "timer:event:trap:100", 1);
    world.send("b", "timer:event:reject:100", 2);
    world.send("c", "timer:event:fine:100", 3);
    world.send("d", "v", 200);
    until("the timers settle", || {
        run.stats.timers_fired.load(Ordering::Relaxed) == 3
    })
    .await;
    until("the dead letters are delivered", || {
        world.output.log().dead_letters.len() == 2
    })
    .await;
    let mut dead: Vec<(Vec<u8>, i64)> = world
        .output
        .log()
        .dead_letters
        .iter()
        .map(|w| (w.key.clone(), w.source.1))
        .collect();
    dead.sort();
    assert_eq!(
        dead,
        [(b"a".to_vec(), -1), (b"b".to_vec(), -1)],
        "the two timers, under their keys, with no input offset"
    );
    let fired = fired(&world.output);
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0]["fired"], "fine");
    // The rejected timer's state write was discarded: b's count starts from 0.
    world.send("b", "v", 300);
    until("b's record has its output", || {
        outputs_per_offset(&world.output, 0).contains_key(&4)
    })
    .await;
    let counted = world
        .output
        .log()
        .outputs
        .iter()
        .find(|w| w.source.1 == 4)
        .expect("the output of offset 4")
        .value
        .clone();
    let counted: serde_json::Value = serde_json::from_slice(&counted).expect("JSON");
    assert_eq!(counted["count"], 1);
    run.stop().await.expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn pending_timers_and_the_watermark_survive_a_restart_and_fire_once() {
    let clock = ManualClock::new(T0);
    let (world, run) = timed_world(&clock, "exactly_once").await;
    world.send("k", "timer:event:later:1000", 500);
    world.send("k", &format!("timer:processing:soon:{}", T0 + 1000), 501);
    until("the records are processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2
    })
    .await;
    run.stop().await.expect("clean stop");
    assert!(fired(&world.output).is_empty());

    // A new run restores them from the checkpoint; the restored watermark (500) holds while
    // earlier timestamps come in.
    let (run, _) = world.start_timed(&clock).await;
    world.handle.assign(&[0]);
    world.send("k", "timer:event:early:499", 10);
    until("the record is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 1
    })
    .await;
    until("the timer at 499 fires at the restored watermark", || {
        fired(&world.output).len() == 1
    })
    .await;
    assert_eq!(fired(&world.output)[0]["watermark"], 500, "501 - 1");
    clock.advance_ms(1000);
    world.send("x", "v", 1001);
    until("both restored timers fire", || {
        fired(&world.output).len() == 3
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    run.stop().await.expect("clean stop");
    let mut names: Vec<String> = fired(&world.output)
        .iter()
        .map(|f| f["fired"].as_str().expect("name").to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["early", "later", "soon"], "each fires exactly once");
}

#[tokio::test(start_paused = true)]
async fn a_component_of_the_0_1_world_still_runs_with_the_same_results() {
    an_older_world_runs_with_the_same_results("weir_test_counter_v0_1").await;
}

#[tokio::test(start_paused = true)]
async fn a_component_of_the_0_2_world_still_runs_with_the_same_results() {
    an_older_world_runs_with_the_same_results("weir_test_counter_v0_2").await;
}

/// The counter built against an older world (`guest`) through the pipeline: its records are
/// lowered without their input index, and its outputs are the counter's exactly.
async fn an_older_world_runs_with_the_same_results(guest: &str) {
    let world = World::new(1, 300, "at_least_once");
    let (run, _) = start_with(
        settings(world.delivery),
        (
            world.source.clone(),
            world.output.clone(),
            world.store.clone(),
        ),
        ReadDelay::Fixed(Duration::ZERO),
        guest,
        Arc::new(SystemClock),
    )
    .await;
    world.handle.assign(&[0]);
    until("every record has its output", || {
        outputs_of(&world.output, 0) == 300
    })
    .await;
    run.stop().await.expect("clean stop");
    // The counter's outputs exactly: the running count of the key at each offset.
    assert_counts_exact(&world.handle, &world.output, 0);
    assert_eq!(run_count(&world.output, 0), 300);
}

#[tokio::test(start_paused = true)]
async fn a_timer_due_during_a_state_outage_waits_for_the_store_and_fires_once() {
    let clock = ManualClock::new(T0);
    let world = World::new(1, 0, "at_least_once");
    let (run, backend) = world.start_timed(&clock).await;
    world.handle.assign(&[0]);
    world.send("k", &format!("timer:processing:t:{}", T0 + 1000), 1);
    until("the record is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 1
    })
    .await;
    backend.set_unavailable(0, true);
    clock.advance_ms(1000);
    until("the round meets the outage and backs off", || {
        run.stats.outage_retries.load(Ordering::Relaxed) >= 2
    })
    .await;
    assert!(
        fired(&world.output).is_empty(),
        "nothing fired while reads fail"
    );
    backend.set_unavailable(0, false);
    until("the timer fires", || !fired(&world.output).is_empty()).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(fired(&world.output).len(), 1, "once");
    assert_eq!(run.stats.timers_fired.load(Ordering::Relaxed), 1);
    run.stop().await.expect("clean stop");
}

/// A round that meets a state outage keeps holding its keys while it backs off: a record of
/// its timer's key that arrives meanwhile runs after the timer, not before (it could clear or
/// move it). A review found the round had let its keys go on an outage.
#[tokio::test(start_paused = true)]
async fn a_round_held_up_by_an_outage_keeps_its_keys_later_records_wait_for_it() {
    let clock = ManualClock::new(T0);
    let world = World::new(1, 0, "at_least_once");
    let (run, backend) = world.start_timed(&clock).await;
    world.handle.assign(&[0]);
    world.send("k", &format!("timer:processing:t:{}", T0 + 1000), 1);
    until("the timer is set", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 1
    })
    .await;
    backend.set_unavailable(0, true);
    clock.advance_ms(1000);
    until("the round meets the outage", || {
        run.stats.outage_retries.load(Ordering::Relaxed) >= 1
    })
    .await;
    world.send("k", "v", 2);
    tokio::time::sleep(Duration::from_secs(1)).await;
    backend.set_unavailable(0, false);
    until("the record behind the timer is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2
    })
    .await;
    let of_k: Vec<serde_json::Value> = world
        .output
        .log()
        .outputs
        .iter()
        .filter(|w| w.key == b"k")
        .map(|w| serde_json::from_slice(&w.value).expect("counter JSON"))
        .collect();
    assert_eq!(of_k.len(), 2, "{of_k:?}");
    assert!(of_k[0].get("fired").is_some(), "the timer first: {of_k:?}");
    assert_eq!(of_k[1]["offset"], 1, "then the record: {of_k:?}");
    run.stop().await.expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn late_records_are_processed_dead_lettered_or_dropped_as_configured_and_counted() {
    for policy in LateRecords::ALL {
        let clock = ManualClock::new(T0);
        let (world, run, _) = configured_world(&clock, &[TOPIC], "at_least_once", |s| {
            s.pipeline.late_records = policy
        })
        .await;
        world.send("a", "v", 1000);
        until("a checkpoint applied the watermark (999)", || {
            run.stats.checkpoints.load(Ordering::Relaxed) >= 1
        })
        .await;
        world.send("b", "v", 999); // late: at the watermark
        world.send("c", "v", 1000); // on time
        until("every record is settled", || {
            outputs_per_offset(&world.output, 0).contains_key(&2)
        })
        .await;
        let stats = run.stats.clone();
        run.stop().await.expect("clean stop");
        let late = &stats.late_records;
        let counted: Vec<u64> = late.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let mut want = [0; 3];
        want[policy.index()] = 1;
        assert_eq!(
            counted, want,
            "{policy:?}: the late record is counted under its policy"
        );
        let log = world.output.log();
        let outputs: Vec<i64> = log.outputs.iter().map(|w| w.source.1).collect();
        let dead: Vec<(i64, Option<DeadLetterKind>)> = log
            .dead_letters
            .iter()
            .map(|w| (w.source.1, w.dead_letter.as_ref().map(|d| d.0)))
            .collect();
        match policy {
            LateRecords::Process => {
                assert_eq!(outputs, [0, 1, 2]);
                assert!(dead.is_empty());
            }
            LateRecords::DeadLetter => {
                assert_eq!(outputs, [0, 2]);
                assert_eq!(dead, [(1, Some(DeadLetterKind::Late))]);
            }
            LateRecords::Drop => {
                assert_eq!(outputs, [0, 2]);
                assert!(dead.is_empty());
            }
        }
    }
}

/// A world of one partition whose every state read waits `read_delay`, and a pipeline over it
/// whose settings `configure` changes, processing time from `clock`, partition 0 assigned.
async fn slow_world(
    clock: &ManualClock,
    read_delay: Duration,
    configure: impl FnOnce(&mut Settings),
) -> (World, Run) {
    let world = World::empty(&[TOPIC], "at_least_once");
    let mut s = settings("at_least_once");
    configure(&mut s);
    let (run, _) = start_with(
        s,
        (
            world.source.clone(),
            world.output.clone(),
            world.store.clone(),
        ),
        ReadDelay::Fixed(read_delay),
        "weir_test_counter",
        Arc::new(clock.clone()),
    )
    .await;
    world.handle.assign(&[0]);
    (world, run)
}

/// A checkpoint asked for while a round of timers waits on state reads (a round runs beside
/// records, as an entry of the execution controller) waits for the round, then is taken.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_asked_for_while_a_round_waits_on_state_is_taken_after_it() {
    let clock = ManualClock::new(T0);
    let (world, run) = slow_world(&clock, Duration::from_secs(1), |s| {
        s.pipeline.checkpoint_interval = Duration::from_secs(3600);
    })
    .await;
    world.send("k", "timer:event:t:100", 1);
    world.send("j", "v", 1_000); // the watermark (999) passes the timer
    until("both records are processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2
    })
    .await;
    // The round started at once and waits on its read.
    assert!(fired(&world.output).is_empty());
    let before = run.stats.checkpoints.load(Ordering::Relaxed);
    run.requests.send_modify(|r| *r += 1);
    until("the checkpoint is taken", || {
        run.stats.checkpoints.load(Ordering::Relaxed) > before
    })
    .await;
    assert_eq!(fired(&world.output).len(), 1, "after the round");
    run.stop().await.expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn a_record_sees_the_applied_watermark_and_the_clock_at_its_call() {
    let clock = ManualClock::new(T0);
    let (world, run) = timed_world(&clock, "at_least_once").await;
    world.send("k", "v", 1_000);
    until("a checkpoint applied the watermark (999)", || {
        run.stats.checkpoints.load(Ordering::Relaxed) >= 1
    })
    .await;
    clock.advance_ms(5);
    world.send("k", "probe:time", 500);
    until("the probe's output", || {
        outputs_per_offset(&world.output, 0).contains_key(&1)
    })
    .await;
    let seen = world
        .output
        .log()
        .outputs
        .iter()
        .find(|w| w.source.1 == 1)
        .expect("the probe's output")
        .value
        .clone();
    let seen: serde_json::Value = serde_json::from_slice(&seen).expect("JSON");
    assert_eq!(seen, serde_json::json!({"watermark": 999, "now": T0 + 5}));
    run.stop().await.expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn records_after_one_that_makes_a_timer_due_wait_for_its_round_and_see_its_watermark() {
    let clock = ManualClock::new(T0);
    let (world, run) = timed_world(&clock, "at_least_once").await;
    world.send("k", "timer:event:t:1500", 1_000);
    until("the timer is set", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 1
    })
    .await;
    // In one batch: the first makes the timer due (watermark 1,999); the second, behind it in
    // offset order, must run after the round, at that watermark (and so be late).
    world.send("k", "v", 2_000);
    world.send("j", "probe:time", 1_800);
    until("the probe's output", || {
        outputs_per_offset(&world.output, 0).contains_key(&2)
    })
    .await;
    let probe = world
        .output
        .log()
        .outputs
        .iter()
        .find(|w| w.source.1 == 2)
        .expect("the probe's output")
        .value
        .clone();
    let seen: serde_json::Value = serde_json::from_slice(&probe).expect("JSON");
    assert_eq!(seen, serde_json::json!({"watermark": 1_999, "now": T0}));
    assert_eq!(
        fired(&world.output).len(),
        1,
        "the timer fired in the round"
    );
    assert_eq!(
        run.stats.late_records[LateRecords::Process.index()].load(Ordering::Relaxed),
        1
    );
    run.stop().await.expect("clean stop");
}
