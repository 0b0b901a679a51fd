//! The worker's side of its timers (docs/time.md; [`crate::pipeline::timers`] holds their
//! state and rounds): when to start a round, its calls beside the record batches, and how a
//! call's outcome is applied — its state writes and emits, its dead letters — as a batch's is.

use super::PartitionWorker;
use crate::pipeline::WorkerError;
use crate::pipeline::attempt::{Ended, Running, batch_deadline};
use crate::pipeline::ports::{DeadLetterKind, ShardSink};
use crate::pipeline::timers::{Called, Round, TimerCall, TimersCalled, removals};
use crate::runtime::BatchCtx;
use crate::runtime::{CallError, Disposition, FiredTimer, Instance};
use crate::state::{Shard, StateError, StateWrite};
use crate::time::keys;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// With nothing in flight: prepares one round of due timers ([`Self::due_round`]) and
    /// starts its call in `running`, beside the record batches to come. The round's keys are
    /// held in the execution controller until it ends, so that a key's later records wait
    /// behind its timer (as FLIP-425's per-key order), while other keys' records run. A state
    /// outage backs off (records go on meanwhile); a corrupt state ends the worker.
    pub(in crate::pipeline) async fn timer_round(
        &mut self,
        running: &mut Running<S>,
    ) -> Result<(), WorkerError> {
        match self.due_round().await {
            Ok(None) => self.round_ended(Ok(())),
            Ok(Some((timers, now_ms))) => {
                self.start_round(timers, now_ms, running);
                Ok(())
            }
            Err(err) => self.round_ended(Err(err)),
        }
    }

    /// A round's preparation or call ended: a success ends any backoff; an outage starts or
    /// lengthens one; a corrupt state ends the worker.
    fn round_ended(&mut self, result: Result<(), StateError>) -> Result<(), WorkerError> {
        match result {
            Ok(()) => {
                self.timers.round_succeeded();
                Ok(())
            }
            Err(err) if err.kind() == crate::error::ErrorKind::Corrupt => Err(self.corrupt(err)),
            Err(err) => {
                let retry_in = self.timers.round_failed();
                tracing::warn!(partition = self.partition.0, error = %err, ?retry_in, "state backend unavailable; timers wait");
                // Counted as a record's retry is, once timers run (not for their first load,
                // which records do not wait for while it backs off).
                if self.timers.loaded() {
                    self.stats.outage_retries.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
        }
    }

    /// With nothing in flight: loads the shard's timers and saved watermark once, applies
    /// (and saves) the watermark the finished records allow, and picks the next round's due
    /// timers, in firing order, at most one per key. `None` when none is due.
    async fn due_round(&mut self) -> Result<Option<(Vec<FiredTimer>, i64)>, StateError> {
        let io_max = self.settings.call_io_allowance;
        let source = self.source.to_string();
        self.timers.load(&*self.shard, io_max, &source).await?;
        self.save_time().await?;
        Ok(self.timers.next_round(self.settings.timer_batch_max))
    }

    /// Saves the applied watermark and the count of pending timers to the shard when they
    /// changed ([`crate::pipeline::timers::Timers::save`]), so that a checkpoint keeps them,
    /// and reports them in the pipeline's metrics.
    ///
    /// # Errors
    /// [`StateError`] from the write: nothing was saved, and a checkpoint must not be taken.
    pub(in crate::pipeline) async fn save_time(&mut self) -> Result<(), StateError> {
        let saved = self.timers.save(&*self.shard).await?;
        if saved.wrote {
            self.dirty = true;
        }
        if let Some(count) = saved.count {
            self.stats
                .record_timers_pending(self.partition, u64::try_from(count).unwrap_or(0));
        }
        if let Some((watermark, now)) = saved.watermark {
            self.stats.record_watermark(self.partition, watermark, now);
        }
        Ok(())
    }
}

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// Starts a round over `timers` in `running`: they leave the head while they fire (they
    /// are settled or retried, never given back) and their keys are held in the controller
    /// until the round ends ([`Self::timers_called`]).
    fn start_round(&mut self, timers: Vec<FiredTimer>, now_ms: i64, running: &mut Running<S>) {
        self.timers.take(&timers);
        let round = Round::new(timers, now_ms, self.settings.outage_backoff_min);
        self.execution.controller.hold(round.held());
        self.call_round(round, running);
    }

    /// Starts the next call of a round that goes on ([`Self::timers_called`] left it in
    /// `Timers::going_on`), if there is one: called at the top of the worker's loop, before
    /// anything looks at what runs.
    pub(in crate::pipeline) fn continue_round(&mut self, running: &mut Running<S>) {
        if let Some(round) = self.timers.going_on() {
            self.call_round(round, running);
        }
    }

    /// Pushes the round's next call (after its delay) into `running`.
    fn call_round(&mut self, round: Round, running: &mut Running<S>) {
        let calling = round.calling();
        let instance = self.take_instance();
        let call = self.timer_call(calling.clone(), round.now_ms());
        running.push(Box::pin(async move {
            if !round.delay().is_zero() {
                tokio::time::sleep(round.delay()).await;
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
        let now = round.now_ms();
        let settled = match called {
            Called::Outage(err) => Err(err),
            Called::Done(dispositions, batch)
                if !round.one_by_one()
                    && !dispositions
                        .iter()
                        .enumerate()
                        .any(|(i, d)| matches!(d, Disposition::Reject(_)) && batch.touched(i)) =>
            {
                // One write: on an outage nothing of the call was applied.
                self.settle_timers(&calling, &dispositions, batch, now)
                    .await?
            }
            // A rejection with effects, or a fault: one timer at a time.
            Called::Done(..) | Called::Fault(_) if !round.one_by_one() => {
                round.go_one_by_one();
                self.timers.go_on(round);
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
                self.timer_failed(&calling[0], DeadLetterKind::Rejected, &reason, now)
                    .await?
            }
            Called::Done(dispositions, batch) => {
                self.settle_timers(&calling, &dispositions, batch, now)
                    .await?
            }
            Called::Fault(fault) => {
                let kind = match fault {
                    CallError::Trap { deadline: true, .. } => DeadLetterKind::Deadline,
                    _ => DeadLetterKind::Trapped,
                };
                self.timer_failed(&calling[0], kind, &fault.to_string(), now)
                    .await?
            }
        };
        match settled {
            Ok(()) => {
                round.settled(calling.len(), self.settings.outage_backoff_min);
                if round.done() {
                    self.execution.controller.finish(round.held(), 0);
                    return self.round_ended(Ok(()));
                }
                self.timers.go_on(round);
                Ok(())
            }
            Err(err) if err.kind() == crate::error::ErrorKind::Corrupt => Err(self.corrupt(err)),
            Err(err) => {
                // Its keys stay held and its timers taken: the same call after a backoff.
                let retry_in = round.backed_off();
                tracing::warn!(partition = self.partition.0, error = %err, ?retry_in, "state backend unavailable; timers wait");
                self.stats.outage_retries.fetch_add(1, Ordering::Relaxed);
                self.timers.go_on(round);
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
            watermark: self.timers.watermarks().applied(),
            now_ms,
            emits: self.call_settings.clone(),
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
        if !emits.is_empty() {
            self.mark_active().await?;
        }
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
