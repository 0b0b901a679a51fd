//! The [`Operator`] trait and the glue that drives it from the exported `process-batch`.

use crate::context::Context;
use crate::record::Record;
use crate::state::StateSpec;
use crate::wit::exports::weir::operator::operator::{Disposition, InputRecord, OperatorInfo};
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

    /// Processes one record.
    ///
    /// # Errors
    /// Return [`Reject`] to refuse the record: it goes to the pipeline's dead-letter topic with
    /// the reason, and the state writes and emits it made are discarded. State and emit errors
    /// convert into `Reject` with `?`.
    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject>;
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
    }
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
