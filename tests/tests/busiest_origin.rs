//! `examples/busiest-origin` on the real broker with exactly-once delivery (docs/topologies.md):
//! per origin and hour the departures (stage `departures`, tumbling event-time windows), re-keyed
//! by hour through an internal topic into stage `top`, which emits each hour's busiest origin
//! once its watermark passes the hour — with its own `max_out_of_orderness` at 0 and no idle
//! advance, so only the watermark the first stage propagates through the internal topic can
//! close its hours. Flights that left more than an hour late also go to a named output topic.
//! Every output must equal an oracle computed here from the CSV with nothing of Weir's code:
//! each hour once, its busiest origin and count exact, `late-departures` exact — over the flights
//! in departure order, and again replayed with bounded disorder. The short tier runs January,
//! the long tier every flight.

use rdkafka::Message;
use std::collections::BTreeMap;
use std::time::Duration;
use weir_cli::flights::{FlightRecord, KeyBy};
use weir_host::config::stages::{StageInput, StageOutput, StageSettings};
use weir_host::config::{Delivery, RuntimeSettings, Settings};
use weir_tests::*;

const HOUR_MS: i64 = 3_600_000;
const MINUTE_MS: i64 = 60_000;
/// How far the disordered replay moves a flight back, at most: the first stage's
/// `max_out_of_orderness`.
const DISORDER: Duration = Duration::from_secs(30 * 60);

/// A flight as the oracle reads it from the CSV.
struct Row {
    origin: String,
    departure_ms: i64,
    departed: bool,
    dep_delay: Option<i64>,
    carrier: String,
    flight: i64,
}

/// The CSV's rows: scheduled departure from `time_hour` (UTC) and `minute`.
fn rows() -> anyhow::Result<Vec<Row>> {
    let mut reader = csv::Reader::from_path(tier_flights_csv()?)?;
    let headers = reader.headers()?.clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .expect("column present")
    };
    let [
        origin,
        time_hour,
        minute,
        dep_time,
        dep_delay,
        carrier,
        flight,
    ] = [
        "origin",
        "time_hour",
        "minute",
        "dep_time",
        "dep_delay",
        "carrier",
        "flight",
    ]
    .map(col);
    let mut out = Vec::with_capacity(tier_flight_count());
    for row in reader.records() {
        let row = row?;
        let hour = humantime::parse_rfc3339(&row[time_hour])?
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        out.push(Row {
            origin: row[origin].to_owned(),
            departure_ms: hour + row[minute].parse::<i64>()? * MINUTE_MS,
            departed: row[dep_time].parse::<i64>().is_ok(),
            dep_delay: row[dep_delay].parse().ok(),
            carrier: row[carrier].to_owned(),
            flight: row[flight].parse()?,
        });
    }
    assert_eq!(out.len(), tier_flight_count());
    Ok(out)
}

/// A flight that left late, as both sides name it: (origin, carrier, flight, departure ms).
type LateFlight = (String, String, i64, i64);

/// The oracle: per hour start, the busiest origin and its departures (ties to the smallest
/// code); and every flight with a departure delay over 60 minutes, counted.
fn oracle(rows: &[Row]) -> (BTreeMap<i64, (String, u64)>, BTreeMap<LateFlight, usize>) {
    let mut per_hour: BTreeMap<i64, BTreeMap<&str, u64>> = BTreeMap::new();
    let mut late = BTreeMap::new();
    for r in rows {
        if r.departed {
            let hour = r.departure_ms - r.departure_ms.rem_euclid(HOUR_MS);
            *per_hour
                .entry(hour)
                .or_default()
                .entry(&r.origin)
                .or_default() += 1;
        }
        if r.dep_delay.is_some_and(|d| d > 60) {
            let flight = (
                r.origin.clone(),
                r.carrier.clone(),
                r.flight,
                r.departure_ms,
            );
            *late.entry(flight).or_default() += 1;
        }
    }
    let busiest = per_hour
        .into_iter()
        .map(|(hour, origins)| {
            let mut best: Option<(&str, u64)> = None;
            for (origin, n) in origins {
                // Ascending codes: only a larger count replaces the best.
                if best.is_none_or(|(_, m)| n > m) {
                    best = Some((origin, n));
                }
            }
            let (origin, n) = best.expect("an hour with departures");
            (hour, (origin.to_owned(), n))
        })
        .collect();
    (busiest, late)
}

/// The pipeline: flights keyed by origin in `input`; `top`'s results to `busiest`, late
/// departures to `late`.
fn pipeline(base: Settings, input: &str, busiest: &str, late: &str) -> Settings {
    let mut s = base;
    let p = &mut s.pipeline;
    p.operator = Default::default();
    p.input_topics = Vec::new();
    p.output_topic = None;
    p.delivery = Delivery::ExactlyOnce;
    p.checkpoint_interval = Duration::from_secs(1);
    p.idle_timeout = Some(Duration::from_secs(2));
    p.idle_advance = true;
    p.stages = vec![
        StageSettings {
            name: "departures".into(),
            operator: guest("busiest_origin_departures"),
            inputs: vec![StageInput {
                topic: Some(input.to_owned()),
                ..StageInput::default()
            }],
            outputs: BTreeMap::from([(
                "late-departures".to_owned(),
                StageOutput {
                    topic: Some(late.to_owned()),
                    partitions: None,
                },
            )]),
            max_out_of_orderness: Some(DISORDER),
            ..StageSettings::default()
        },
        StageSettings {
            name: "top".into(),
            operator: guest("busiest_origin_top"),
            inputs: vec![StageInput {
                stage: Some("departures".to_owned()),
                ..StageInput::default()
            }],
            outputs: BTreeMap::from([(
                "default".to_owned(),
                StageOutput {
                    topic: Some(busiest.to_owned()),
                    partitions: None,
                },
            )]),
            // Only the first stage's markers may close an hour here.
            max_out_of_orderness: Some(Duration::ZERO),
            idle_advance: Some(false),
            ..StageSettings::default()
        },
    ];
    s
}

/// Runs the pipeline over `flights` (in the order given) and checks its outputs against the
/// oracle: one result per hour, exact, none twice; the late departures exact.
async fn run_and_check(flights: &[FlightRecord], rows: &[Row], what: &str) -> anyhow::Result<()> {
    let (want, want_late) = oracle(rows);
    let (input, busiest, late, dlq) = (
        unique("busiest-in"),
        unique("busiest-out"),
        unique("late-departures"),
        unique("busiest-dlq"),
    );
    create_topics(&[(&input, 4), (&busiest, 2), (&late, 2), (&dlq, 1)]).await?;
    weir_cli::flights::produce(&kafka_bootstrap(), &input, flights).await?;
    let mut base = settings(
        guest("busiest_origin_departures"),
        &input,
        &busiest,
        &dlq,
        RuntimeSettings::default(),
    );
    base.state = memory_state_on_s3().await?;
    let settings = pipeline(base, &input, &busiest, &late);
    settings.validate()?;
    let started = std::time::Instant::now();
    let running = RunningStages::start(&settings)?;
    let out = read_exactly(
        &busiest,
        want.len(),
        Duration::from_secs(600),
        Duration::from_secs(5),
    )
    .await?;
    let late_out = read_exactly(
        &late,
        want_late.values().sum(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await?;
    println!(
        "busiest-origin, {what}: {} flights → {} hours, {} late departures in {:.2?} (debug-profile host, real broker)",
        flights.len(),
        out.len(),
        late_out.len(),
        started.elapsed()
    );
    running.stop().await?;
    let dead = read_exactly(&dlq, 0, Duration::from_secs(1), Duration::from_secs(1)).await?;
    assert!(dead.is_empty(), "{what}: {} dead letters", dead.len());

    let mut got = BTreeMap::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let hour = v["hour_start_ms"].as_i64().expect("hour_start_ms");
        assert_eq!(
            msg.key(),
            Some(hour.to_string().as_bytes()),
            "keyed by hour"
        );
        let result = (
            v["origin"].as_str().expect("origin").to_owned(),
            v["departures"].as_u64().expect("departures"),
        );
        assert!(
            got.insert(hour, result).is_none(),
            "{what}: hour {hour} emitted twice"
        );
    }
    assert_eq!(got.len(), want.len(), "{what}: hours");
    for (hour, want) in &want {
        assert_eq!(got.get(hour), Some(want), "{what}: hour {hour}");
    }
    let mut got_late: BTreeMap<LateFlight, usize> = BTreeMap::new();
    for msg in &late_out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let flight = (
            String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned(),
            v["carrier"].as_str().unwrap_or_default().to_owned(),
            v["flight"].as_i64().unwrap_or_default(),
            msg.timestamp().to_millis().unwrap_or(-1),
        );
        *got_late.entry(flight).or_default() += 1;
    }
    assert_eq!(got_late, want_late, "{what}: late departures");
    Ok(())
}

/// In departure order, then replayed with every flight moved back by up to [`DISORDER`] (a
/// seeded shuffle): both equal the oracle, which does not depend on the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busiest_origin_per_hour_matches_the_oracle_in_order_and_disordered() -> anyhow::Result<()>
{
    let _one_at_a_time = FULL_FLIGHT_RUNS.lock().await;
    init_tracing();
    let rows = rows()?;
    let flights = weir_cli::flights::read_csv_keyed(&tier_flights_csv()?, KeyBy::Origin)?;
    assert_eq!(flights.len(), tier_flight_count());
    run_and_check(&flights, &rows, "in departure order").await?;

    let bound = DISORDER.as_millis() as u64;
    let mut arrival: Vec<(i64, usize)> = (0..flights.len())
        .map(|i| {
            let delay = splitmix64(43 ^ i as u64) % bound;
            (flights[i].timestamp_ms + delay as i64, i)
        })
        .collect();
    arrival.sort_unstable();
    let shuffled: Vec<FlightRecord> = arrival.iter().map(|(_, i)| flights[*i].clone()).collect();
    run_and_check(&shuffled, &rows, "with bounded disorder").await
}
