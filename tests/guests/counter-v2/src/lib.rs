//! `counter` v2, SCENARIOS.md S12's upgrade that changes the state format: `count` was a plain
//! number (the `counter` fixture, schema version 0) and is now `{count, last_seen_ms}` at schema
//! version 1, upgraded from version 0 as each key's value is read (issue 20, item 6). It adds
//! 10 per record (so that a test tells its counts from `counter`'s, as issue 20's savepoint
//! acceptance asks) and emits `{"count": n, "offset": o}` per record, as `counter` does.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use weir_sdk::{Context, Operator, Record, Reject, StateSpec, ValueState};

/// The operator.
#[derive(Debug)]
pub struct CounterV2;

/// One key's count and the timestamp of its last record (-1: none, or counted before v2).
#[derive(Debug, Serialize, Deserialize)]
struct Count {
    count: u64,
    last_seen_ms: i64,
}

/// Version 0 held the count alone.
fn upgrade(from: u32, value: Value) -> Result<Value, String> {
    match from {
        0 => Ok(json!({ "count": value, "last_seen_ms": -1 })),
        other => Err(format!("no upgrade from schema version {other}")),
    }
}

/// What each record adds.
const STEP: u64 = 10;

const COUNT: ValueState<Count> = ValueState::new("count").versioned(1, upgrade);

#[derive(Serialize)]
struct Output {
    count: u64,
    offset: i64,
}

impl Operator for CounterV2 {
    const NAME: &'static str = "counter";
    const VERSION: &'static str = "0.2.0";
    const STATES: &'static [StateSpec] = &[COUNT.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let mut state = ctx.get(&COUNT)?.unwrap_or(Count {
            count: 0,
            last_seen_ms: -1,
        });
        state.count += STEP;
        state.last_seen_ms = record.timestamp_ms();
        ctx.set(&COUNT, &state)?;
        ctx.emit_json(
            record.key(),
            &Output {
                count: state.count,
                offset: record.offset(),
            },
        )
    }
}

weir_sdk::export_operator!(CounterV2);
