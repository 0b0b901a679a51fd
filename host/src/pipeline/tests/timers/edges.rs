//! A stage downstream of an internal topic (docs/topologies.md): its input is an edge whose
//! watermark only the upstream shards' markers move — the lowest of them, once each has
//! written one — never the records' timestamps; an upstream shard holds it until its marker
//! says it is idle, however long it is silent; a restart keeps each upstream shard's watermark
//! it checkpointed. A record an upstream shard sent again from below a frontier its marker
//! named is dropped, before and after a restart (`crate::time::edge`).

use super::*;
use crate::runtime::Header;
use crate::time::edge::{FRONTIER_HEADER, Frontier, ORIGIN_HEADER, Origin, TopicKey};
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

    /// Upstream shard `shard`'s marker naming the frontier its checkpoint reached: its input
    /// topic `up`'s next offset `next`.
    fn mark_frontier(&self, shard: i32, watermark_ms: i64, next: i64) {
        let marker = Marker {
            shard,
            watermark_ms,
            idle: false,
        };
        let frontier = Frontier(BTreeMap::from([(TopicKey::of("up"), next)]));
        let headers = vec![
            Header {
                name: MARKER_HEADER.to_owned(),
                value: marker.encode().into_bytes(),
            },
            Header {
                name: FRONTIER_HEADER.to_owned(),
                value: frontier.encode().into_bytes(),
            },
        ];
        self.handle
            .produce_with_headers(TOPIC, 0, (b"", b""), watermark_ms, headers);
    }

    /// A record `value` of key `k` that upstream shard `shard` emitted for its input topic
    /// `up`'s record at `offset`.
    fn send_from(&self, shard: i32, offset: i64, value: &str) {
        let origin = Origin {
            shard,
            input: TopicKey::of("up"),
            offset,
        };
        let header = Header {
            name: ORIGIN_HEADER.to_owned(),
            value: origin.encode().to_vec(),
        };
        self.handle
            .produce_with_headers(TOPIC, 0, (b"k", value.as_bytes()), 10, vec![header]);
    }

    /// The stage again (after a stop), over its edge of `upstream_shards` shards.
    async fn restart_edge_stage(&self, clock: &ManualClock, upstream_shards: usize) -> Run {
        let (run, _) = self
            .start_configured(clock, |s| {
                s.pipeline.edges.inputs = BTreeMap::from([(TOPIC.to_owned(), upstream_shards)]);
            })
            .await;
        self.handle.assign(&[0]);
        run
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

/// The restored watermark is each upstream shard's, not only the edge's: after a restart, a
/// marker of one shard moves the edge as far as the other's checkpointed marker allows, and
/// no further.
#[tokio::test(start_paused = true)]
async fn a_restarted_stage_keeps_each_upstream_shards_watermark() {
    let clock = ManualClock::new(T0);
    let (world, run) = edge_world(&clock, 2, |_| {}).await;
    world.send("k", "timer:event:first:1000", 10);
    world.mark(0, 5_000);
    world.mark(1, 4_000);
    until("the first timer fires", || fired(&world.output).len() == 1).await;
    run.stop().await.expect("clean stop");

    let run = world.restart_edge_stage(&clock, 2).await;
    world.send("k", "timer:event:second:4500", 20);
    world.mark(1, 9_000);
    until("the second timer fires", || fired(&world.output).len() == 2).await;
    assert_eq!(
        fired(&world.output)[1]["watermark"],
        5_000,
        "shard 0's checkpointed 5000 and shard 1's new 9000: no new marker of shard 0 needed"
    );
    run.stop().await.expect("clean stop");
}

/// The counts partition 0's outputs hold for key `k`, in order (fired timers and markers
/// left out).
fn counts(output: &MemoryOutput) -> Vec<u64> {
    output
        .log()
        .outputs
        .iter()
        .filter(|w| w.partition == Partition(0) && w.marker.is_none())
        .filter_map(|w| serde_json::from_slice::<serde_json::Value>(&w.value).ok())
        .filter_map(|v| v["count"].as_u64())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_record_an_upstream_shard_sent_again_from_below_its_marked_frontier_is_dropped_across_a_restart()
 {
    let clock = ManualClock::new(T0);
    let (world, run) = edge_world(&clock, 2, |_| {}).await;
    // Upstream shard 0 sends for its input's offsets 0..3, then its checkpoint's marker.
    for offset in 0..3 {
        world.send_from(0, offset, "v");
    }
    world.mark_frontier(0, 1_000, 3);
    // It fell back to an older checkpoint (its newest unreadable) and sends 1 and 2 again,
    // then goes on with 3; shard 1 sends its offset 1, which no frontier of its covers.
    world.send_from(0, 1, "v");
    world.send_from(0, 2, "v");
    world.send_from(0, 3, "v");
    world.send_from(1, 1, "v");
    until("the records are processed", || {
        counts(&world.output).len() == 5
    })
    .await;
    assert_eq!(counts(&world.output), [1, 2, 3, 4, 5]);
    assert_eq!(run.stats.records_repeated.load(Ordering::Relaxed), 2);
    run.stop().await.expect("clean stop");

    // The frontier is in the checkpoint: after a restart, shard 0's offset 2 is a repeat still.
    let run = world.restart_edge_stage(&clock, 2).await;
    world.send_from(0, 2, "v");
    world.send_from(0, 4, "v");
    until("the new record is processed", || {
        counts(&world.output).len() == 6
    })
    .await;
    assert_eq!(counts(&world.output)[5], 6, "only offset 4 counted");
    assert_eq!(run.stats.records_repeated.load(Ordering::Relaxed), 1);
    run.stop().await.expect("clean stop");
}
