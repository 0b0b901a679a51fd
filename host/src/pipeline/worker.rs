//! The worker of one partition: records in → execution controller → batches → prefetch →
//! guest call → apply state → emit.
//!
//! Execution (as Flink 2.0's asynchronous execution, FLIP-425): records are admitted up to
//! `pipeline.in_flight_max`; the [`super::controller::ExecutionController`] forms batches in which no key is in
//! another unfinished batch, and the worker runs up to `runtime.partition_instances_max` of
//! them at once, each on its own instance, so records with other keys proceed while one batch
//! waits for state. A batch's effects are applied by the worker, one batch at a time, as its
//! call ends; a key's next batch starts only after that, so each key sees its records in input
//! order and its outputs leave in input order.
//!
//! Batch semantics (see the WIT `process-batch` docs):
//! 1. Prefetch the declared value states of every distinct key in the batch (one `get_many`).
//! 2. Call the guest once for the whole batch with a CPU budget of `record_deadline × n`
//!    (capped at `batch_deadline_max`).
//! 3. On success, apply the batch's staged writes to the shard, produce its emits in order and
//!    dead-letter the rejected records — unless a rejected record had staged effects, in which
//!    case the batch is run again around it so that exactly its effects are discarded.
//! 4. On a trap, discard everything and isolate the failing record ([`super::isolation`]):
//!    halves of halves, each part's effects applied before the next runs (one record at a
//!    time after a CPU deadline); a record that traps alone is dead-lettered.
//!
//! A state backend outage aborts the call from the host; the worker backs off and retries the
//! same records, which pauses the partition (its queue fills and the consumer loop pauses that
//! partition's fetching; other partitions go on) but never dead-letters a good record.
//! Invariant: effects of a record are applied at most once and only after its call succeeded;
//! effects of records with the same key are applied in input order.
//!
//! Checkpoints (docs/checkpoints.md): every `checkpoint_interval` the worker stops admitting,
//! lets every admitted record finish, waits for every output delivery, then checkpoints its
//! shard with the offsets after the last processed record. Records below those offsets
//! (already in the state it resumed from) are skipped.
//!
//! The end ([`Control`], heard outside the queue: [`super::events`]): told to finish
//! (shutdown), it processes what the loop hands over until the loop closes the queue; once
//! the partition is revoked it drops the records not yet admitted. Either way it then finishes
//! what it admitted, checkpoints once more and ends — but it never waits on what holds it
//! back: a batch backing off from a state outage is tried again at once, and one that fails
//! again ends the worker without its last checkpoint (its offsets would cover records whose
//! effects are not applied; the next owner resumes from the last one); a sink that takes no
//! more output gets nothing more; a refused delivery is given up on by the sink.

use super::PipelineStats;
use super::attempt::{Ended, Execution, Running, Task, attempt, batch_deadline};
use super::events::{Assignment, Batch, EventSender, Stall};
use super::isolation::Isolation;
use super::ports::{DeadLetterKind, ShardSink, SinkError};
use super::timers::Timers;
use crate::config::{FailurePolicy, LateRecords, RuntimeSettings};
use crate::ids::{Offset, Partition};
use crate::runtime::guest_log::LogSource;
use crate::runtime::{BatchCtx, CallSettings, Disposition, InputRecord, Operator};
use crate::state::checkpoint::InputOffsets;
use crate::state::{Shard, StateError};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

mod backlog;
mod checkpoint;
mod edges;
mod effects;
mod ended;
mod error;
mod run;
mod start;
mod tables;
mod timers;

use backlog::Backlog;
pub use error::WorkerError;
pub(crate) use start::WorkerStart;

/// One partition's worker.
pub(crate) struct PartitionWorker<S: Shard, K: ShardSink> {
    pub partition: Partition,
    pub operator: Arc<Operator<S>>,
    pub shard: Arc<S>,
    /// Where outputs and dead letters go; exactly-once, its transaction decides checkpoints.
    pub sink: K,
    pub settings: RuntimeSettings,
    pub stats: Arc<PipelineStats>,
    /// How its instances log: label, partition and the pipeline's log sink.
    pub source: LogSource,
    /// The execution controller and the instances.
    pub execution: Execution<S>,
    /// What it tells the consumer loop: a stall while it backs off from an outage (the loop
    /// pauses the partition), each checkpoint's offsets.
    pub events: EventSender,
    /// What the consumer loop asks besides the records: told to finish or revoked, the worker
    /// takes its last steps (module docs).
    pub assignment: Assignment,
    /// A batch failed again after the worker was told to finish or revoked: it ends without
    /// its last checkpoint (module docs).
    pub gave_up: bool,
    /// The outage stall the loop was last told of.
    pub stall_reported: bool,
    /// The sink backlog stall ([`ShardSink::held_back`]) the loop was last told of.
    pub sink_held_reported: bool,
    /// The input position the shard's state reflects (the checkpoint it resumed from, then
    /// every finished record). Valid as a checkpoint's offsets only when nothing is in flight.
    pub offsets: InputOffsets,
    /// The position after the last admitted record: records below it are not admitted again.
    pub admitted: InputOffsets,
    /// Records were processed since the last checkpoint.
    pub dirty: bool,
    /// How often to checkpoint.
    pub checkpoint_interval: Duration,
    /// When the partition's shard began to open: the first processed record reports the
    /// recovery time from it.
    pub opened_at: Option<Instant>,
    /// What a record whose call fails for good does.
    pub failure_policy: FailurePolicy,
    /// Each change asks for a checkpoint now, besides the interval's.
    pub checkpoint_requests: watch::Receiver<u64>,
    /// The shard's timers and watermark ([`super::timers`]).
    pub timers: Timers,
    /// The marker the sink last wrote to its internal outputs ([`ShardSink::watermark`]).
    pub marked: Option<crate::time::watermark::Marker>,
    /// Its edges' frontiers and what it saved of them ([`edges`]).
    pub edges: edges::EdgeTracking,
    /// What a record behind the watermark does.
    pub late_records: LateRecords,
    /// What each call gets besides its records: the sink's limits and table, the run's
    /// parameters (`weir:operator/parameters`).
    pub call_settings: Arc<CallSettings>,
    /// The run's table inputs: topic → the value state its records set
    /// ([`crate::pipeline::tables`]).
    pub tables: std::collections::BTreeMap<String, String>,
    /// Whether the consumer has handed out every record of the partition's input topics up
    /// to their end: kept by the consumer loop ([`super::ports::Source::at_end`]); only a
    /// caught-up shard's watermark follows processing time (`idle_advance`).
    pub caught_up: Arc<AtomicBool>,
}

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// Processes batches and checkpoints every `checkpoint_interval` until told to finish or
    /// revoked, then checkpoints a last time (which waits for every delivery) — or ends without
    /// it when what holds it back does not let go (module docs).
    pub async fn run(mut self, mut queue: mpsc::Receiver<Batch>) -> Result<(), WorkerError> {
        match self.run_until_closed(&mut queue).await {
            // A delivery the sink gave up on once told to finish or revoked: the outputs of
            // the records since the last checkpoint are not all acknowledged (or their
            // transaction is lost), so none is taken; the next owner resumes from the last.
            Err(err @ (WorkerError::Sink { .. } | WorkerError::Transaction { .. }))
                if self.assignment.is_closing() =>
            {
                self.ended_without_checkpoint(&crate::error::Chain(&err));
                Ok(())
            }
            ended => ended,
        }
    }

    /// Records waiting in Weir keep their inputs active: waiting in Weir is not idleness.
    /// Queued (the queue not empty) or held by an outage: every input (their topics are
    /// unknown while queued); received and waiting for room in flight: theirs. Also tells the
    /// watermarks whether the consumer is caught up.
    fn note_waiting_inputs(&mut self, backlog: &mut Backlog, queue_empty: bool) {
        if self.execution.backing_off > 0 || !queue_empty {
            let now = self.timers.now_ms();
            self.timers.watermarks_mut().held(now);
        }
        if backlog.records.is_empty() {
            backlog.topics.clear();
        } else {
            let now = self.timers.now_ms();
            for topic in &backlog.topics {
                self.timers.watermarks_mut().seen(topic, now);
            }
        }
        self.timers
            .watermarks_mut()
            .set_caught_up(self.caught_up.load(Ordering::Acquire));
    }

    /// Admits what the backlog holds while there is room in flight ([`Self::admit`]) and
    /// dead-letters the late records it turns away (`late_records = dead_letter`).
    async fn admit_backlog(&mut self, backlog: &mut Backlog) -> Result<(), WorkerError> {
        loop {
            // Table updates next: applied once everything admitted finished.
            if self.table_next(&backlog.records) {
                if !self.execution.controller.is_idle()
                    || !self.apply_table_updates(backlog).await?
                {
                    return Ok(());
                }
                continue;
            }
            for late in self.admit(&mut backlog.records) {
                let watermark = self.timers.watermarks().applied().unwrap_or_default();
                let reason = format!(
                    "late: timestamp {} ms is at or before the watermark {watermark} ms",
                    late.timestamp_ms
                );
                self.dead_letter(&late, DeadLetterKind::Late, &reason)
                    .await?;
            }
            // Stopped at a table update (not for room, nor a due timer): go on with it.
            if !self.table_next(&backlog.records) || !self.execution.controller.has_room() {
                return Ok(());
            }
        }
    }

    /// Tells the consumer loop when the worker starts or stops backing off from an outage: a
    /// full queue then pauses the partition instead of holding the loop up.
    async fn report_stall(&mut self) {
        let stalled = self.execution.backing_off > 0;
        if stalled != self.stall_reported {
            self.stall_reported = stalled;
            self.events.stalled(Stall::StateOutage, stalled).await;
        }
        let held = self.sink.held_back();
        if held != self.sink_held_reported {
            self.sink_held_reported = held;
            self.events.stalled(Stall::SinkBacklog, held).await;
        }
    }

    /// Ends a worker told to finish or revoked whose batch failed again after that (module
    /// docs): what is in flight is dropped unfinished and no checkpoint is taken.
    fn abandon(&mut self, running: &mut Running<S>) {
        let dropped = self.execution.controller.in_flight();
        running.clear();
        self.execution.ready.clear();
        self.ended_without_checkpoint(&format_args!(
            "the state store failed again after the {} (records in flight dropped: {dropped})",
            self.assignment.control().as_str()
        ));
    }

    /// Logs and counts the worker's end without its last checkpoint, for `why`.
    pub(super) fn ended_without_checkpoint(&self, why: &dyn std::fmt::Display) {
        self.stats
            .closed_without_checkpoint
            .fetch_add(1, Ordering::Relaxed);
        let control = self.assignment.control().as_str();
        tracing::warn!(partition = self.partition.0, control, %why, "the partition ends without its last checkpoint; its next owner resumes from the last one");
    }

    /// Admits records from `backlog` while the controller has room; drops those the state
    /// already reflects (below the offsets it resumed from: a consumer can deliver some again
    /// around a seek). A late record (at or before the applied watermark) is admitted, dropped
    /// or returned to be dead-lettered, as `late_records` says (docs/time.md).
    fn admit(&mut self, backlog: &mut VecDeque<InputRecord>) -> Vec<InputRecord> {
        let mut late_letters = Vec::new();
        let now = self.timers.now_ms();
        let (mut admitted, mut skipped) = (0u64, 0u64);
        while self.execution.controller.has_room()
            && !self.table_next(backlog)
            && let Some(mut record) = backlog.pop_front()
        {
            if self
                .admitted
                .next(&record.topic)
                .is_some_and(|next| record.offset < next.0)
            {
                skipped += 1;
                continue;
            }
            self.admitted.advance(&record.topic, Offset(record.offset));
            if let Some(marker) = self.marker(&record) {
                // A watermark marker of an edge: nothing of it runs (docs/topologies.md).
                self.timers
                    .watermarks_mut()
                    .marker(&record.topic, marker, now);
                self.offsets.advance(&record.topic, Offset(record.offset));
                self.dirty = true;
                continue;
            }
            if self.repeat(&mut record) {
                continue;
            }
            self.timers
                .watermarks_mut()
                .admitted(&record.topic, record.timestamp_ms, now);
            if self.timers.watermarks().is_late(record.timestamp_ms) {
                self.stats.late(self.late_records);
                match self.late_records {
                    LateRecords::Process => {}
                    LateRecords::Drop => {
                        // Nothing of it runs: the state's position moves past it at once
                        // (offsets only move forward, and a checkpoint waits for every
                        // earlier record to finish).
                        self.offsets.advance(&record.topic, Offset(record.offset));
                        self.dirty = true;
                        continue;
                    }
                    LateRecords::DeadLetter => {
                        self.offsets.advance(&record.topic, Offset(record.offset));
                        self.dirty = true;
                        late_letters.push(record);
                        continue;
                    }
                }
            }
            self.execution.controller.admit(record);
            admitted += 1;
            // A timer this record's timestamp made due fires before any later record runs: the
            // later ones then see the watermark it allows, and their lateness is decided there.
            if self.timers.due_by_watermark(now) {
                break;
            }
        }
        if skipped > 0 {
            self.stats
                .records_skipped
                .fetch_add(skipped, Ordering::Relaxed);
        }
        if admitted > 0 {
            self.stats.records_in.fetch_add(admitted, Ordering::Relaxed);
            self.stats.metrics.records_in.increment(admitted);
            self.stats
                .records_in_flight
                .fetch_add(admitted, Ordering::Relaxed);
            self.stats.records_in_flight_peak.fetch_max(
                self.execution.controller.in_flight() as u64,
                Ordering::Relaxed,
            );
            metrics::gauge!("weir_records_in_flight").increment(admitted as f64);
        }
        late_letters
    }

    /// Starts attempts while an instance is free: retries and re-runs first, then new batches
    /// from the controller.
    fn dispatch(&mut self, running: &mut Running<S>) {
        let call_settings = self.call_settings.clone();
        let exec = &mut self.execution;
        while !exec.idle.is_empty() || exec.live < exec.instances_max {
            let task = match exec.ready.pop_front() {
                Some(task) => task,
                None => match exec.controller.next_batch() {
                    Some(batch) => Task {
                        isolation: Isolation::whole(batch.records.len()),
                        records: Arc::new(batch.records),
                        keys: batch.keys,
                        delay: Duration::ZERO,
                        backoff: self.settings.outage_backoff_min,
                        prefetched: None,
                    },
                    None => break,
                },
            };
            let instance = exec.idle.pop();
            if instance.is_none() {
                exec.live += 1;
            }
            let calling = task.isolation.current().map_or(0, |r| r.len());
            let deadline = batch_deadline(&self.settings, calling);
            let attempt = attempt(
                self.shard.clone(),
                self.operator.clone(),
                (self.source.clone(), self.assignment.clone()),
                instance,
                task,
                deadline,
                call_settings.clone(),
                // Constant while records are in flight: it is applied only with none.
                self.timers.watermarks().applied(),
            );
            running.push(Box::pin(async move { Ended::Batch(attempt.await) }));
        }
        self.stats
            .batches_in_flight_peak
            .fetch_max(running.len() as u64, Ordering::Relaxed);
    }

    /// Moves the offsets past `records`, whose effects are now applied.
    pub(super) fn processed(&mut self, records: &[InputRecord]) {
        for record in records {
            self.offsets.advance(&record.topic, Offset(record.offset));
        }
        self.dirty = true;
        if let Some(opened_at) = self.opened_at.take() {
            let took = opened_at.elapsed();
            self.stats.record_recovery(took);
            tracing::info!(
                partition = self.partition.0,
                ms = took.as_millis() as u64,
                "first records processed after opening the shard"
            );
        }
    }
}
