//! The join helpers through the Rust harness, driving a stage's two inputs: the shared test
//! vectors (the Python SDK runs the same file and must match byte for byte).

use serde_json::Value;
use std::cell::RefCell;
use weir_sdk::join::{IntervalJoin, Joined, WindowJoin};
use weir_sdk::testing::Harness;
use weir_sdk::{Context, Operator, Record, Reject, StateKind, StateSpec, Timer};

enum Helper {
    Window(WindowJoin<Value, Value>),
    Interval(IntervalJoin<Value, Value>),
}

thread_local! {
    /// The helper of the case running on this thread (a test operator has no constructor).
    static HELPER: RefCell<Option<Helper>> = const { RefCell::new(None) };
}

fn helper_from(spec: &Value) -> Helper {
    let ms = |field: &str| spec[field].as_i64().unwrap_or(0);
    match spec["kind"].as_str() {
        Some("window") => Helper::Window(WindowJoin::new("j", ms("size_ms"))),
        Some("interval") => {
            Helper::Interval(IntervalJoin::new("j", ms("lower_ms"), ms("upper_ms")))
        }
        other => panic!("unknown join kind {other:?}"),
    }
}

/// The operator of the vectors: input 0 left, input 1 right; each pair out as `{"l":…,"r":…}`.
struct Joining;

impl Operator for Joining {
    const NAME: &'static str = "joining";
    const VERSION: &'static str = "1.0.0";
    const STATES: &'static [StateSpec] = &[StateSpec {
        name: "j",
        kind: StateKind::Map,
        ttl_ms: None,
        version: 0,
    }];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let value: Value = serde_json::from_slice(record.value())?;
        let ts = record.timestamp_ms();
        let left = record.input() == 0;
        let joined: Joined<Value> = HELPER.with(|h| match (h.borrow().as_ref(), left) {
            (Some(Helper::Window(j)), true) => j.left(ctx, &value, ts),
            (Some(Helper::Window(j)), false) => j.right(ctx, &value, ts),
            (Some(Helper::Interval(j)), true) => j.left(ctx, &value, ts),
            (Some(Helper::Interval(j)), false) => j.right(ctx, &value, ts),
            (None, _) => panic!("no helper set"),
        })?;
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
        HELPER.with(|h| match h.borrow().as_ref() {
            Some(Helper::Window(j)) => j.on_timer(ctx, timer),
            Some(Helper::Interval(j)) => j.on_timer(ctx, timer),
            None => panic!("no helper set"),
        })?;
        Ok(())
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8")
}

#[test]
fn join_helpers_produce_the_shared_vectors_byte_for_byte() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/joins.json");
    let vectors: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("vectors readable"))
            .expect("vectors are JSON");
    let cases = vectors["cases"].as_array().expect("cases");
    assert!(cases.len() >= 2);
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        HELPER.with(|h| *h.borrow_mut() = Some(helper_from(&case["join"])));
        let mut h = Harness::<Joining>::new();
        for (i, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            if let Some(record) = step.get("record") {
                let key = record["key"].as_str().expect("key");
                let input = u32::from(record["side"] == "r");
                let value = serde_json::json!({ "v": record["v"] }).to_string();
                let out = h.send_from(
                    input,
                    key.as_bytes(),
                    value.as_bytes(),
                    record["ts"].as_i64().expect("ts"),
                );
                assert!(out.is_ok(), "{name}, step {i}: {:?}", out.reason);
            }
            if let Some(to) = step.get("watermark") {
                for (timer, out) in h.advance_watermark(to.as_i64().expect("ms")) {
                    assert!(out.is_ok(), "{name}, step {i}, {timer:?}: {:?}", out.reason);
                }
            }
            for (key, want) in step["state"].as_object().into_iter().flatten() {
                let got: Vec<Value> = h
                    .map_bytes(key.as_bytes(), "j")
                    .iter()
                    .map(|(k, v)| serde_json::json!([text(k), text(v)]))
                    .collect();
                assert_eq!(&Value::Array(got), want, "{name}, step {i}: state of {key}");
            }
            for (key, want) in step["timers"].as_object().into_iter().flatten() {
                let got: serde_json::Map<String, Value> = h
                    .timers(key.as_bytes())
                    .into_iter()
                    .map(|(n, (at, _))| (n, Value::from(at)))
                    .collect();
                assert_eq!(
                    &Value::Object(got),
                    want,
                    "{name}, step {i}: timers of {key}"
                );
            }
        }
        let got: Vec<Value> = h
            .outputs
            .iter()
            .map(|o| serde_json::json!([text(&o.key), text(&o.value)]))
            .collect();
        assert_eq!(&Value::Array(got), &case["outputs"], "{name}: outputs");
        let left = case["timers_left"].as_u64().unwrap_or(0) as usize;
        assert_eq!(h.pending_timers(), left, "{name}: timers left");
    }
}

/// A record without a timestamp is rejected: a join is in event time.
#[test]
fn a_record_without_event_time_is_rejected() {
    HELPER.with(|h| *h.borrow_mut() = Some(Helper::Window(WindowJoin::new("j", 10))));
    let mut h = Harness::<Joining>::new();
    let out = h.send_from(0, b"a", br#"{"v":1}"#, -1);
    assert!(!out.is_ok());
    assert!(
        out.reason
            .as_deref()
            .is_some_and(|r| r.contains("event time")),
        "{:?}",
        out.reason
    );
}
