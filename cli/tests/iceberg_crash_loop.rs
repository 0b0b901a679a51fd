//! Crash loop of the Iceberg sink (issue 21, docs/iceberg.md): `weir run` with
//! `[pipeline.iceberg]` and no output topic runs `flight-delays` exactly-once on `lsm` state on
//! the S3 server, into a table in a SQLite catalog with its files on the same server, while a
//! slice of the flights keeps arriving. It is killed again and again (34 times in the long tier, 6
//! in the short one) — with SIGKILL at random moments, and
//! by the fail points between a shard's data files closing and its pending list, between the
//! checkpoint's manifest and its offsets, and on either side of the committer's table commit —
//! and restarted each time with the same static group membership. A last run brings the
//! table up to date: read back by pyiceberg, it holds every route's running counts 1..n once
//! each and the oracle's statistics. The committer's orphan collection (hourly in a run; here
//! called once the runs are over, without its age) then leaves no data file the table does
//! not list, and finds some to delete.

use crate::crash_loop::{AFTER_MANIFEST, flights_rounds, shuffled_rounds};
use object_store::ObjectStore as _;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_cli::flights::FlightRecord;
use weir_host::clock::SystemClock;
use weir_host::config::KafkaSettings;
use weir_host::sink::iceberg::committer::GroupOffsets;
use weir_host::sink::iceberg::output::stored_pipeline_uid;
use weir_host::sink::iceberg::{Committer, Lakehouse, LakehouseSettings, commit::files_in_table};
use weir_host::state::ShardId;
use weir_host::state::lsm::backend::object_store_from_url;
use weir_host::state::lsm::cache::BlockCaches;
use weir_tests::iceberg::{
    assert_route_stats_exactly_once, flight_delays_columns, read_with_pyiceberg,
};
use weir_tests::process::{CounterConfig, WeirProcess};
use weir_tests::*;

const PARTITIONS: i32 = 4;
const FLIGHTS_PER_ROUND: usize = 200;
const NAMESPACE: &str = "weir";
const TABLE: &str = "route_stats";

const AFTER_FILES: &str = "iceberg-after-files";
const BEFORE_COMMIT: &str = "iceberg-before-commit";
const AFTER_COMMIT: &str = "iceberg-after-commit";

/// `[pipeline.iceberg]` and `[iceberg]` as TOML (after the `[pipeline]` settings).
fn table_sections(db: &Path, warehouse: &str) -> String {
    let columns: Vec<String> = flight_delays_columns()
        .iter()
        .map(|c| {
            let kind = serde_json::to_value(c.kind).expect("a type encodes");
            format!(
                "{{ name = \"{}\", type = {kind}, required = {} }}",
                c.name, c.required
            )
        })
        .collect();
    let options: String = s3_options()
        .iter()
        .map(|(k, v)| format!("{k} = \"{v}\"\n"))
        .collect();
    format!(
        r#"[pipeline.iceberg]
namespace = "{NAMESPACE}"
table = "{TABLE}"
columns = [{columns}]
[iceberg]
catalog_uri = "sqlite://{db}?mode=rwc"
warehouse = "{warehouse}"
commit_interval = "300ms"
[iceberg.options]
{options}"#,
        columns = columns.join(", "),
        db = db.display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iceberg_killed_and_restarted_again_and_again_holds_every_row_once_and_collects_orphans()
-> anyhow::Result<()> {
    init_tracing();
    let mut rng = rand::thread_rng();
    let points = [AFTER_FILES, AFTER_MANIFEST, BEFORE_COMMIT, AFTER_COMMIT];
    let (random, per_point) = tiered((2, 1), (18, 4));
    let rounds = shuffled_rounds(random, &points, per_point, &mut rng);
    let flights: Vec<FlightRecord> = weir_cli::flights::read_csv(&flights_csv())?
        .into_iter()
        .take(rounds.len() * FLIGHTS_PER_ROUND)
        .collect();

    let (input, dlq) = (unique("ice-in"), unique("ice-dlq"));
    create_topics(&[(&input, PARTITIONS), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("catalog.db");
    let mut config = CounterConfig::new(&input, "", &dlq).await?;
    config.output = None; // rows only, to the table
    let bucket = config
        .state_url
        .trim_start_matches("s3://")
        .split('/')
        .next()
        .expect("a bucket")
        .to_owned();
    let warehouse = format!("s3://{bucket}/warehouse");
    config.operator = guest("flight_delays");
    config.instance_id = Some("iceberg-crash-loop-host".to_owned());
    config.session_timeout_ms = 10_000;
    config.exactly_once = true;
    config.pipeline_extra = table_sections(&db, &warehouse);
    let config_path = dir.path().join("weir.toml");
    config.write(&config_path)?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));

    // Each fail point at its first evaluation: a commit's have few chances a round (the
    // committer commits only what is new), and at one hit in two they were often missed.
    let hits = flights_rounds(
        (bin, &config_path, dir.path()),
        &rounds,
        (&input, &flights, FLIGHTS_PER_ROUND),
        1,
        &mut rng,
    )
    .await?;
    let kills = rounds.len();

    // Orphans now: data files no snapshot lists (files of checkpoints that never completed).
    let lakehouse = Lakehouse::open(&LakehouseSettings {
        catalog_uri: Some(format!("sqlite://{}?mode=rwc", db.display())),
        warehouse: Some(warehouse.clone()),
        options: s3_options(),
        ..LakehouseSettings::default()
    })
    .await?;
    let (store, prefix) = object_store_from_url(
        &format!("{warehouse}/{NAMESPACE}/{TABLE}/data"),
        &s3_options(),
    )?;
    let unlisted = || async {
        let table = lakehouse
            .catalog()
            .load_table(&Lakehouse::ident(NAMESPACE, TABLE))
            .await?;
        let listed: Vec<String> = store
            .list_with_delimiter(Some(&prefix))
            .await?
            .objects
            .into_iter()
            .map(|o| format!("s3://{bucket}/{}", o.location))
            .collect();
        let paths: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
        let in_table = files_in_table(&table, &paths).await?;
        let rows: u64 = weir_tests::iceberg::current_rows(&table);
        anyhow::Ok((listed.len() - in_table.len(), rows))
    };
    let (orphans_before, _) = unlisted().await?;

    // The last run, without fail points, brings the table up to date.
    let started = Instant::now();
    let mut weir = WeirProcess::spawn(bin, &config_path, dir.path().join("final.log"), &[])?;
    let deadline = Instant::now() + Duration::from_secs(180);
    let complete = loop {
        let (_, rows) = unlisted().await?;
        if rows >= flights.len() as u64 {
            break Ok(started.elapsed());
        }
        if Instant::now() > deadline {
            break Err(anyhow::anyhow!(
                "after 180 s the table holds {rows} of {} rows",
                flights.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    weir.kill().await?;
    let complete = complete.map_err(|e| e.context(weir.tail()))?;

    // The committer's orphan collection (hourly, files older than `orphan_file_age`), on
    // what the runs left, now and without the age: no run is left to close a file.
    let (state, state_prefix) = object_store_from_url(&config.state_url, &s3_options())?;
    let uid = stored_pipeline_uid(state.as_ref(), &state_prefix, &config.name).await?;
    let committer = Committer {
        lakehouse: lakehouse.clone(),
        ident: Lakehouse::ident(NAMESPACE, TABLE),
        uid,
        store: state,
        shards: ShardId {
            pipeline: config.name.clone(),
            partition: weir_host::ids::Partition(0),
        }
        .shards_under(&state_prefix),
        interval: Duration::from_secs(60),
        clock: Arc::new(SystemClock),
        group: Some(GroupOffsets {
            kafka: KafkaSettings {
                bootstrap_servers: kafka_bootstrap(),
                security: Default::default(),
                consumer: Default::default(),
                producer: Default::default(),
            },
            group: config.group.clone(),
            topics: vec![input.clone()],
        }),
        orphan_grace: Duration::ZERO,
    };
    let deleted = committer
        .collect_orphans(&Arc::new(BlockCaches::none()), Duration::ZERO)
        .await?;
    let (orphans_after, rows) = unlisted().await?;
    eprintln!(
        "iceberg crash loop: {kills} kills, fail point hits {hits:?}, {} flights, table complete {complete:?} into the last run ({rows} rows); {orphans_before} data files in no snapshot before it, {} deleted as orphans after, {orphans_after} left",
        flights.len(),
        deleted.len()
    );
    assert_eq!(orphans_after, 0, "every file is in the table or deleted");
    for name in points {
        assert!(
            hits.get(name).copied().unwrap_or(0) > 0,
            "fail point {name} was never hit: {hits:?}"
        );
    }
    // A crash between a shard's files and its list leaves those files behind.
    assert!(
        !deleted.is_empty(),
        "no orphan data file after {} crashes after the files closed",
        hits[AFTER_FILES]
    );
    let read = read_with_pyiceberg(&db, &format!("{NAMESPACE}.{TABLE}"))?;
    assert_route_stats_exactly_once(&read, &flights);
    Ok(())
}
