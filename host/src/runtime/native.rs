//! Operators compiled into the host: the no-Wasm baseline that `weir bench` runs the same
//! logic as a guest against, so the cost of the Wasm boundary (and of the sandbox) is measured,
//! not guessed. A native operator sees a batch as a guest does — the value states of each
//! record's key (prefetched by the worker), staged writes and emits that the worker applies
//! only when the call succeeds — but runs in the host's address space with no memory cap, CPU
//! deadline or emit limit: it is for trusted, built-in code only, never for tenants.

use super::batch::{BatchCtx, Staged, StagedEmit};
use super::bindings::{Disposition, InputRecord, OperatorInfo};
use super::host::OperatorMeta;
use crate::state::key;
use bytes::Bytes;

/// Logic of a native operator.
pub trait NativeOperator: std::fmt::Debug + Send + Sync + 'static {
    /// What it declares, as a guest's `describe` (checked the same way).
    fn describe(&self) -> OperatorInfo;

    /// Processes one record; `Err` rejects it (to the dead-letter topic, its effects dropped by
    /// the worker as for a guest's rejection).
    ///
    /// # Errors
    /// [`Rejected`], with the reason the dead letter carries.
    fn process(&self, ctx: &mut NativeContext<'_>, record: &InputRecord) -> Result<(), Rejected>;
}

/// A native operator's rejection of its record: the reason its dead letter carries, as a
/// guest's `reject` has one. Any error converts into one (its message and causes,
/// `: `-separated, as [`crate::error::Chain`] prints them), so an operator rejects with `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected(pub String);

impl<E: std::error::Error + 'static> From<E> for Rejected {
    fn from(err: E) -> Self {
        Self(crate::error::Chain(&err).to_string())
    }
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A native operator's handle on the current record's keyed state and emits.
#[derive(Debug)]
pub struct NativeContext<'a> {
    batch: &'a mut BatchCtx,
    meta: &'a OperatorMeta,
    record: u32,
    key: &'a [u8],
}

impl NativeContext<'_> {
    /// The value state `name` of the record's key; `None` when it has none. Only declared
    /// value states are read (the worker prefetched them for every key of the batch).
    pub fn value_get(&self, name: &str) -> Option<Bytes> {
        if !self.meta.value_states.iter().any(|s| s == name) {
            return None;
        }
        self.batch
            .local_get(&key::value_key(self.key, name))
            .flatten()
    }

    /// The row of `key` in the stage's global table `name` (docs/topologies.md, "Global
    /// tables"); `None` when it has none, or the stage reads no such table.
    pub fn lookup(&self, name: &str, key: &[u8]) -> Option<Bytes> {
        self.batch.call.global_tables.get(name)?.get(key)
    }

    /// Sets the value state `name` of the record's key (no TTL).
    pub fn value_set(&mut self, name: &str, value: Vec<u8>) {
        let staged = Staged {
            value: Some(Bytes::from(value)),
            expires_at_ms: None,
        };
        self.batch
            .stage(self.record, key::value_key(self.key, name), staged);
    }

    /// Emits `value` under `key` to the output topic.
    pub fn emit(&mut self, key: &[u8], value: Vec<u8>) {
        self.batch.stage_emit(StagedEmit {
            record: self.record,
            output: 0,
            timestamp_ms: None,
            key: key.to_vec(),
            value,
            headers: Vec::new(),
        });
    }
}

/// Runs `logic` over the batch's records in order; the dispositions and the staging area, as a
/// guest call returns them.
pub(super) fn call_batch(
    logic: &dyn NativeOperator,
    meta: &OperatorMeta,
    mut batch: BatchCtx,
) -> (Vec<Disposition>, BatchCtx) {
    let records = batch.records.clone();
    let mut dispositions = Vec::with_capacity(records.len());
    for (index, record) in records.iter().enumerate() {
        let mut ctx = NativeContext {
            batch: &mut batch,
            meta,
            record: index as u32,
            key: &record.key,
        };
        dispositions.push(match logic.process(&mut ctx, record) {
            Ok(()) => Disposition::Ok,
            Err(Rejected(reason)) => Disposition::Reject(reason),
        });
    }
    (dispositions, batch)
}
