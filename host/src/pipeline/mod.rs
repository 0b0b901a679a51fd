//! Runs one pipeline: the consumer loop that batches records per partition and the
//! per-partition workers ([`worker`]) that call the operator.
//!
//! Records of a partition go to that partition's worker in offset order; its execution
//! controller runs batches of different keys at once, each key's records in offset order;
//! partitions run concurrently. Co-partitioned input topics share the worker (and shard)
//! of their partition number. A shard is recovered from its newest decided checkpoint when its
//! partition is assigned, and the consumer is seeked to that checkpoint's offsets;
//! workers checkpoint every `pipeline.checkpoint_interval`; on revoke a worker drops its queued
//! records, checkpoints and closes the shard. docs/checkpoints.md is the protocol.

mod attempt;
pub mod controller;
mod isolation;
pub mod worker;

use crate::clock::SharedClock;
use crate::config::{Delivery, Settings};
use crate::runtime::{InputRecord, Operator, Runtime, RuntimeError};
use crate::sink::{self, DeliveryGuard, Sink};
use crate::source::{self, SourceConsumer, SourceContext};
use crate::state::checkpoint::InputOffsets;
use crate::state::{Recovery, Shard, ShardId, StateBackend, StateError};
use crate::telemetry::RunMetrics;
pub use attempt::prefetch;
use futures::FutureExt;
use rdkafka::Offset;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::topic_partition_list::TopicPartitionList;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use worker::{Decision, PartitionWorker, WorkerError};

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
    /// Time spent running guest calls, ns: inside their polls, so calls of one partition that
    /// overlap (the execution controller) are not counted twice.
    pub guest_call_ns: AtomicU64,
    /// Guest calls that trapped.
    pub traps: AtomicU64,
    /// Retries after a state backend outage.
    pub outage_retries: AtomicU64,
    /// Guest calls aborted by the host because the state backend failed mid-call.
    pub calls_aborted: AtomicU64,
    /// Times a partition could not get another operator instance (the host's pool was
    /// exhausted): it ran with those it had, or waited for one.
    pub instances_unavailable: AtomicU64,
    /// Times a partition was paused at the consumer because its worker was stalled.
    pub partition_pauses: AtomicU64,
    /// Fetched records dropped because the shard's checkpoint already reflects them.
    pub records_skipped: AtomicU64,
    /// Checkpoints committed.
    pub checkpoints: AtomicU64,
    /// Checkpoints that failed on a store error (retried at the next interval).
    pub checkpoint_failures: AtomicU64,
    /// Checkpoints refused because another owner had claimed the shard.
    pub checkpoints_fenced: AtomicU64,
    /// Total time of committed checkpoints (drain deliveries, flush, manifest), ns.
    pub checkpoint_ns_total: AtomicU64,
    /// Longest committed checkpoint, ns.
    pub checkpoint_ns_max: AtomicU64,
    /// Bytes the committed checkpoints uploaded (SSTs new since the previous checkpoint).
    pub checkpoint_uploaded_bytes: AtomicU64,
    /// Shards opened (recovered from their checkpoint, or new).
    pub shards_opened: AtomicU64,
    /// Shards of revoked partitions closed (after their last checkpoint, or its failure).
    pub shards_closed: AtomicU64,
    /// Shards whose first record was processed after opening: the count behind
    /// `recovery_ns_*`.
    pub recoveries: AtomicU64,
    /// Total time from starting to open a shard to its first processed record, ns.
    pub recovery_ns_total: AtomicU64,
    /// Longest such time, ns.
    pub recovery_ns_max: AtomicU64,
    /// Records admitted by the partitions' execution controllers and not finished.
    pub records_in_flight: AtomicU64,
    /// Most records one partition had in flight at once.
    pub records_in_flight_peak: AtomicU64,
    /// Most batches one partition ran at once (each on its own instance).
    pub batches_in_flight_peak: AtomicU64,
    /// Records whose call failed for good and that `failure_policy = "skip"` dropped.
    pub records_skipped_failed: AtomicU64,
    /// Where each partition run here stands, by partition.
    pub partitions: Mutex<BTreeMap<i32, PartitionProgress>>,
    /// The newest committed checkpoints of this run, oldest first, at most
    /// [`CHECKPOINT_HISTORY_MAX`].
    pub checkpoint_history: Mutex<VecDeque<CheckpointRecord>>,
    /// The run's exported series (records nothing unless built by [`PipelineStats::labelled`]).
    pub metrics: RunMetrics,
    /// The budget of the run's log lines about failed records (dead-lettered or skipped).
    pub failure_log: crate::telemetry::LogBudget,
}

/// Checkpoints kept in [`PipelineStats::checkpoint_history`].
pub const CHECKPOINT_HISTORY_MAX: usize = 64;

/// Where one partition (its shard) stands on this host.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
pub struct PartitionProgress {
    /// The partition (shard) number.
    pub partition: i32,
    /// Next offset to read per input topic as of the last committed checkpoint (what a new
    /// owner resumes from; as a consumer group's committed offsets).
    pub checkpointed_offsets: BTreeMap<String, i64>,
    /// Each input topic's high watermark as the consumer last saw it (-1: not known yet).
    pub high_watermarks: BTreeMap<String, i64>,
    /// Records behind the high watermarks (summed over input topics) from the checkpointed
    /// offsets: records a crash now would read again, or that wait to be processed.
    pub lag: i64,
    /// Bytes of state the last checkpoint references.
    pub state_bytes: u64,
    /// Version of the last committed checkpoint (the manifest version for `lsm`).
    pub checkpoint_version: Option<u64>,
    /// What holds the partition back, if anything (absent while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<PartitionProblem>,
}

/// What holds a partition back on its host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PartitionProblem {
    /// `paused`: it waits and tries again on its own (a dead-letter topic that refuses
    /// records, a fallback to an older checkpoint under way); `failed`: it needs a person
    /// (no usable checkpoint is left) and is retried with backoff meanwhile.
    pub state: PartitionState,
    /// Why, one line.
    pub reason: String,
}

/// The state of a [`PartitionProblem`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PartitionState {
    /// It waits and tries again on its own.
    Paused,
    /// It cannot go on without a person; retried with backoff.
    Failed,
}

impl PartitionProgress {
    fn update_lag(&mut self) {
        self.lag = self
            .high_watermarks
            .iter()
            .filter(|(_, high)| **high >= 0)
            .map(|(topic, high)| {
                (high - self.checkpointed_offsets.get(topic).copied().unwrap_or(0)).max(0)
            })
            .sum();
    }
}

/// One committed checkpoint of one partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct CheckpointRecord {
    /// The partition (shard).
    pub partition: i32,
    /// The checkpoint's version (the manifest version for `lsm`).
    pub version: u64,
    /// When it committed, ms since the Unix epoch.
    pub committed_ms: u64,
    /// How long it took (drain, flush, manifest, transaction), ms.
    pub duration_ms: u64,
    /// Bytes it uploaded.
    pub uploaded_bytes: u64,
    /// Bytes of state it references.
    pub state_bytes: u64,
    /// Next offset per input topic it recorded.
    pub offsets: BTreeMap<String, i64>,
}

impl PipelineStats {
    /// Stats whose figures are also exported as pipeline `pipeline` of `tenant`
    /// ([`RunMetrics::new`]).
    pub fn labelled(tenant: &str, pipeline: &str) -> Self {
        Self {
            metrics: RunMetrics::new(tenant, pipeline),
            ..Self::default()
        }
    }

    /// Records that reached a final disposition (ok, dead-lettered, or skipped by
    /// `failure_policy = "skip"`).
    pub fn records_done(&self) -> u64 {
        self.records_ok.load(Ordering::Relaxed)
            + self.dead_lettered.load(Ordering::Relaxed)
            + self.records_skipped_failed.load(Ordering::Relaxed)
    }

    pub(crate) fn record_checkpoint(&self, took: Duration, uploaded_bytes: u64) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.checkpoint_ns_total.fetch_add(ns, Ordering::Relaxed);
        self.checkpoint_ns_max.fetch_max(ns, Ordering::Relaxed);
        self.checkpoint_uploaded_bytes
            .fetch_add(uploaded_bytes, Ordering::Relaxed);
        self.metrics.checkpoint_duration.record(took.as_secs_f64());
        self.metrics.checkpoint_bytes.record(uploaded_bytes as f64);
    }

    /// Records a committed checkpoint of `partition` in the history and its progress.
    pub(crate) fn record_checkpoint_of(&self, record: CheckpointRecord) {
        {
            let mut partitions = self.partitions.lock().expect("progress lock");
            let progress = partitions.entry(record.partition).or_default();
            progress.partition = record.partition;
            progress.checkpointed_offsets = record.offsets.clone();
            progress.state_bytes = record.state_bytes;
            progress.checkpoint_version = Some(record.version);
            progress.update_lag();
            self.metrics
                .consumer_lag(record.partition)
                .set(progress.lag as f64);
        }
        let mut history = self.checkpoint_history.lock().expect("history lock");
        if history.len() == CHECKPOINT_HISTORY_MAX {
            history.pop_front();
        }
        history.push_back(record);
    }

    /// Records the input topics' high watermarks of `partition`.
    pub(crate) fn record_high_watermarks(&self, partition: i32, highs: BTreeMap<String, i64>) {
        let mut partitions = self.partitions.lock().expect("progress lock");
        let progress = partitions.entry(partition).or_default();
        progress.partition = partition;
        progress.high_watermarks = highs;
        progress.update_lag();
        self.metrics
            .consumer_lag(partition)
            .set(progress.lag as f64);
    }

    /// Records that `partition` resumed from a checkpoint with `offsets` (its progress until
    /// its next checkpoint here).
    pub(crate) fn record_resumed(&self, partition: i32, offsets: &InputOffsets) {
        let mut partitions = self.partitions.lock().expect("progress lock");
        let progress = partitions.entry(partition).or_default();
        progress.partition = partition;
        progress.checkpointed_offsets = offsets.iter().map(|(t, o)| (t.to_owned(), o)).collect();
        progress.problem = None;
        progress.update_lag();
        self.metrics
            .consumer_lag(partition)
            .set(progress.lag as f64);
    }

    /// Records what holds `partition` back (`None`: nothing, it runs).
    pub(crate) fn set_problem(&self, partition: i32, problem: Option<PartitionProblem>) {
        let mut partitions = self.partitions.lock().expect("progress lock");
        let progress = partitions.entry(partition).or_default();
        progress.partition = partition;
        progress.problem = problem;
    }

    /// Forgets `partition`: it is no longer run here.
    pub(crate) fn forget_partition(&self, partition: i32) {
        // Its new owner reports its lag: summed over hosts, the figure stays right.
        self.metrics.consumer_lag(partition).set(0.0);
        self.partitions
            .lock()
            .expect("progress lock")
            .remove(&partition);
    }

    pub(crate) fn record_recovery(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.recoveries.fetch_add(1, Ordering::Relaxed);
        self.recovery_ns_total.fetch_add(ns, Ordering::Relaxed);
        self.recovery_ns_max.fetch_max(ns, Ordering::Relaxed);
        self.metrics.recovery.record(took.as_secs_f64());
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

/// How often a paused partition's pending records are offered to its worker again, and how
/// often the loop looks at shards being opened or closed while it has nothing else to do.
const PAUSED_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// How often the consumer loop, waiting for room in a worker's queue, checks whether the
/// worker is stalled by an outage (and the partition should be paused instead).
const STALL_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// How long a partition whose shard another owner claimed stays paused before this host tries
/// to open it again (a rebalance that revokes it ends the wait sooner).
const FENCED_HOLD: Duration = Duration::from_secs(10);

/// How long after a failed shard open (store unavailable) it is tried again.
const OPEN_RETRY_DELAY: Duration = Duration::from_secs(1);

/// First wait before a shard with no usable checkpoint left is tried again; doubles up to
/// [`NO_CHECKPOINT_RETRY_MAX`].
const NO_CHECKPOINT_RETRY_MIN: Duration = Duration::from_secs(5);

/// Longest wait between tries of a shard with no usable checkpoint left.
const NO_CHECKPOINT_RETRY_MAX: Duration = Duration::from_secs(300);

/// Longest wait before a shard whose transactions keep failing is reopened (exactly-once).
const TRANSACTION_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// How often the partitions' high watermarks are read for their progress (lag).
const WATERMARKS_INTERVAL: Duration = Duration::from_secs(1);

/// How long a seek may wait for librdkafka to accept it.
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

struct WorkerHandle {
    tx: mpsc::Sender<Vec<InputRecord>>,
    /// Set by the worker while it backs off from a state outage.
    stalled: Arc<AtomicBool>,
    /// Set by the worker's sink while it waits to send a refused record again.
    sink_stalled: Arc<AtomicBool>,
    /// Set by the loop when the partition is revoked.
    revoked: Arc<AtomicBool>,
    task: JoinHandle<Result<(), WorkerError>>,
}

/// A shard being opened (recovered and claimed) in the background; its partition is paused.
struct Opening<S> {
    task: JoinHandle<Result<Opened<S>, OpenError>>,
    started: Instant,
}

/// An opened shard, with its transactional producer in exactly-once mode (transactions
/// initialised, one begun).
struct Opened<S> {
    shard: S,
    producer: Option<FutureProducer>,
}

/// Why opening a shard failed.
#[derive(Debug, thiserror::Error)]
enum OpenError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("kafka transactions")]
    Kafka(#[from] KafkaError),
}

/// How long opening a shard may wait for each Kafka transaction step.
const TRANSACTION_SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything a running pipeline holds.
///
/// A partition's life on this host (docs/checkpoints.md, "Recovery" and "Rebalance"): its first
/// fetched record finds no worker → the partition is paused and its shard opened in the
/// background ([`Opening`]) → the consumer is seeked to the checkpoint's offsets, the worker
/// starts and the partition resumes → on revoke the worker drops what is queued, checkpoints
/// and ends ([`Running::closing`]); the partition is not opened again here before that ends.
struct Running<B: StateBackend> {
    settings: Settings,
    backend: Arc<B>,
    operator: Arc<Operator<B::Shard>>,
    producer: rdkafka::producer::FutureProducer,
    /// The largest record each output topic takes (read at start).
    limits: sink::limits::RecordLimits,
    stats: Arc<PipelineStats>,
    consumer: Arc<SourceConsumer>,
    workers: HashMap<i32, WorkerHandle>,
    opening: HashMap<i32, Opening<B::Shard>>,
    /// Workers of revoked partitions, finishing their last checkpoint, and when they were
    /// revoked.
    closing: HashMap<i32, (Instant, JoinHandle<Result<(), WorkerError>>)>,
    /// Partitions not to open before the instant (fenced, or a failed open).
    hold: HashMap<i32, Instant>,
    /// Records fetched but not yet handed to their partition's worker.
    pending: HashMap<i32, Vec<InputRecord>>,
    /// Partitions paused at the consumer: their worker's queue is full, or it is not running
    /// yet.
    paused: HashSet<i32>,
    /// Offsets of committed checkpoints, from the workers, to commit to Kafka.
    checkpointed_tx: mpsc::UnboundedSender<(i32, InputOffsets)>,
    checkpointed_rx: mpsc::UnboundedReceiver<(i32, InputOffsets)>,
    /// Received from `checkpointed_rx`, not yet committed.
    checkpointed: Vec<(i32, InputOffsets)>,
    /// Notified when a worker ends, so that the loop reacts (a fenced or failed shard is
    /// reopened) without waiting for a record.
    worker_ended: Arc<tokio::sync::Notify>,
    control: PipelineControl,
    /// When the input's high watermarks were last copied into the partitions' progress.
    watermarks_read: Instant,
    /// What each partition's last worker here found corrupt: its next open falls back past
    /// the checkpoints it makes unusable (docs/checkpoints.md, "Corruption").
    corruption: HashMap<i32, crate::state::KnownCorruption>,
    /// The next wait of partitions whose open found no usable checkpoint.
    open_backoff: HashMap<i32, Duration>,
    /// The next wait before reopening a partition whose transaction failed, and when it last
    /// did (exactly-once).
    transaction_backoff: HashMap<i32, (Duration, Instant)>,
}

/// Runs the pipeline until `shutdown` completes or a fatal error occurs, then drains the
/// workers (every queued batch processed and delivered, a last checkpoint) and returns.
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
    let (_requests, control) = PipelineControl::new();
    run_controlled(settings, backend, clock, stats, control, shutdown).await
}

/// What a running pipeline can be asked to do besides stopping.
#[derive(Debug, Clone)]
pub struct PipelineControl {
    /// Each change of the value asks every partition for a checkpoint now, besides the
    /// interval's (as Flink's `POST /jobs/{id}/checkpoints`). A partition with nothing new
    /// since its last checkpoint has nothing to write.
    pub checkpoint_requests: watch::Receiver<u64>,
}

impl PipelineControl {
    /// A control and the sender that drives it.
    pub fn new() -> (watch::Sender<u64>, Self) {
        let (tx, rx) = watch::channel(0);
        (
            tx,
            Self {
                checkpoint_requests: rx,
            },
        )
    }
}

/// [`run`], with `control` to ask the running pipeline for checkpoints.
///
/// # Errors
/// As [`run`].
pub async fn run_controlled<B: StateBackend>(
    settings: Settings,
    backend: Arc<B>,
    clock: SharedClock,
    stats: Arc<PipelineStats>,
    control: PipelineControl,
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
    run_operator(settings, backend, operator, stats, control, shutdown).await
}

/// [`run_controlled`] with an operator already compiled (with `settings.runtime`'s limits;
/// `settings.pipeline.operator` is not read): a host running many pipelines compiles each
/// component once.
///
/// # Errors
/// As [`run`].
pub async fn run_operator<B: StateBackend>(
    settings: Settings,
    backend: Arc<B>,
    operator: Arc<Operator<B::Shard>>,
    stats: Arc<PipelineStats>,
    control: PipelineControl,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
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
    let consumer = Arc::new(consumer);
    let limits = sink::limits::read_limits(&settings).await;
    let producer = sink::producer(&settings, &limits).map_err(PipelineError::Kafka)?;
    let (checkpointed_tx, checkpointed_rx) = mpsc::unbounded_channel();
    let mut running = Running {
        settings,
        backend,
        operator,
        producer,
        limits,
        stats,
        consumer: consumer.clone(),
        workers: HashMap::new(),
        opening: HashMap::new(),
        closing: HashMap::new(),
        hold: HashMap::new(),
        pending: HashMap::new(),
        paused: HashSet::new(),
        checkpointed_tx,
        checkpointed_rx,
        checkpointed: Vec::new(),
        worker_ended: Arc::new(tokio::sync::Notify::new()),
        control,
        watermarks_read: Instant::now(),
        corruption: HashMap::new(),
        open_backoff: HashMap::new(),
        transaction_backoff: HashMap::new(),
    };
    let result = running.consume(&consumer, &context, shutdown).await;
    let drained = running.drain(&consumer).await;
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
            // While a partition is paused or a shard is changing hands, wake up now and then.
            let retry = !self.paused.is_empty() || !self.closing.is_empty();
            let first = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                msg = consumer.recv() => Some(msg),
                // librdkafka runs the revoke inside `recv`, which returns only with a record.
                () = context.revoked() => None,
                () = self.worker_ended.notified() => None,
                // A checkpoint's offsets, to commit to Kafka while the input is quiet.
                Some(done) = self.checkpointed_rx.recv() => {
                    self.checkpointed.push(done);
                    None
                }
                () = tokio::time::sleep(PAUSED_RETRY_INTERVAL), if retry => None,
                // Now and then, to refresh the partitions' lag while the input is quiet.
                () = tokio::time::sleep_until((self.watermarks_read + WATERMARKS_INTERVAL).into()) => None,
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
            self.pause_assigned(context, consumer);
            self.tend_shards(consumer).await?;
            if self.watermarks_read.elapsed() >= WATERMARKS_INTERVAL {
                self.watermarks_read = Instant::now();
                self.read_high_watermarks(context);
            }
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

    /// Forgets revoked partitions: fetched records dropped, a shard being opened abandoned, a
    /// running worker told to drop its queue, checkpoint and end (it moves to `closing`).
    fn drop_revoked(&mut self, context: &SourceContext) {
        for partition in context.take_revoked() {
            self.pending.remove(&partition);
            self.paused.remove(&partition);
            self.hold.remove(&partition);
            self.open_backoff.remove(&partition);
            if let Some(opening) = self.opening.remove(&partition) {
                opening.task.abort();
            }
            if let Some(worker) = self.workers.remove(&partition) {
                worker.revoked.store(true, Ordering::Relaxed);
                drop(worker.tx);
                if let Some((_, older)) = self
                    .closing
                    .insert(partition, (Instant::now(), worker.task))
                {
                    older.abort();
                }
            }
        }
    }

    /// Pauses newly assigned partitions that have no shard yet: `tend_shards` opens their
    /// shards right away (recovery does not wait for a first record) and resumes them after
    /// the seek.
    fn pause_assigned(&mut self, context: &SourceContext, consumer: &SourceConsumer) {
        for partition in context.take_assigned() {
            let busy =
                self.workers.contains_key(&partition) || self.opening.contains_key(&partition);
            if !busy && self.paused.insert(partition) {
                self.set_paused(consumer, partition, true);
            }
        }
    }

    /// Moves shards along their life: reaps closed and failed workers, starts opening shards
    /// for paused partitions that have none, finishes opens (seek, start the worker, resume),
    /// and commits checkpointed offsets to Kafka.
    async fn tend_shards(&mut self, consumer: &SourceConsumer) -> Result<(), PipelineError> {
        let closed: Vec<i32> = self
            .closing
            .iter()
            .filter(|(_, (_, task))| task.is_finished())
            .map(|(p, _)| *p)
            .collect();
        for partition in closed {
            if let Some((revoked_at, task)) = self.closing.remove(&partition) {
                let ms = revoked_at.elapsed().as_millis() as u64;
                self.stats.shards_closed.fetch_add(1, Ordering::Relaxed);
                self.stats.forget_partition(partition);
                match task.await {
                    Ok(Ok(())) => tracing::info!(partition, ms, "revoked partition closed"),
                    Ok(Err(err)) => {
                        tracing::warn!(partition, ms, error = %err, "revoked partition closed with an error; the next owner resumes from its last checkpoint")
                    }
                    Err(_) => return Err(PipelineError::WorkerPanicked(partition)),
                }
            }
        }
        let ended: Vec<i32> = self
            .workers
            .iter()
            .filter(|(_, w)| w.task.is_finished())
            .map(|(p, _)| *p)
            .collect();
        for partition in ended {
            self.worker_ended(partition, consumer).await?;
        }
        let now = Instant::now();
        self.hold.retain(|_, until| *until > now);
        let waiting: Vec<i32> = self
            .paused
            .iter()
            .copied()
            .filter(|p| {
                !self.workers.contains_key(p)
                    && !self.opening.contains_key(p)
                    && !self.closing.contains_key(p)
                    && !self.hold.contains_key(p)
            })
            .collect();
        for partition in waiting {
            self.start_opening(partition);
        }
        let opened: Vec<i32> = self
            .opening
            .iter()
            .filter(|(_, o)| o.task.is_finished())
            .map(|(p, _)| *p)
            .collect();
        for partition in opened {
            self.finish_opening(partition, consumer).await?;
        }
        self.commit_checkpointed(consumer);
        Ok(())
    }

    /// Copies the input topics' high watermarks of the partitions run here into their
    /// progress (from librdkafka's statistics: no request is made).
    fn read_high_watermarks(&self, context: &SourceContext) {
        for &partition in self.workers.keys() {
            let highs = self
                .settings
                .pipeline
                .input_topics
                .iter()
                .map(|topic| {
                    let high = context.high_watermark(topic, partition).unwrap_or(-1);
                    (topic.clone(), high)
                })
                .collect();
            self.stats.record_high_watermarks(partition, highs);
        }
    }

    /// Opens `partition`'s shard in the background (recovery and claim read the store). In
    /// exactly-once mode, first fences the previous owner's producer (`init_transactions`) and
    /// reads the committed offsets' metadata, which names the checkpoint to open
    /// (docs/checkpoints.md, "Recovery" step 3).
    fn start_opening(&mut self, partition: i32) {
        let id = ShardId {
            pipeline: self.settings.pipeline.name.clone(),
            partition,
        };
        let backend = self.backend.clone();
        let (settings, consumer) = (self.settings.clone(), self.consumer.clone());
        let known_corruption = self.corruption.get(&partition).cloned().unwrap_or_default();
        let limits = self.limits;
        let task = match self.settings.pipeline.delivery {
            Delivery::AtLeastOnce => tokio::spawn(async move {
                // Kafka names a checkpoint only if an exactly-once run committed one (the
                // pipeline switched modes); manifest-decided ones count anyway.
                let committed = committed_checkpoint(&settings, partition, consumer).await?;
                let recovery = Recovery {
                    committed,
                    known_corruption,
                };
                Ok(Opened {
                    shard: backend.open_shard_at(&id, &recovery).await?,
                    producer: None,
                })
            }),
            Delivery::ExactlyOnce => tokio::spawn(async move {
                let producer = sink::transactional_producer(&settings, partition, &limits)?;
                let init = producer.clone();
                tokio::task::spawn_blocking(move || {
                    init.init_transactions(TRANSACTION_SETUP_TIMEOUT)
                })
                .await
                .unwrap_or(Err(KafkaError::Canceled))?;
                let committed = committed_checkpoint(&settings, partition, consumer).await?;
                let recovery = Recovery {
                    committed,
                    known_corruption,
                };
                let shard = backend.open_shard_at(&id, &recovery).await?;
                let begin = producer.clone();
                tokio::task::spawn_blocking(move || begin.begin_transaction())
                    .await
                    .unwrap_or(Err(KafkaError::Canceled))?;
                Ok(Opened {
                    shard,
                    producer: Some(producer),
                })
            }),
        };
        self.opening.insert(
            partition,
            Opening {
                task,
                started: Instant::now(),
            },
        );
    }

    /// No usable checkpoint is left for `partition`'s shard: starting empty would lose its
    /// state. The partition stays assigned and paused, failed in its status with `err`, and is
    /// tried again with backoff; the others go on.
    fn no_usable_checkpoint(&mut self, partition: i32, err: &StateError) {
        let wait = self
            .open_backoff
            .get(&partition)
            .copied()
            .unwrap_or(NO_CHECKPOINT_RETRY_MIN);
        self.open_backoff
            .insert(partition, (wait * 2).min(NO_CHECKPOINT_RETRY_MAX));
        tracing::error!(partition, error = %err, retry_in = ?wait, "no usable checkpoint is left for the shard; the partition stays paused");
        self.stats.set_problem(
            partition,
            Some(PartitionProblem {
                state: PartitionState::Failed,
                reason: format!("{}", crate::error::Chain(err)),
            }),
        );
        self.hold.insert(partition, Instant::now() + wait);
    }

    /// Takes an opened shard: seeks the consumer to its checkpoint's offsets (dropping what
    /// was fetched before), starts its worker and resumes the partition.
    async fn finish_opening(
        &mut self,
        partition: i32,
        consumer: &SourceConsumer,
    ) -> Result<(), PipelineError> {
        let Some(opening) = self.opening.remove(&partition) else {
            return Ok(());
        };
        let Opened { shard, producer } = match opening.task.await {
            Ok(Ok(opened)) => opened,
            Ok(Err(OpenError::State(err))) if err.kind() == crate::error::ErrorKind::Corrupt => {
                self.no_usable_checkpoint(partition, &err);
                return Ok(());
            }
            Ok(Err(err)) => {
                tracing::warn!(partition, error = %err, retry_in = ?OPEN_RETRY_DELAY, "cannot open shard; retrying");
                self.hold
                    .insert(partition, Instant::now() + OPEN_RETRY_DELAY);
                return Ok(());
            }
            Err(_) => return Err(PipelineError::WorkerPanicked(partition)),
        };
        self.stats.shards_opened.fetch_add(1, Ordering::Relaxed);
        self.open_backoff.remove(&partition);
        // The fallback is recorded in the claim: what was found corrupt is known durably.
        self.corruption.remove(&partition);
        let offsets = match shard.recovered_offsets() {
            Ok(offsets) => offsets.unwrap_or_default(),
            Err(err) => {
                self.no_usable_checkpoint(partition, &err);
                return Ok(());
            }
        };
        if let Err(err) = self.seek(consumer, partition, &offsets) {
            tracing::warn!(partition, error = %err, retry_in = ?OPEN_RETRY_DELAY, "cannot seek to the checkpoint's offsets; reopening");
            self.hold
                .insert(partition, Instant::now() + OPEN_RETRY_DELAY);
            return Ok(());
        }
        // Fetched from wherever the consumer was: the seek fetches what counts again.
        self.pending.remove(&partition);
        if self.settings.pipeline.delivery == Delivery::AtLeastOnce && !offsets.is_empty() {
            // The group's committed offsets follow the owner: the previous one committed
            // nothing after its revoke, so what it checkpointed last reaches the group here
            // (lag dashboards and autoscalers read it; recovery reads the checkpoint).
            self.checkpointed.push((partition, offsets.clone()));
        }
        tracing::info!(
            partition,
            ms = opening.started.elapsed().as_millis() as u64,
            ?offsets,
            "shard opened; partition resumes"
        );
        self.stats.record_resumed(partition, &offsets);
        self.start_worker(partition, shard, offsets, opening.started, producer);
        if self.paused.remove(&partition) {
            self.set_paused(consumer, partition, false);
        }
        Ok(())
    }

    /// Seeks every input topic's `partition` to its offset in `offsets`; a topic without one
    /// (the checkpoint saw none of its records, or there is no checkpoint) to where
    /// `auto.offset.reset` says a new group starts — never left where the consumer happens to
    /// be, which may be past records the state does not reflect (a shard reopened after a
    /// failed transaction, or records fetched and dropped meanwhile).
    fn seek(
        &self,
        consumer: &SourceConsumer,
        partition: i32,
        offsets: &InputOffsets,
    ) -> Result<(), KafkaError> {
        let reset = match self
            .settings
            .kafka
            .consumer
            .get("auto.offset.reset")
            .map(String::as_str)
        {
            Some("latest" | "largest" | "end") => Offset::End,
            _ => Offset::Beginning,
        };
        for topic in &self.settings.pipeline.input_topics {
            let to = offsets.next(topic).map_or(reset, Offset::Offset);
            consumer.seek(topic, partition, to, SEEK_TIMEOUT)?;
        }
        Ok(())
    }

    /// Commits (asynchronously) the offsets of checkpoints committed since the last call, for
    /// partitions still owned — never one whose revoke reached this loop: its next owner
    /// commits what it recovers (S1). Informational — lag and tooling read them; recovery reads
    /// the checkpoint — so a failure is only logged.
    fn commit_checkpointed(&mut self, consumer: &SourceConsumer) {
        let owned: HashSet<i32> = self.workers.keys().copied().collect();
        self.commit_offsets(consumer, &owned, CommitMode::Async);
    }

    /// Commits the newest checkpointed offsets received for the `owned` partitions (later
    /// checkpoints replace earlier ones) and forgets the others'.
    fn commit_offsets(
        &mut self,
        consumer: &SourceConsumer,
        owned: &HashSet<i32>,
        mode: CommitMode,
    ) {
        while let Ok(done) = self.checkpointed_rx.try_recv() {
            self.checkpointed.push(done);
        }
        let mut newest: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for (partition, offsets) in std::mem::take(&mut self.checkpointed) {
            if owned.contains(&partition) {
                for (topic, next) in offsets.iter() {
                    newest.insert((topic.to_owned(), partition), next);
                }
            }
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in &newest {
            if let Err(err) = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next)) {
                tracing::warn!(partition, error = %err, "cannot list offset to commit");
            }
        }
        if tpl.count() > 0
            && let Err(err) = consumer.commit(&tpl, mode)
        {
            tracing::warn!(error = %err, "cannot commit checkpointed offsets to Kafka");
        }
    }

    /// Hands the partition's pending records to its worker in batches of at most
    /// `batch_records_max`. A partition without a running worker is paused and keeps its
    /// records until its shard is open. A busy worker gets plain backpressure (this waits for
    /// room); a worker backing off from a state outage gets its partition paused at the
    /// consumer instead, the records stay pending and the other partitions go on; it is resumed
    /// once everything is handed over. Without `consumer` (when draining), waits for room as
    /// long as it takes.
    async fn send_pending(
        &mut self,
        partition: i32,
        consumer: Option<&SourceConsumer>,
    ) -> Result<(), PipelineError> {
        let Some(worker) = self.workers.get(&partition) else {
            if let Some(consumer) = consumer
                && self.paused.insert(partition)
            {
                self.set_paused(consumer, partition, true);
            }
            return Ok(());
        };
        let (tx, stalled, sink_stalled) = (
            worker.tx.clone(),
            worker.stalled.clone(),
            worker.sink_stalled.clone(),
        );
        let Some(mut records) = self.pending.remove(&partition) else {
            return Ok(());
        };
        let batch_max = self.settings.runtime.batch_records_max;
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
                        Err(_still_full)
                            if stalled.load(Ordering::Relaxed)
                                || sink_stalled.load(Ordering::Relaxed) =>
                        {
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
                // The worker's queue is closed: it ended. Find out why.
                return match consumer {
                    Some(consumer) => self.worker_ended(partition, consumer).await,
                    None => Err(self.worker_failure(partition).await),
                };
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

    /// A worker ended on its own. Fenced: another owner claimed the shard, so this host drops
    /// the partition's records and pauses it for [`FENCED_HOLD`] (a rebalance will normally
    /// revoke it meanwhile). A failed transaction: the same, for [`OPEN_RETRY_DELAY`], then the
    /// shard is reopened from its decided checkpoint. Corrupt state: the same, and the shard is
    /// reopened from a checkpoint that does not reference what was found corrupt. Anything
    /// else stops the pipeline.
    async fn worker_ended(
        &mut self,
        partition: i32,
        consumer: &SourceConsumer,
    ) -> Result<(), PipelineError> {
        match self.worker_failure(partition).await {
            PipelineError::Worker(WorkerError::Corrupt {
                opened_from,
                source,
                ..
            }) => {
                let known = self.corruption.entry(partition).or_default();
                known.add(&source, opened_from);
                self.stats.set_problem(
                    partition,
                    Some(PartitionProblem {
                        state: PartitionState::Paused,
                        reason: format!(
                            "falling back to an older checkpoint: {}",
                            crate::error::Chain(&source)
                        ),
                    }),
                );
                self.pending.remove(&partition);
                self.hold
                    .insert(partition, Instant::now() + OPEN_RETRY_DELAY);
                if self.paused.insert(partition) {
                    self.set_paused(consumer, partition, true);
                }
                Ok(())
            }
            PipelineError::Worker(
                ref err @ (WorkerError::Fenced { .. } | WorkerError::Transaction { .. }),
            ) => {
                let hold = match err {
                    WorkerError::Fenced { .. } => FENCED_HOLD,
                    _ => {
                        // A transaction that keeps failing (its outputs refused) reopens the
                        // shard less and less often, and says so in the partition's status.
                        let now = Instant::now();
                        let (wait, last) = self
                            .transaction_backoff
                            .get(&partition)
                            .copied()
                            .unwrap_or((OPEN_RETRY_DELAY, now));
                        let wait = if now.duration_since(last) < TRANSACTION_BACKOFF_MAX * 2 {
                            wait
                        } else {
                            OPEN_RETRY_DELAY
                        };
                        self.transaction_backoff
                            .insert(partition, ((wait * 2).min(TRANSACTION_BACKOFF_MAX), now));
                        self.stats.set_problem(
                            partition,
                            Some(PartitionProblem {
                                state: PartitionState::Paused,
                                reason: format!(
                                    "the exactly-once transaction was lost ({}); reopening from the last decided checkpoint in {wait:?}",
                                    crate::error::Chain(err)
                                ),
                            }),
                        );
                        wait
                    }
                };
                self.pending.remove(&partition);
                self.hold.insert(partition, Instant::now() + hold);
                if self.paused.insert(partition) {
                    self.set_paused(consumer, partition, true);
                }
                Ok(())
            }
            other => Err(other),
        }
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
            Ok(()) => tracing::debug!(partition, paused, "partition fetch state changed"),
            Err(err) => {
                tracing::warn!(partition, paused, error = %err, "cannot change partition fetch state")
            }
        }
    }

    fn start_worker(
        &mut self,
        partition: i32,
        shard: B::Shard,
        offsets: InputOffsets,
        opened_at: Instant,
        transactional: Option<FutureProducer>,
    ) {
        let (tx, rx) = mpsc::channel(self.settings.runtime.partition_queue_batches_max);
        let is_transactional = transactional.is_some();
        let (producer, decision) = match transactional {
            Some(producer) => (
                producer.clone(),
                Decision::Transaction {
                    producer,
                    consumer: self.consumer.clone(),
                },
            ),
            None => (self.producer.clone(), Decision::Manifest),
        };
        let stalled = Arc::new(AtomicBool::new(false));
        let revoked = Arc::new(AtomicBool::new(false));
        let sink_stalled = Arc::new(AtomicBool::new(false));
        let (stall_flag, stall_stats) = (sink_stalled.clone(), self.stats.clone());
        let refused_stats = self.stats.clone();
        let worker = PartitionWorker {
            partition,
            operator: self.operator.clone(),
            shard: Arc::new(shard),
            sink: Sink::new(
                producer,
                self.settings.pipeline.output_topic.clone(),
                self.settings.pipeline.dead_letter_topic.clone(),
                self.limits,
                is_transactional,
                DeliveryGuard {
                    on_stall: Box::new(move |reason| {
                        // A refused delivery pauses the partition (its worker waits) and says
                        // why in its status.
                        stall_flag.store(reason.is_some(), Ordering::Relaxed);
                        stall_stats.set_problem(
                            partition,
                            reason.map(|reason| PartitionProblem {
                                state: PartitionState::Paused,
                                reason,
                            }),
                        );
                    }),
                    give_up: revoked.clone(),
                    on_output_refused: Box::new(move || {
                        refused_stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                        refused_stats
                            .metrics
                            .dead_lettered(sink::DeadLetterKind::OutputRefused)
                            .increment(1);
                    }),
                },
            ),
            settings: self.settings.runtime.clone(),
            stats: self.stats.clone(),
            source: format!("{}/{}", self.settings.pipeline.name, partition).into(),
            execution: attempt::Execution::new(
                self.settings.pipeline.in_flight_max,
                &self.settings.runtime,
                self.stats.clone(),
            ),
            stalled: stalled.clone(),
            revoked: revoked.clone(),
            admitted: offsets.clone(),
            offsets,
            dirty: false,
            checkpoint_interval: self.settings.pipeline.checkpoint_interval,
            opened_at: Some(opened_at),
            checkpointed: self.checkpointed_tx.clone(),
            decision,
            failure_policy: self.settings.pipeline.failure_policy,
            checkpoint_requests: self.control.checkpoint_requests.clone(),
        };
        let ended = self.worker_ended.clone();
        let task = tokio::spawn(async move {
            let result = worker.run(rx).await;
            ended.notify_one();
            result
        });
        self.workers.insert(
            partition,
            WorkerHandle {
                tx,
                stalled,
                sink_stalled,
                revoked,
                task,
            },
        );
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

    /// Closes every worker's queue and waits for it to finish its batches, deliveries and last
    /// checkpoint; waits for revoked partitions' workers too. Then commits the last
    /// checkpoints of the partitions it still owns to the group, synchronously, before the
    /// consumer closes (at-least-once: exactly-once committed them in their transactions).
    async fn drain(&mut self, consumer: &SourceConsumer) -> Result<(), PipelineError> {
        for (_, opening) in self.opening.drain() {
            opening.task.abort();
        }
        let owned: HashSet<i32> = self.workers.keys().copied().collect();
        let deadline = tokio::time::Instant::now() + self.settings.runtime.shutdown_drain_max;
        match tokio::time::timeout_at(deadline, self.drain_all()).await {
            Ok(result) => {
                // The partitions it still owns: their last checkpoints reach the group before
                // the consumer leaves it.
                self.commit_offsets(consumer, &owned, CommitMode::Sync);
                result
            }
            Err(_) => {
                // A worker stuck in an outage would keep shutdown waiting forever. Nothing is
                // lost by stopping it: no offset is committed for records it did not finish.
                let partitions: Vec<i32> = self.workers.keys().copied().collect();
                tracing::warn!(?partitions, max = ?self.settings.runtime.shutdown_drain_max, "shutdown: workers still busy; stopping them without finishing");
                for (_, worker) in self.workers.drain() {
                    worker.task.abort();
                }
                for (_, (_, task)) in self.closing.drain() {
                    task.abort();
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
                // The partition's next owner resumes from its last decided checkpoint.
                Ok(
                    Ok(())
                    | Err(
                        WorkerError::Fenced { .. }
                        | WorkerError::Transaction { .. }
                        | WorkerError::Corrupt { .. },
                    ),
                ) => Ok(()),
                Ok(Err(err)) => Err(PipelineError::Worker(err)),
                Err(_) => Err(PipelineError::WorkerPanicked(partition)),
            };
            self.workers.remove(&partition);
            result = result.and(outcome);
        }
        let partitions: Vec<i32> = self.closing.keys().copied().collect();
        for partition in partitions {
            let Some((_, task)) = self.closing.get_mut(&partition) else {
                continue;
            };
            if let Err(_panicked) = task.await {
                result = result.and(Err(PipelineError::WorkerPanicked(partition)));
            }
            self.closing.remove(&partition);
        }
        result
    }
}

/// The checkpoint version the partition's committed Kafka offsets name in their metadata
/// (docs/checkpoints.md, "Recovery" step 3), if any. Exactly-once calls it after
/// `init_transactions`, which fenced the previous owner's producer and aborted its open
/// transaction. A blocking librdkafka call, run on the blocking pool.
async fn committed_checkpoint(
    settings: &Settings,
    partition: i32,
    consumer: Arc<SourceConsumer>,
) -> Result<Option<u64>, KafkaError> {
    let mut wanted = TopicPartitionList::new();
    for topic in &settings.pipeline.input_topics {
        wanted.add_partition(topic, partition);
    }
    // With `isolation.level = read_committed` librdkafka asks for stable offsets: the fetch
    // waits until no transaction is pending for them.
    let committed = tokio::task::spawn_blocking(move || {
        consumer.committed_offsets(wanted, TRANSACTION_SETUP_TIMEOUT)
    })
    .await
    .unwrap_or(Err(KafkaError::Canceled))?;
    let version = committed
        .elements()
        .iter()
        .find_map(|e| crate::state::checkpoint::parse_manifest_metadata(e.metadata()));
    tracing::info!(partition, ?version, "committed offsets read");
    Ok(version)
}
