//! One live operator instance ([`Instance`]) and its call path: `process-batch` on a batch's
//! records under a CPU deadline and a wall-clock cap, and a failed call turned into a
//! [`CallError`].

use super::batch::BatchCtx;
use super::bindings::{Disposition, InputRecord, OperatorWorld};
use super::epoch::EpochTicker;
use super::host::HostCtx;
use super::{CallError, DeadlineExceeded, HostAbort, OperatorMeta, guest_log, native, ticks};
use crate::state::{Shard, StateError};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::Store;
use wasmtime::component::TypedFunc;

/// `process-batch` as typed once per instance: the batch's records shared, not copied, until
/// the call lowers them into guest memory.
pub(super) type ProcessBatch = TypedFunc<(Arc<Vec<InputRecord>>,), (Vec<Disposition>,)>;

/// One live instance with its store.
pub struct Instance<S: Shard> {
    pub(super) kind: InstanceKind<S>,
}

/// What runs an instance's calls: a component in its store, or logic compiled into the host.
pub(super) enum InstanceKind<S: Shard> {
    Wasm {
        store: Store<HostCtx<S>>,
        bindings: OperatorWorld,
        process_batch: ProcessBatch,
        /// Wall-clock time a call may spend beyond twice its CPU deadline (waiting on state
        /// I/O).
        io_allowance: Duration,
        /// The engine's epoch, ticking while a call runs.
        ticker: Arc<EpochTicker>,
    },
    Native {
        logic: Arc<dyn native::NativeOperator>,
        meta: Arc<OperatorMeta>,
    },
}

impl<S: Shard> std::fmt::Debug for Instance<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance").finish_non_exhaustive()
    }
}

impl<S: Shard> Instance<S> {
    /// Calls `process-batch` on `batch.records` with a CPU budget of `deadline`, and returns
    /// the dispositions with the staging area (whose effects the caller applies).
    ///
    /// A call is also bounded in wall-clock time by `2 × deadline + call_io_allowance`, so a
    /// guest blocked in a host call (a WASI timer) ends as a deadline trap.
    ///
    /// # Errors
    /// [`CallError`]; after any error the instance must be dropped.
    pub async fn call_batch(
        &mut self,
        batch: BatchCtx,
        deadline: Duration,
    ) -> Result<(Vec<Disposition>, BatchCtx), CallError> {
        let (store, process_batch, io_allowance, ticker) = match &mut self.kind {
            InstanceKind::Wasm {
                store,
                process_batch,
                io_allowance,
                ticker,
                ..
            } => (store, process_batch, *io_allowance, ticker.clone()),
            InstanceKind::Native { logic, meta } => {
                return Ok(native::call_batch(&**logic, meta, batch));
            }
        };
        let records = batch.records.clone();
        let data = store.data_mut();
        data.log.take_recent_stderr();
        data.waiting_on_state = false;
        data.batch = batch;
        data.deadline_ticks_left = ticks(deadline);
        store.set_epoch_deadline(1);
        // Epoch deadlines only fire while guest code runs; a guest parked in a host call (a WASI
        // timer, a state read that never returns) is bounded by this wall-clock cap instead.
        let wall_clock_max = deadline.saturating_mul(2).saturating_add(io_allowance);
        let call = process_batch.call_async(&mut *store, (records.clone(),));
        let ticking = ticker.ticking();
        let result = tokio::time::timeout(wall_clock_max, call).await;
        drop(ticking);
        let result = match result {
            Ok(result) => result.map(|(dispositions,)| dispositions),
            Err(_elapsed) if store.data().waiting_on_state => {
                // Stuck on storage, not on the guest: an outage, retried, never dead-lettered.
                return Err(CallError::Aborted(HostAbort::State(
                    StateError::Unavailable {
                        shard: "(state read)".into(),
                        source: format!("state read still waiting after {wall_clock_max:?}").into(),
                    },
                )));
            }
            Err(_elapsed) => {
                return Err(CallError::Trap {
                    message: format!(
                        "operator exceeded its CPU deadline: still running after {wall_clock_max:?} of wall-clock time (blocked in a host call)"
                    ),
                    deadline: true,
                });
            }
        };
        let batch = std::mem::take(&mut store.data_mut().batch);
        match result {
            Ok(dispositions) if dispositions.len() == records.len() => Ok((dispositions, batch)),
            Ok(dispositions) => Err(CallError::DispositionCount {
                expected: records.len(),
                got: dispositions.len(),
            }),
            Err(err) => {
                let stderr = store.data().log.take_recent_stderr();
                Err(classify_trap(err, &stderr))
            }
        }
    }
}

/// Turns a wasmtime error into a [`CallError`]: a host abort stays a host abort; a trap's
/// message leads with what the guest last wrote to stderr (a Rust panic message), then the
/// trap's cause, then its context.
fn classify_trap(err: wasmtime::Error, stderr: &[String]) -> CallError {
    let err = match err.downcast::<HostAbort>() {
        Ok(abort) => return CallError::Aborted(abort),
        Err(err) => err,
    };
    let deadline = err.downcast_ref::<DeadlineExceeded>().is_some();
    // The cause first ("wasm trap: call stack exhausted"): the context wasmtime adds (a wasm
    // backtrace) can be long, and the message is cut to one log line.
    let cause = err.root_cause().to_string();
    let full = format!("{err:#}");
    let trap = if full.starts_with(&cause) {
        full
    } else {
        format!("{cause}; {full}")
    };
    let mut message = if stderr.is_empty() {
        trap
    } else {
        format!("{}; {trap}", stderr.join(" | "))
    };
    if message.len() > guest_log::LINE_BYTES_MAX {
        let mut end = guest_log::LINE_BYTES_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    CallError::Trap { message, deadline }
}
