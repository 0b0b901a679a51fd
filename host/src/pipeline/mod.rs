//! Runs one pipeline: the consumer loop that batches records per partition and the
//! per-partition workers ([`worker`]) that call the operator.
//!
//! Records of a partition are handled in offset order by that partition's worker, one batch at
//! a time; partitions run concurrently. Co-partitioned input topics share the worker (and shard)
//! of their partition number. On revoke, a partition's worker is aborted and its queued records
//! are dropped, offsets and state untouched (the `memory` shard goes with it; a later
//! assignment rebuilds it from the earliest offset).

pub mod worker;

use crate::clock::SharedClock;
use crate::config::Settings;
use crate::runtime::{InputRecord, Operator, Runtime, RuntimeError};
use crate::sink::{self, Sink};
use crate::source::{self, SourceConsumer, SourceContext};
use crate::state::{ShardId, StateBackend, StateError};
use futures::FutureExt;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use worker::{PartitionWorker, WorkerError};

/// Counters of one pipeline run; read them any time (relaxed atomics).
#[derive(Debug, Default)]
pub struct PipelineStats {
    /// Records handed to workers.
    pub records_in: AtomicU64,
    /// Records processed with disposition `ok`.
    pub records_ok: AtomicU64,
    /// Records sent to the dead-letter topic.
    pub dead_lettered: AtomicU64,
    /// Records emitted to the output topic.
    pub emitted: AtomicU64,
    /// Guest calls made (batch calls and one-record re-runs).
    pub guest_calls: AtomicU64,
    /// Wall time spent inside guest calls, ns.
    pub guest_call_ns: AtomicU64,
    /// Guest calls that trapped.
    pub traps: AtomicU64,
    /// Retries after a state backend outage.
    pub outage_retries: AtomicU64,
    /// Guest calls aborted by the host because the state backend failed mid-call.
    pub calls_aborted: AtomicU64,
    /// Times a partition was paused at the consumer because its worker was stalled.
    pub partition_pauses: AtomicU64,
}

impl PipelineStats {
    /// Records that reached a final disposition (ok or dead-lettered).
    pub fn records_done(&self) -> u64 {
        self.records_ok.load(Ordering::Relaxed) + self.dead_lettered.load(Ordering::Relaxed)
    }
}

/// Why a pipeline stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The operator could not be loaded.
    #[error("cannot load operator")]
    Operator(#[source] RuntimeError),
    /// Kafka client setup or consumption failed.
    #[error("kafka client failed")]
    Kafka(#[source] KafkaError),
    /// A shard could not be opened.
    #[error("cannot open shard")]
    State(#[source] StateError),
    /// A partition worker failed.
    #[error("partition worker failed")]
    Worker(#[source] WorkerError),
    /// Shutdown stopped these partitions' workers without finishing their queued records,
    /// after `shutdown_drain_max` (they were stuck, for example in a state outage).
    #[error("shutdown gave up draining partitions {0:?}")]
    DrainTimedOut(Vec<i32>),
    /// A partition worker panicked (a bug).
    #[error("partition worker panicked. partition={0}")]
    WorkerPanicked(i32),
}

/// How often a paused partition's pending records are offered to its worker again.
const PAUSED_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// How often the consumer loop, waiting for room in a worker's queue, checks whether the
/// worker is stalled by an outage (and the partition should be paused instead).
const STALL_CHECK_INTERVAL: Duration = Duration::from_millis(50);

struct WorkerHandle {
    tx: mpsc::Sender<Vec<InputRecord>>,
    /// Set by the worker while it backs off from a state outage.
    stalled: Arc<AtomicBool>,
    task: JoinHandle<Result<(), WorkerError>>,
}

/// Everything a running pipeline holds.
struct Running<B: StateBackend> {
    settings: Settings,
    backend: Arc<B>,
    operator: Arc<Operator<B::Shard>>,
    producer: rdkafka::producer::FutureProducer,
    stats: Arc<PipelineStats>,
    workers: HashMap<i32, WorkerHandle>,
    /// Records fetched but not yet handed to their partition's worker.
    pending: HashMap<i32, Vec<InputRecord>>,
    /// Partitions paused at the consumer because their worker's queue is full.
    paused: HashSet<i32>,
}

/// Runs the pipeline until `shutdown` completes or a fatal error occurs, then drains the
/// workers (every queued batch processed and delivered) and returns the stats.
///
/// # Errors
/// [`PipelineError`] for an unloadable operator, a Kafka setup failure or a failed worker.
pub async fn run<B: StateBackend>(
    settings: Settings,
    backend: Arc<B>,
    clock: SharedClock,
    stats: Arc<PipelineStats>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let runtime =
        Runtime::<B::Shard>::new(&settings.runtime, clock).map_err(PipelineError::Operator)?;
    let operator = Arc::new(
        runtime
            .load_operator(&settings.pipeline.operator)
            .await
            .map_err(PipelineError::Operator)?,
    );
    let meta = operator.meta();
    tracing::info!(pipeline = %settings.pipeline.name, operator = %meta.name, version = %meta.version, states = meta.states.len(), "operator loaded");
    let (consumer, context) = source::consumer(&settings).map_err(PipelineError::Kafka)?;
    let topics: Vec<&str> = settings
        .pipeline
        .input_topics
        .iter()
        .map(String::as_str)
        .collect();
    consumer.subscribe(&topics).map_err(PipelineError::Kafka)?;
    let producer = sink::producer(&settings).map_err(PipelineError::Kafka)?;
    let mut running = Running {
        settings,
        backend,
        operator,
        producer,
        stats,
        workers: HashMap::new(),
        pending: HashMap::new(),
        paused: HashSet::new(),
    };
    let result = running.consume(&consumer, &context, shutdown).await;
    let drained = running.drain().await;
    result.and(drained)
}

impl<B: StateBackend> Running<B> {
    async fn consume(
        &mut self,
        consumer: &SourceConsumer,
        context: &SourceContext,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), PipelineError> {
        let batch_max = self.settings.runtime.batch_records_max;
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            // While a partition is paused, wake up now and then to hand its records over.
            let retry = !self.paused.is_empty();
            let first = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                msg = consumer.recv() => Some(msg),
                () = tokio::time::sleep(PAUSED_RETRY_INTERVAL), if retry => None,
            };
            if let Some(msg) = first {
                self.take(msg, consumer, context).await?;
                // Take what is already fetched without waiting, then hand out partial batches
                // so that a quiet partition's records are not held back.
                for _ in 0..batch_max.saturating_mul(4) {
                    match consumer.recv().now_or_never() {
                        Some(msg) => self.take(msg, consumer, context).await?,
                        None => break,
                    }
                }
            }
            self.drop_revoked(context);
            let partitions: Vec<i32> = self.pending.keys().copied().collect();
            for partition in partitions {
                self.send_pending(partition, Some(consumer)).await?;
            }
        }
    }

    /// Queues one fetched record for its partition's worker. Revocations are applied first:
    /// librdkafka runs the revoke callback inside `recv`, before the first record of a new
    /// assignment, so a record is never queued behind a revoked partition's leftovers.
    async fn take(
        &mut self,
        msg: Result<BorrowedMessage<'_>, KafkaError>,
        consumer: &SourceConsumer,
        context: &SourceContext,
    ) -> Result<(), PipelineError> {
        self.drop_revoked(context);
        let msg = match msg {
            Ok(msg) => msg,
            Err(err) => {
                // librdkafka reports broker trouble here and keeps retrying on its own.
                tracing::warn!(error = %err, "consumer error");
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Ok(());
            }
        };
        let record = source::to_input_record(&msg);
        let partition = record.partition;
        let batch = self.pending.entry(partition).or_default();
        batch.push(record);
        if batch.len() >= self.settings.runtime.batch_records_max
            && !self.paused.contains(&partition)
        {
            self.send_pending(partition, Some(consumer)).await?;
        }
        Ok(())
    }

    fn drop_revoked(&mut self, context: &SourceContext) {
        for partition in context.take_revoked() {
            self.pending.remove(&partition);
            self.paused.remove(&partition);
            if let Some(worker) = self.workers.remove(&partition) {
                worker.task.abort();
            }
        }
    }

    /// Hands the partition's pending records to its worker in batches of at most
    /// `batch_records_max`. A busy worker gets plain backpressure (this waits for room); a
    /// worker backing off from a state outage gets its partition paused at the consumer instead,
    /// the records stay pending and the other partitions go on; it is resumed once everything is
    /// handed over. Without `consumer` (when draining), waits for room as long as it takes.
    async fn send_pending(
        &mut self,
        partition: i32,
        consumer: Option<&SourceConsumer>,
    ) -> Result<(), PipelineError> {
        let Some(mut records) = self.pending.remove(&partition) else {
            return Ok(());
        };
        let batch_max = self.settings.runtime.batch_records_max;
        let (tx, stalled) = {
            let worker = self.worker(partition).await?;
            (worker.tx.clone(), worker.stalled.clone())
        };
        while !records.is_empty() {
            let permit = match consumer {
                None => tx.reserve().await.ok(),
                Some(_) if self.paused.contains(&partition) => match tx.try_reserve() {
                    Ok(permit) => Some(permit),
                    Err(mpsc::error::TrySendError::Full(())) => {
                        self.pending.insert(partition, records);
                        return Ok(());
                    }
                    Err(mpsc::error::TrySendError::Closed(())) => None,
                },
                Some(consumer) => loop {
                    match tokio::time::timeout(STALL_CHECK_INTERVAL, tx.reserve()).await {
                        Ok(permit) => break permit.ok(),
                        Err(_still_full) if stalled.load(Ordering::Relaxed) => {
                            self.pending.insert(partition, records);
                            self.paused.insert(partition);
                            self.set_paused(consumer, partition, true);
                            return Ok(());
                        }
                        Err(_still_full) => {}
                    }
                },
            };
            let Some(permit) = permit else {
                // The worker's queue is closed: it ended with an error. Report it.
                return Err(self.worker_failure(partition).await);
            };
            let rest = records.split_off(records.len().min(batch_max));
            permit.send(std::mem::replace(&mut records, rest));
        }
        if let Some(consumer) = consumer
            && self.paused.remove(&partition)
        {
            self.set_paused(consumer, partition, false);
        }
        Ok(())
    }

    /// Pauses or resumes fetching of `partition` of every input topic.
    fn set_paused(&self, consumer: &SourceConsumer, partition: i32, paused: bool) {
        let mut tpl = TopicPartitionList::new();
        for topic in &self.settings.pipeline.input_topics {
            tpl.add_partition(topic, partition);
        }
        let result = if paused {
            consumer.pause(&tpl)
        } else {
            consumer.resume(&tpl)
        };
        if paused {
            self.stats.partition_pauses.fetch_add(1, Ordering::Relaxed);
        }
        match result {
            Ok(()) => tracing::info!(partition, paused, "partition fetch state changed"),
            Err(err) => {
                tracing::warn!(partition, paused, error = %err, "cannot change partition fetch state")
            }
        }
    }

    async fn worker(&mut self, partition: i32) -> Result<&WorkerHandle, PipelineError> {
        if !self.workers.contains_key(&partition) {
            let id = ShardId {
                pipeline: self.settings.pipeline.name.clone(),
                partition,
            };
            let shard = Arc::new(
                self.backend
                    .open_shard(&id)
                    .await
                    .map_err(PipelineError::State)?,
            );
            let (tx, rx) = mpsc::channel(self.settings.runtime.partition_queue_batches_max);
            let stalled = Arc::new(AtomicBool::new(false));
            let worker = PartitionWorker {
                partition,
                operator: self.operator.clone(),
                shard,
                sink: Sink::new(
                    self.producer.clone(),
                    self.settings.pipeline.output_topic.clone(),
                    self.settings.pipeline.dead_letter_topic.clone(),
                ),
                settings: self.settings.runtime.clone(),
                stats: self.stats.clone(),
                source: format!("{}/{}", self.settings.pipeline.name, partition).into(),
                instance: None,
                stalled: stalled.clone(),
            };
            let task = tokio::spawn(worker.run(rx));
            self.workers
                .insert(partition, WorkerHandle { tx, stalled, task });
        }
        Ok(self
            .workers
            .get(&partition)
            .expect("the worker was inserted just above"))
    }

    async fn worker_failure(&mut self, partition: i32) -> PipelineError {
        match self.workers.remove(&partition) {
            Some(worker) => match worker.task.await {
                Ok(Err(err)) => PipelineError::Worker(err),
                Ok(Ok(())) | Err(_) => PipelineError::WorkerPanicked(partition),
            },
            None => PipelineError::WorkerPanicked(partition),
        }
    }

    /// Closes every worker's queue and waits for it to finish its batches and deliveries.
    async fn drain(&mut self) -> Result<(), PipelineError> {
        let deadline = tokio::time::Instant::now() + self.settings.runtime.shutdown_drain_max;
        match tokio::time::timeout_at(deadline, self.drain_all()).await {
            Ok(result) => result,
            Err(_) => {
                // A worker stuck in an outage would keep shutdown waiting forever. Nothing is
                // lost by stopping it: no offset is committed for records it did not finish.
                let partitions: Vec<i32> = self.workers.keys().copied().collect();
                tracing::warn!(?partitions, max = ?self.settings.runtime.shutdown_drain_max, "shutdown: workers still busy; stopping them without finishing");
                for (_, worker) in self.workers.drain() {
                    worker.task.abort();
                }
                Err(PipelineError::DrainTimedOut(partitions))
            }
        }
    }

    async fn drain_all(&mut self) -> Result<(), PipelineError> {
        let partitions: Vec<i32> = self.pending.keys().copied().collect();
        let mut result = Ok(());
        for partition in partitions {
            if let Err(err) = self.send_pending(partition, None).await {
                result = result.and(Err(err));
            }
        }
        let partitions: Vec<i32> = self.workers.keys().copied().collect();
        for partition in partitions {
            let Some(worker) = self.workers.get_mut(&partition) else {
                continue;
            };
            // Close the queue, then wait; the handle stays registered until the worker ends
            // so that a timeout above can still abort it.
            let (closed, _) = mpsc::channel(1);
            drop(std::mem::replace(&mut worker.tx, closed));
            let outcome = match (&mut worker.task).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(err)) => Err(PipelineError::Worker(err)),
                Err(_) => Err(PipelineError::WorkerPanicked(partition)),
            };
            self.workers.remove(&partition);
            result = result.and(outcome);
        }
        result
    }
}
