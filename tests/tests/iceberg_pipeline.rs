//! A pipeline writing to an Iceberg table (issue 21), on the real broker, the S3 server and a
//! SQLite catalog, read back by `pyiceberg`: a slice of the flights through `flight-delays`,
//! exactly-once, with the committer running beside the shards. Every route's running `flights`
//! counts are in the table once each, 1..n with no gap, and the last of each route equals the
//! oracle computed here from the records produced.

use object_store::path::Path;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_cli::flights::FlightRecord;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{Delivery, RuntimeSettings, Settings};
use weir_host::ids::Partition;
use weir_host::pipeline::PipelineControl;
use weir_host::sink::iceberg::committer::GroupOffsets;
use weir_host::sink::iceberg::storage::WarehouseStorage;
use weir_host::sink::iceberg::{Committer, Lakehouse, LakehouseSettings, TableTarget};
use weir_host::state::ShardId;
use weir_host::state::configured::ConfiguredBackend;
use weir_host::state::hooked_store::{HookedStore, Request, RequestHook};
use weir_host::state::lsm::backend::LsmBackend;
use weir_host::state::lsm::backend::object_store_from_url;
use weir_tests::iceberg::flight_delays_table;
use weir_tests::*;

/// Flights of the slice: enough for every partition to checkpoint and commit several times.
const SLICE: usize = 20_000;

/// Counts the requests of a store by kind, and the data files written.
#[derive(Debug, Default)]
struct Requests {
    puts: AtomicU64,
    gets: AtomicU64,
    lists: AtomicU64,
    data_files: AtomicU64,
}

#[async_trait::async_trait]
impl RequestHook for Requests {
    async fn before(&self, request: Request, location: Option<&Path>) -> object_store::Result<()> {
        let counter = match request {
            Request::Put => &self.puts,
            Request::Get => &self.gets,
            Request::List => &self.lists,
            Request::Copy | Request::Delete => return Ok(()),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if request == Request::Put && location.is_some_and(|l| l.as_ref().ends_with(".parquet")) {
            self.data_files.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl std::fmt::Display for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "{} PUT ({} data files), {} GET, {} LIST",
            n(&self.puts),
            n(&self.data_files),
            n(&self.gets),
            n(&self.lists)
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flights_into_an_iceberg_table_exactly_once_hold_each_routes_counts_once_and_the_oracle()
-> anyhow::Result<()> {
    init_tracing();
    let flights: Vec<FlightRecord> = weir_cli::flights::read_csv(&flights_csv())?
        .into_iter()
        .take(SLICE)
        .collect();
    let input = unique("ice-flights");
    let (output, dlq) = (unique("ice-stats"), unique("ice-dlq"));
    create_topics(&[(&input, 4), (&output, 4), (&dlq, 1)]).await?;
    weir_cli::flights::produce(&kafka_bootstrap(), &input, &flights).await?;

    let state = lsm_state_on_s3(64 << 10).await?;
    let url = state.lsm.url.clone().expect("an S3 URL");
    let bucket = url
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .expect("a bucket")
        .to_owned();
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("catalog.db");
    // The table's files, and the committer's reads of the shards' checkpoints, through stores
    // that count their requests.
    let warehouse = format!("s3://{bucket}/warehouse");
    let table_requests = Arc::new(Requests::default());
    let (store, prefix) = object_store_from_url(&warehouse, &s3_options())?;
    let counted = Arc::new(HookedStore::new(store, table_requests.clone()));
    let lakehouse = Lakehouse::open_with(
        &LakehouseSettings {
            catalog_uri: Some(format!("sqlite://{}?mode=rwc", db.display())),
            warehouse: Some(warehouse.clone()),
            commit_interval: Duration::from_millis(500),
            ..LakehouseSettings::default()
        },
        WarehouseStorage::with_store(&warehouse, counted, prefix),
    )
    .await?;
    let committer_requests = Arc::new(Requests::default());

    let mut settings = Settings {
        state: state.clone(),
        ..settings(
            guest("flight_delays"),
            &input,
            &output,
            &dlq,
            RuntimeSettings::default(),
        )
    };
    settings.pipeline.delivery = Delivery::ExactlyOnce;
    settings.pipeline.checkpoint_interval = Duration::from_millis(300);
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = LsmBackend::from_settings(&state.lsm, clock.clone())?;
    let shards = ShardId {
        pipeline: settings.pipeline.name.clone(),
        partition: Partition(0),
    }
    .shards_under(backend.prefix());
    let uid = unique("uid");
    let target = TableTarget {
        committer: Committer {
            lakehouse: lakehouse.clone(),
            ident: Lakehouse::ident("t1", "route_stats"),
            uid: uid.clone(),
            store: Arc::new(HookedStore::new(
                backend.store().clone(),
                committer_requests.clone(),
            )),
            shards,
            interval: lakehouse.settings().commit_interval,
            clock: clock.clone(),
            group: Some(GroupOffsets {
                kafka: settings.kafka.clone(),
                group: settings.pipeline.group_id(),
                topics: settings.pipeline.input_topics.clone(),
            }),
            orphan_grace: Duration::from_secs(3600),
        },
        lakehouse: lakehouse.clone(),
        tenant: "t1".into(),
        table: "route_stats".into(),
        schema: Arc::new(flight_delays_table()),
        uid,
        to_topic: true,
    };
    let (_requests, control) = PipelineControl::new();
    let control = weir_host::runner::RunControl {
        pipeline: control,
        table: Some(target),
    };
    let started = Instant::now();
    let pipeline = RunningPipeline::start_controlled(
        settings,
        Arc::new(ConfiguredBackend::Lsm(Box::new(backend))),
        clock,
        control,
    );
    pipeline
        .wait_done(SLICE as u64, Duration::from_secs(300))
        .await?;

    // The last checkpoints are committed within a few commit intervals.
    let ident = Lakehouse::ident("t1", "route_stats");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let table = lakehouse.catalog().load_table(&ident).await?;
        let rows: u64 = weir_tests::iceberg::current_rows(&table);
        if rows >= SLICE as u64 {
            assert_eq!(rows, SLICE as u64, "no row twice");
            let snapshots = table.metadata().snapshots().count();
            println!(
                "iceberg flights: {SLICE} rows in the table {:.2?} after the start ({:.0} rows/s, debug-profile host, 4 partitions, 300 ms checkpoints); {snapshots} snapshots; table requests: {table_requests}; committer's state reads: {committer_requests}",
                started.elapsed(),
                SLICE as f64 / started.elapsed().as_secs_f64(),
            );
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the table holds {rows} of {SLICE} rows after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pipeline.stop().await?;

    let read = weir_tests::iceberg::read_with_pyiceberg(&db, "t1.route_stats")?;
    weir_tests::iceberg::assert_route_stats_exactly_once(&read, &flights);
    Ok(())
}

/// Through the API (`weir serve` with `[pipelines.iceberg]`): a `counter` pipeline with a
/// table of its `{count, offset}` emits, exactly-once. Every record is a row once (each key's
/// counts 1..n, every input offset once per partition), and a record whose emit is not a row
/// (`probe:time` emits other fields) is dead-lettered naming the table, its effects gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_made_through_the_api_writes_its_table_once_and_dead_letters_rows_that_do_not_fit()
-> anyhow::Result<()> {
    use rdkafka::message::{Headers, Message};
    use reqwest::Method;
    use serde_json::json;
    use weir_tests::api::*;
    let bucket = create_s3_bucket().await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("catalog.db");
    let mut runner = runner_config(&unique("ice"));
    runner.iceberg = LakehouseSettings {
        catalog_uri: Some(format!("sqlite://{}?mode=rwc", db.display())),
        warehouse: Some(format!("s3://{bucket}/warehouse")),
        options: s3_options(),
        commit_interval: Duration::from_millis(300),
        ..LakehouseSettings::default()
    };
    let (addr, _) = start_server_with(Some(runner)).await?;
    let tenant = tenant_id("ice");
    let key = tenant_with_key(addr, &tenant).await?;
    upload_counter(addr, &key, 1).await?;
    let table = json!({"table": "counts", "columns": [
        {"name": "count", "type": "long", "required": true},
        {"name": "offset", "type": "long", "required": true}]});
    let (input, _output) = counter_pipeline_p(
        addr,
        &key,
        &tenant,
        json!({"delivery": "exactly_once", "iceberg": table}),
    )
    .await?;
    let mut expected = BTreeMap::new();
    produce_counter(&input, 2, (0, 300), 30, &mut expected).await?;
    // `probe:time` of key0, partition 0: its emit has other fields than the table's.
    produce(&input, 0, &[(b"key0".to_vec(), b"probe:time".to_vec())]).await?;
    let dlq = read_exactly(
        &kafka_topic_of(&tenant, "dlq"),
        1,
        Duration::from_secs(60),
        Duration::from_millis(200),
    )
    .await?;
    let error = dlq[0]
        .headers()
        .and_then(|h| {
            (0..h.count())
                .map(|i| h.get(i))
                .find(|h| h.key == "weir.error")
                .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
        })
        .unwrap_or_default();
    assert!(error.contains("Iceberg table"), "{error}");

    // The committer's snapshots: polled, as a user's query would.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let read = loop {
        let read = weir_tests::iceberg::read_with_pyiceberg(&db, &format!("{tenant}.counts"));
        let rows = read
            .as_ref()
            .ok()
            .and_then(|r| r["rows"].as_array().map(Vec::len));
        if rows == Some(300) {
            break read?;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the table holds {rows:?} of 300 rows after 60 s: {read:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let mut counts: Vec<u64> = read["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["count"].as_u64())
        .collect();
    counts.sort_unstable();
    let mut want: Vec<u64> = expected.values().flat_map(|n| 1..=*n).collect();
    want.sort_unstable();
    assert_eq!(counts, want, "each key's counts 1..n, once each");
    let mut offsets: Vec<u64> = read["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["offset"].as_u64())
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(
        offsets.len(),
        150,
        "two partitions of 150 records: offsets 0..150"
    );
    let (status, _, _) = call(addr, Method::GET, "/v1/pipelines/p", Some(&key), None).await?;
    assert!(status.is_success());
    Ok(())
}

/// Through the API, with no output topic (rows go only to the table): a reset to a savepoint
/// (issue 12) neither skips nor duplicates rows. After the savepoint S more records are
/// counted and their rows committed; the pipeline is stopped, reset to S and started, so the
/// records after S are processed again (from S's counts, the same rows) before new ones
/// arrive. The table holds every record's row once: each key's counts 1..n once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_to_a_savepoint_neither_skips_nor_duplicates_the_tables_rows() -> anyhow::Result<()>
{
    use serde_json::json;
    use weir_tests::api::*;
    let bucket = create_s3_bucket().await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("catalog.db");
    let mut runner = runner_config(&unique("ice-reset"));
    runner.iceberg = LakehouseSettings {
        catalog_uri: Some(format!("sqlite://{}?mode=rwc", db.display())),
        warehouse: Some(format!("s3://{bucket}/warehouse")),
        options: s3_options(),
        commit_interval: Duration::from_millis(300),
        ..LakehouseSettings::default()
    };
    let lakehouse = Lakehouse::open(&runner.iceberg).await?;
    let (addr, _) = start_server_with(Some(runner)).await?;
    let tenant = tenant_id("icer");
    let key = tenant_with_key(addr, &tenant).await?;
    upload_counter(addr, &key, 1).await?;
    let input = kafka_topic_of(&tenant, "in");
    create_topics(&[(&input, 2), (&kafka_topic_of(&tenant, "dlq"), 1)]).await?;
    let spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["in"], "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 300, "delivery": "exactly_once",
        "iceberg": {"table": "counts", "columns": [
            {"name": "count", "type": "long", "required": true},
            {"name": "offset", "type": "long", "required": true}]},
    });
    create_pipeline(addr, &key, "a", &spec).await?;
    let ident = Lakehouse::ident(&tenant, "counts");
    let rows_reach = |n: u64| {
        let (lakehouse, ident) = (&lakehouse, &ident);
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let rows = match lakehouse.catalog().load_table(ident).await {
                    Ok(table) => weir_tests::iceberg::current_rows(&table),
                    Err(_) => 0, // not created yet
                };
                if rows >= n {
                    return anyhow::Ok(rows);
                }
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "the table holds {rows} of {n} rows after 60 s"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };

    let mut expected = BTreeMap::new();
    produce_counter(&input, 2, (0, 200), 20, &mut expected).await?;
    rows_reach(200).await?;
    let taken = post(
        addr,
        &key,
        "/v1/pipelines/a/savepoints",
        json!({"name": "s"}),
    )
    .await?;
    let saved: i64 = taken["shards"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["offsets"]["in"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(saved, 200, "the savepoint holds the first 200: {taken}");
    produce_counter(&input, 2, (200, 400), 20, &mut expected).await?;
    rows_reach(400).await?;

    set_desired(addr, &key, "a", "stop").await?;
    post(
        addr,
        &key,
        "/v1/pipelines/a/reset",
        json!({"savepoint": "s"}),
    )
    .await?;
    set_desired(addr, &key, "a", "start").await?;
    produce_counter(&input, 2, (400, 500), 20, &mut expected).await?;
    // In each partition the replay of 200..400 comes before 400..500: once their rows are
    // in, so is anything the replay wrote.
    let rows = rows_reach(500).await?;
    assert_eq!(rows, 500, "no row twice");
    let read = weir_tests::iceberg::read_with_pyiceberg(&db, &format!("{tenant}.counts"))?;
    let mut counts: Vec<u64> = read["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["count"].as_u64())
        .collect();
    counts.sort_unstable();
    let mut want: Vec<u64> = expected.values().flat_map(|n| 1..=*n).collect();
    want.sort_unstable();
    assert_eq!(counts, want, "each key's counts 1..n, once each");
    Ok(())
}
