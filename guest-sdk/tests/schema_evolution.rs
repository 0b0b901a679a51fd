//! Schema evolution of a state (SCENARIOS.md S12, issue 20 item 6): an operator whose `count`
//! held a plain number switches to one whose `count` is `{count, last_seen_ms}` at schema
//! version 1 with an upgrade from version 0. Old values are upgraded as they are read and
//! written back at version 1 by the next write; an operator that reads an older schema version
//! refuses a newer value (the record fails, nothing is misread).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use weir_sdk::testing::Harness;
use weir_sdk::{Context, Operator, Record, Reject, StateSpec, ValueState};

const COUNT_V0: ValueState<u64> = ValueState::new("count");

struct CounterV1;

impl Operator for CounterV1 {
    const NAME: &'static str = "counter";
    const VERSION: &'static str = "1.0.0";
    const STATES: &'static [StateSpec] = &[COUNT_V0.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let count = ctx.get(&COUNT_V0)?.unwrap_or(0) + 1;
        ctx.set(&COUNT_V0, &count)?;
        ctx.emit_json(record.key(), &json!({ "count": count }))
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Count {
    count: u64,
    last_seen_ms: i64,
}

/// Version 0 stored the count alone; it had no time (-1).
fn upgrade(from: u32, value: Value) -> Result<Value, String> {
    match from {
        0 => Ok(json!({ "count": value, "last_seen_ms": -1 })),
        other => Err(format!("no upgrade from schema version {other}")),
    }
}

const COUNT_V1: ValueState<Count> = ValueState::new("count").versioned(1, upgrade);

struct CounterV2;

impl Operator for CounterV2 {
    const NAME: &'static str = "counter";
    const VERSION: &'static str = "2.0.0";
    const STATES: &'static [StateSpec] = &[COUNT_V1.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let mut state = ctx.get(&COUNT_V1)?.unwrap_or(Count {
            count: 0,
            last_seen_ms: -1,
        });
        state.count += 1;
        state.last_seen_ms = record.timestamp_ms();
        ctx.set(&COUNT_V1, &state)?;
        ctx.emit_json(record.key(), &json!({ "count": state.count }))
    }
}

#[test]
fn counts_carry_over_a_switch_that_upgrades_the_states_schema_as_values_are_read() {
    let mut v1 = Harness::<CounterV1>::new();
    for _ in 0..3 {
        assert!(v1.send(b"a", b"").is_ok());
    }
    assert!(v1.send(b"b", b"").is_ok());
    assert_eq!(CounterV2::STATES[0].version, 1);

    let mut v2 = v1.switch::<CounterV2>();
    // `b` is not read after the switch: its value stays at version 0 (nothing rewrites it).
    assert_eq!(
        v2.value(b"b", &COUNT_V1),
        Some(Count {
            count: 1,
            last_seen_ms: -1
        })
    );
    let out = v2.send_at(b"a", b"", 1_000);
    assert!(out.is_ok(), "{:?}", out.reason);
    assert_eq!(
        v2.value(b"a", &COUNT_V1),
        Some(Count {
            count: 4,
            last_seen_ms: 1_000
        })
    );

    // Back to the operator that reads schema version 0: `a`, now at version 1, is refused;
    // `b`, still at version 0, is read.
    let mut back = v2.switch::<CounterV1>();
    let refused = back.send(b"a", b"");
    let reason = refused.reason.expect("a newer value is refused");
    assert!(
        reason.contains("state `count`") && reason.contains("schema version 1"),
        "{reason}"
    );
    assert!(back.send(b"b", b"").is_ok());
    assert_eq!(back.value(b"b", &COUNT_V0), Some(2));
}
