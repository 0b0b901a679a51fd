//! The [`Operator`] trait and the glue that drives it from the exported `process-batch`.

use crate::context::Context;
use crate::context::{TimeDomain, Timer};
use crate::record::Record;
use crate::state::StateSpec;
use crate::wit::exports::weir::operator::operator::{
    Disposition, FiredTimer, InputRecord, OperatorInfo,
};
use crate::wit::weir::operator::types::TimeDomain as WitTimeDomain;
use std::fmt;

/// A stream operator: called once per input record, in offset order per partition.
///
/// Implementors are usually unit structs: the operator value is never constructed, since
/// nothing may persist in instance memory between batches (see the crate docs).
pub trait Operator: 'static {
    /// The operator's name, 1..=64 bytes.
    const NAME: &'static str;
    /// The operator's version, at most 64 bytes (semver recommended).
    const VERSION: &'static str;
    /// Every named state the operator uses; the host refuses undeclared names.
    const STATES: &'static [StateSpec];
    /// The named outputs it emits to with [`Context::emit_to`] besides `default` (at most 16,
    /// each 1..=64 bytes of `[a-z0-9_-]`); the pipeline binds each to a topic or a later
    /// stage. Default: none.
    const OUTPUTS: &'static [&'static str] = &[];

    /// Processes one record.
    ///
    /// # Errors
    /// Return [`Reject`] to refuse the record: it goes to the pipeline's dead-letter topic with
    /// the reason, and the state writes and emits it made are discarded. State and emit errors
    /// convert into `Reject` with `?`.
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject>;

    /// Handles a timer of the key `timer.key` that fired (as Flink's
    /// `KeyedProcessFunction.onTimer`): `ctx` acts for that key, as for a record, so state,
    /// emits and timers work the same. The timer is already removed; set it again to re-arm
    /// it. Timers fire in time order, never before the key's earlier records ran. The default
    /// does nothing.
    ///
    /// # Errors
    /// As [`Operator::process`]: a [`Reject`] discards the timer's effects and sends it to the
    /// dead-letter topic (with `weir.timer.*` headers naming it).
    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        let _ = (ctx, timer);
        Ok(())
    }
}

/// The reason an operator refuses a record; the record is dead-lettered with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    reason: String,
}

impl Reject {
    /// A rejection with a human-readable reason (kept to at most 4 KiB by the host).
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// The reason given.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl From<serde_json::Error> for Reject {
    fn from(err: serde_json::Error) -> Self {
        Reject::new(format!("invalid JSON: {err}"))
    }
}

/// Builds the `operator-info` of `O`. Used by [`export_operator!`](crate::export_operator).
pub fn describe<O: Operator>() -> OperatorInfo {
    OperatorInfo {
        name: O::NAME.to_owned(),
        version: O::VERSION.to_owned(),
        states: O::STATES
            .iter()
            .copied()
            .map(StateSpec::to_descriptor)
            .collect(),
        outputs: O::OUTPUTS.iter().map(|o| (*o).to_owned()).collect(),
    }
}

/// Drives [`Operator::on_timer`] over the fired timers of an `on-timers` call, collecting a
/// disposition per timer. Used by [`export_operator!`](crate::export_operator).
pub fn on_timers<O: Operator>(timers: Vec<FiredTimer>) -> Vec<Disposition> {
    let mut dispositions = Vec::with_capacity(timers.len());
    for (index, fired) in timers.into_iter().enumerate() {
        let index = u32::try_from(index).expect("the host caps timer batches far below u32::MAX");
        let mut ctx = Context::for_record(index);
        let timer = Timer {
            key: fired.key,
            name: fired.name,
            time_ms: fired.time_ms,
            domain: match fired.domain {
                WitTimeDomain::EventTime => TimeDomain::EventTime,
                WitTimeDomain::ProcessingTime => TimeDomain::ProcessingTime,
            },
        };
        dispositions.push(match O::on_timer(&mut ctx, &timer) {
            Ok(()) => Disposition::Ok,
            Err(reject) => Disposition::Reject(reject.reason),
        });
    }
    dispositions
}

/// Runs `O::process` over a batch, one record at a time, collecting a disposition per record.
/// Used by [`export_operator!`](crate::export_operator).
pub fn process_batch<O: Operator>(records: Vec<InputRecord>) -> Vec<Disposition> {
    let mut dispositions = Vec::with_capacity(records.len());
    for (index, input) in records.iter().enumerate() {
        let index = u32::try_from(index).expect("the host caps batches far below u32::MAX records");
        let mut ctx = Context::for_record(index);
        let record = Record::new(input);
        dispositions.push(match O::process(&mut ctx, &record) {
            Ok(()) => Disposition::Ok,
            Err(reject) => Disposition::Reject(reject.reason),
        });
    }
    dispositions
}
