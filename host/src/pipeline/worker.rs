//! The worker of one partition: batches in → prefetch → guest call → apply state → emit.
//!
//! Batch semantics (see the WIT `process-batch` docs):
//! 1. Prefetch the declared value states of every distinct key in the batch (one `get_many`).
//! 2. Call the guest once for the whole batch with a CPU budget of `record_deadline × n`
//!    (capped at `batch_deadline_max`).
//! 3. On success, apply the batch's staged writes to the shard, produce its emits in order and
//!    dead-letter the rejected records — unless a rejected record had staged effects, in which
//!    case fall through to step 4 so that exactly its effects are discarded.
//! 4. On a trap (or step 3's exception), discard everything and re-run the records one at a
//!    time with the per-record deadline; a record that traps alone is dead-lettered.
//!
//! A state backend outage aborts the call from the host; the worker backs off and retries the
//! same records, which pauses the partition (its queue fills and the consumer loop pauses that
//! partition's fetching; other partitions go on) but never dead-letters a good record. Invariant: effects of a record are applied at most once and only
//! after its call succeeded, in input order.
//!
//! Checkpoints (docs/checkpoints.md): every `checkpoint_interval`, between batches, the worker
//! waits for every output delivery, then checkpoints its shard with the offsets after the last
//! processed record. Records below those offsets (already in the state it resumed from) are
//! skipped. When its queue closes — shutdown, or the partition was revoked — it checkpoints once
//! more and ends; after a revoke it drops the batches still queued, unprocessed.

use super::PipelineStats;
use crate::config::RuntimeSettings;
use crate::runtime::{BatchCtx, CallError, Disposition, InputRecord, Instance, Operator};
use crate::sink::{DeadLetterKind, Sink, SinkError};
use crate::source::SourceConsumer;
use crate::state::checkpoint::{CheckpointError, DecidedBy, InputOffsets, manifest_metadata};
use crate::state::{Shard, StateError, key};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Longest retry delay after an outage.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long committing a checkpoint's Kafka transaction may take.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// What decides a worker's checkpoints (docs/checkpoints.md, "Delivery guarantees").
pub(crate) enum Decision {
    /// At-least-once: outputs acknowledged, then the manifest write decides.
    Manifest,
    /// Exactly-once: the shard's transactional producer (a transaction is open) commits the
    /// interval's outputs with the input offsets, naming the manifest; that commit decides.
    Transaction {
        /// The shard's producer (also the sink's).
        producer: FutureProducer,
        /// The pipeline's consumer, for its group metadata (which fences a stale generation).
        consumer: Arc<SourceConsumer>,
    },
}

/// Why a worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Producing output or dead letters failed for good.
    #[error("partition {partition}: output failed")]
    Sink {
        /// The partition.
        partition: i32,
        /// The failure.
        #[source]
        source: SinkError,
    },
    /// The shard's stored state is corrupt: retrying cannot help, so the partition stops.
    #[error("partition {partition}: state is corrupt")]
    Corrupt {
        /// The partition.
        partition: i32,
        /// The failure.
        #[source]
        source: StateError,
    },
    /// Another owner claimed the shard (its checkpoint was refused): this host must stop
    /// writing it. Not a pipeline failure: the partition has moved.
    #[error("partition {partition}: fenced by a newer owner of the shard")]
    Fenced {
        /// The partition.
        partition: i32,
    },
    /// The checkpoint's Kafka transaction did not commit (exactly-once mode): the state holds
    /// effects whose outputs are not committed, so the shard must be reopened from its last
    /// decided checkpoint.
    #[error("partition {partition}: the checkpoint's transaction failed")]
    Transaction {
        /// The partition.
        partition: i32,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// A fresh instance could not be created.
    #[error("partition {partition}: cannot instantiate the operator")]
    Instantiate {
        /// The partition.
        partition: i32,
        /// The failure.
        #[source]
        source: crate::runtime::RuntimeError,
    },
}

/// Outcome of one attempt that did not complete.
enum Attempt {
    /// The state backend failed: back off and retry the same records (or stop if corrupt).
    Unavailable(StateError),
    /// The batch must be re-run one record at a time.
    Split,
}

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
    if value_states.is_empty() {
        return Ok(batch);
    }
    let mut seen: HashSet<&[u8]> = HashSet::with_capacity(records.len());
    let mut keys = Vec::with_capacity(records.len() * value_states.len());
    for record in records.iter() {
        if seen.insert(record.key.as_slice()) {
            for name in value_states {
                keys.push(key::value_key(&record.key, name));
            }
        }
    }
    let values = shard.get_many(&keys).await?;
    batch.add_prefetched(keys, values);
    Ok(batch)
}

/// One partition's worker.
pub(crate) struct PartitionWorker<S: Shard> {
    pub partition: i32,
    pub operator: Arc<Operator<S>>,
    pub shard: Arc<S>,
    pub sink: Sink,
    pub settings: RuntimeSettings,
    pub stats: Arc<PipelineStats>,
    pub source: Arc<str>,
    pub instance: Option<Instance<S>>,
    /// Raised while backing off from an outage, so the consumer loop pauses the partition.
    pub stalled: Arc<AtomicBool>,
    /// Raised by the consumer loop when the partition is revoked: queued batches are dropped,
    /// unprocessed, and the worker checkpoints and ends.
    pub revoked: Arc<AtomicBool>,
    /// The input position the shard's state reflects (the checkpoint it resumed from, then
    /// every processed record).
    pub offsets: InputOffsets,
    /// Records were processed since the last checkpoint.
    pub dirty: bool,
    /// How often to checkpoint.
    pub checkpoint_interval: Duration,
    /// When the partition's shard began to open: the first processed record reports the
    /// recovery time from it.
    pub opened_at: Option<Instant>,
    /// Where committed checkpoints' offsets go, for the consumer loop to commit to Kafka
    /// (at-least-once mode).
    pub checkpointed: mpsc::UnboundedSender<(i32, InputOffsets)>,
    /// What decides a checkpoint.
    pub decision: Decision,
}

impl<S: Shard> PartitionWorker<S> {
    /// Processes batches and checkpoints every `checkpoint_interval` until the queue closes,
    /// then checkpoints a last time (which waits for every delivery).
    pub async fn run(
        mut self,
        mut batches: mpsc::Receiver<Vec<InputRecord>>,
    ) -> Result<(), WorkerError> {
        let start = tokio::time::Instant::now() + self.checkpoint_interval;
        let mut ticks = tokio::time::interval_at(start, self.checkpoint_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                // The tick first: a partition with a full queue must still checkpoint.
                biased;
                _ = ticks.tick() => self.checkpoint(false).await?,
                batch = batches.recv() => match batch {
                    Some(_) if self.revoked.load(Ordering::Relaxed) => {}
                    Some(records) => {
                        let records = self.unprocessed(records);
                        if !records.is_empty() {
                            self.process(Arc::new(records)).await?;
                        }
                    }
                    None => break,
                },
            }
        }
        self.checkpoint(true).await
    }

    /// Drops the records the state already reflects (below the offsets it resumed from): a
    /// consumer can deliver some again around a seek.
    fn unprocessed(&self, mut records: Vec<InputRecord>) -> Vec<InputRecord> {
        let before = records.len();
        records.retain(|r| {
            self.offsets
                .next(&r.topic)
                .is_none_or(|next| r.offset >= next)
        });
        let skipped = before - records.len();
        if skipped > 0 {
            self.stats
                .records_skipped
                .fetch_add(skipped as u64, Ordering::Relaxed);
        }
        records
    }

    /// Checkpoints the shard if records were processed since the last checkpoint (docs/
    /// checkpoints.md steps 1–7). A failed checkpoint leaves the previous one current and is
    /// retried at the next tick; at the `last` one (queue closed) it is only logged: the
    /// records since the previous checkpoint will be read again by the next owner.
    async fn checkpoint(&mut self, last: bool) -> Result<(), WorkerError> {
        if !self.dirty {
            return Ok(());
        }
        let started = Instant::now();
        tracing::debug!(partition = self.partition, last, "checkpoint starting");
        // At-least-once output: every output of the records the checkpoint covers is
        // acknowledged before the checkpoint commits their offsets. (Exactly-once: the
        // transaction commit flushes them; waiting here could hang on a fenced producer whose
        // deliveries only fail at `message.timeout.ms`.)
        if matches!(self.decision, Decision::Manifest) {
            self.drain_sink().await?;
        }
        let decided_by = match self.decision {
            Decision::Manifest => DecidedBy::Manifest,
            Decision::Transaction { .. } => DecidedBy::Transaction,
        };
        match self.shard.checkpoint(&self.offsets, decided_by).await {
            Ok(report) => {
                // docs/checkpoints.md step 7: the manifest is written, Kafka not yet told.
                fail::fail_point!("checkpoint-after-manifest", |_| {
                    crate::fail_points::crash("checkpoint-after-manifest")
                });
                let Some(report) = report else {
                    self.dirty = false;
                    return Ok(()); // the shard keeps no durable state
                };
                if let Decision::Transaction { producer, consumer } = &self.decision {
                    // Handles cloned: no borrow of `self` (its instance is not `Sync`) may
                    // live across the await.
                    commit_transaction(
                        self.partition,
                        &self.offsets,
                        self.stats.clone(),
                        producer.clone(),
                        consumer.clone(),
                        report.version,
                    )
                    .await?;
                    // Committed: every delivery has completed; forget them.
                    self.drain_sink().await?;
                }
                self.dirty = false;
                self.shard.checkpoint_decided(report.version);
                let elapsed = started.elapsed();
                self.stats.record_checkpoint(elapsed, report.uploaded_bytes);
                metrics::histogram!("weir_checkpoint_duration_seconds")
                    .record(elapsed.as_secs_f64());
                metrics::counter!("weir_checkpoint_uploaded_bytes_total")
                    .increment(report.uploaded_bytes);
                tracing::debug!(
                    partition = self.partition,
                    version = report.version,
                    ms = elapsed.as_millis() as u64,
                    uploaded_bytes = report.uploaded_bytes,
                    state_bytes = report.state_bytes,
                    "checkpoint committed"
                );
                if matches!(self.decision, Decision::Manifest) {
                    // The consumer loop may be gone at shutdown; Kafka's copy is informational.
                    let _ = self
                        .checkpointed
                        .send((self.partition, self.offsets.clone()));
                }
                Ok(())
            }
            Err(CheckpointError::Fenced { shard }) => {
                self.stats
                    .checkpoints_fenced
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(partition = self.partition, %shard, "checkpoint refused: another owner claimed the shard; closing it");
                Err(WorkerError::Fenced {
                    partition: self.partition,
                })
            }
            Err(CheckpointError::State(err)) if err.kind() == crate::error::ErrorKind::Corrupt => {
                Err(WorkerError::Corrupt {
                    partition: self.partition,
                    source: err,
                })
            }
            Err(CheckpointError::State(err)) => {
                self.stats
                    .checkpoint_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(partition = self.partition, error = %err, last, "checkpoint failed; the previous one stays current");
                Ok(())
            }
        }
    }

    async fn process(&mut self, records: Arc<Vec<InputRecord>>) -> Result<(), WorkerError> {
        let n = records.len();
        self.stats.records_in.fetch_add(n as u64, Ordering::Relaxed);
        let deadline = self
            .settings
            .record_deadline
            .saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))
            .min(
                self.settings
                    .batch_deadline_max
                    .max(self.settings.record_deadline),
            );
        let mut backoff = self.settings.outage_backoff_min;
        loop {
            match self.attempt(records.clone(), deadline, n > 1).await? {
                Ok(()) => {
                    self.stalled.store(false, Ordering::Relaxed);
                    self.processed(&records);
                    return Ok(());
                }
                Err(Attempt::Unavailable(err)) => self.pause(err, &mut backoff).await?,
                Err(Attempt::Split) => break,
            }
        }
        for record in records.iter() {
            let single = Arc::new(vec![record.clone()]);
            let mut backoff = self.settings.outage_backoff_min;
            loop {
                match self
                    .attempt(single.clone(), self.settings.record_deadline, false)
                    .await?
                {
                    Ok(()) => break,
                    Err(Attempt::Unavailable(err)) => self.pause(err, &mut backoff).await?,
                    Err(Attempt::Split) => unreachable!("a single-record attempt never splits"),
                }
            }
        }
        self.stalled.store(false, Ordering::Relaxed);
        self.processed(&records);
        Ok(())
    }

    async fn drain_sink(&mut self) -> Result<(), WorkerError> {
        match self.sink.drain().await {
            Ok(()) => Ok(()),
            Err(source) => Err(self.sink_failed(source)),
        }
    }

    /// Moves the offsets past `records`, whose effects are now applied.
    fn processed(&mut self, records: &[InputRecord]) {
        for record in records {
            self.offsets.advance(&record.topic, record.offset);
        }
        self.dirty = true;
        if let Some(opened_at) = self.opened_at.take() {
            let took = opened_at.elapsed();
            self.stats.record_recovery(took);
            tracing::info!(
                partition = self.partition,
                ms = took.as_millis() as u64,
                "first records processed after opening the shard"
            );
        }
    }

    async fn pause(&mut self, err: StateError, backoff: &mut Duration) -> Result<(), WorkerError> {
        if err.kind() == crate::error::ErrorKind::Corrupt {
            return Err(WorkerError::Corrupt {
                partition: self.partition,
                source: err,
            });
        }
        tracing::warn!(partition = self.partition, error = %err, retry_in = ?*backoff, "state backend unavailable; partition paused");
        self.stats.outage_retries.fetch_add(1, Ordering::Relaxed);
        self.stalled.store(true, Ordering::Relaxed);
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
        Ok(())
    }

    /// One call over `records`. `may_split`: on a guest fault, ask for a one-by-one re-run
    /// instead of dead-lettering (true for batches of more than one record).
    async fn attempt(
        &mut self,
        records: Arc<Vec<InputRecord>>,
        deadline: Duration,
        may_split: bool,
    ) -> Result<Result<(), Attempt>, WorkerError> {
        // Clone the handles so no borrow of `self` (which holds the non-`Sync` instance) lives
        // across the await.
        let (shard, operator) = (self.shard.clone(), self.operator.clone());
        let batch = match prefetch(&*shard, &operator.meta().value_states, records.clone()).await {
            Ok(batch) => batch,
            Err(err) => return Ok(Err(Attempt::Unavailable(err))),
        };
        let instance = self.instance().await?;
        let started = Instant::now();
        let result = instance.call_batch(batch, deadline).await;
        self.stats.guest_calls.fetch_add(1, Ordering::Relaxed);
        self.stats
            .guest_call_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let (dispositions, batch) = match result {
            Ok(ok) => ok,
            Err(CallError::Aborted(crate::runtime::HostAbort::State(err))) => {
                // An error out of a call leaves the store unusable (wasmtime marks it trapped),
                // so the instance goes even though the guest did nothing wrong.
                self.instance = None;
                self.stats.calls_aborted.fetch_add(1, Ordering::Relaxed);
                return Ok(Err(Attempt::Unavailable(err)));
            }
            Err(fault) => {
                // The instance is unusable after a trap: drop it, never reuse it.
                self.instance = None;
                self.stats.traps.fetch_add(1, Ordering::Relaxed);
                if may_split {
                    tracing::debug!(partition = self.partition, error = %fault, "batch trapped; re-running one record at a time");
                    return Ok(Err(Attempt::Split));
                }
                let kind = match &fault {
                    CallError::Trap { deadline: true, .. } => DeadLetterKind::Deadline,
                    _ => DeadLetterKind::Trapped,
                };
                tracing::warn!(partition = self.partition, offset = records[0].offset, error = %fault, "record dead-lettered");
                self.dead_letter(&records[0], kind, &fault.to_string())
                    .await?;
                return Ok(Ok(()));
            }
        };
        let rejected_with_effects = dispositions
            .iter()
            .enumerate()
            .any(|(i, d)| matches!(d, Disposition::Reject(_)) && batch.touched(i));
        if rejected_with_effects && may_split {
            return Ok(Err(Attempt::Split));
        }
        let apply_effects = !rejected_with_effects;
        if let Err(err) = self
            .commit(&records, &dispositions, batch, apply_effects)
            .await?
        {
            return Ok(Err(Attempt::Unavailable(err)));
        }
        Ok(Ok(()))
    }

    async fn instance(&mut self) -> Result<&mut Instance<S>, WorkerError> {
        if self.instance.is_none() {
            let instance = self
                .operator
                .instantiate(Some(self.shard.clone()), self.source.clone())
                .await
                .map_err(|source| WorkerError::Instantiate {
                    partition: self.partition,
                    source,
                })?;
            self.instance = Some(instance);
        }
        Ok(self
            .instance
            .as_mut()
            .expect("the instance was created just above"))
    }

    /// Applies a successful call: state writes, emits, dead letters for rejections. Returns
    /// `Ok(Err(_))` when the shard is unavailable (nothing applied, nothing produced).
    async fn commit(
        &mut self,
        records: &[InputRecord],
        dispositions: &[Disposition],
        batch: BatchCtx,
        apply_effects: bool,
    ) -> Result<Result<(), StateError>, WorkerError> {
        let (writes, emits) = batch.into_effects();
        if apply_effects {
            if !writes.is_empty()
                && let Err(err) = self.shard.apply(writes).await
            {
                return Ok(Err(err));
            }
            for emit in &emits {
                if let Err(source) = self.sink.emit(emit).await {
                    return Err(self.sink_failed(source));
                }
            }
            self.stats
                .emitted
                .fetch_add(emits.len() as u64, Ordering::Relaxed);
        }
        let mut ok = 0u64;
        for (record, disposition) in records.iter().zip(dispositions) {
            match disposition {
                Disposition::Ok => ok += 1,
                Disposition::Reject(reason) => {
                    self.dead_letter(record, DeadLetterKind::Rejected, reason)
                        .await?;
                }
            }
        }
        self.stats.records_ok.fetch_add(ok, Ordering::Relaxed);
        Ok(Ok(()))
    }

    async fn dead_letter(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> Result<(), WorkerError> {
        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        match self.sink.dead_letter(record, kind, error).await {
            Ok(()) => Ok(()),
            Err(source) => Err(self.sink_failed(source)),
        }
    }

    /// The worker's error for a failed delivery. Exactly-once: the transactional producer is
    /// unusable (fenced, or a fatal error) and the open transaction lost, so the shard is
    /// reopened from its decided checkpoint, as after a failed commit — not a pipeline failure.
    fn sink_failed(&self, source: SinkError) -> WorkerError {
        let partition = self.partition;
        match (&self.decision, source) {
            (Decision::Transaction { .. }, SinkError::Delivery { source, .. }) => {
                tracing::warn!(partition, error = %source, "output failed in the open transaction; reopening the shard from its last decided checkpoint");
                WorkerError::Transaction { partition, source }
            }
            (Decision::Manifest, source) => WorkerError::Sink { partition, source },
        }
    }
}

/// Whether a transactional producer's error means another owner took over (its producer
/// fenced ours, or the consumer group moved on to a newer generation).
fn is_fenced(error: &KafkaError) -> bool {
    let code = match error {
        KafkaError::Transaction(e) => e.code(),
        other => match other.rdkafka_error_code() {
            Some(code) => code,
            None => return false,
        },
    };
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::FencedInstanceId
            | RDKafkaErrorCode::IllegalGeneration
            | RDKafkaErrorCode::UnknownMemberId
    )
}

/// Exactly-once (docs/checkpoints.md step 8): commits the open transaction — the outputs
/// since the last checkpoint — with the input offsets and `version` in their metadata, then
/// begins the next one. Any failure ends the worker: fenced when another producer took the
/// `transactional.id` over, else the shard must be reopened from its decided checkpoint.
async fn commit_transaction(
    partition: i32,
    input: &InputOffsets,
    stats: Arc<PipelineStats>,
    producer: FutureProducer,
    consumer: Arc<SourceConsumer>,
    version: u64,
) -> Result<(), WorkerError> {
    let mut offsets = TopicPartitionList::new();
    for (topic, next) in input.iter() {
        offsets
            .add_partition_offset(topic, partition, Offset::Offset(next))
            .and_then(|()| {
                offsets
                    .find_partition(topic, partition)
                    .map(|mut e| e.set_metadata(manifest_metadata(version)))
                    .ok_or(KafkaError::Global(RDKafkaErrorCode::UnknownPartition))
            })
            .map_err(|source| WorkerError::Transaction { partition, source })?;
    }
    let committed = tokio::task::spawn_blocking(move || {
        let group = consumer
            .group_metadata()
            .ok_or(KafkaError::Global(RDKafkaErrorCode::State))?;
        producer.send_offsets_to_transaction(&offsets, &group, TRANSACTION_TIMEOUT)?;
        producer.commit_transaction(TRANSACTION_TIMEOUT)?;
        producer.begin_transaction()
    })
    .await
    .unwrap_or(Err(KafkaError::Canceled));
    match committed {
        Ok(()) => Ok(()),
        Err(source) if is_fenced(&source) => {
            stats.checkpoints_fenced.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(partition, error = %source, "transaction refused: another producer owns the shard's transactional.id; closing it");
            Err(WorkerError::Fenced { partition })
        }
        Err(source) => {
            stats.checkpoint_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(partition, error = %source, "checkpoint transaction failed; reopening the shard from its last decided checkpoint");
            Err(WorkerError::Transaction { partition, source })
        }
    }
}
