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

use std::time::Duration;
use weir_cli::flights::{FlightRecord, KeyBy};
use weir_host::config::{Delivery, RuntimeSettings};
use weir_tests::busiest::{OracleFlight, busiest_oracle, busiest_stages_toml, check_busiest};
use weir_tests::*;

const MINUTE_MS: i64 = 60_000;
/// How far the disordered replay moves a flight back, at most: the first stage's
/// `max_out_of_orderness`.
const DISORDER: Duration = Duration::from_secs(30 * 60);

/// The CSV's rows as the oracle reads them: scheduled departure from `time_hour` (UTC) and
/// `minute`.
fn rows() -> anyhow::Result<Vec<OracleFlight>> {
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
        out.push(OracleFlight {
            origin: row[origin].to_owned(),
            departure_ms: hour + row[minute].parse::<i64>()? * MINUTE_MS,
            departed: row[dep_time].parse::<i64>().is_ok(),
            dep_delay: row[dep_delay].parse().ok(),
            flight: (row[carrier].to_owned(), row[flight].parse()?),
        });
    }
    assert_eq!(out.len(), tier_flight_count());
    Ok(out)
}

/// Runs the pipeline over `flights` (in the order given) and checks its outputs against the
/// oracle: one result per hour, exact, none twice; the late departures exact.
async fn run_and_check(
    flights: &[FlightRecord],
    rows: &[OracleFlight],
    what: &str,
) -> anyhow::Result<()> {
    let (want, want_late) = busiest_oracle(rows);
    let (input, busiest, late, dlq) = (
        unique("busiest-in"),
        unique("busiest-out"),
        unique("late-departures"),
        unique("busiest-dlq"),
    );
    create_topics(&[(&input, 4), (&busiest, 2), (&late, 2), (&dlq, 1)]).await?;
    weir_cli::flights::produce(&kafka_bootstrap(), &input, flights).await?;
    let mut settings = settings(
        guest("busiest_origin_departures"),
        &input,
        &busiest,
        &dlq,
        RuntimeSettings::default(),
    );
    settings.state = memory_state_on_s3().await?;
    let guests = guest("busiest_origin_top");
    let stages = busiest_stages_toml(
        guests.parent().expect("the guests' directory"),
        &input,
        (&busiest, &late),
        &humantime::format_duration(DISORDER).to_string(),
    );
    let p = &mut settings.pipeline;
    p.stages = stages_of(&stages)?;
    p.operator = Default::default();
    p.input_topics = Vec::new();
    p.output_topic = None;
    p.delivery = Delivery::ExactlyOnce;
    p.checkpoint_interval = Duration::from_secs(1);
    p.idle_timeout = Some(Duration::from_secs(2));
    p.idle_advance = true;
    settings.validate()?;
    let started = std::time::Instant::now();
    let mut running = RunningStages::start(&settings)?;
    let out = running
        .while_running(read_exactly(
            &busiest,
            want.len(),
            Duration::from_secs(600),
            Duration::from_secs(5),
        ))
        .await?;
    let late_out = running
        .while_running(read_exactly(
            &late,
            want_late.values().sum(),
            Duration::from_secs(60),
            Duration::from_secs(1),
        ))
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
    check_busiest(what, (&out, &late_out), (&want, &want_late))
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
