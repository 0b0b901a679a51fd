//! Global tables (docs/topologies.md, "Global tables") over the memory source, read by the
//! `join` guest in `lookup` mode through `weir:operator/tables`: every partition of the table
//! is loaded before any stream record runs (and before the member joins the group) and is
//! looked up by a key that is not the record's, a later update reaches the records after it
//! once applied, an empty table loads at once and fills as rows come, a restart reads on from
//! the table's snapshot (a damaged one from the beginning), and a table whose topic is missing
//! fails the run naming it.

use super::*;
use crate::clock::ManualClock;

const PLANES: &str = "planes";

/// A world whose stream is `TOPIC` and whose source also holds `PLANES`.
fn planes_world() -> World {
    let (source, handle) = MemorySource::new(&[TOPIC]);
    World {
        source,
        output: MemoryOutput::new(1 << 20, Some(handle.clone())),
        handle,
        store: Arc::new(InMemory::new()),
        delivery: "at_least_once",
    }
}

/// Starts the `join` guest in lookup mode over `world`, `PLANES` its global table `planes`
/// looked up by each record's field `tailnum`; partitions 0 and 1 assigned.
async fn start_enrich(world: &World) -> Run {
    let mut settings = settings(world.delivery);
    settings.pipeline.global_tables = [(PLANES.to_owned(), "planes".to_owned())].into();
    settings.pipeline.parameters = [
        ("join", "lookup"),
        ("table", "planes"),
        ("field", "tailnum"),
    ]
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
    world.handle.assign(&[0, 1]);
    run
}

/// A flight of `tailnum` to partition `partition` of the stream.
fn flight(world: &World, partition: i32, id: &str, tailnum: &str) {
    let value = format!(r#"{{"id":"{id}","tailnum":"{tailnum}"}}"#);
    world
        .handle
        .produce(TOPIC, partition, id.as_bytes(), value.as_bytes(), 0);
}

/// Each flight's id → the plane row it was enriched with (`None`: no row), in output order.
fn enriched(output: &MemoryOutput) -> Vec<(String, Option<String>)> {
    output
        .log()
        .outputs
        .iter()
        .map(|w| {
            let v: serde_json::Value = serde_json::from_slice(&w.value).expect("lookup JSON");
            let plane = v["r"]["maker"].as_str().map(str::to_owned);
            (v["l"]["id"].as_str().expect("an id").to_owned(), plane)
        })
        .collect()
}

fn plane(world: &World, partition: i32, tailnum: &str, maker: Option<&str>) {
    let value = maker.map_or_else(String::new, |m| format!(r#"{{"maker":"{m}"}}"#));
    world
        .handle
        .produce(PLANES, partition, tailnum.as_bytes(), value.as_bytes(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_global_table_is_loaded_whole_before_any_record_runs_and_looked_up_by_any_key() {
    let world = planes_world();
    // Flights first: they still see the rows, which come from every partition of the table.
    flight(&world, 0, "f1", "N1");
    flight(&world, 1, "f2", "N2");
    flight(&world, 0, "f3", "N3");
    flight(&world, 1, "f4", "N404");
    plane(&world, 0, "N1", Some("BOEING"));
    plane(&world, 1, "N2", Some("AIRBUS"));
    plane(&world, 2, "N3", Some("CESSNA"));
    plane(&world, 1, "N2", Some("EMBRAER"));
    plane(&world, 2, "N3", None);
    let run = start_enrich(&world).await;
    until("every flight's output", || {
        enriched(&world.output).len() == 4
    })
    .await;
    let mut seen = enriched(&world.output);
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("f1".to_owned(), Some("BOEING".to_owned())),
            ("f2".to_owned(), Some("EMBRAER".to_owned())),
            ("f3".to_owned(), None),
            ("f4".to_owned(), None),
        ],
        "the last row of each key, N3 deleted by its tombstone, N404 never there"
    );
    run.stop().await.expect("stops cleanly");
}

#[tokio::test(start_paused = true)]
async fn the_member_joins_the_group_only_after_its_global_tables_loaded() {
    let world = planes_world();
    plane(&world, 0, "N1", Some("BOEING"));
    flight(&world, 0, "f1", "N1");
    let run = start_enrich(&world).await;
    until("the flight's output", || enriched(&world.output).len() == 1).await;
    assert_eq!(
        world.handle.joined_after_tables(),
        Some(1),
        "joined once its one global table had caught up, not while it loaded"
    );
    run.stop().await.expect("stops cleanly");
}

#[tokio::test(start_paused = true)]
async fn a_global_table_update_reaches_the_records_after_it_is_applied_and_never_goes_back() {
    let world = planes_world();
    plane(&world, 0, "N1", Some("OLD"));
    let run = start_enrich(&world).await;
    flight(&world, 0, "f0", "N1");
    until("the first output", || enriched(&world.output).len() == 1).await;
    plane(&world, 1, "N1", Some("NEW"));
    // The table's reader and the stream's consumer are not in step: flights go on until one
    // sees the update; none after it sees the old row again.
    let mut n = 1;
    while enriched(&world.output).last().and_then(|(_, p)| p.clone()) != Some("NEW".into()) {
        assert!(n < 1000, "the update was never applied");
        flight(&world, 0, &format!("f{n}"), "N1");
        n += 1;
        until("the flight's output", || enriched(&world.output).len() == n).await;
    }
    let makers: Vec<Option<String>> = enriched(&world.output)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    let first_new = makers
        .iter()
        .position(|m| m.as_deref() == Some("NEW"))
        .expect("seen");
    assert!(first_new >= 1, "f0 ran before the update: {makers:?}");
    assert!(
        makers[..first_new]
            .iter()
            .all(|m| m.as_deref() == Some("OLD")),
        "{makers:?}"
    );
    run.stop().await.expect("stops cleanly");
}

#[tokio::test(start_paused = true)]
async fn an_empty_global_table_loads_at_once_and_fills_as_its_topic_gets_rows() {
    let world = planes_world();
    world.handle.create_topic(PLANES, 3);
    flight(&world, 0, "f0", "N1");
    let run = start_enrich(&world).await;
    until("the first output", || enriched(&world.output).len() == 1).await;
    assert_eq!(enriched(&world.output), [("f0".to_owned(), None)]);
    plane(&world, 2, "N1", Some("BOEING"));
    let mut n = 1;
    while enriched(&world.output)
        .last()
        .and_then(|(_, p)| p.clone())
        .is_none()
    {
        assert!(n < 1000, "the row never reached the table");
        flight(&world, 0, &format!("f{n}"), "N1");
        n += 1;
        until("the flight's output", || enriched(&world.output).len() == n).await;
    }
    run.stop().await.expect("stops cleanly");
    // A restart's table holds the row, from the snapshot or the topic.
    let run = start_enrich(&world).await;
    flight(&world, 1, "g", "N1");
    until("the restarted run's output", || {
        enriched(&world.output).len() == n + 1
    })
    .await;
    assert_eq!(
        enriched(&world.output)[n],
        ("g".to_owned(), Some("BOEING".to_owned()))
    );
    run.stop().await.expect("stops cleanly");
}

#[tokio::test(start_paused = true)]
async fn a_restart_reads_the_table_on_from_its_snapshot_and_a_damaged_one_from_the_beginning() {
    use object_store::ObjectStoreExt as _;
    let world = planes_world();
    plane(&world, 0, "N1", Some("BOEING"));
    plane(&world, 1, "N2", Some("AIRBUS"));
    let run = start_enrich(&world).await;
    flight(&world, 0, "f1", "N1");
    until("the first output", || enriched(&world.output).len() == 1).await;
    run.stop().await.expect("stops cleanly");
    let snapshot = object_store::path::Path::from("weir/pipelines/counter/global-tables/planes");
    world
        .store
        .head(&snapshot)
        .await
        .expect("the load saved the table");

    plane(&world, 1, "N3", Some("CESSNA"));
    let run = start_enrich(&world).await;
    flight(&world, 1, "f2", "N2");
    flight(&world, 1, "f3", "N3");
    until("the flights' outputs", || {
        enriched(&world.output).len() == 3
    })
    .await;
    run.stop().await.expect("stops cleanly");
    let follows = world.handle.table_follows();
    assert_eq!(
        follows[1],
        (PLANES.to_owned(), BTreeMap::from([(0, 1), (1, 1)])),
        "the second run began where the first one's snapshot ended, not at the beginning"
    );

    world
        .store
        .put(&snapshot, b"WGT1 damaged".as_slice().into())
        .await
        .expect("puts");
    let run = start_enrich(&world).await;
    flight(&world, 0, "f4", "N3");
    until("the last flight's output", || {
        enriched(&world.output).len() == 4
    })
    .await;
    run.stop().await.expect("stops cleanly");
    assert_eq!(
        world.handle.table_follows()[2],
        (PLANES.to_owned(), BTreeMap::new()),
        "from the beginning"
    );
    let seen = enriched(&world.output);
    assert_eq!(
        seen[1..],
        [
            ("f2".to_owned(), Some("AIRBUS".to_owned())),
            ("f3".to_owned(), Some("CESSNA".to_owned())),
            ("f4".to_owned(), Some("CESSNA".to_owned())),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_global_table_whose_topic_is_missing_fails_the_run_naming_it() {
    let world = planes_world();
    flight(&world, 0, "f1", "N1");
    let run = start_enrich(&world).await;
    let err = run.task.await.expect("no panic").expect_err("fails");
    assert!(matches!(err, PipelineError::GlobalTable(_)), "{err:?}");
    let message = crate::error::Chain(&err).to_string();
    assert!(
        message.contains("global table `planes`") && message.contains("no partitions"),
        "{message}"
    );
    assert_eq!(err.kind(), crate::error::ErrorKind::Unavailable, "retried");
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_past_the_topics_end_is_dropped_and_the_topic_read_from_its_beginning() {
    use object_store::ObjectStoreExt as _;
    let world = planes_world();
    plane(&world, 0, "N1", Some("BOEING"));
    // A snapshot of an earlier topic of that name: further than this one's end, with a row
    // this one never had.
    let earlier = crate::state::global_table::GlobalTable::default();
    earlier.apply(&[crate::runtime::InputRecord {
        key: b"N999".to_vec(),
        value: br#"{"maker":"STALE"}"#.to_vec(),
        timestamp_ms: 0,
        headers: Vec::new(),
        topic: PLANES.into(),
        partition: 0,
        offset: 99,
        input: 0,
    }]);
    let (snapshot, _) = earlier.snapshot();
    let path = object_store::path::Path::from("weir/pipelines/counter/global-tables/planes");
    world.store.put(&path, snapshot.into()).await.expect("puts");
    let run = start_enrich(&world).await;
    flight(&world, 0, "f1", "N1");
    flight(&world, 0, "f2", "N999");
    until("both outputs", || enriched(&world.output).len() == 2).await;
    run.stop().await.expect("stops cleanly");
    assert_eq!(
        enriched(&world.output),
        [
            ("f1".to_owned(), Some("BOEING".to_owned())),
            ("f2".to_owned(), None),
        ],
        "the topic's row, not the stale one"
    );
}
