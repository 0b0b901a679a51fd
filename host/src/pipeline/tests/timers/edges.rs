//! A stage downstream of an internal topic (docs/topologies.md): its input is an edge whose
//! watermark only the upstream shards' markers move — the lowest of them, once each has
//! written one — never the records' timestamps; an upstream shard holds it until its marker
//! says it is idle, however long it is silent; a restart keeps the watermark it checkpointed and
//! waits for every upstream shard again.

use super::*;
use crate::runtime::Header;
use crate::time::watermark::{MARKER_HEADER, Marker};

/// A world whose one input is an edge that `upstream_shards` shards write, its pipeline
/// changed by `configure`.
async fn edge_world(
    clock: &ManualClock,
    upstream_shards: usize,
    configure: impl FnOnce(&mut Settings),
) -> (World, Run) {
    let (world, run, _) = configured_world(clock, &[TOPIC], "exactly_once", |s| {
        s.pipeline.edges.inputs = BTreeMap::from([(TOPIC.to_owned(), upstream_shards)]);
        configure(s);
    })
    .await;
    (world, run)
}

impl World {
    /// Upstream shard `shard`'s marker of `watermark_ms`, as its checkpoint writes it.
    fn mark(&self, shard: i32, watermark_ms: i64) {
        self.send_marker(Marker {
            shard,
            watermark_ms,
            idle: false,
        });
    }

    /// Upstream shard `shard`'s marker saying its inputs went idle at `watermark_ms`.
    fn mark_idle(&self, shard: i32, watermark_ms: i64) {
        self.send_marker(Marker {
            shard,
            watermark_ms,
            idle: true,
        });
    }

    fn send_marker(&self, marker: Marker) {
        let (value, watermark_ms) = (marker.encode(), marker.watermark_ms);
        let header = Header {
            name: MARKER_HEADER.to_owned(),
            value: value.into_bytes(),
        };
        self.handle
            .produce_with_headers(TOPIC, 0, (b"", b""), watermark_ms, vec![header]);
    }
}

#[tokio::test(start_paused = true)]
async fn an_edges_watermark_waits_for_its_slowest_upstream_shard() {
    let clock = ManualClock::new(T0);
    let (world, run) = edge_world(&clock, 2, |_| {}).await;
    world.send("k", "timer:event:t:1000", 10);
    world.mark(0, 5_000);
    world.send("k", "v", 9_000);
    until("the records are processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        fired(&world.output).is_empty(),
        "upstream shard 1 has written no marker, and a record's timestamp moves nothing"
    );
    world.mark(1, 2_000);
    until("the timer fires", || !fired(&world.output).is_empty()).await;
    assert_eq!(fired(&world.output)[0]["watermark"], 2_000, "shard 1's");
    let processed = run.stats.records_ok.load(Ordering::Relaxed);
    run.stop().await.expect("clean stop");
    assert_eq!(processed, 2, "markers are not records");
    let outputs = world.output.log().outputs.len();
    assert_eq!(
        outputs, 2,
        "the record's count and the fired timer, nothing for a marker: {outputs}"
    );
}

/// A silent upstream shard is slow, not idle (its checkpoints may be far apart while it
/// works): it holds the edge until its own marker says its inputs are idle.
#[tokio::test(start_paused = true)]
async fn an_upstream_shard_holds_the_edge_until_its_marker_says_it_is_idle() {
    let clock = ManualClock::new(T0);
    let (world, run) = edge_world(&clock, 2, |s| {
        s.pipeline.idle_timeout = Some(Duration::from_secs(5));
    })
    .await;
    world.send("k", "timer:event:t:1000", 10);
    world.mark(0, 5_000);
    until("the record is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 1
    })
    .await;
    clock.advance_ms(60_000);
    world.mark(0, 6_000);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        fired(&world.output).is_empty(),
        "shard 1, silent for a minute, still holds the edge"
    );
    world.mark_idle(1, i64::MIN);
    until("the timer fires", || !fired(&world.output).is_empty()).await;
    assert_eq!(
        fired(&world.output)[0]["watermark"],
        6_000,
        "shard 1 said it is idle: it holds nothing back"
    );
    run.stop().await.expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn a_restarted_stage_keeps_its_edges_watermark_and_waits_for_every_upstream_shard() {
    let clock = ManualClock::new(T0);
    let (world, run) = edge_world(&clock, 2, |_| {}).await;
    world.send("k", "timer:event:first:1000", 10);
    world.mark(0, 3_000);
    world.mark(1, 4_000);
    until("the first timer fires", || fired(&world.output).len() == 1).await;
    run.stop().await.expect("clean stop");

    let (run, _) = world
        .start_configured(&clock, |s| {
            s.pipeline.edges.inputs = BTreeMap::from([(TOPIC.to_owned(), 2)]);
        })
        .await;
    world.handle.assign(&[0]);
    world.send("k", "timer:event:second:3500", 20);
    world.mark(1, 9_000);
    until("the record is processed", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        fired(&world.output).len(),
        1,
        "the restored watermark (3000) holds: shard 0 has written nothing since the restart"
    );
    world.mark(0, 3_800);
    until("the second timer fires", || fired(&world.output).len() == 2).await;
    assert_eq!(fired(&world.output)[1]["watermark"], 3_800);
    run.stop().await.expect("clean stop");
}
