//! `join`, a test fixture of the SDK's join helpers run by the host (docs/topologies.md,
//! "Joins"): input 0 is the left side, input 1 the right; each record's value is JSON; for
//! every record of the other side it joins it emits `{"l": L, "r": R}` (the two values) under
//! its key, and `{"dropped": true}` when the helper dropped it (behind the watermark).
//!
//! Parameters: `join` = `window` (with `size_ms`) or `interval` (with `lower_ms` and
//! `upper_ms`); both keep the map state `j`. Or `join` = `lookup` (with `table` and `field`):
//! a stream–global-table enrichment, keeping no state — each record's value is looked up in
//! the global table `table` by the string in its JSON field `field`, and `{"l": value, "r":
//! row}` is emitted, `row` the table's JSON row or `null` when it has none. Or `join` =
//! `enrich`, bench/kstreams-compare's enrichment: each record (an order, JSON with an `item`
//! field) with its key's row of the co-partitioned table in value state `c` and its item's row
//! of the global table `items`, emitted as `{"o":order,"c":row,"i":row}` (`null` for a row
//! missing) by concatenating the bytes, as the Kafka Streams side does. Or `join` =
//! `window-bytes` (with `size_ms`), bench/kstreams-compare's window join: `window` over the
//! values as they are (serde_json's `RawValue`: checked to be JSON, never parsed into a tree,
//! stored as the same bytes when they are compact), each result `{"l":L,"r":R}` made by
//! concatenating bytes, as the Kafka Streams side does.

use serde_json::Value;
use serde_json::value::RawValue;
use weir_sdk::join::{IntervalJoin, Joined, WindowJoin};
use weir_sdk::{Context, Operator, Record, Reject, StateKind, StateSpec, Timer, ValueState};

/// `join=enrich`'s table state: the row of the record's key.
const CUSTOMER: ValueState<Value> = ValueState::new("c");

/// The operator.
#[derive(Debug)]
pub struct Join;

/// The helper the parameters name.
enum Helper {
    Window(WindowJoin<Value, Value>),
    Interval(IntervalJoin<Value, Value>),
}

/// A JSON value kept as its bytes (`join=window-bytes`).
type Raw = Box<RawValue>;

/// The parameter `name` as ms, or a rejection naming it.
fn ms(ctx: &Context, name: &str) -> Result<i64, Reject> {
    let text = ctx.parameter(name).unwrap_or_default();
    text.parse()
        .map_err(|_| Reject::new(format!("parameter {name} must be ms, not `{text}`")))
}

/// The parameter `size_ms`: a window's length.
fn window_size(ctx: &Context) -> Result<i64, Reject> {
    let size = ms(ctx, "size_ms")?;
    if size <= 0 {
        return Err(Reject::new("parameter size_ms must be positive"));
    }
    Ok(size)
}

fn helper(ctx: &Context) -> Result<Helper, Reject> {
    match ctx.parameter("join").as_deref() {
        Some("window") => Ok(Helper::Window(WindowJoin::new("j", window_size(ctx)?))),
        Some("interval") => {
            let (lower, upper) = (ms(ctx, "lower_ms")?, ms(ctx, "upper_ms")?);
            if lower > upper {
                return Err(Reject::new("parameter lower_ms must be at most upper_ms"));
            }
            Ok(Helper::Interval(IntervalJoin::new("j", lower, upper)))
        }
        other => Err(Reject::new(format!(
            "parameter join must be `window` or `interval`, not {other:?}"
        ))),
    }
}

impl Operator for Join {
    const NAME: &'static str = "join";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[
        StateSpec {
            name: "j",
            kind: StateKind::Map,
            ttl_ms: None,
            version: 0,
        },
        CUSTOMER.spec(),
    ];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let mode = ctx.parameter("join");
        match mode.as_deref() {
            Some("enrich") => return enrich(ctx, record),
            Some("window-bytes") => return window_bytes(ctx, record),
            _ => {}
        }
        let value: Value = serde_json::from_slice(record.value())?;
        if mode.as_deref() == Some("lookup") {
            return lookup(ctx, record, &value);
        }
        let ts = record.timestamp_ms();
        let left = record.input() == 0;
        let joined: Joined<Value> = match (helper(ctx)?, left) {
            (Helper::Window(j), true) => j.left(ctx, &value, ts)?,
            (Helper::Window(j), false) => j.right(ctx, &value, ts)?,
            (Helper::Interval(j), true) => j.left(ctx, &value, ts)?,
            (Helper::Interval(j), false) => j.right(ctx, &value, ts)?,
        };
        for other in &joined.matches {
            let (l, r) = if left {
                (&value, other)
            } else {
                (other, &value)
            };
            ctx.emit_json(record.key(), &serde_json::json!({ "l": l, "r": r }))?;
        }
        if joined.dropped {
            ctx.emit_json(record.key(), &serde_json::json!({ "dropped": true }))?;
        }
        Ok(())
    }

    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        if ctx.parameter("join").as_deref() == Some("window-bytes") {
            WindowJoin::<Raw, Raw>::new("j", window_size(ctx)?).on_timer(ctx, timer)?;
            return Ok(());
        }
        match helper(ctx)? {
            Helper::Window(j) => j.on_timer(ctx, timer)?,
            Helper::Interval(j) => j.on_timer(ctx, timer)?,
        };
        Ok(())
    }
}

/// The value of the JSON string field `"item":"…"` of `order`, found by its bytes.
fn item_of(order: &[u8]) -> Option<&[u8]> {
    const FIELD: &[u8] = b"\"item\":\"";
    let start = order.windows(FIELD.len()).position(|w| w == FIELD)? + FIELD.len();
    let len = order[start..].iter().position(|b| *b == b'"')?;
    Some(&order[start..start + len])
}

/// `join=enrich`: the order with its customer's and its item's rows.
fn enrich(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
    let order = record.value();
    let customer = ctx.get_bytes(&CUSTOMER)?;
    let item = match item_of(order) {
        Some(item) => ctx.lookup_bytes("items", item)?,
        None => None,
    };
    let (customer, item) = (
        customer.as_deref().unwrap_or(b"null"),
        item.as_deref().unwrap_or(b"null"),
    );
    let mut out = Vec::with_capacity(order.len() + customer.len() + item.len() + 16);
    out.extend_from_slice(b"{\"o\":");
    out.extend_from_slice(order);
    out.extend_from_slice(b",\"c\":");
    out.extend_from_slice(customer);
    out.extend_from_slice(b",\"i\":");
    out.extend_from_slice(item);
    out.push(b'}');
    ctx.emit(record.key(), &out)
}

/// `join=window-bytes`: the record joined with the other side's records of its window, each
/// pair emitted as `{"l":L,"r":R}` from the values' bytes.
fn window_bytes(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
    let join = WindowJoin::<Raw, Raw>::new("j", window_size(ctx)?);
    let text = std::str::from_utf8(record.value())
        .map_err(|_| Reject::new("the record's value is not UTF-8"))?;
    let value = RawValue::from_string(text.to_owned())?;
    let left = record.input() == 0;
    let joined = if left {
        join.left(ctx, &value, record.timestamp_ms())?
    } else {
        join.right(ctx, &value, record.timestamp_ms())?
    };
    let mut out = Vec::new();
    for other in &joined.matches {
        let (l, r) = if left {
            (value.get(), other.get())
        } else {
            (other.get(), value.get())
        };
        out.clear();
        out.extend_from_slice(b"{\"l\":");
        out.extend_from_slice(l.as_bytes());
        out.extend_from_slice(b",\"r\":");
        out.extend_from_slice(r.as_bytes());
        out.push(b'}');
        ctx.emit(record.key(), &out)?;
    }
    if joined.dropped {
        ctx.emit(record.key(), br#"{"dropped":true}"#)?;
    }
    Ok(())
}

/// `join=lookup`: `value` enriched from the global table by its field.
fn lookup(ctx: &mut Context, record: &Record, value: &Value) -> Result<(), Reject> {
    let (Some(table), Some(field)) = (ctx.parameter("table"), ctx.parameter("field")) else {
        return Err(Reject::new(
            "join=lookup needs the parameters table and field",
        ));
    };
    let Some(key) = value.get(&field).and_then(Value::as_str) else {
        return Err(Reject::new(format!(
            "the record has no string field `{field}`"
        )));
    };
    let row: Option<Value> = ctx.lookup(&table, key.as_bytes())?;
    ctx.emit_json(record.key(), &serde_json::json!({ "l": value, "r": row }))
}

weir_sdk::export_operator!(Join);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_sdk::testing::Harness;

    /// The parameters pick the helper; without them every record is rejected, naming them.
    #[test]
    fn the_parameters_pick_the_join_and_missing_ones_reject_naming_them() {
        let mut h = Harness::<Join>::new().with_parameters(&[
            ("join", "interval"),
            ("lower_ms", "0"),
            ("upper_ms", "5"),
        ]);
        assert!(h.send_from(1, b"a", br#"{"bid":1}"#, 12).is_ok());
        let out = h.send_from(0, b"a", br#"{"auction":7}"#, 10);
        assert_eq!(
            out.emitted[0].value,
            br#"{"l":{"auction":7},"r":{"bid":1}}"#.as_slice()
        );
        let mut lookup = Harness::<Join>::new()
            .with_parameters(&[
                ("join", "lookup"),
                ("table", "planes"),
                ("field", "tailnum"),
            ])
            .with_global_table("planes", &[(b"N1", br#"{"maker":"BOEING"}"#)]);
        let out = lookup.send(b"f1", br#"{"tailnum":"N1"}"#);
        assert_eq!(
            out.emitted[0].value,
            br#"{"l":{"tailnum":"N1"},"r":{"maker":"BOEING"}}"#.as_slice()
        );
        lookup.set_global_row("planes", b"N1", None);
        let out = lookup.send(b"f2", br#"{"tailnum":"N1"}"#);
        assert_eq!(
            out.emitted[0].value,
            br#"{"l":{"tailnum":"N1"},"r":null}"#.as_slice()
        );
        let mut enrich = Harness::<Join>::new()
            .with_parameters(&[("join", "enrich")])
            .with_global_table("items", &[(b"sku-00007", br#"{"w":3}"#)]);
        let out = enrich.send(b"key-1", br#"{"order":1,"item":"sku-00007"}"#);
        assert_eq!(
            out.emitted[0].value,
            br#"{"o":{"order":1,"item":"sku-00007"},"c":null,"i":{"w":3}}"#.as_slice()
        );
        let mut bare = Harness::<Join>::new();
        let out = bare.send_from(0, b"a", b"{}", 1);
        assert!(out.reason.is_some_and(|r| r.contains("parameter join")));
    }

    /// `window-bytes` pairs the values' own bytes (spaces kept) within a window, drops nothing
    /// in an open window, and forgets a window once the watermark closes it.
    #[test]
    fn window_bytes_joins_the_values_as_they_are_within_a_window() {
        let mut h =
            Harness::<Join>::new().with_parameters(&[("join", "window-bytes"), ("size_ms", "10")]);
        assert!(h.send_from(0, b"k", br#"{"a": 1}"#, 10).emitted.is_empty());
        let out = h.send_from(1, b"k", br#"{"b":2}"#, 19);
        assert_eq!(out.emitted.len(), 1);
        assert_eq!(
            out.emitted[0].value,
            br#"{"l":{"a": 1},"r":{"b":2}}"#.as_slice()
        );
        // The next window: nothing of the first to join.
        assert!(h.send_from(1, b"k", br#"{"b":3}"#, 20).emitted.is_empty());
        h.advance_watermark(19);
        let left: Vec<_> = h.map_bytes(b"k", "j").into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            left,
            [br#"[20,"r"]"#.to_vec()],
            "the first window's records are gone"
        );
        let out = h.send_from(0, b"k", br#"[5]"#, 18);
        assert_eq!(out.emitted[0].value, br#"{"dropped":true}"#.as_slice());
        let out = h.send_from(0, b"k", b"not json", 25);
        assert!(out.reason.is_some());
    }
}
