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

use super::PipelineStats;
use crate::config::RuntimeSettings;
use crate::runtime::{BatchCtx, CallError, Disposition, InputRecord, Instance, Operator};
use crate::sink::{DeadLetterKind, Sink, SinkError};
use crate::state::{Shard, StateError, key};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Longest retry delay after an outage.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

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
}

impl<S: Shard> PartitionWorker<S> {
    /// Processes batches until the queue closes, then waits for every delivery.
    pub async fn run(
        mut self,
        mut batches: mpsc::Receiver<Vec<InputRecord>>,
    ) -> Result<(), WorkerError> {
        while let Some(records) = batches.recv().await {
            self.process(Arc::new(records)).await?;
        }
        self.sink.drain().await.map_err(|source| WorkerError::Sink {
            partition: self.partition,
            source,
        })
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
        Ok(())
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
                self.sink
                    .emit(emit)
                    .await
                    .map_err(|source| WorkerError::Sink {
                        partition: self.partition,
                        source,
                    })?;
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
        self.sink
            .dead_letter(record, kind, error)
            .await
            .map_err(|source| WorkerError::Sink {
                partition: self.partition,
                source,
            })
    }
}
