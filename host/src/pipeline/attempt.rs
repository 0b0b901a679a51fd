//! One attempt of a batch, and the execution state of a partition's worker: the batch being
//! run ([`Task`], with the [`Isolation`] of its records after a failure), the attempt that
//! gets an instance, prefetches the batch's states and calls the guest ([`attempt`]), and the
//! controller, tasks and instances of one partition ([`Execution`]). The worker
//! ([`super::worker`]) decides what an ended attempt leads to.

use super::PipelineStats;
use super::controller::ExecutionController;
use super::events::Assignment;
use super::isolation::Isolation;
use super::timers::TimersCalled;
use crate::config::RuntimeSettings;
use crate::runtime::guest_log::LogSource;
use crate::runtime::{
    BatchCtx, CallError, CallSettings, Disposition, InputRecord, Instance, Operator,
};
use crate::state::{Shard, StateError, key};
use foldhash::{HashSet, HashSetExt};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Builds the staging area of a call over `records`, with the value states `value_states` of
/// every distinct key prefetched from `shard` in one `get_many`.
///
/// # Errors
/// [`StateError::Unavailable`] from the shard.
pub async fn prefetch<S: Shard>(
    shard: &S,
    value_states: &[String],
    records: Arc<Vec<InputRecord>>,
) -> Result<BatchCtx, StateError> {
    let mut batch = BatchCtx::new(records.clone());
    prefetch_into(
        shard,
        value_states,
        records.iter().map(|r| r.key.as_slice()),
        &mut batch,
    )
    .await?;
    Ok(batch)
}

/// Adds to `batch` the value states `value_states` of every distinct key of `keys`, read from
/// `shard` in one `get_many` (a timer call's keys, as a record batch's).
///
/// # Errors
/// [`StateError::Unavailable`] from the shard.
pub(super) async fn prefetch_into<'k, S: Shard>(
    shard: &S,
    value_states: &[String],
    keys: impl ExactSizeIterator<Item = &'k [u8]>,
    batch: &mut BatchCtx,
) -> Result<(), StateError> {
    prefetch_cached(shard, value_states, keys, batch, None).await
}

/// [`prefetch_into`], taking what `cache` holds (values read for the same records by an
/// earlier attempt, none of whose keys was written since) instead of reading it again.
async fn prefetch_cached<'k, S: Shard>(
    shard: &S,
    value_states: &[String],
    keys: impl ExactSizeIterator<Item = &'k [u8]>,
    batch: &mut BatchCtx,
    cache: Option<&Prefetched>,
) -> Result<(), StateError> {
    if value_states.is_empty() {
        return Ok(());
    }
    let mut seen: HashSet<&[u8]> = HashSet::with_capacity(keys.len());
    let mut state_keys = Vec::with_capacity(keys.len() * value_states.len());
    let (mut cached_keys, mut cached_values) = (Vec::new(), Vec::new());
    for key in keys {
        if seen.insert(key) {
            for name in value_states {
                let state_key = key::value_key(key, name);
                match cache.and_then(|c| c.get(&state_key)) {
                    Some(value) => {
                        cached_values.push(value.clone());
                        cached_keys.push(state_key);
                    }
                    None => state_keys.push(state_key),
                }
            }
        }
    }
    if !state_keys.is_empty() {
        let values = shard.get_many(&state_keys).await?;
        batch.add_prefetched(state_keys, values);
    }
    batch.add_prefetched(cached_keys, cached_values);
    Ok(())
}

/// Values a batch's attempt read, by state key: after a trap, what the calls isolating its
/// records take instead of reading the shard again (state keys of records whose effects were
/// applied since are dropped: [`Task::applied`]).
pub(super) type Prefetched = foldhash::HashMap<Vec<u8>, Option<bytes::Bytes>>;

/// A batch handed out by the execution controller, being run.
pub(super) struct Task {
    /// The batch's records, in input order.
    pub(super) records: Arc<Vec<InputRecord>>,
    /// Hashes of its keys, given back to the controller when it finishes.
    pub(super) keys: Vec<u64>,
    /// Which of its records the next call covers: all of them, until a call fails
    /// ([`Isolation`]).
    pub(super) isolation: Isolation,
    /// Wait before the next attempt (after an outage).
    pub(super) delay: Duration,
    /// The delay after the next outage.
    pub(super) backoff: Duration,
    /// What the first failed call read, for the calls that isolate its records; `None`
    /// before a trap.
    pub(super) prefetched: Option<Prefetched>,
}

impl Task {
    /// The records of the next call: the whole batch, or the range isolation is at.
    pub(super) fn call_records(&self) -> Arc<Vec<InputRecord>> {
        match self.isolation.current() {
            Some(range) if !self.isolation.is_whole(self.records.len()) => {
                Arc::new(self.records[range].to_vec())
            }
            _ => self.records.clone(),
        }
    }

    /// Where the next call's records start in the batch.
    pub(super) fn call_start(&self) -> usize {
        self.isolation.current().map_or(0, |r| r.start)
    }

    /// The records at `range` of the batch ran and their effects were applied: the values of
    /// their keys read before may be stale, and are read again by the next call that needs
    /// them.
    pub(super) fn applied(&mut self, range: std::ops::Range<usize>, value_states: &[String]) {
        let Some(cache) = &mut self.prefetched else {
            return;
        };
        for record in &self.records[range] {
            for name in value_states {
                cache.remove(&key::value_key(&record.key, name));
            }
        }
    }

    /// Keeps what a failed call read (`prefetched`), for the calls after it.
    pub(super) fn keep_prefetched(&mut self, prefetched: Prefetched) {
        match &mut self.prefetched {
            Some(cache) => cache.extend(prefetched),
            None => self.prefetched = Some(prefetched),
        }
    }

    /// The next call is a new attempt, not a retry after an outage.
    pub(super) fn reset_backoff(&mut self, backoff_min: Duration) {
        self.delay = Duration::ZERO;
        self.backoff = backoff_min;
    }
}

/// Why an attempt did not produce dispositions.
pub(super) enum Failure {
    /// The prefetch failed: back off and retry (or stop if the state is corrupt).
    Unavailable(StateError),
    /// The host aborted the call because a state read failed: as `Unavailable`.
    Aborted(StateError),
    /// The guest trapped or hit its deadline.
    Fault(CallError),
    /// No instance could be created.
    Instantiate(crate::runtime::RuntimeError),
}

/// An attempt that ended, handed back to the worker.
pub(super) struct Attempted<S: Shard> {
    pub(super) task: Task,
    /// The records the call was given.
    pub(super) records: Arc<Vec<InputRecord>>,
    /// The instance, unless the call left it unusable (a trap, an abort) or none was created.
    pub(super) instance: Option<Instance<S>>,
    /// Time spent polling the guest call (see [`time_polls`]), if one was made.
    pub(super) call_time: Option<Duration>,
    /// When the attempt started (after its delay): the start of its processing latency.
    pub(super) started: Instant,
    /// Time the prefetch of the batch's declared states took, if one was made.
    pub(super) prefetch_time: Option<Duration>,
    /// What a call that trapped had read (empty otherwise).
    pub(super) prefetched: Prefetched,
    pub(super) result: Result<(Vec<Disposition>, BatchCtx), Failure>,
}

/// What a running task of the worker hands back when it ends.
pub(super) enum Ended<S: Shard> {
    /// An attempt of a batch of records.
    Batch(Attempted<S>),
    /// The call of a round of fired timers ([`super::timers`]).
    Timers(TimersCalled<S>),
}

/// The worker's running tasks: attempts of record batches, and at most one round of timers.
pub(super) type Running<S> = FuturesUnordered<BoxFuture<'static, Ended<S>>>;

/// One attempt of `task`: wait its delay (cut short once the worker is told to finish or
/// revoked: `assignment`), get an instance (`instance`, or a new one logging as `source`),
/// prefetch, call — with `watermark` (the shard's applied one) and the operator's clock as
/// the call's time. Owns all it uses, so that many run at once within the worker's task.
#[allow(clippy::too_many_arguments)]
pub(super) async fn attempt<S: Shard>(
    shard: Arc<S>,
    operator: Arc<Operator<S>>,
    (source, assignment): (LogSource, Assignment),
    instance: Option<Instance<S>>,
    task: Task,
    deadline: Duration,
    emits: Arc<CallSettings>,
    watermark: Option<i64>,
) -> Attempted<S> {
    if !task.delay.is_zero() {
        assignment.sleep(task.delay).await;
    }
    let started = crate::clock::monotonic_now();
    let records = task.call_records();
    let call = CallInput {
        emits: &emits,
        watermark,
    };
    let prepared = prepare(&shard, &operator, source, instance, &task, &records, call).await;
    let (mut instance, batch, prefetch_time) = match prepared {
        Ok(prepared) => prepared,
        Err(NotCalled {
            instance,
            prefetch_time,
            failure,
        }) => {
            return Attempted {
                task,
                records,
                instance,
                call_time: None,
                started,
                prefetch_time,
                prefetched: Prefetched::default(),
                result: Err(failure),
            };
        }
    };
    let mut busy = Duration::ZERO;
    let result = time_polls(instance.call_batch(batch, deadline), &mut busy).await;
    // An error out of a call leaves the store unusable (wasmtime marks it trapped), so the
    // instance goes even when the guest did nothing wrong (a host abort).
    let mut prefetched = Prefetched::default();
    let (instance, result) = match result {
        Ok(ok) => (Some(instance), Ok(ok)),
        Err(CallError::Aborted(crate::runtime::HostAbort::State(err))) => {
            (None, Err(Failure::Aborted(err)))
        }
        Err(fault) => {
            // What it read serves the calls that isolate the trapping record.
            prefetched = instance.take_prefetched();
            (None, Err(Failure::Fault(fault)))
        }
    };
    Attempted {
        task,
        records,
        instance,
        call_time: Some(busy),
        started,
        prefetch_time,
        prefetched,
        result,
    }
}

/// What a call is given beside its records: the emit limits, and the shard's applied
/// watermark.
#[derive(Clone, Copy)]
struct CallInput<'a> {
    emits: &'a Arc<CallSettings>,
    watermark: Option<i64>,
}

/// An attempt that ended before its call: the instance if it had one, the prefetch's time if
/// one ran, and why.
struct NotCalled<S: Shard> {
    instance: Option<Instance<S>>,
    prefetch_time: Option<Duration>,
    failure: Failure,
}

/// The steps of an attempt before its call: an instance (`instance`, or a new one logging as
/// `source`), and the batch of `records` with the task's declared states prefetched, its emit
/// limits and its time set. Returns the instance, the batch and the prefetch's time.
async fn prepare<S: Shard>(
    shard: &Arc<S>,
    operator: &Operator<S>,
    source: LogSource,
    instance: Option<Instance<S>>,
    task: &Task,
    records: &Arc<Vec<InputRecord>>,
    call: CallInput<'_>,
) -> Result<(Instance<S>, BatchCtx, Option<Duration>), NotCalled<S>> {
    let instance = match instance {
        Some(instance) => instance,
        None => operator
            .instantiate(Some(shard.clone()), source)
            .await
            .map_err(|err| NotCalled {
                instance: None,
                prefetch_time: None,
                failure: Failure::Instantiate(err),
            })?,
    };
    let value_states = &operator.meta().value_states;
    let prefetch_time = (!value_states.is_empty()).then(crate::clock::monotonic_now);
    let mut batch = BatchCtx::new(records.clone());
    let prefetched = prefetch_cached(
        &**shard,
        value_states,
        records.iter().map(|r| r.key.as_slice()),
        &mut batch,
        task.prefetched.as_ref(),
    )
    .await;
    let prefetch_time = prefetch_time.map(|t| t.elapsed());
    if let Err(err) = prefetched {
        return Err(NotCalled {
            instance: Some(instance),
            prefetch_time,
            failure: Failure::Unavailable(err),
        });
    }
    batch.set_call_settings(call.emits);
    let now = i64::try_from(operator.clock().now_ms()).unwrap_or(i64::MAX);
    batch.set_time(call.watermark, now);
    Ok((instance, batch, prefetch_time))
}

/// The CPU deadline of a call over `n` records: `record_deadline × n`, capped at
/// `batch_deadline_max`.
pub(super) fn batch_deadline(settings: &RuntimeSettings, n: usize) -> Duration {
    settings
        .record_deadline
        .saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))
        .min(settings.batch_deadline_max.max(settings.record_deadline))
}

/// Runs `future`, adding the time spent inside its polls to `busy`: what a guest call costs,
/// without the time other calls of the partition ran while it waited.
async fn time_polls<F: std::future::Future>(future: F, busy: &mut Duration) -> F::Output {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        let started = crate::clock::monotonic_now();
        let poll = future.as_mut().poll(cx);
        *busy += started.elapsed();
        poll
    })
    .await
}

/// The worker's execution state: admission and batching ([`ExecutionController`]), the tasks
/// waiting for an instance, and the instances.
pub(crate) struct Execution<S: Shard> {
    pub(super) controller: ExecutionController,
    /// Tasks to attempt again (after an outage, or the next record of a one-by-one re-run),
    /// before any new batch.
    pub(super) ready: VecDeque<Task>,
    /// Instances not in a call.
    pub(super) idle: Vec<Instance<S>>,
    /// Instances that exist or are being created (idle plus those in attempts).
    pub(super) live: usize,
    /// Most instances now: `runtime.partition_instances_max`, lowered to those it has when
    /// creating one fails (the host's pool of instances is exhausted by other partitions), and
    /// restored after the next checkpoint.
    pub(super) instances_max: usize,
    /// `runtime.partition_instances_max`.
    pub(super) instances_configured: usize,
    /// Tasks waiting out a backoff (outage, or no instance to be had): the partition is
    /// stalled while there is one.
    pub(super) backing_off: usize,
    /// Where records in flight are counted.
    pub(super) stats: Arc<PipelineStats>,
}

impl<S: Shard> Execution<S> {
    /// Execution for a partition: `in_flight_max` records admitted at most (at least 1).
    pub fn new(
        in_flight_max: usize,
        settings: &RuntimeSettings,
        stats: Arc<PipelineStats>,
    ) -> Self {
        let instances = settings.partition_instances_max.max(1);
        Self {
            controller: ExecutionController::new(in_flight_max, settings.batch_records_max),
            ready: VecDeque::new(),
            idle: Vec::new(),
            live: 0,
            instances_max: instances,
            instances_configured: instances,
            backing_off: 0,
            stats,
        }
    }

    /// `n` records finished, or will never finish.
    pub(super) fn left_flight(&self, n: usize) {
        self.stats
            .records_in_flight
            .fetch_sub(n as u64, Ordering::Relaxed);
        metrics::gauge!("weir_records_in_flight").decrement(n as f64);
    }

    /// With nothing running: gives the instances beyond one back to the host's pool (other
    /// partitions may be waiting for one) and lifts a lowered instance limit.
    pub(super) fn release_instances(&mut self) {
        debug_assert_eq!(self.live, self.idle.len(), "nothing is running");
        self.idle.truncate(1);
        self.live = self.idle.len();
        self.instances_max = self.instances_configured;
    }
}

impl<S: Shard> Drop for Execution<S> {
    /// Records that will never finish (the worker failed, or its task was aborted) leave the
    /// in-flight count.
    fn drop(&mut self) {
        self.left_flight(self.controller.in_flight());
    }
}
