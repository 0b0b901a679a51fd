//! `examples/flight-weather` on the real broker with exactly-once delivery (docs/topologies.md):
//! flights re-keyed by origin and scheduled hour through an internal topic (`by-hour`),
//! enriched from the co-partitioned `weather` table and the `planes` global table (`enrich`),
//! re-keyed by manufacturer and by visibility into `stats`. The tables are loaded first, then
//! the flights; every group's statistics must equal an oracle computed here from the CSVs.
//! The short tier runs the flights of 1–2 January, the long tier every flight. Then a weather
//! update between two halves of the flights: seen by the later flights, not by the earlier.

use std::time::Duration;
use weir_host::config::{Delivery, RuntimeSettings, Settings};
use weir_tests::flight_weather::*;
use weir_tests::*;

/// The topics of one run: flights, weather, planes, stats, dead letters.
struct Topics {
    flights: String,
    weather: String,
    planes: String,
    stats: String,
    dlq: String,
}

/// Makes the topics (weather with as many partitions as the flights: co-partitioned with the
/// internal topic `by-hour` writes) and loads both tables from the CSVs.
async fn topics_with_tables() -> anyhow::Result<Topics> {
    let t = Topics {
        flights: unique("fw-flights"),
        weather: unique("fw-weather"),
        planes: unique("fw-planes"),
        stats: unique("fw-stats"),
        dlq: unique("fw-dlq"),
    };
    create_topics(&[(&t.flights, 4), (&t.stats, 2), (&t.dlq, 1)]).await?;
    let data = flights_csv();
    let weather = weir_cli::tables::read_table_csv(
        &data.with_file_name("weather.csv"),
        &["origin", "time_hour"],
    )?;
    let planes =
        weir_cli::tables::read_table_csv(&data.with_file_name("planes.csv"), &["tailnum"])?;
    weir_cli::tables::produce_table(&kafka_bootstrap(), &t.weather, 4, &weather).await?;
    weir_cli::tables::produce_table(&kafka_bootstrap(), &t.planes, 2, &planes).await?;
    Ok(t)
}

/// The pipeline's settings over `t`: three stages, exactly-once, memory state on S3.
async fn pipeline_settings(t: &Topics) -> anyhow::Result<Settings> {
    let component = guest("flight_weather");
    let mut settings = settings(
        component.clone(),
        &t.flights,
        &t.stats,
        &t.dlq,
        RuntimeSettings::default(),
    );
    settings.state = memory_state_on_s3().await?;
    let stages =
        flight_weather_stages_toml(&component, &t.flights, (&t.weather, &t.planes), &t.stats);
    let p = &mut settings.pipeline;
    p.stages = stages_of(&stages)?;
    p.operator = Default::default();
    p.input_topics = Vec::new();
    p.output_topic = None;
    p.delivery = Delivery::ExactlyOnce;
    p.checkpoint_interval = Duration::from_secs(1);
    settings.validate()?;
    Ok(settings)
}

/// The flights scheduled before `before` (a `time_hour`), as `weir load-flights` produces
/// them (keyed by route, in departure order), and as the oracle reads them.
fn flights_before(
    before: &str,
) -> anyhow::Result<(Vec<weir_cli::flights::FlightRecord>, Vec<WeatherFlight>)> {
    let csv = tier_flights_csv()?;
    let cut = humantime::parse_rfc3339(before)?
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let records: Vec<_> = weir_cli::flights::read_csv(&csv)?
        .into_iter()
        // The scheduled hour, not the minute: the oracle's cut is by `time_hour`.
        .filter(|f| f.timestamp_ms - f.timestamp_ms.rem_euclid(3_600_000) < cut)
        .collect();
    let oracle = weather_flights(&csv, before)?;
    assert_eq!(
        records.len(),
        oracle.len(),
        "the same flights on both sides"
    );
    Ok((records, oracle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_weather_equals_the_oracle_over_the_broker_exactly_once() -> anyhow::Result<()> {
    let _one_at_a_time = FULL_FLIGHT_RUNS.lock().await;
    init_tracing();
    let before = tiered("2013-01-03T00:00:00Z", "2014-01-02T00:00:00Z");
    let (flights, oracle_flights) = flights_before(before)?;
    let data = flights_csv();
    let want = flight_weather_oracle(
        &oracle_flights,
        &manufacturers(&data.with_file_name("planes.csv"))?,
        &visibilities(&data.with_file_name("weather.csv"))?,
    );
    let t = topics_with_tables().await?;
    weir_cli::flights::produce(&kafka_bootstrap(), &t.flights, &flights).await?;
    let settings = pipeline_settings(&t).await?;
    let started = std::time::Instant::now();
    let mut running = RunningStages::start(&settings)?;
    let out = running
        .while_running(read_exactly(
            &t.stats,
            2 * flights.len(),
            Duration::from_secs(1200),
            Duration::from_secs(3),
        ))
        .await?;
    println!(
        "flight-weather: {} flights → {} statistics of {} groups in {:.2?} (debug-profile host, real broker)",
        flights.len(),
        out.len(),
        want.len(),
        started.elapsed()
    );
    running.stop().await?;
    let dead = read_exactly(&t.dlq, 0, Duration::from_secs(1), Duration::from_secs(1)).await?;
    assert!(dead.is_empty(), "{} dead letters", dead.len());
    check_flight_weather(&out, &want)
}

/// A produced flight as the oracle reads it.
fn as_oracle(flight: &weir_cli::flights::FlightRecord) -> WeatherFlight {
    let v: serde_json::Value = serde_json::from_slice(&flight.json).expect("a flight's JSON");
    WeatherFlight {
        hour_key: format!(
            "{}|{}",
            v["origin"].as_str().unwrap_or_default(),
            v["time_hour"].as_str().unwrap_or_default()
        ),
        tailnum: v["tailnum"].as_str().map(str::to_owned),
        arr_delay: v["arr_delay"].as_i64(),
    }
}

/// Half the flights, their outputs awaited, then a new weather row for an hour that has
/// flights on both sides of the split, applied and checkpointed by `enrich`, then the rest:
/// the flights of that hour before the update count under its old visibility, those after
/// under the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weather_update_is_seen_by_the_later_flights_and_not_by_the_earlier() -> anyhow::Result<()>
{
    init_tracing();
    let (flights, _) = flights_before("2013-01-02T00:00:00Z")?;
    let oracle: Vec<WeatherFlight> = flights.iter().map(as_oracle).collect();
    // The busiest hour key; the split after its second flight.
    let mut per_hour: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, f) in oracle.iter().enumerate() {
        per_hour.entry(&f.hour_key).or_default().push(i);
    }
    let (hour, at) = per_hour
        .iter()
        .max_by_key(|(_, at)| at.len())
        .expect("flights");
    anyhow::ensure!(at.len() >= 4, "the busiest hour has {} flights", at.len());
    let (hour, split) = ((*hour).to_owned(), at[1] + 1);
    let data = flights_csv();
    let makers = manufacturers(&data.with_file_name("planes.csv"))?;
    let mut visibility = visibilities(&data.with_file_name("weather.csv"))?;
    let mut want = flight_weather_oracle(&oracle[..split], &makers, &visibility);
    visibility.insert(hour.clone(), "0.01".to_owned());
    for (group, (n, count, sum)) in flight_weather_oracle(&oracle[split..], &makers, &visibility) {
        let entry = want.entry(group).or_default();
        entry.0 += n;
        entry.1 += count;
        entry.2 += sum;
    }

    let t = topics_with_tables().await?;
    let settings = pipeline_settings(&t).await?;
    let enrich_group = weir_host::config::stages::run_name(&settings.pipeline.group_id(), "enrich");
    let mut running = RunningStages::start(&settings)?;
    weir_cli::flights::produce(&kafka_bootstrap(), &t.flights, &flights[..split]).await?;
    let first = running
        .while_running(read_exactly(
            &t.stats,
            2 * split,
            Duration::from_secs(120),
            Duration::ZERO,
        ))
        .await?;
    anyhow::ensure!(first.len() == 2 * split);
    // The hour's new row (visibility 0.01 miles: no other row has it), in the weather
    // partition the hour's flights meet it in; awaited until `enrich` checkpointed past it.
    let (origin, time_hour) = hour.split_once('|').expect("origin|time_hour");
    let row = weir_cli::tables::TableRow {
        key: hour.clone(),
        json: serde_json::to_vec(&serde_json::json!({
            "origin": origin, "time_hour": time_hour, "visib": 0.01
        }))?,
    };
    weir_cli::tables::produce_table(&kafka_bootstrap(), &t.weather, 4, &[row]).await?;
    let partition = java_partition(hour.as_bytes(), 4) as usize;
    let end = high_watermarks(&t.weather, 4)?[partition];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while committed_offsets(&enrich_group, &t.weather, 4)?[partition] != Some(end) {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the weather update was not checkpointed in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    weir_cli::flights::produce(&kafka_bootstrap(), &t.flights, &flights[split..]).await?;
    let out = running
        .while_running(read_exactly(
            &t.stats,
            2 * flights.len(),
            Duration::from_secs(120),
            Duration::from_secs(2),
        ))
        .await?;
    running.stop().await?;
    assert!(
        want.contains_key("visibility=0.01"),
        "the later flights of {hour} count under the update"
    );
    check_flight_weather(&out, &want)
}
