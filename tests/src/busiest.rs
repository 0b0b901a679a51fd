//! The oracle of `examples/busiest-origin` (docs/topologies.md) and the check of its outputs,
//! for the tests that run it: per hour of scheduled departure, the origin with the most flights
//! that departed (ties to the smallest code), and the flights that left more than an hour late.

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use std::collections::BTreeMap;
use std::time::Duration;

const HOUR_MS: i64 = 3_600_000;

/// A flight that left late, as both sides name it: (origin, carrier, flight, departure ms).
pub type LateFlight = (String, String, i64, i64);

/// Per hour start (ms), the busiest origin and its departures.
pub type Busiest = BTreeMap<i64, (String, u64)>;

/// Each late departure and how often it occurs.
pub type LateFlights = BTreeMap<LateFlight, usize>;

/// One flight as the oracle needs it.
#[derive(Debug, Clone)]
pub struct OracleFlight {
    /// Its origin airport.
    pub origin: String,
    /// Scheduled departure, ms since the Unix epoch.
    pub departure_ms: i64,
    /// It departed (a `dep_time`).
    pub departed: bool,
    /// Its departure delay, minutes, if known.
    pub dep_delay: Option<i64>,
    /// Carrier and flight number.
    pub flight: (String, i64),
}

/// The loader's flights (keyed by origin, timestamped with their scheduled departure) as the
/// oracle reads them.
///
/// # Errors
/// A flight whose JSON does not parse.
pub fn oracle_flights(
    flights: &[weir_cli::flights::FlightRecord],
) -> anyhow::Result<Vec<OracleFlight>> {
    flights
        .iter()
        .map(|f| {
            let v: serde_json::Value = serde_json::from_slice(&f.json)?;
            Ok(OracleFlight {
                origin: f.key.clone(),
                departure_ms: f.timestamp_ms,
                departed: v["dep_time"].is_i64(),
                dep_delay: v["dep_delay"].as_i64(),
                flight: (
                    v["carrier"].as_str().unwrap_or_default().to_owned(),
                    v["flight"].as_i64().unwrap_or_default(),
                ),
            })
        })
        .collect()
}

/// Per hour start, the busiest origin and its departures; and every flight with a departure
/// delay over 60 minutes, counted.
pub fn busiest_oracle(flights: &[OracleFlight]) -> (Busiest, LateFlights) {
    let mut per_hour: BTreeMap<i64, BTreeMap<&str, u64>> = BTreeMap::new();
    let mut late = BTreeMap::new();
    for f in flights {
        if f.departed {
            let hour = f.departure_ms - f.departure_ms.rem_euclid(HOUR_MS);
            *per_hour
                .entry(hour)
                .or_default()
                .entry(&f.origin)
                .or_default() += 1;
        }
        if f.dep_delay.is_some_and(|d| d > 60) {
            let (carrier, number) = f.flight.clone();
            let key = (f.origin.clone(), carrier, number, f.departure_ms);
            *late.entry(key).or_default() += 1;
        }
    }
    let busiest = per_hour
        .into_iter()
        .filter_map(|(hour, origins)| {
            let mut best: Option<(&str, u64)> = None;
            for (origin, n) in origins {
                // Ascending codes: only a larger count replaces the best.
                if best.is_none_or(|(_, m)| n > m) {
                    best = Some((origin, n));
                }
            }
            best.map(|(origin, n)| (hour, (origin.to_owned(), n)))
        })
        .collect();
    (busiest, late)
}

/// A `weir run` of `busiest-origin` on new topics: flights into `input` (4 partitions), results
/// to `busiest`, late departures to `late`.
#[derive(Debug)]
pub struct BusiestTopics {
    /// The flights' topic.
    pub input: String,
    /// The second stage's results.
    pub busiest: String,
    /// The first stage's named output `late-departures`.
    pub late: String,
}

/// New topics for `busiest-origin` named after `prefix`, and a `weir run` config over them:
/// exactly-once, both stages (`busiest_stages_toml`, in departure order), `lsm` on a new bucket.
///
/// # Errors
/// When the topics or the bucket cannot be created.
pub async fn busiest_process_config(
    prefix: &str,
) -> anyhow::Result<(BusiestTopics, crate::process::CounterConfig)> {
    use crate::unique;
    let (input, busiest, late, dlq) = (
        unique(&format!("{prefix}-in")),
        unique(&format!("{prefix}-out")),
        unique(&format!("{prefix}-late")),
        unique(&format!("{prefix}-dlq")),
    );
    crate::create_topics(&[(&input, 4), (&busiest, 2), (&late, 2), (&dlq, 1)]).await?;
    let mut config = crate::process::CounterConfig::new(&input, &busiest, &dlq).await?;
    config.exactly_once = true;
    let guests = crate::guest("busiest_origin_top");
    config.stages = busiest_stages_toml(
        guests.parent().expect("the guests' directory"),
        &input,
        (&busiest, &late),
        "0s",
    );
    let topics = BusiestTopics {
        input,
        busiest,
        late,
    };
    Ok((topics, config))
}

/// Reads exactly the outputs the oracle expects of `busiest-origin` (read_committed): `want`'s
/// hours from `busiest` (within 3 minutes, then nothing more for 5 s), `want_late`'s late
/// departures from `late`.
///
/// # Errors
/// Fewer or more records than the oracle's.
pub async fn read_busiest(
    (busiest, late): (&str, &str),
    (want, want_late): (&Busiest, &LateFlights),
) -> anyhow::Result<(Vec<OwnedMessage>, Vec<OwnedMessage>)> {
    let hours = crate::read_exactly(
        busiest,
        want.len(),
        Duration::from_secs(180),
        Duration::from_secs(5),
    )
    .await?;
    let late = crate::read_exactly(
        late,
        want_late.values().sum(),
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await?;
    Ok((hours, late))
}

/// Checks the outputs of `busiest-origin` (`busiest`: the second stage's; `late`: the
/// `late-departures` topic's) against the oracle: each hour once, keyed by the hour, equal to
/// `want`; every late departure once, with its key, flight and timestamp.
///
/// # Panics
/// On the first difference, naming `what`.
///
/// # Errors
/// An output that is not JSON.
pub fn check_busiest(
    what: &str,
    (busiest, late): (&[OwnedMessage], &[OwnedMessage]),
    (want, want_late): (&Busiest, &LateFlights),
) -> anyhow::Result<()> {
    let mut got = BTreeMap::new();
    for msg in busiest {
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
    for (hour, want) in want {
        assert_eq!(got.get(hour), Some(want), "{what}: hour {hour}");
    }
    let mut got_late = LateFlights::new();
    for msg in late {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let flight = (
            String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned(),
            v["carrier"].as_str().unwrap_or_default().to_owned(),
            v["flight"].as_i64().unwrap_or_default(),
            msg.timestamp().to_millis().unwrap_or(-1),
        );
        *got_late.entry(flight).or_default() += 1;
    }
    assert_eq!(&got_late, want_late, "{what}: late departures");
    Ok(())
}

/// The `[[pipeline.stages]]` of `busiest-origin` over `input`, its results to `busiest` and its
/// late departures to `late`, each stage's component from `guests`; the first stage's
/// `max_out_of_orderness` is `disorder` (humantime).
pub fn busiest_stages_toml(
    guests: &std::path::Path,
    input: &str,
    (busiest, late): (&str, &str),
    disorder: &str,
) -> String {
    format!(
        r#"[[pipeline.stages]]
name = "departures"
operator = "{departures}"
inputs = [{{ topic = "{input}" }}]
outputs = {{ late-departures = {{ topic = "{late}" }} }}
max_out_of_orderness = "{disorder}"

[[pipeline.stages]]
name = "top"
operator = "{top}"
inputs = [{{ stage = "departures" }}]
outputs = {{ default = {{ topic = "{busiest}" }} }}
max_out_of_orderness = "0s"
idle_advance = false
"#,
        departures = guests.join("busiest_origin_departures.wasm").display(),
        top = guests.join("busiest_origin_top.wasm").display(),
    )
}
