//! Unit-test an operator natively with `cargo test` (no component, no host), as Flink's operator
//! test harnesses do: state in memory, records processed with the host's rules, and time moved
//! only when the test says. The Rust twin of the Python SDK's `weir.testing`.
//!
//! ```ignore
//! use weir_sdk::testing::Harness;
//!
//! #[test]
//! fn counts_per_key() {
//!     let mut h = Harness::<Counter>::new();
//!     h.send(b"a", b"{}");
//!     let out = h.send(b"a", b"{}");
//!     assert!(out.is_ok());
//!     assert_eq!(out.emitted[0].value, br#"{"count":2}"#);
//!     assert_eq!(h.value(b"a", &COUNT), Some(2));
//! }
//! ```
//!
//! What it keeps of the host: state scoped to each record's key; a record's state writes, timer
//! changes and emits applied only if it is processed (a [`Reject`](crate::Reject) or a panic
//! discards them); undeclared states, the wrong kind, values over 1 MiB, map keys over 4 KiB and
//! output over 1,000,000 bytes per record refused with the host's reasons; map iteration in
//! ascending byte order of encoded keys; timers (one per key and name, at most 1,024 per key)
//! fired in the host's order, each removed before its [`Operator::on_timer`] runs.
//! [`Harness::advance_watermark`] and [`Harness::advance_processing_time`] fire what becomes
//! due, as the host does between records. What it does not: TTL expiry, durability, watermarks
//! from record timestamps, and the Wasm sandbox (memory and CPU caps): build the component and
//! run it in Weir for those.
//!
//! The harness works in native builds only; in a component the same calls go to the host.

use crate::context::{TimeDomain, Timer};
use crate::operator::{Operator, on_timers, process_batch};
use crate::state::{MapState, StateKind, ValueState};
use crate::wit::exports::weir::operator::operator::{Disposition, FiredTimer, InputRecord};
use crate::wit::weir::operator::types::Header as WitHeader;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The host's default limit on a state value, bytes.
pub const VALUE_BYTES_MAX: u64 = 1 << 20;
/// The host's default limit on a map key, bytes.
pub const MAP_KEY_BYTES_MAX: u64 = 4 << 10;
/// The host's default limit on the output of one input record, bytes (keys, values and
/// headers, plus 64 per emit and 64 per header).
pub const EMIT_BYTES_MAX: u64 = 1_000_000;
/// The largest output record as Kafka counts it (key, value and headers, plus 97 bytes of
/// framing and 10 per header): the producer's default `message.max.bytes`.
pub const OUTPUT_RECORD_BYTES_MAX: u64 = 1_000_000;
/// The host's cap on a map page.
pub const MAP_PAGE_MAX: u32 = 1024;
/// The host's default limit on the timers of one key.
pub const TIMERS_PER_KEY_MAX: u32 = 1024;
/// The longest timer name, bytes.
pub const TIMER_NAME_BYTES_MAX: usize = 128;

/// One record an operator emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The output it went to: `default`, or one of [`Operator::OUTPUTS`].
    pub output: String,
    /// Its key (empty for a null key).
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
    /// Its headers as (name, value).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The timestamp the operator gave it ([`crate::Context::emit_to_at`]); `None`: its input
    /// record's.
    pub timestamp_ms: Option<i64>,
}

/// What became of one record or fired timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Why it was refused (a [`Reject`](crate::Reject)'s reason, or `panic: …`); `None` when
    /// it was processed.
    pub reason: Option<String>,
    /// What it emitted, when processed (a refused call's emits are discarded).
    pub emitted: Vec<Output>,
}

impl Outcome {
    /// Whether it was processed.
    pub fn is_ok(&self) -> bool {
        self.reason.is_none()
    }
}

/// A record refused by the operator, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The record's key.
    pub key: Vec<u8>,
    /// The record's value.
    pub value: Vec<u8>,
    /// Why.
    pub reason: String,
}

type Slot = (Vec<u8>, String);

/// One write to undo when a call is refused: the table, the slot and what it held.
#[derive(Debug)]
enum Undo {
    Value(Slot, Option<Vec<u8>>),
    Map(Slot, Vec<u8>, Option<Vec<u8>>),
    Timer(Slot, Option<(i64, TimeDomain)>),
}

/// The host's imports over maps, with an undo log per call.
#[derive(Debug, Default)]
struct MemoryHost {
    kinds: HashMap<String, StateKind>,
    values: BTreeMap<Slot, Vec<u8>>,
    maps: BTreeMap<Slot, BTreeMap<Vec<u8>, Vec<u8>>>,
    timers: BTreeMap<Slot, (i64, TimeDomain)>,
    /// The key the current call acts for (one record or timer per call).
    key: Vec<u8>,
    undo: Vec<Undo>,
    emitted: Vec<Output>,
    emitted_bytes: u64,
    logs: Vec<(&'static str, String)>,
    watermark_ms: Option<i64>,
    now_ms: i64,
    /// The operator's declared named outputs.
    outputs: Vec<String>,
    /// The stage's parameters.
    parameters: BTreeMap<String, String>,
    /// The stage's global tables: name → key → value.
    global_tables: BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>,
}

thread_local! {
    /// The host of the call in progress on this thread, lent by its [`Harness`].
    static HOST: RefCell<Option<MemoryHost>> = const { RefCell::new(None) };
}

fn with_host<R>(f: impl FnOnce(&mut MemoryHost) -> R) -> R {
    HOST.with(|cell| {
        let mut host = cell.borrow_mut();
        let host = host.as_mut().expect(
            "a Weir host call outside a `weir_sdk::testing::Harness` call: a native build has \
             no host, run the operator through the harness",
        );
        f(host)
    })
}

/// The WIT imports' signatures over the [`MemoryHost`] of the current call.
pub(crate) mod imports;

impl MemoryHost {
    fn rollback(&mut self) {
        for undo in self.undo.drain(..).rev() {
            match undo {
                Undo::Value(slot, old) => match old {
                    Some(v) => {
                        self.values.insert(slot, v);
                    }
                    None => {
                        self.values.remove(&slot);
                    }
                },
                Undo::Map(slot, key, old) => {
                    let map = self.maps.entry(slot.clone()).or_default();
                    match old {
                        Some(v) => {
                            map.insert(key, v);
                        }
                        None => {
                            map.remove(&key);
                        }
                    }
                    if map.is_empty() {
                        self.maps.remove(&slot);
                    }
                }
                Undo::Timer(slot, old) => match old {
                    Some(t) => {
                        self.timers.insert(slot, t);
                    }
                    None => {
                        self.timers.remove(&slot);
                    }
                },
            }
        }
    }
}

/// Runs operator `O` over records and time you give it, one record (or fired timer) per call;
/// a batch of several behaves the same, since each record's writes are visible to the next at
/// once.
#[derive(Debug)]
pub struct Harness<O: Operator> {
    host: Option<MemoryHost>,
    /// Every record emitted by processed records and fired timers, in order.
    pub outputs: Vec<Output>,
    /// Every refused record with its reason, in order.
    pub dead_letters: Vec<DeadLetter>,
    /// Every fired timer that was refused, with its reason, in order.
    pub dead_timers: Vec<(Timer, String)>,
    offset: i64,
    _operator: PhantomData<fn() -> O>,
}

impl<O: Operator> Default for Harness<O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<O: Operator> Harness<O> {
    /// A harness with empty state, no watermark and processing time 0.
    pub fn new() -> Self {
        let host = MemoryHost {
            kinds: O::STATES
                .iter()
                .map(|s| (s.name.to_owned(), s.kind))
                .collect(),
            outputs: O::OUTPUTS.iter().map(|o| (*o).to_owned()).collect(),
            ..MemoryHost::default()
        };
        Self {
            host: Some(host),
            outputs: Vec::new(),
            dead_letters: Vec::new(),
            dead_timers: Vec::new(),
            offset: 0,
            _operator: PhantomData,
        }
    }

    /// The same state, timers, watermark and clock under operator `P`: a switch of the
    /// pipeline to another operator version, as `weir pipeline switch` does (what `P`'s states
    /// read of `O`'s values — upgrades, refusals — shows in the records sent next). The outputs
    /// and dead letters so far stay with this harness.
    pub fn switch<P: Operator>(mut self) -> Harness<P> {
        let mut host = self
            .host
            .take()
            .expect("the harness holds its host between calls");
        host.kinds = P::STATES
            .iter()
            .map(|s| (s.name.to_owned(), s.kind))
            .collect();
        host.outputs = P::OUTPUTS.iter().map(|o| (*o).to_owned()).collect();
        Harness {
            host: Some(host),
            outputs: Vec::new(),
            dead_letters: Vec::new(),
            dead_timers: Vec::new(),
            offset: self.offset,
            _operator: PhantomData,
        }
    }

    /// The same harness with the stage's parameters `parameters` (name, value), as a
    /// pipeline's `parameters` sets them.
    pub fn with_parameters(mut self, parameters: &[(&str, &str)]) -> Self {
        self.host_mut().parameters = parameters
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self
    }

    /// The same harness reading global table `name` (as a stage input's `global_table`)
    /// with `rows` (key, value); [`Harness::set_global_row`] changes it later.
    pub fn with_global_table(mut self, name: &str, rows: &[(&[u8], &[u8])]) -> Self {
        self.host_mut().global_tables.insert(
            name.to_owned(),
            rows.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect(),
        );
        self
    }

    /// Sets (or, with `None`, deletes: a tombstone) the row of `key` in global table `name`,
    /// as an update of its topic that the host applied before the next record. Creates the
    /// table if the harness had none of that name.
    pub fn set_global_row(&mut self, name: &str, key: &[u8], value: Option<&[u8]>) {
        let rows = self
            .host_mut()
            .global_tables
            .entry(name.to_owned())
            .or_default();
        match value {
            Some(v) => rows.insert(key.to_vec(), v.to_vec()),
            None => rows.remove(key),
        };
    }

    /// The same harness starting at processing time `now_ms`.
    pub fn with_processing_time(mut self, now_ms: i64) -> Self {
        self.host_mut().now_ms = now_ms;
        self
    }

    fn host(&self) -> &MemoryHost {
        self.host
            .as_ref()
            .expect("the harness holds its host between calls")
    }

    fn host_mut(&mut self) -> &mut MemoryHost {
        self.host
            .as_mut()
            .expect("the harness holds its host between calls")
    }

    /// Processes a record with no timestamp (-1) at the next offset of partition 0.
    pub fn send(&mut self, key: &[u8], value: &[u8]) -> Outcome {
        self.send_at(key, value, -1)
    }

    /// Processes a record with timestamp `timestamp_ms` at the next offset of partition 0.
    pub fn send_at(&mut self, key: &[u8], value: &[u8], timestamp_ms: i64) -> Outcome {
        self.send_from(0, key, value, timestamp_ms)
    }

    /// Processes a record of the stage's input `input` (its index in the stage's `inputs`)
    /// with timestamp `timestamp_ms`, at the next offset of partition 0.
    pub fn send_from(
        &mut self,
        input: u32,
        key: &[u8],
        value: &[u8],
        timestamp_ms: i64,
    ) -> Outcome {
        let record = InputRecord {
            key: key.to_vec(),
            value: value.to_vec(),
            timestamp_ms,
            headers: Vec::<WitHeader>::new(),
            topic: "test".to_owned(),
            partition: 0,
            offset: self.offset,
            input,
        };
        self.offset += 1;
        let outcome = self.call(key, move || process_batch::<O>(vec![record]));
        if let Some(reason) = &outcome.reason {
            self.dead_letters.push(DeadLetter {
                key: key.to_vec(),
                value: value.to_vec(),
                reason: reason.clone(),
            });
        }
        outcome
    }

    /// One call for `key`: its effects kept if it returns ok, else undone.
    fn call(&mut self, key: &[u8], call: impl FnOnce() -> Vec<Disposition>) -> Outcome {
        let mut host = self.host.take().expect("calls do not nest");
        host.key = key.to_vec();
        host.undo.clear();
        host.emitted.clear();
        host.emitted_bytes = 0;
        HOST.with(|cell| *cell.borrow_mut() = Some(host));
        let result = catch_unwind(AssertUnwindSafe(call));
        let mut host = HOST
            .with(|cell| cell.borrow_mut().take())
            .expect("the call's host is still lent");
        let reason = match result {
            Ok(dispositions) => match dispositions.into_iter().next() {
                Some(Disposition::Ok) => None,
                Some(Disposition::Reject(reason)) => Some(reason),
                None => Some("the operator returned no disposition".to_owned()),
            },
            Err(panic) => Some(format!(
                "panic: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)")
            )),
        };
        let emitted = std::mem::take(&mut host.emitted);
        let outcome = match reason {
            None => {
                host.undo.clear();
                self.outputs.extend(emitted.iter().cloned());
                Outcome {
                    reason: None,
                    emitted,
                }
            }
            Some(reason) => {
                host.rollback();
                Outcome {
                    reason: Some(reason),
                    emitted: Vec::new(),
                }
            }
        };
        self.host = Some(host);
        outcome
    }

    /// The event-time watermark operators see, ms; `None` until advanced.
    pub fn watermark(&self) -> Option<i64> {
        self.host().watermark_ms
    }

    /// The processing time operators see, ms.
    pub fn processing_time(&self) -> i64 {
        self.host().now_ms
    }

    /// Moves the watermark to `to_ms` (never back) and fires every event-time timer at or
    /// before it, in the host's order; returns each fired timer with what became of it.
    pub fn advance_watermark(&mut self, to_ms: i64) -> Vec<(Timer, Outcome)> {
        let host = self.host_mut();
        let to = host.watermark_ms.map_or(to_ms, |w| w.max(to_ms));
        host.watermark_ms = Some(to);
        self.fire(TimeDomain::EventTime, to)
    }

    /// Moves processing time forward *by* `by_ms` and fires every processing-time timer due by
    /// then, in the host's order; returns each fired timer with what became of it.
    pub fn advance_processing_time(&mut self, by_ms: i64) -> Vec<(Timer, Outcome)> {
        let host = self.host_mut();
        host.now_ms += by_ms;
        let now = host.now_ms;
        self.fire(TimeDomain::ProcessingTime, now)
    }

    /// Rounds of due timers, as the host fires them: each round those due when it starts, at
    /// most one per key, ordered by time, then key length, key and name; a timer re-armed at or
    /// before `up_to`, or the next of a key, fires in a later round.
    fn fire(&mut self, domain: TimeDomain, up_to: i64) -> Vec<(Timer, Outcome)> {
        let mut fired = Vec::new();
        loop {
            let mut due: Vec<(i64, usize, Vec<u8>, String)> = self
                .host()
                .timers
                .iter()
                .filter(|(_, (at, d))| *d == domain && *at <= up_to)
                .map(|((key, name), (at, _))| (*at, key.len(), key.clone(), name.clone()))
                .collect();
            if due.is_empty() {
                return fired;
            }
            due.sort();
            let mut keys = BTreeSet::new();
            for (at, _, key, name) in due {
                if !keys.insert(key.clone()) {
                    continue;
                }
                self.host_mut().timers.remove(&(key.clone(), name.clone()));
                let timer = Timer {
                    key: key.clone(),
                    name: name.clone(),
                    time_ms: at,
                    domain,
                };
                let wit = FiredTimer {
                    key: key.clone(),
                    name,
                    time_ms: at,
                    domain: domain.to_wit(),
                };
                let outcome = self.call(&key, move || on_timers::<O>(vec![wit]));
                if let Some(reason) = &outcome.reason {
                    self.dead_timers.push((timer.clone(), reason.clone()));
                }
                fired.push((timer, outcome));
            }
        }
    }

    /// The pending timers of `key`: name → (time, domain).
    pub fn timers(&self, key: &[u8]) -> BTreeMap<String, (i64, TimeDomain)> {
        self.host()
            .timers
            .iter()
            .filter(|((k, _), _)| k == key)
            .map(|((_, name), at)| (name.clone(), *at))
            .collect()
    }

    /// How many timers are pending, all keys.
    pub fn pending_timers(&self) -> usize {
        self.host().timers.len()
    }

    /// The stored value of `state` for `key`, decoded; `None` when absent.
    ///
    /// # Panics
    /// When the stored bytes do not decode as `T`.
    pub fn value<T: DeserializeOwned>(&self, key: &[u8], state: &ValueState<T>) -> Option<T> {
        self.host()
            .values
            .get(&(key.to_vec(), state.name().to_owned()))
            .map(|b| state.schema().decode(b).expect("stored value decodes"))
    }

    /// The stored entries of `state` for `key`, decoded, in iteration order.
    ///
    /// # Panics
    /// When stored bytes do not decode as `K` and `V`.
    pub fn map<K: DeserializeOwned + Serialize, V: DeserializeOwned>(
        &self,
        key: &[u8],
        state: &MapState<K, V>,
    ) -> Vec<(K, V)> {
        self.map_bytes(key, state.name())
            .into_iter()
            .map(|(k, v)| {
                (
                    serde_json::from_slice(&k).expect("stored map key decodes"),
                    state.schema().decode(&v).expect("stored map value decodes"),
                )
            })
            .collect()
    }

    /// The stored entries of map state `name` for `key` as bytes, in iteration order: what the
    /// host would hold, to compare byte for byte.
    pub fn map_bytes(&self, key: &[u8], name: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.host()
            .maps
            .get(&(key.to_vec(), name.to_owned()))
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// The keys that hold an entry of map state `name`, in byte order.
    pub fn map_keys(&self, name: &str) -> Vec<Vec<u8>> {
        self.host()
            .maps
            .keys()
            .filter(|(_, n)| n == name)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every (level, line) the operator logged.
    pub fn logs(&self) -> &[(&'static str, String)] {
        &self.host().logs
    }
}
