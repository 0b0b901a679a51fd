//! A round of fired timers (see the parent module): its calls, which run as tasks beside the
//! record batches, and how each call's outcome is applied — all of it, one timer at a time
//! after a trap or a rejection with effects, or again after a backoff on an outage.

use super::super::PipelineStats;
use super::super::attempt::{Ended, Running, batch_deadline, prefetch_into};
use super::super::controller::key_hash;
use super::super::ports::{DeadLetterKind, ShardSink};
use super::super::worker::PartitionWorker;
use crate::pipeline::WorkerError;
use crate::pipeline::policy::ROUND_BACKOFF_MAX;
use crate::runtime::guest_log::LogSource;
use crate::runtime::{
    BatchCtx, CallError, Disposition, EmitLimits, FiredTimer, HostAbort, Instance, Operator,
};
use crate::state::{Shard, StateError, StateWrite};
use crate::time::keys;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A fired timer's two entries, removed when it fires.
fn removals(timer: &FiredTimer) -> [Vec<u8>; 2] {
    [
        keys::per_key(&timer.key, &timer.name),
        keys::time_index(timer.domain, timer.time_ms, &timer.key, &timer.name),
    ]
}

/// A round of fired timers in progress: held in the execution controller from its start until
/// its last timer is settled, whatever happens in between (a re-run one timer at a time, an
/// outage's backoff), as a batch of records holds its keys.
#[derive(Debug)]
pub(in crate::pipeline) struct Round {
    /// Its timers, in firing order, at most one per key.
    timers: Arc<Vec<FiredTimer>>,
    /// Timers before this one are settled (fired, or dead-lettered).
    next: usize,
    /// After a trap or a rejection with effects: one timer per call.
    one_by_one: bool,
    /// Hashes of its keys, held in the execution controller.
    held: Vec<u64>,
    /// Processing time of its calls, ms.
    now_ms: i64,
    /// Wait before the next call (after an outage), and the wait after the next outage.
    delay: Duration,
    backoff: Duration,
}

impl Round {
    /// The timers of the next call: the rest of the round, or its next timer alone.
    fn calling(&self) -> Arc<Vec<FiredTimer>> {
        match (self.one_by_one, self.next) {
            (false, 0) => self.timers.clone(),
            (false, next) => Arc::new(self.timers[next..].to_vec()),
            (true, next) => Arc::new(vec![self.timers[next].clone()]),
        }
    }
}

/// A call of a round that ended beside the record batches, handed back to the worker
/// ([`PartitionWorker::timers_called`]).
pub(in crate::pipeline) struct TimersCalled<S: Shard> {
    round: Round,
    /// The timers the call was given.
    calling: Arc<Vec<FiredTimer>>,
    /// The instance, unless the call left it unusable or none could be created.
    instance: Option<Instance<S>>,
    called: Called,
}

/// An `on-timers` call with all it needs owned, so that it runs beside the worker's record
/// batches as their attempts do ([`super::attempt::attempt`]).
struct TimerCall<S: Shard> {
    timers: Arc<Vec<FiredTimer>>,
    shard: Arc<S>,
    operator: Arc<Operator<S>>,
    source: LogSource,
    stats: Arc<PipelineStats>,
    /// The call's time: the shard's applied watermark, and the clock.
    watermark: Option<i64>,
    now_ms: i64,
    deadline: Duration,
    emits: EmitLimits,
    /// Longest wait for the prefetch.
    io_max: Duration,
}

impl<S: Shard> TimerCall<S> {
    /// Prefetches the timers' keys' declared value states (as for a batch of records), stages
    /// every fired timer's entries as removed and calls `on-timers` on `instance` (or a new
    /// one). Returns the instance unless the call left it unusable or none could be created.
    async fn run(self, instance: Option<Instance<S>>) -> (Option<Instance<S>>, Called) {
        let mut batch = BatchCtx::for_timers(self.timers.clone());
        batch.set_emit_limits(&self.emits);
        batch.set_time(self.watermark, self.now_ms);
        let keys = self.timers.iter().map(|t| t.key.as_slice());
        let value_states = &self.operator.meta().value_states;
        let io_max = self.io_max;
        match tokio::time::timeout(
            io_max,
            prefetch_into(&*self.shard, value_states, keys, &mut batch),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return (instance, Called::Outage(err)),
            Err(_) => {
                let err = StateError::Unavailable {
                    shard: self.source.label.to_string(),
                    source: format!("prefetch still waiting after {io_max:?}").into(),
                };
                return (instance, Called::Outage(err));
            }
        }
        for timer in self.timers.iter() {
            for key in removals(timer) {
                batch.stage_removal(key);
            }
        }
        let mut instance = match instance {
            Some(instance) => instance,
            None => match self
                .operator
                .instantiate(Some(self.shard.clone()), self.source.clone())
                .await
            {
                Ok(instance) => instance,
                Err(err) => {
                    let err = StateError::Unavailable {
                        shard: self.source.label.to_string(),
                        source: Box::new(err),
                    };
                    return (None, Called::Outage(err));
                }
            },
        };
        let result = instance.call_timers(batch, self.deadline).await;
        self.stats.guest_calls.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok((dispositions, batch)) => (Some(instance), Called::Done(dispositions, batch)),
            // The store is unusable after any error.
            Err(CallError::Aborted(HostAbort::State(err))) => (None, Called::Outage(err)),
            Err(fault) => {
                self.stats.traps.fetch_add(1, Ordering::Relaxed);
                (None, Called::Fault(fault))
            }
        }
    }
}

/// How a round's call ended.
pub(in crate::pipeline) enum Called {
    /// Dispositions and staged effects.
    Done(Vec<Disposition>, BatchCtx),
    /// The guest failed (trap, deadline, wrong disposition count).
    Fault(CallError),
    /// The state backend failed.
    Outage(StateError),
}

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// Starts a round over `timers` in `running`: they leave the head while they fire (they
    /// are settled or retried, never given back) and their keys are held in the controller
    /// until the round ends ([`Self::timers_called`]).
    pub(super) fn start_round(
        &mut self,
        timers: Vec<FiredTimer>,
        now_ms: i64,
        running: &mut Running<S>,
    ) {
        for t in &timers {
            let index = keys::time_index(t.domain, t.time_ms, &t.key, &t.name);
            self.timers.head.take(t.domain, &index);
        }
        // Distinct: a round has at most one timer per key.
        let held: Vec<u64> = timers.iter().map(|t| key_hash(&t.key)).collect();
        self.execution.controller.hold(&held);
        let round = Round {
            timers: Arc::new(timers),
            next: 0,
            one_by_one: false,
            held,
            now_ms,
            delay: Duration::ZERO,
            backoff: self.settings.outage_backoff_min,
        };
        self.call_round(round, running);
    }

    /// Starts the next call of a round that goes on ([`Self::timers_called`] left it in
    /// `Timers::going_on`), if there is one: called at the top of the worker's loop, before
    /// anything looks at what runs.
    pub(in crate::pipeline) fn continue_round(&mut self, running: &mut Running<S>) {
        if let Some(round) = self.timers.going_on.take() {
            self.call_round(round, running);
        }
    }

    /// Pushes the round's next call (after its delay) into `running`.
    fn call_round(&mut self, round: Round, running: &mut Running<S>) {
        let calling = round.calling();
        let instance = self.take_instance();
        let call = self.timer_call(calling.clone(), round.now_ms);
        running.push(Box::pin(async move {
            if !round.delay.is_zero() {
                tokio::time::sleep(round.delay).await;
            }
            let (instance, called) = call.run(instance).await;
            Ended::Timers(TimersCalled {
                round,
                calling,
                instance,
                called,
            })
        }));
    }

    /// A call of a round ended ([`Self::start_round`]): its effects are applied, or its
    /// timers dead-lettered, and the round ends — its keys' records may run — once every timer
    /// is settled; until then it goes on (`Timers::going_on`, started again at the top of the
    /// worker's loop): one timer at a time after a trap or a rejection with effects, the same
    /// call again after a backoff on an outage. Nothing of it is ever called inline: record
    /// calls beside it are left unpolled meanwhile, and their wall-clock caps would run out.
    pub(in crate::pipeline) async fn timers_called(
        &mut self,
        ended: TimersCalled<S>,
    ) -> Result<(), WorkerError> {
        let TimersCalled {
            mut round,
            calling,
            instance,
            called,
        } = ended;
        self.give_back_instance(instance);
        round.delay = Duration::ZERO;
        let now = round.now_ms;
        let settled = match called {
            Called::Outage(err) => Err(err),
            Called::Done(dispositions, batch)
                if !round.one_by_one
                    && !dispositions
                        .iter()
                        .enumerate()
                        .any(|(i, d)| matches!(d, Disposition::Reject(_)) && batch.touched(i)) =>
            {
                // One write: on an outage nothing of the call was applied.
                let settled = self
                    .settle_timers(&calling, &dispositions, batch, now)
                    .await?;
                settled.map(|()| round.next = round.timers.len())
            }
            // A rejection with effects, or a fault: one timer at a time.
            Called::Done(..) | Called::Fault(_) if !round.one_by_one => {
                round.one_by_one = true;
                self.timers.going_on = Some(round);
                return Ok(());
            }
            // One timer alone, rejected with effects: those are discarded, it is
            // dead-lettered.
            Called::Done(dispositions, batch)
                if batch.touched(0)
                    && matches!(dispositions.first(), Some(Disposition::Reject(_))) =>
            {
                let reason = match dispositions.into_iter().next() {
                    Some(Disposition::Reject(reason)) => reason,
                    _ => String::new(),
                };
                let settled = self
                    .timer_failed(&calling[0], DeadLetterKind::Rejected, &reason, now)
                    .await?;
                settled.map(|()| round.next += 1)
            }
            Called::Done(dispositions, batch) => {
                let settled = self
                    .settle_timers(&calling, &dispositions, batch, now)
                    .await?;
                settled.map(|()| round.next += 1)
            }
            Called::Fault(fault) => {
                let kind = match fault {
                    CallError::Trap { deadline: true, .. } => DeadLetterKind::Deadline,
                    _ => DeadLetterKind::Trapped,
                };
                let settled = self
                    .timer_failed(&calling[0], kind, &fault.to_string(), now)
                    .await?;
                settled.map(|()| round.next += 1)
            }
        };
        match settled {
            Ok(()) if round.next < round.timers.len() => {
                round.backoff = self.settings.outage_backoff_min;
                self.timers.going_on = Some(round);
                Ok(())
            }
            Ok(()) => {
                self.execution.controller.finish(&round.held, 0);
                self.round_ended(Ok(()))
            }
            Err(err) if err.kind() == crate::error::ErrorKind::Corrupt => Err(self.corrupt(err)),
            Err(err) => {
                // Its keys stay held and its timers taken: the same call after a backoff.
                tracing::warn!(partition = self.partition, error = %err, retry_in = ?round.backoff, "state backend unavailable; timers wait");
                self.stats.outage_retries.fetch_add(1, Ordering::Relaxed);
                round.delay = round.backoff;
                round.backoff = (round.backoff * 2).min(ROUND_BACKOFF_MAX);
                self.timers.going_on = Some(round);
                Ok(())
            }
        }
    }

    /// What a call over `timers` needs, owned (see [`TimerCall::run`]).
    fn timer_call(&self, timers: Arc<Vec<FiredTimer>>, now_ms: i64) -> TimerCall<S> {
        TimerCall {
            deadline: batch_deadline(&self.settings, timers.len()),
            timers,
            shard: self.shard.clone(),
            operator: self.operator.clone(),
            source: self.source.clone(),
            stats: self.stats.clone(),
            watermark: self.timers.watermarks.applied(),
            now_ms,
            emits: EmitLimits {
                record_bytes_max: self.sink.output_bytes_max(),
                table: self.sink.emit_table(),
            },
            io_max: self.settings.call_io_allowance,
        }
    }

    /// An idle instance, or `None` with one more counted live (the call creates it).
    fn take_instance(&mut self) -> Option<Instance<S>> {
        let instance = self.execution.idle.pop();
        if instance.is_none() {
            self.execution.live += 1;
        }
        instance
    }

    /// An instance back from a call: idle again, or gone (`None`: a failed call left it
    /// unusable, or none could be created).
    fn give_back_instance(&mut self, instance: Option<Instance<S>>) {
        match instance {
            Some(instance) => self.execution.idle.push(instance),
            None => self.execution.live -= 1,
        }
    }

    /// Applies a successful call over `timers`: every timer's removal, the effects (writes and
    /// emits), and dead letters for the rejected ones (whose effects, if any, the caller made
    /// sure are not in `batch`).
    async fn settle_timers(
        &mut self,
        timers: &[FiredTimer],
        dispositions: &[Disposition],
        batch: BatchCtx,
        now_ms: i64,
    ) -> Result<Result<(), StateError>, WorkerError> {
        fail::fail_point!("timers-before-apply", |_| crate::fail_points::crash(
            "timers-before-apply"
        ));
        // The fired timers' removals are staged by the host, not counted by the call.
        let added = batch.timers_added() - timers.len() as i64;
        let mut batch = batch;
        // Released once the writes are applied (and so counted as held), or dropped.
        let quota = batch.take_quota();
        let (writes, emits) = batch.into_effects();
        let follow: Vec<StateWrite> = writes
            .iter()
            .filter(|w| w.key.starts_with(&keys::TIME_INDEX))
            .cloned()
            .collect();
        let applied = self.shard.apply(writes).await;
        drop(quota);
        if let Err(err) = applied {
            return Ok(Err(err));
        }
        self.timers.applied(&follow, added);
        self.dirty = true;
        self.sink.position(&self.offsets);
        for emit in &emits {
            let source = self
                .timers
                .source(self.partition, &timers[emit.record as usize], now_ms);
            if let Err(err) = self.sink.emit(emit, &source).await {
                return Err(self.sink_failed(err));
            }
        }
        self.stats
            .emitted
            .fetch_add(emits.len() as u64, Ordering::Relaxed);
        self.stats.metrics.records_out.increment(emits.len() as u64);
        for (timer, disposition) in timers.iter().zip(dispositions) {
            if let Disposition::Reject(reason) = disposition {
                let source = self.timers.source(self.partition, timer, now_ms);
                self.dead_letter(&source, DeadLetterKind::Rejected, reason)
                    .await?;
            }
        }
        self.stats.timers_fired(timers.len() as u64);
        fail::fail_point!("timers-after-emit", |_| crate::fail_points::crash(
            "timers-after-emit"
        ));
        Ok(Ok(()))
    }

    /// A timer rejected, or whose call failed, alone: its entries removed, nothing else of it
    /// applied, and it is dead-lettered — a rejection always, a failure as `failure_policy`
    /// says (or skipped, or the pipeline stops).
    async fn timer_failed(
        &mut self,
        timer: &FiredTimer,
        kind: DeadLetterKind,
        error: &str,
        now_ms: i64,
    ) -> Result<Result<(), StateError>, WorkerError> {
        let writes: Vec<StateWrite> = removals(timer)
            .into_iter()
            .map(|key| StateWrite {
                key,
                value: None,
                expires_at_ms: None,
            })
            .collect();
        if let Err(err) = self.shard.apply(writes.clone()).await {
            return Ok(Err(err));
        }
        self.timers.applied(&writes, -1);
        self.dirty = true;
        let source = self.timers.source(self.partition, timer, now_ms);
        self.stats.timers_fired(1);
        if kind == DeadLetterKind::Rejected {
            self.dead_letter(&source, kind, error).await?;
        } else {
            self.failed_alone(&source, kind, error).await?;
        }
        Ok(Ok(()))
    }
}
