//! What the worker does with an ended attempt (module docs of `worker`, steps 3–4): applies a
//! successful call's effects, or schedules what comes next — a retry after an outage, a
//! one-by-one re-run around a trapping record, a dead letter.

use super::PartitionWorker;
use crate::config::FailurePolicy;
use crate::pipeline::WorkerError;
use crate::pipeline::attempt::{Attempted, Failure, Task};
use crate::pipeline::isolation::{Outcome, Verdict};
use crate::pipeline::policy::OUTAGE_BACKOFF_MAX;
use crate::pipeline::ports::{DeadLetterKind, ShardSink};
use crate::runtime::guest_log::GuestLevel;
use crate::runtime::{BatchCtx, CallError, Disposition, InputRecord, Instance, RuntimeError};
use crate::state::{Shard, StateError};
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// Handles an ended attempt: applies a successful call's effects, or schedules what comes
    /// next (module docs).
    pub(super) async fn attempted(&mut self, attempted: Attempted<S>) -> Result<(), WorkerError> {
        let Attempted {
            task,
            records,
            instance,
            call_time,
            started,
            prefetch_time,
            prefetched,
            result,
        } = attempted;
        self.attempt_ended(instance, &task, call_time, prefetch_time);
        match result {
            Err(Failure::Instantiate(source)) => {
                self.no_instance(task, &source);
                Ok(())
            }
            Err(Failure::Unavailable(err)) => self.retry_later(task, err),
            Err(Failure::Aborted(err)) => {
                self.stats.calls_aborted.fetch_add(1, Ordering::Relaxed);
                self.retry_later(task, err)
            }
            Err(Failure::Fault(fault)) => {
                let mut task = task;
                task.keep_prefetched(prefetched);
                self.faulted(task, &records, &fault).await
            }
            Ok((dispositions, batch)) => {
                self.called(task, &records, started, &dispositions, batch)
                    .await
            }
        }
    }

    /// The instance back to the idle ones (or gone), a retry's backoff ended, the call and the
    /// prefetch counted.
    fn attempt_ended(
        &mut self,
        instance: Option<Instance<S>>,
        task: &Task,
        call_time: Option<Duration>,
        prefetch_time: Option<Duration>,
    ) {
        if let Some(took) = prefetch_time {
            self.stats.metrics.state_get.record(took.as_secs_f64());
        }
        match instance {
            Some(instance) => self.execution.idle.push(instance),
            None => self.execution.live -= 1,
        }
        if !task.delay.is_zero() {
            // A retry after a backoff ended (it may back off again below).
            self.execution.backing_off -= 1;
        }
        if let Some(took) = call_time {
            self.stats.guest_calls.fetch_add(1, Ordering::Relaxed);
            self.stats
                .guest_call_ns
                .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// No instance could be created: the host's pool of instances is exhausted by other
    /// partitions (or instantiation fails for now). Goes on with the instances this partition
    /// has until its next checkpoint; with none, waits and tries again, as after an outage.
    fn no_instance(&mut self, task: Task, source: &RuntimeError) {
        self.stats
            .instances_unavailable
            .fetch_add(1, Ordering::Relaxed);
        self.execution.instances_max = self.execution.live.max(1);
        if self.execution.live > 0 {
            tracing::debug!(partition = self.partition.0, error = %source, instances = self.execution.live, "no further instance; running with those there are");
            self.execution.ready.push_front(task);
        } else {
            tracing::warn!(partition = self.partition.0, error = %source, retry_in = ?task.backoff, "cannot instantiate the operator; partition paused");
            self.back_off(task);
        }
    }

    /// The call over `records` trapped or ran out of its deadline: isolate the failing record
    /// ([`crate::pipeline::isolation`]); one that fails alone fails for good.
    async fn faulted(
        &mut self,
        mut task: Task,
        records: &[InputRecord],
        fault: &CallError,
    ) -> Result<(), WorkerError> {
        self.stats.traps.fetch_add(1, Ordering::Relaxed);
        let deadline = matches!(fault, CallError::Trap { deadline: true, .. });
        let outcome = match fault {
            _ if deadline => Outcome::Deadline,
            // How far the guest got: where isolation looks first.
            CallError::Trap { reached, .. } => Outcome::Trapped {
                reached: Some(*reached as usize),
            },
            _ => Outcome::Trapped { reached: None },
        };
        tracing::debug!(partition = self.partition.0, offset = records[0].offset, records = records.len(), error = %fault, "call failed; isolating the failing record");
        match task.isolation.settle(outcome) {
            Verdict::Continue => self.step(task),
            Verdict::Isolated(index) => {
                let kind = if deadline {
                    DeadLetterKind::Deadline
                } else {
                    DeadLetterKind::Trapped
                };
                let record = &task.records[index];
                self.failed_alone(record, kind, &fault.to_string()).await?;
                task.isolation.record_settled();
                self.step(task);
            }
        }
        Ok(())
    }

    /// The call over `records` succeeded: applies its effects — unless a rejected record had
    /// staged some, when the batch runs again without it, so that exactly its effects are
    /// discarded.
    async fn called(
        &mut self,
        mut task: Task,
        records: &[InputRecord],
        started: Instant,
        dispositions: &[Disposition],
        batch: BatchCtx,
    ) -> Result<(), WorkerError> {
        let rejected_with_effects = dispositions
            .iter()
            .enumerate()
            .find(|(i, d)| matches!(d, Disposition::Reject(_)) && batch.touched(*i))
            .map(|(i, _)| i);
        if let Some(i) = rejected_with_effects
            && records.len() > 1
        {
            let index = task.call_start() + i;
            task.isolation.settle(Outcome::RejectedWithEffects(index));
            self.step(task);
            return Ok(());
        }
        let committed = self
            .commit(
                records,
                dispositions,
                batch,
                rejected_with_effects.is_none(),
            )
            .await?;
        match committed {
            Ok(()) => {
                self.stats
                    .metrics
                    .batch_processing
                    .record(started.elapsed().as_secs_f64());
                if let Some(range) = task.isolation.current() {
                    task.applied(range, &self.operator.meta().value_states);
                }
                task.isolation.settle(Outcome::Done);
                self.step(task);
                Ok(())
            }
            Err(err) => self.retry_later(task, err),
        }
    }

    /// A record failed alone (trapped, or ran out of its deadline): dead-letter it, skip it or
    /// stop, as `failure_policy` says.
    pub(in crate::pipeline) async fn failed_alone(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> Result<(), WorkerError> {
        // Once in the operator's log, within its budgets: what the guest wrote to stderr before
        // it trapped, held during the isolation's re-runs (runtime::guest_log).
        self.operator.log(self.source.clone()).line(
            GuestLevel::Error,
            &format!(
                "record {}@{} failed ({}): {}",
                record.topic,
                record.offset,
                kind.as_str(),
                first_line(error)
            ),
        );
        match self.failure_policy {
            FailurePolicy::DeadLetter => self.dead_letter(record, kind, error).await,
            FailurePolicy::Skip => {
                if let Some(suppressed) = self.stats.failure_log.admit() {
                    tracing::warn!(partition = self.partition.0, topic = %record.topic, offset = record.offset, kind = kind.as_str(), cause = first_line(error), suppressed, "record skipped (failure_policy = skip)");
                }
                self.stats
                    .records_skipped_failed
                    .fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            FailurePolicy::Fail => {
                tracing::error!(partition = self.partition.0, topic = %record.topic, offset = record.offset, error, "record failed; stopping the pipeline (failure_policy = fail)");
                Err(WorkerError::RecordFailed {
                    partition: self.partition,
                    topic: record.topic.to_string(),
                    offset: record.offset,
                    reason: error.to_owned(),
                })
            }
        }
    }

    /// Schedules `task` again after its backoff (the state backend failed; nothing of it was
    /// applied), raising `stalled` so the consumer loop pauses the partition; a corrupt state
    /// ends the worker instead.
    pub(super) fn retry_later(&mut self, task: Task, err: StateError) -> Result<(), WorkerError> {
        if err.kind() == crate::error::ErrorKind::Corrupt {
            return Err(self.corrupt(err));
        }
        tracing::warn!(partition = self.partition.0, error = %err, retry_in = ?task.backoff, "state backend unavailable; partition paused");
        self.stats.outage_retries.fetch_add(1, Ordering::Relaxed);
        self.back_off(task);
        Ok(())
    }

    /// The worker's end after finding its shard corrupt.
    pub(in crate::pipeline) fn corrupt(&self, source: StateError) -> WorkerError {
        tracing::error!(partition = self.partition.0, error = %source, "shard state is corrupt; the partition falls back to an older checkpoint");
        WorkerError::Corrupt {
            partition: self.partition,
            opened_from: self.shard.opened_from(),
            source,
        }
    }

    /// Schedules `task` after its backoff (doubling the next one), counting it as backing off:
    /// the consumer loop pauses the partition while any task is.
    pub(super) fn back_off(&mut self, mut task: Task) {
        if self.assignment.is_closing() {
            // Told to finish or revoked: no further wait; the worker ends (module docs).
            self.gave_up = true;
        }
        task.delay = task.backoff;
        task.backoff = (task.backoff * 2).min(OUTAGE_BACKOFF_MAX);
        self.execution.backing_off += 1;
        self.execution.ready.push_back(task);
    }

    /// A call of `task` is settled: the next range isolation asks for, or the batch finishes.
    pub(super) fn step(&mut self, mut task: Task) {
        if !task.isolation.is_finished() {
            task.reset_backoff(self.settings.outage_backoff_min);
            self.execution.ready.push_front(task);
            return;
        }
        self.execution
            .controller
            .finish(&task.keys, task.records.len());
        self.execution.left_flight(task.records.len());
        self.processed(&task.records);
    }
}

/// The first line of `text`: a trap's cause, without the wasm backtrace that follows it.
pub(super) fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}
