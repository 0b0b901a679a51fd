use weir_sdk::{Context, Operator, Record, Reject, StateSpec, ValueState};

/// Counts records per key and emits `{"count": n}` for each one.
struct Counter;

const COUNT: ValueState<u64> = ValueState::new("count");

impl Operator for Counter {
    const NAME: &'static str = "counter";
    const VERSION: &'static str = "1.0.0";
    const STATES: &'static [StateSpec] = &[COUNT.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let count = ctx.get(&COUNT)?.unwrap_or(0) + 1;
        ctx.set(&COUNT, &count)?;
        ctx.emit_json(record.key(), &serde_json::json!({ "count": count }))?;
        Ok(())
    }
}

weir_sdk::export_operator!(Counter);
