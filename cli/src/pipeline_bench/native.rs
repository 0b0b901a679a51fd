//! The `weir bench` workloads' logic compiled into the host (the no-Wasm baseline): the
//! `counter` guest's and the `flight-delays` example's.

use serde::{Deserialize, Serialize};
use weir_host::runtime::bindings::{StateDescriptor, StateKind};
use weir_host::runtime::native::{NativeContext, NativeOperator, Rejected};
use weir_host::runtime::{InputRecord, OperatorInfo};

fn value_state(name: &str) -> StateDescriptor {
    StateDescriptor {
        name: name.to_owned(),
        kind: StateKind::Value,
        ttl_ms: None,
        version: 0,
    }
}

/// The `counter` guest's logic (tests/guests/counter, poison values aside) compiled into the
/// host: `count[key] += 1` as JSON, emitting `{"count": n, "offset": o}`.
#[derive(Debug)]
pub struct NativeCounter;

impl NativeOperator for NativeCounter {
    fn describe(&self) -> OperatorInfo {
        OperatorInfo {
            name: "counter".into(),
            version: "0.1.0".into(),
            states: vec![value_state("count")],
            outputs: Vec::new(),
        }
    }

    fn process(&self, ctx: &mut NativeContext<'_>, record: &InputRecord) -> Result<(), Rejected> {
        let count: u64 = match ctx.value_get("count") {
            Some(bytes) => serde_json::from_slice(&bytes)?,
            None => 0,
        } + 1;
        ctx.value_set("count", serde_json::to_vec(&count)?);
        #[derive(Serialize)]
        struct Output {
            count: u64,
            offset: i64,
        }
        let out = serde_json::to_vec(&Output {
            count,
            offset: record.offset,
        })?;
        ctx.emit(&record.key, out);
        Ok(())
    }
}

/// The `flight-delays` example's logic compiled into the host: per route, flights and the
/// count, sum, maximum and mean of the arrival delay, as JSON state and output.
#[derive(Debug)]
pub struct NativeFlightDelays;

#[derive(Debug, Default, Serialize, Deserialize)]
struct RouteStats {
    flights: u64,
    delay_count: u64,
    delay_sum: i64,
    delay_max: Option<i64>,
}

impl NativeOperator for NativeFlightDelays {
    fn describe(&self) -> OperatorInfo {
        OperatorInfo {
            name: "flight-delays".into(),
            version: "0.1.0".into(),
            states: vec![value_state("route-stats")],
            outputs: Vec::new(),
        }
    }

    fn process(&self, ctx: &mut NativeContext<'_>, record: &InputRecord) -> Result<(), Rejected> {
        #[derive(Deserialize)]
        struct Flight {
            origin: String,
            dest: String,
            arr_delay: Option<i64>,
        }
        #[derive(Serialize)]
        struct Output<'a> {
            route: &'a str,
            flights: u64,
            delay_count: u64,
            delay_sum: i64,
            delay_max: Option<i64>,
            delay_mean: Option<f64>,
        }
        let flight: Flight = serde_json::from_slice(&record.value)?;
        let mut stats: RouteStats = match ctx.value_get("route-stats") {
            Some(bytes) => serde_json::from_slice(&bytes)?,
            None => RouteStats::default(),
        };
        stats.flights += 1;
        if let Some(delay) = flight.arr_delay {
            stats.delay_count += 1;
            stats.delay_sum += delay;
            stats.delay_max = Some(stats.delay_max.map_or(delay, |max| max.max(delay)));
        }
        ctx.value_set("route-stats", serde_json::to_vec(&stats)?);
        let route = format!("{}-{}", flight.origin, flight.dest);
        let mean =
            (stats.delay_count > 0).then(|| stats.delay_sum as f64 / stats.delay_count as f64);
        let out = serde_json::to_vec(&Output {
            route: &route,
            flights: stats.flights,
            delay_count: stats.delay_count,
            delay_sum: stats.delay_sum,
            delay_max: stats.delay_max,
            delay_mean: mean,
        })?;
        ctx.emit(&record.key, out);
        Ok(())
    }
}
