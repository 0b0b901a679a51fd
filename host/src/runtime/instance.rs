//! One live operator instance ([`Instance`]) and its call path: `process-batch` on a batch's
//! records (or `on-timers` on fired timers) under a CPU deadline and a wall-clock cap, and a
//! failed call turned into a [`CallError`].

use super::batch::BatchCtx;
use super::bindings::{Disposition, FiredTimer, InputRecord, LegacyInputRecord};
use super::epoch::EpochTicker;
use super::host::HostCtx;
use super::{CallError, DeadlineExceeded, HostAbort, OperatorMeta, guest_log, native, ticks};
use crate::state::{Shard, StateError};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::Store;
use wasmtime::component::TypedFunc;

/// `process-batch` of an instance.
pub(super) enum ProcessBatch {
    /// 0.3 and later, typed once per instance: the batch's records shared, not copied, until
    /// the call lowers them into guest memory.
    Current(TypedFunc<(Arc<Vec<InputRecord>>,), (Vec<Disposition>,)>),
    /// 0.2 and 0.1, whose records have no input index: typed per call, over
    /// [`LegacyInputRecord`]s borrowed from the batch (its type check walks the two small
    /// types; a legacy component pays it per call).
    Legacy(wasmtime::component::Func),
}

/// `process-batch` typed for records without their input index.
type LegacyProcessBatch<'a> = TypedFunc<(&'a [LegacyInputRecord<'a>],), (Vec<Disposition>,)>;

/// `on-timers` as typed once per instance.
pub(super) type OnTimers = TypedFunc<(Arc<Vec<FiredTimer>>,), (Vec<Disposition>,)>;

/// One live instance with its store.
pub struct Instance<S: Shard> {
    pub(super) kind: InstanceKind<S>,
}

/// What runs an instance's calls: a component in its store, or logic compiled into the host.
pub(super) enum InstanceKind<S: Shard> {
    Wasm {
        store: Store<HostCtx<S>>,
        /// The component instance (its `describe` is called through the world's bindings).
        instance: wasmtime::component::Instance,
        process_batch: ProcessBatch,
        /// `on-timers`; `None` for a 0.1 component, which has no timers.
        on_timers: Option<OnTimers>,
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
    /// The prefetched values of the last call's batch, taken out (after a failed call, whose
    /// batch stays in the instance): empty for a native instance or after a successful call.
    pub fn take_prefetched(&mut self) -> foldhash::HashMap<Vec<u8>, Option<bytes::Bytes>> {
        match &mut self.kind {
            InstanceKind::Wasm { store, .. } => store.data_mut().batch.take_prefetched(),
            InstanceKind::Native { .. } => Default::default(),
        }
    }

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
        if let InstanceKind::Native { logic, meta } = &self.kind {
            return Ok(native::call_batch(&**logic, meta, batch));
        }
        self.call(batch, deadline).await
    }

    /// Calls `on-timers` on `batch.timers` (a [`BatchCtx::for_timers`]) with a CPU budget of
    /// `deadline`, as [`Self::call_batch`] does records. An operator without timers (a 0.1
    /// component, a native operator) cannot have set any; it is given none and answers `ok`.
    ///
    /// # Errors
    /// [`CallError`]; after any error the instance must be dropped.
    pub async fn call_timers(
        &mut self,
        batch: BatchCtx,
        deadline: Duration,
    ) -> Result<(Vec<Disposition>, BatchCtx), CallError> {
        match &self.kind {
            InstanceKind::Wasm {
                on_timers: Some(_), ..
            } => self.call(batch, deadline).await,
            _ => Ok((vec![Disposition::Ok; batch.timers.len()], batch)),
        }
    }

    /// One guest call: `on-timers` when `batch` holds timers, else `process-batch`.
    async fn call(
        &mut self,
        batch: BatchCtx,
        deadline: Duration,
    ) -> Result<(Vec<Disposition>, BatchCtx), CallError> {
        let InstanceKind::Wasm {
            store,
            process_batch,
            on_timers,
            io_allowance,
            ticker,
            ..
        } = &mut self.kind
        else {
            unreachable!("native calls return before")
        };
        let (io_allowance, ticker) = (*io_allowance, ticker.clone());
        let records = batch.records.clone();
        let timers = batch.timers.clone();
        let expected = records.len().max(timers.len());
        let data = store.data_mut();
        data.log.take_recent_stderr();
        // Stderr is held until the call ends: a trap's report carries it (guest_log).
        data.log.call_started();
        data.waiting_on_state = false;
        data.batch = batch;
        data.deadline_ticks_left = ticks(deadline);
        store.set_epoch_deadline(1);
        // Epoch deadlines only fire while guest code runs; a guest parked in a host call (a WASI
        // timer, a state read that never returns) is bounded by this wall-clock cap instead.
        let wall_clock_max = deadline.saturating_mul(2).saturating_add(io_allowance);
        let call: std::pin::Pin<
            Box<dyn std::future::Future<Output = wasmtime::Result<Vec<Disposition>>> + Send + '_>,
        > = match on_timers {
            Some(on_timers) if !timers.is_empty() => Box::pin(async move {
                on_timers
                    .call_async(&mut *store, (timers,))
                    .await
                    .map(|(d,)| d)
            }),
            _ => match process_batch {
                ProcessBatch::Current(process_batch) => Box::pin(async move {
                    process_batch
                        .call_async(&mut *store, (records,))
                        .await
                        .map(|(d,)| d)
                }),
                ProcessBatch::Legacy(func) => {
                    let func = *func;
                    Box::pin(async move {
                        let legacy: Vec<LegacyInputRecord<'_>> =
                            records.iter().map(LegacyInputRecord::from).collect();
                        let typed: LegacyProcessBatch<'_> = func.typed(&*store)?;
                        typed
                            .call_async(&mut *store, (&legacy,))
                            .await
                            .map(|(d,)| d)
                    })
                }
            },
        };
        let ticking = ticker.ticking();
        let result = tokio::time::timeout(wall_clock_max, call).await;
        drop(ticking);
        let InstanceKind::Wasm { store, .. } = &mut self.kind else {
            unreachable!("matched above")
        };
        call_ended(store, result, expected, wall_clock_max)
    }
}

/// The end of a guest call in `store` that had `wall_clock_max` (`result`: `Err` once it ran
/// out): its `expected` dispositions and its batch back, or why not — an outage when it was
/// stuck on a state read, a trap, a wrong count of dispositions.
fn call_ended<S: Shard>(
    store: &mut Store<HostCtx<S>>,
    result: Result<wasmtime::Result<Vec<Disposition>>, tokio::time::error::Elapsed>,
    expected: usize,
    wall_clock_max: Duration,
) -> Result<(Vec<Disposition>, BatchCtx), CallError> {
    store
        .data()
        .log
        .call_ended(matches!(result, Ok(Ok(ref d)) if d.len() == expected));
    let result = match result {
        Ok(result) => result,
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
                reached: store.data().batch.reached(),
            });
        }
    };
    match result {
        Ok(dispositions) if dispositions.len() == expected => {
            Ok((dispositions, std::mem::take(&mut store.data_mut().batch)))
        }
        // A failed call's batch stays in the store: what it read can serve the calls that
        // isolate its records ([`Instance::take_prefetched`]).
        Ok(dispositions) => Err(CallError::DispositionCount {
            expected,
            got: dispositions.len(),
        }),
        Err(err) => {
            let stderr = store.data().log.take_recent_stderr();
            let reached = store.data().batch.reached();
            Err(classify_trap(err, &stderr, reached))
        }
    }
}

/// Turns a wasmtime error into a [`CallError`]: a host abort stays a host abort; a trap's
/// message leads with what the guest last wrote to stderr (a Rust panic message), then the
/// trap's cause, then its context; `reached` is how far the guest got ([`CallError::Trap`]).
fn classify_trap(err: wasmtime::Error, stderr: &[String], reached: u32) -> CallError {
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
    CallError::Trap {
        message,
        deadline,
        reached,
    }
}
