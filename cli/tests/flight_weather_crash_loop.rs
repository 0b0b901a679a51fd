//! A crash loop over `examples/flight-weather` (docs/topologies.md): its three stages in one
//! `weir run` process, exactly-once on `lsm` on the S3 server, fed per round the weather rows
//! and the planes of the round's flights (tables first), then the flights, while it is killed
//! and restarted at least 30 times (5 in the short tier) — with SIGKILL at random moments, at
//! the fail points around the checkpoint, and in the middle of a table's load: a shard's
//! co-partitioned `weather` rows half applied at its open, the global `planes` table half read
//! before its snapshot. A `read_committed` consumer then sees every flight's two statistics
//! updates exactly once, every group equal to the oracle.

use crate::crash_loop::{AFTER_MANIFEST, BEFORE_MANIFEST, run_and_kill, shuffled_rounds};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;
use weir_cli::flights::{FlightRecord, KeyBy};
use weir_cli::tables::TableRow;
use weir_tests::flight_weather::*;
use weir_tests::process::{CounterConfig, WeirProcess};
use weir_tests::*;

const TABLE_MID_LOAD: &str = "table-mid-load";
const GLOBAL_TABLE_MID_LOAD: &str = "global-table-mid-load";
const FLIGHTS_PER_ROUND: usize = 120;

/// A flight's hour key (`{origin}|{time_hour}`) and tail number.
fn keys_of(flight: &FlightRecord) -> (String, Option<String>) {
    let v: serde_json::Value = serde_json::from_slice(&flight.json).expect("a flight's JSON");
    let hour = format!(
        "{}|{}",
        v["origin"].as_str().unwrap_or_default(),
        v["time_hour"].as_str().unwrap_or_default()
    );
    (hour, v["tailnum"].as_str().map(str::to_owned))
}

/// The rows of `table` whose keys are among `keys`, in the CSV's order.
fn rows_of(table: &[TableRow], keys: &BTreeSet<String>) -> Vec<TableRow> {
    table
        .iter()
        .filter(|r| keys.contains(&r.key))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_weather_killed_during_loads_and_checkpoints_equals_the_oracle_once()
-> anyhow::Result<()> {
    init_tracing();
    let mut rng = rand::thread_rng();
    let points = [
        BEFORE_MANIFEST,
        AFTER_MANIFEST,
        TABLE_MID_LOAD,
        GLOBAL_TABLE_MID_LOAD,
    ];
    let (random, per_point) = tiered((1, 1), (14, 4));
    let rounds = shuffled_rounds(random, &points, per_point, &mut rng);
    let flights: Vec<FlightRecord> =
        weir_cli::flights::read_csv_keyed(&flights_csv(), KeyBy::Route)?
            .into_iter()
            .take(rounds.len() * FLIGHTS_PER_ROUND)
            .collect();
    let data = flights_csv();
    let weather_rows = weir_cli::tables::read_table_csv(
        &data.with_file_name("weather.csv"),
        &["origin", "time_hour"],
    )?;
    let plane_rows =
        weir_cli::tables::read_table_csv(&data.with_file_name("planes.csv"), &["tailnum"])?;
    let oracle: Vec<WeatherFlight> = flights
        .iter()
        .map(|f| {
            let (hour_key, tailnum) = keys_of(f);
            let v: serde_json::Value = serde_json::from_slice(&f.json).expect("JSON");
            WeatherFlight {
                hour_key,
                tailnum,
                arr_delay: v["arr_delay"].as_i64(),
            }
        })
        .collect();
    let makers: HashMap<String, String> = manufacturers(&data.with_file_name("planes.csv"))?;
    let want = flight_weather_oracle(
        &oracle,
        &makers,
        &visibilities(&data.with_file_name("weather.csv"))?,
    );

    let (flights_topic, weather, planes, stats, dlq) = (
        unique("fwc-flights"),
        unique("fwc-weather"),
        unique("fwc-planes"),
        unique("fwc-stats"),
        unique("fwc-dlq"),
    );
    create_topics(&[(&flights_topic, 4), (&stats, 2), (&dlq, 1)]).await?;
    let mut config = CounterConfig::new(&flights_topic, &stats, &dlq).await?;
    config.exactly_once = true;
    config.instance_id = Some("flight-weather-crash-loop-host".to_owned());
    config.session_timeout_ms = 10_000;
    config.stages = flight_weather_stages_toml(
        &guest("flight_weather"),
        &flights_topic,
        (&weather, &planes),
        &stats,
    );
    let dir = tempfile::tempdir()?;
    let config_path = dir.path().join("weir.toml");
    config.write(&config_path)?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));

    let loader = weir_cli::flights::Loader::new(&kafka_bootstrap())?;
    let mut hits = std::collections::BTreeMap::new();
    for (round, (kill, slice)) in rounds
        .iter()
        .zip(flights.chunks(FLIGHTS_PER_ROUND))
        .enumerate()
    {
        // The round's weather and planes first (again when an earlier round had them: a new
        // offset each, so every load has rows to read), then its flights.
        let (hours, tails): (BTreeSet<String>, BTreeSet<String>) = slice
            .iter()
            .map(keys_of)
            .map(|(h, t)| (h, t.unwrap_or_default()))
            .unzip();
        let bootstrap = kafka_bootstrap();
        weir_cli::tables::produce_table(&bootstrap, &weather, 4, &rows_of(&weather_rows, &hours))
            .await?;
        weir_cli::tables::produce_table(&bootstrap, &planes, 2, &rows_of(&plane_rows, &tails))
            .await?;
        if round == 0 {
            weir_cli::flights::produce(&bootstrap, &flights_topic, slice).await?;
        } else {
            loader.produce(&flights_topic, slice).await?;
        }
        let log = dir.path().join(format!("round-{round:02}.log"));
        run_and_kill(
            bin,
            &config_path,
            log,
            round,
            (*kill, 1),
            &mut rng,
            &mut hits,
        )
        .await?;
    }

    let mut weir = WeirProcess::spawn(bin, &config_path, dir.path().join("final.log"), &[])?;
    let out = read_exactly(
        &stats,
        2 * flights.len(),
        Duration::from_secs(180),
        Duration::from_secs(3),
    )
    .await;
    weir.kill().await?;
    let out = out.map_err(|e| e.context(weir.tail()))?;
    eprintln!(
        "flight-weather crash loop: {} kills, fail point hits {hits:?}, {} flights, {} groups",
        rounds.len(),
        flights.len(),
        want.len()
    );
    assert!(rounds.len() >= tiered(5, 30));
    for name in points {
        assert!(
            hits.get(name).copied().unwrap_or(0) > 0,
            "fail point {name} was never hit: {hits:?}"
        );
    }
    check_flight_weather(&out, &want)
}
