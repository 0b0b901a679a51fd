//! The window helpers through the Rust harness: the shared test vectors (the Python SDK runs the
//! same file and must match byte for byte), and the session helper against a model on
//! out-of-order input.

use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use weir_sdk::testing::Harness;
use weir_sdk::window::{
    Added, Aggregate, HoppingWindows, SessionWindows, TumblingWindows, WindowResult,
};
use weir_sdk::{Context, Operator, Record, Reject, StateKind, StateSpec, Timer};

/// The vectors' accumulator: records counted and their `n` summed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Acc {
    count: u64,
    sum: i64,
}

impl Aggregate for Acc {
    fn merge(&mut self, other: Self) {
        self.count += other.count;
        self.sum += other.sum;
    }
}

enum Helper {
    Tumbling(TumblingWindows<Acc>),
    Hopping(HoppingWindows<Acc>),
    Session(SessionWindows<Acc>),
}

thread_local! {
    /// The helper of the case running on this thread (a test operator has no constructor).
    static HELPER: RefCell<Option<Helper>> = const { RefCell::new(None) };
}

fn helper_from(spec: &Value) -> Helper {
    let ms = |field: &str| spec[field].as_i64().unwrap_or(0);
    let lateness = ms("allowed_lateness_ms");
    match spec["kind"].as_str() {
        Some("tumbling") => Helper::Tumbling(
            TumblingWindows::new("w", ms("size_ms")).with_allowed_lateness_ms(lateness),
        ),
        Some("hopping") => Helper::Hopping(
            HoppingWindows::new("w", ms("size_ms"), ms("slide_ms"))
                .with_allowed_lateness_ms(lateness),
        ),
        Some("session") => Helper::Session(
            SessionWindows::new("w", ms("gap_ms")).with_allowed_lateness_ms(lateness),
        ),
        other => panic!("unknown window kind {other:?}"),
    }
}

#[derive(Serialize)]
struct Emitted<'a> {
    start: i64,
    end: i64,
    update: bool,
    acc: &'a Acc,
}

fn emit_result(ctx: &mut Context, key: &[u8], result: &WindowResult<Acc>) -> Result<(), Reject> {
    ctx.emit_json(
        key,
        &Emitted {
            start: result.window.start_ms,
            end: result.window.end_ms,
            update: result.update,
            acc: &result.acc,
        },
    )
}

/// The operator of the vectors: `{"n": N}` in, window results out.
struct Windowed;

impl Operator for Windowed {
    const NAME: &'static str = "windowed";
    const VERSION: &'static str = "1.0.0";
    const STATES: &'static [StateSpec] = &[StateSpec {
        name: "w",
        kind: StateKind::Map,
        ttl_ms: None,
        version: 0,
    }];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let value: Value = serde_json::from_slice(record.value())?;
        let acc = Acc {
            count: 1,
            sum: value["n"].as_i64().unwrap_or(0),
        };
        let ts = record.timestamp_ms();
        let added: Added<Acc> = HELPER.with(|h| match h.borrow().as_ref() {
            Some(Helper::Tumbling(w)) => w.add(ctx, ts, acc),
            Some(Helper::Hopping(w)) => w.add(ctx, ts, acc),
            Some(Helper::Session(w)) => w.add(ctx, ts, acc),
            None => panic!("no helper set"),
        })?;
        for update in &added.updates {
            emit_result(ctx, record.key(), update)?;
        }
        if added.dropped > 0 {
            ctx.emit_json(
                record.key(),
                &serde_json::json!({ "dropped": added.dropped }),
            )?;
        }
        Ok(())
    }

    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        let result = HELPER.with(|h| match h.borrow().as_ref() {
            Some(Helper::Tumbling(w)) => w.on_timer(ctx, timer),
            Some(Helper::Hopping(w)) => w.on_timer(ctx, timer),
            Some(Helper::Session(w)) => w.on_timer(ctx, timer),
            None => panic!("no helper set"),
        })?;
        if let Some(result) = result {
            emit_result(ctx, &timer.key, &result)?;
        }
        Ok(())
    }
}

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/windows.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("vectors readable"))
        .expect("vectors are JSON")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8")
}

#[test]
fn window_helpers_produce_the_shared_vectors_byte_for_byte() {
    let vectors = vectors();
    let cases = vectors["cases"].as_array().expect("cases");
    assert!(cases.len() >= 6);
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        HELPER.with(|h| *h.borrow_mut() = Some(helper_from(&case["window"])));
        let mut h = Harness::<Windowed>::new();
        for (i, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            if let Some(record) = step.get("record") {
                let key = record["key"].as_str().expect("key");
                let value = serde_json::json!({ "n": record["n"] }).to_string();
                let out = h.send_at(
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
                    .map_bytes(key.as_bytes(), "w")
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

/// One step of a generated run.
#[derive(Debug, Clone)]
enum Step {
    Record { key: u8, ts: i64, n: i64 },
    Watermark(i64),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0u8..2, 0i64..300, 1i64..100).prop_map(|(key, ts, n)| Step::Record { key, ts, n }),
        1 => (0i64..40).prop_map(Step::Watermark),
    ];
    prop::collection::vec(step, 1..60)
}

/// A session result as the harness and the model give it: (key, start, end, count, sum,
/// update), or a dropped record as (key, -1, ts, 0, 0, false).
type Emission = (u8, i64, i64, u64, i64, bool);

/// A live record of the model: (id, timestamp, n).
type Live = (usize, i64, i64);

/// A session of the model: (start, end, its records).
type Session = (i64, i64, Vec<Live>);

/// The model: sessions recomputed from scratch, per key, over the records still live, with no
/// state but the records and which of them some emitted result covered.
struct Model {
    gap: i64,
    lateness: i64,
    watermark: Option<i64>,
    /// Per key: live records (id, ts, n).
    live: BTreeMap<u8, Vec<Live>>,
    emitted_ids: BTreeSet<usize>,
    next_id: usize,
    out: Vec<Emission>,
}

impl Model {
    /// The key's sessions: (start, end, records), records less than `gap` apart together.
    fn sessions(&self, key: u8) -> Vec<Session> {
        let mut records = self.live.get(&key).cloned().unwrap_or_default();
        records.sort_by_key(|r| (r.1, r.0));
        let mut sessions: Vec<Session> = Vec::new();
        for r in records {
            match sessions.last_mut() {
                Some((_, end, members)) if r.1 < *end => {
                    *end = (*end).max(r.1 + self.gap);
                    members.push(r);
                }
                _ => sessions.push((r.1, r.1 + self.gap, vec![r])),
            }
        }
        sessions
    }

    fn emit(&mut self, key: u8, session: &Session) {
        let update = session.2.iter().any(|r| self.emitted_ids.contains(&r.0));
        let count = session.2.len() as u64;
        let sum = session.2.iter().map(|r| r.2).sum();
        self.out
            .push((key, session.0, session.1, count, sum, update));
        self.emitted_ids.extend(session.2.iter().map(|r| r.0));
    }

    fn record(&mut self, key: u8, ts: i64, n: i64) {
        let id = self.next_id;
        self.next_id += 1;
        self.live.entry(key).or_default().push((id, ts, n));
        let session = self
            .sessions(key)
            .into_iter()
            .find(|s| s.2.iter().any(|r| r.0 == id))
            .expect("the record is in a session");
        if self
            .watermark
            .is_some_and(|w| session.1 - 1 + self.lateness <= w)
        {
            // the session it would be in is past its lateness: dropped
            self.live.entry(key).or_default().retain(|r| r.0 != id);
            self.out.push((key, -1, ts, 0, 0, false));
            return;
        }
        if self.watermark.is_some_and(|w| session.1 - 1 <= w) {
            self.emit(key, &session);
        }
    }

    fn advance(&mut self, to: i64) {
        let w = self.watermark.map_or(to, |w| w.max(to));
        self.watermark = Some(w);
        let keys: Vec<u8> = self.live.keys().copied().collect();
        for key in keys {
            let mut sessions = self.sessions(key);
            sessions.sort_by_key(|s| s.1);
            for s in &sessions {
                let due = s.1 - 1 <= w;
                if due && !s.2.iter().all(|r| self.emitted_ids.contains(&r.0)) {
                    self.emit(key, s);
                }
            }
            for s in sessions {
                if s.1 - 1 + self.lateness <= w {
                    let gone: BTreeSet<usize> = s.2.iter().map(|r| r.0).collect();
                    if let Some(live) = self.live.get_mut(&key) {
                        live.retain(|r| !gone.contains(&r.0));
                    }
                }
            }
        }
    }
}

fn per_key(emissions: &[Emission]) -> BTreeMap<u8, Vec<Emission>> {
    let mut out: BTreeMap<u8, Vec<Emission>> = BTreeMap::new();
    for e in emissions {
        out.entry(e.0).or_default().push(*e);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// On out-of-order input with watermarks moving among the records, the session helper
    /// emits, per key and in order, what the model computes; and once the watermark passes
    /// everything, no window state and no timer is left.
    #[test]
    fn session_windows_match_a_model_on_out_of_order_input(
        steps in steps(),
        gap in 1i64..40,
        lateness in 0i64..30,
    ) {
        HELPER.with(|h| {
            *h.borrow_mut() = Some(Helper::Session(
                SessionWindows::new("w", gap).with_allowed_lateness_ms(lateness),
            ))
        });
        let mut h = Harness::<Windowed>::new();
        let mut model = Model {
            gap,
            lateness,
            watermark: None,
            live: BTreeMap::new(),
            emitted_ids: BTreeSet::new(),
            next_id: 0,
            out: Vec::new(),
        };
        let mut wm = 0;
        let mut steps = steps;
        steps.push(Step::Watermark(1_000));
        for step in steps {
            match step {
                Step::Record { key, ts, n } => {
                    let out = h.send_at(&[b'a' + key], format!(r#"{{"n":{n}}}"#).as_bytes(), ts);
                    prop_assert!(out.is_ok(), "{:?}", out.reason);
                    model.record(key, ts, n);
                }
                Step::Watermark(by) => {
                    wm += by;
                    for (_, out) in h.advance_watermark(wm) {
                        prop_assert!(out.is_ok(), "{:?}", out.reason);
                    }
                    model.advance(wm);
                }
            }
        }
        let got: Vec<Emission> = h
            .outputs
            .iter()
            .map(|o| {
                let v: Value = serde_json::from_slice(&o.value).expect("JSON");
                let key = o.key[0] - b'a';
                match v.get("dropped") {
                    Some(_) => (key, -1, 0, 0, 0, false),
                    None => (
                        key,
                        v["start"].as_i64().unwrap_or(0),
                        v["end"].as_i64().unwrap_or(0),
                        v["acc"]["count"].as_u64().unwrap_or(0),
                        v["acc"]["sum"].as_i64().unwrap_or(0),
                        v["update"].as_bool().unwrap_or(false),
                    ),
                }
            })
            .collect();
        // a dropped record's timestamp is not in the output: compare it as 0
        let want: Vec<Emission> = model
            .out
            .iter()
            .map(|e| if e.1 == -1 { (e.0, -1, 0, 0, 0, false) } else { *e })
            .collect();
        prop_assert_eq!(per_key(&got), per_key(&want));
        prop_assert_eq!(h.pending_timers(), 0);
        prop_assert!(h.map_keys("w").is_empty());
    }
}

/// The harness keeps the host's rules: a refused record's state writes, timers and emits are
/// discarded; a panic is a refusal too.
struct Picky;

const SEEN: weir_sdk::ValueState<u64> = weir_sdk::ValueState::new("seen");

impl Operator for Picky {
    const NAME: &'static str = "picky";
    const VERSION: &'static str = "1.0.0";
    const STATES: &'static [StateSpec] = &[SEEN.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let seen = ctx.get(&SEEN)?.unwrap_or(0) + 1;
        ctx.set(&SEEN, &seen)?;
        ctx.set_timer("t", 100, weir_sdk::TimeDomain::ProcessingTime)?;
        ctx.emit(record.key(), b"ok")?;
        match record.value() {
            b"reject" => Err(Reject::new("no")),
            b"panic" => panic!("boom"),
            _ => Ok(()),
        }
    }

    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        ctx.emit(
            &timer.key,
            format!("fired at {}", ctx.processing_time()).as_bytes(),
        )
    }
}

#[test]
fn the_harness_discards_the_effects_of_refused_records_and_fires_processing_time_timers() {
    let mut h = Harness::<Picky>::new().with_processing_time(50);
    let out = h.send(b"k", b"reject");
    assert_eq!(out.reason.as_deref(), Some("no"));
    let out = h.send(b"k", b"panic");
    assert_eq!(out.reason.as_deref(), Some("panic: boom"));
    assert_eq!(h.value(b"k", &SEEN), None);
    assert_eq!(h.pending_timers(), 0);
    assert!(h.outputs.is_empty());
    assert_eq!(h.dead_letters.len(), 2);

    assert!(h.send(b"k", b"fine").is_ok());
    assert_eq!(h.value(b"k", &SEEN), Some(1));
    assert_eq!(
        h.timers(b"k").get("t"),
        Some(&(100, weir_sdk::TimeDomain::ProcessingTime))
    );
    assert!(h.advance_processing_time(49).is_empty());
    let fired = h.advance_processing_time(1);
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].1.emitted[0].value, b"fired at 100");
    assert_eq!(h.pending_timers(), 0);
}

const REFUSED_HOURS: TumblingWindows<Acc> = TumblingWindows::new("w", 10);
const REFUSED_SESSIONS: SessionWindows<Acc> = SessionWindows::new("s", 10);

/// Windows whose every timer its `on_timer` refuses, after the helpers handled it.
struct RefusingTimers;

impl Operator for RefusingTimers {
    const NAME: &'static str = "refusing-timers";
    const VERSION: &'static str = "1.0.0";
    const STATES: &'static [StateSpec] = &[REFUSED_HOURS.spec(), REFUSED_SESSIONS.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let one = Acc { count: 1, sum: 0 };
        REFUSED_HOURS.add(ctx, record.timestamp_ms(), one.clone())?;
        REFUSED_SESSIONS.add(ctx, record.timestamp_ms(), one)?;
        Ok(())
    }

    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        REFUSED_HOURS.on_timer(ctx, timer)?;
        REFUSED_SESSIONS.on_timer(ctx, timer)?;
        Err(Reject::new("refused"))
    }
}

/// A rejected `on_timer` leaves its window without a timer (the host discards the call's
/// removal of it): the key's next window, or next session record, removes it.
#[test]
fn a_window_whose_timer_was_refused_is_removed_once_past_its_lateness() {
    let mut h = Harness::<RefusingTimers>::new();
    assert!(h.send_at(b"k", b"{}", 5).is_ok());
    let fired = h.advance_watermark(20);
    assert_eq!(fired.len(), 2);
    assert!(fired.iter().all(|(_, out)| !out.is_ok()));
    assert_eq!(h.pending_timers(), 0);
    assert_eq!(h.map_bytes(b"k", "w").len(), 1, "left behind");
    assert_eq!(h.map_bytes(b"k", "s").len(), 1, "left behind");
    assert!(h.send_at(b"k", b"{}", 35).is_ok());
    let starts = |name: &str| -> Vec<String> {
        h.map_bytes(b"k", name)
            .iter()
            .map(|(k, _)| text(k))
            .collect()
    };
    assert_eq!(starts("w"), ["30"]);
    assert_eq!(starts("s"), ["35"]);
}
