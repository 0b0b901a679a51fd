//! A stage upstream of an internal topic (docs/topologies.md): at its checkpoints its sink
//! writes the shard's watermark as a marker among its outputs — the time through which it has
//! emitted, `idle` once its inputs went idle — and before it emits again after an idle marker,
//! a marker that says it is active, so that the stage downstream counts it again before its
//! records arrive.

use super::*;
use crate::time::watermark::Marker;

/// The markers and outputs of partition 0, in the order they were published: `Some(marker)`,
/// or `None` for an output record.
fn published(output: &MemoryOutput) -> Vec<Option<Marker>> {
    output
        .log()
        .outputs
        .iter()
        .filter(|w| w.partition == Partition(0))
        .map(|w| w.marker)
        .collect()
}

/// An at-least-once stage whose output is an internal topic (its sinks write markers), its
/// settings changed by `configure`, partition 0 assigned.
async fn upstream_world(
    clock: &ManualClock,
    configure: impl FnOnce(&mut Settings),
) -> (World, Run) {
    let mut world = World::empty(&[TOPIC], "at_least_once");
    world.output = world.output.clone().with_markers();
    let (run, _) = world
        .start_configured(clock, |s| {
            s.pipeline.input_topics = vec![TOPIC.to_owned()];
            configure(s);
        })
        .await;
    world.handle.assign(&[0]);
    (world, run)
}

fn marker(watermark_ms: i64, idle: bool) -> Option<Marker> {
    Some(Marker {
        shard: 0,
        watermark_ms,
        idle,
    })
}

#[tokio::test(start_paused = true)]
async fn an_upstream_shard_marks_itself_idle_then_active_again_before_its_next_emit() {
    let clock = ManualClock::new(T0);
    let (world, run) = upstream_world(&clock, |s| {
        s.pipeline.idle_timeout = Some(Duration::from_secs(5));
    })
    .await;
    world.send("k", "v", 1_000);
    // Its first emit since it started comes after a marker that says it is active (its last
    // one before a restart may have said idle): with no watermark yet, the lowest time.
    until("the first marker follows the output", || {
        published(&world.output) == [marker(i64::MIN, false), None, marker(999, false)]
    })
    .await;
    // Its input silent past `idle_timeout`: the next checkpoint says so.
    clock.advance_ms(6_000);
    until("the idle marker", || published(&world.output).len() == 4).await;
    assert_eq!(published(&world.output)[3], marker(999, true));
    // A record again: its output comes after a marker that says the shard is active.
    world.send("k", "v", 2_000);
    until("the second output", || {
        published(&world.output)
            .iter()
            .filter(|m| m.is_none())
            .count()
            == 2
    })
    .await;
    assert_eq!(
        published(&world.output)[4..6],
        [marker(999, false), None],
        "active again before the emit, at the watermark it had"
    );
    until("the watermark moves on at the next checkpoint", || {
        published(&world.output).last() == Some(&marker(1_999, false))
    })
    .await;
    run.stop().await.expect("clean stop");
}

/// Each marker names the frontier its checkpoint reached (`crate::time::edge`): the next
/// offset of each input, written once every output of the records below it is acknowledged.
#[tokio::test(start_paused = true)]
async fn an_upstream_shards_marker_names_the_frontier_its_checkpoint_reached() {
    let clock = ManualClock::new(T0);
    let (world, run) = upstream_world(&clock, |_| {}).await;
    for ts in [1_000, 1_001, 1_002] {
        world.send("k", "v", ts);
    }
    until("a marker follows the outputs", || {
        published(&world.output).last() == Some(&marker(1_001, false))
    })
    .await;
    let (frontiers, records) = {
        let log = world.output.log();
        let markers = log.outputs.iter().filter(|w| w.marker.is_some());
        let frontiers: Vec<_> = markers.map(|w| w.frontier.clone()).collect();
        let records = log.outputs.iter().filter(|w| w.marker.is_none()).count();
        (frontiers, records)
    };
    let expected = crate::time::edge::Frontier(BTreeMap::from([(
        crate::time::edge::TopicKey::of(TOPIC),
        3,
    )]));
    assert_eq!(frontiers.last(), Some(&Some(expected)));
    assert_eq!(records, 3, "the outputs come before it");
    run.stop().await.expect("clean stop");
}

/// A consumer stalled with records before its partition's end is silent, not idle: the shard's
/// markers go on holding the stage downstream. Before, one shard of busiest-origin's first stage
/// got its first records 5–9 s after it opened on a loaded machine, said by then that it was
/// idle, and the second stage closed hours before that shard's counts came.
#[tokio::test(start_paused = true)]
async fn an_upstream_shard_whose_consumer_stalls_mid_input_does_not_say_it_is_idle() {
    let clock = ManualClock::new(T0);
    let (world, run) = upstream_world(&clock, |s| {
        s.pipeline.idle_timeout = Some(Duration::from_secs(5));
    })
    .await;
    world.send("k", "v", 1_000);
    until("the first marker follows the output", || {
        published(&world.output) == [marker(i64::MIN, false), None, marker(999, false)]
    })
    .await;
    world.handle.stall(0, true);
    world.send("k", "v", 2_000);
    // Past `idle_timeout` with the record still unread; checkpoints come in virtual time.
    clock.advance_ms(6_000);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        published(&world.output),
        [marker(i64::MIN, false), None, marker(999, false)],
        "stalled before the partition's end: silent, not idle"
    );
    world.handle.stall(0, false);
    until("the second output and its marker", || {
        published(&world.output).last() == Some(&marker(1_999, false))
    })
    .await;
    assert_eq!(
        published(&world.output)[3..],
        [None, marker(1_999, false)],
        "no idle marker, so no active one either"
    );
    run.stop().await.expect("clean stop");
}
