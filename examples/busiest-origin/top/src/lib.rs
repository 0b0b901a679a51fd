//! `busiest-origin`'s second stage (`top`): per hour, the origin with the most departures (ties
//! to the smallest airport code), emitted once the watermark passes the hour. It reads the
//! first stage (`busiest-origin-departures`) through an internal topic keyed by the hour, so it
//! is right only if the first stage's watermark crosses the repartition: with its own
//! `max_out_of_orderness` at 0 its windows close on the propagated watermark alone
//! (docs/topologies.md).
//!
//! Input: `{"origin","hour_start_ms","departures"}` keyed by the hour's start, timestamped with
//! its last millisecond. Output: key the hour's start, value
//! `{"hour_start_ms","origin","departures"}`. State: the map state `origins` (origin →
//! departures) of each open hour, and its timer `close`.

use serde::{Deserialize, Serialize};
use weir_sdk::{Context, MapState, Operator, Record, Reject, StateSpec, TimeDomain, Timer};

/// The operator.
#[derive(Debug)]
pub struct Top;

/// One origin's departures in one hour, as the first stage sends it.
#[derive(Debug, Deserialize)]
struct HourCount {
    origin: String,
    departures: u64,
}

/// What is emitted per hour.
#[derive(Debug, Serialize)]
struct Busiest<'a> {
    hour_start_ms: i64,
    origin: &'a str,
    departures: u64,
}

/// Each open hour's departures per origin.
pub const ORIGINS: MapState<String, u64> = MapState::new("origins");

/// The timer that closes an hour.
const CLOSE: &str = "close";

impl Operator for Top {
    const NAME: &'static str = "busiest-origin-top";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[ORIGINS.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let count: HourCount = serde_json::from_slice(record.value())?;
        if ctx.watermark().is_some_and(|w| record.timestamp_ms() <= w) {
            return Err(Reject::new(format!(
                "the count of {} came after its hour closed",
                count.origin
            )));
        }
        // A put, not an add: a count that crossed the edge twice changes nothing.
        ctx.map_put(&ORIGINS, &count.origin, &count.departures)?;
        ctx.set_timer(CLOSE, record.timestamp_ms(), TimeDomain::EventTime)
    }

    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        let origins = ctx.map_entries(&ORIGINS)?;
        let busiest = origins
            .iter()
            .max_by(|(a, n), (b, m)| n.cmp(m).then_with(|| b.cmp(a)));
        if let Some((origin, departures)) = busiest {
            let hour_start_ms = std::str::from_utf8(&timer.key)
                .ok()
                .and_then(|k| k.parse().ok())
                .ok_or_else(|| Reject::new("the key is not an hour"))?;
            let value = serde_json::to_vec(&Busiest {
                hour_start_ms,
                origin,
                departures: *departures,
            })?;
            ctx.emit(&timer.key, &value)?;
        }
        for (origin, _) in &origins {
            ctx.map_remove(&ORIGINS, origin)?;
        }
        Ok(())
    }
}

// Exported in the component only: a native build (its unit tests) has no host to link to.
#[cfg(target_arch = "wasm32")]
weir_sdk::export_operator!(Top);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_sdk::testing::Harness;

    /// The origin with the most departures wins, ties to the smallest code, once the
    /// watermark passes the hour; nothing of the hour stays.
    #[test]
    fn the_busiest_origin_wins_ties_to_the_smallest_code() {
        let mut h = Harness::<Top>::new();
        let end = 3_600_000 - 1;
        for (origin, n) in [("LGA", 7), ("EWR", 9), ("JFK", 9), ("LGA", 8)] {
            let value = format!(r#"{{"origin":"{origin}","hour_start_ms":0,"departures":{n}}}"#);
            assert!(h.send_at(b"0", value.as_bytes(), end).is_ok());
        }
        assert!(
            h.advance_watermark(end - 1).is_empty(),
            "open until its last ms"
        );
        let fired = h.advance_watermark(end);
        let v: serde_json::Value =
            serde_json::from_slice(&fired[0].1.emitted[0].value).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"hour_start_ms":0,"origin":"EWR","departures":9})
        );
        assert!(h.map(b"0", &ORIGINS).is_empty());
        let late = h.send_at(
            b"0",
            br#"{"origin":"EWR","hour_start_ms":0,"departures":1}"#,
            end,
        );
        assert!(
            late.reason
                .is_some_and(|r| r.contains("after its hour closed"))
        );
    }
}
