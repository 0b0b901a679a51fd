//! The SDK's join helpers run by the host (docs/topologies.md, "Joins"): the `join` guest over
//! two co-partitioned inputs of the memory source, in event time. A window join's pair comes
//! out once whichever side arrives second, and its state is gone once the watermark passes the
//! window; an interval join joins at both bounds of its interval and not one ms past them.

use super::*;
use crate::clock::ManualClock;
use crate::state::key;

const LEFT: &str = "auctions";
const RIGHT: &str = "bids";

/// A pipeline of the `join` guest over `LEFT` and `RIGHT` with `parameters`, partition 0
/// assigned; its world and run.
async fn join_world(parameters: &[(&str, &str)]) -> (World, Run) {
    let (source, handle) = MemorySource::new(&[LEFT, RIGHT]);
    let world = World {
        source,
        output: MemoryOutput::new(1 << 20, Some(handle.clone())),
        handle,
        store: Arc::new(InMemory::new()),
        delivery: "at_least_once",
    };
    let mut settings = settings(world.delivery);
    settings.pipeline.input_topics = vec![LEFT.to_owned(), RIGHT.to_owned()];
    settings.pipeline.parameters = parameters
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let (run, _) = start_with(
        settings,
        (
            world.source.clone(),
            world.output.clone(),
            world.store.clone(),
        ),
        ReadDelay::Fixed(Duration::ZERO),
        "weir_test_join",
        Arc::new(ManualClock::new(1_700_000_000_000)),
    )
    .await;
    world.handle.assign(&[0]);
    (world, run)
}

/// Partition 0's outputs as JSON, in output order.
fn joined(output: &MemoryOutput) -> Vec<serde_json::Value> {
    output
        .log()
        .outputs
        .iter()
        .filter(|w| w.partition == Partition(0))
        .map(|w| serde_json::from_slice(&w.value).expect("join JSON"))
        .collect()
}

/// The entries of map state `j` of `key` in the shard's last checkpoint.
async fn stored(world: &World, key: &[u8]) -> usize {
    let clock: SharedClock = Arc::new(SystemClock);
    let shard = MemoryBackend::durable(world.store.clone(), "weir".into(), clock)
        .open_shard(&ShardId {
            pipeline: "counter".to_owned(),
            partition: Partition(0),
        })
        .await
        .expect("opens");
    let mut prefix = Vec::new();
    key::encode_prefix(&mut prefix, key, "j");
    shard.scan(&prefix, None, 100).await.expect("scans").len()
}

#[tokio::test(start_paused = true)]
async fn a_window_joins_pair_comes_once_and_its_state_goes_with_the_window() {
    let (world, run) = join_world(&[("join", "window"), ("size_ms", "10")]).await;
    let h = &world.handle;
    h.produce(LEFT, 0, b"k", br#"{"a":1}"#, 3);
    h.produce(RIGHT, 0, b"k", br#"{"b":10}"#, 5);
    // Another window of another key, on both inputs: the watermark passes [0, 10).
    h.produce(LEFT, 0, b"other", br#"{"a":2}"#, 30);
    h.produce(RIGHT, 0, b"other", br#"{"b":20}"#, 31);
    until("both pairs", || joined(&world.output).len() == 2).await;
    until("the window's timer fired", || {
        run.stats
            .watermarks
            .lock()
            .expect("watermarks")
            .get(&Partition(0))
            .is_some_and(|w| *w >= 29)
            && run.stats.timers_fired.load(Ordering::Relaxed) >= 1
    })
    .await;
    run.stop().await.expect("stops cleanly");
    assert_eq!(
        joined(&world.output),
        [
            serde_json::json!({"l": {"a": 1}, "r": {"b": 10}}),
            serde_json::json!({"l": {"a": 2}, "r": {"b": 20}}),
        ]
    );
    assert_eq!(stored(&world, b"k").await, 0, "the window [0, 10) is gone");
    assert_eq!(stored(&world, b"other").await, 2, "[30, 40) is open");
}

#[tokio::test(start_paused = true)]
async fn an_interval_join_joins_at_both_bounds_and_not_past_them() {
    // A bid at t + 0 ..= t + 5 of its auction's t joins it.
    let (world, run) =
        join_world(&[("join", "interval"), ("lower_ms", "0"), ("upper_ms", "5")]).await;
    let h = &world.handle;
    h.produce(LEFT, 0, b"k", br#"{"auction":1}"#, 100);
    for (i, t) in [99, 100, 105, 106].into_iter().enumerate() {
        h.produce(RIGHT, 0, b"k", format!(r#"{{"bid":{i}}}"#).as_bytes(), t);
    }
    until("the joins", || {
        run.stats.records_ok.load(Ordering::Relaxed) == 5
    })
    .await;
    run.stop().await.expect("stops cleanly");
    assert_eq!(
        joined(&world.output),
        [
            serde_json::json!({"l": {"auction": 1}, "r": {"bid": 1}}),
            serde_json::json!({"l": {"auction": 1}, "r": {"bid": 2}}),
        ],
        "the bids at 100 and 105, not at 99 nor 106"
    );
}
