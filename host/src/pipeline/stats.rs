//! The figures of one pipeline run: counters ([`PipelineStats`]), each partition's progress
//! and problem, and the committed checkpoints — what the status and the metrics show.

use crate::config::LateRecords;
use crate::ids::{ManifestVersion, Offset, Partition};
use crate::state::checkpoint::InputOffsets;
use crate::telemetry::RunMetrics;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    /// Records of an edge dropped as repeats: their upstream shard had sent them before a
    /// frontier its markers named (`crate::time::edge`).
    pub records_repeated: AtomicU64,
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
    /// Workers that ended — told to finish or revoked — without their last checkpoint: the
    /// state store failed again, or a delivery was given up on (the next owner resumes from
    /// the last checkpoint).
    pub closed_without_checkpoint: AtomicU64,
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
    /// Timers that fired (their `on-timers` call ended: applied, rejected or failed).
    pub timers_fired: AtomicU64,
    /// Records behind the watermark, by [`LateRecords`] policy (index
    /// [`LateRecords::index`]).
    pub late_records: [AtomicU64; 3],
    /// Event-time watermark of each partition's shard, as applied, ms.
    pub watermarks: Mutex<BTreeMap<Partition, i64>>,
    /// Where each partition run here stands, by partition.
    pub partitions: Mutex<BTreeMap<Partition, PartitionProgress>>,
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
    /// The stage whose partition it is, in a pipeline of stages (absent in a one-operator
    /// pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The partition (shard) number.
    pub partition: Partition,
    /// Next offset to read per input topic as of the last committed checkpoint (what a new
    /// owner resumes from; as a consumer group's committed offsets).
    pub checkpointed_offsets: BTreeMap<String, Offset>,
    /// Each input topic's high watermark as the consumer last saw it (-1: not known yet).
    pub high_watermarks: BTreeMap<String, i64>,
    /// Records behind the high watermarks (summed over input topics) from the checkpointed
    /// offsets: records a crash now would read again, or that wait to be processed.
    pub lag: i64,
    /// Bytes of state the last checkpoint references.
    pub state_bytes: u64,
    /// The shard's applied event-time watermark, ms since the Unix epoch (absent: none yet;
    /// docs/time.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_ms: Option<i64>,
    /// Timers pending in the shard (set, not fired or cleared), as of the last timer round or
    /// checkpoint (absent: the operator has no timers, or they are not loaded yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers_pending: Option<u64>,
    /// Version of the last committed checkpoint (the manifest version for `lsm`).
    pub checkpoint_version: Option<ManifestVersion>,
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
                (high - self.checkpointed_offsets.get(topic).map_or(0, |o| o.0)).max(0)
            })
            .sum();
    }
}

/// One committed checkpoint of one partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct CheckpointRecord {
    /// The stage whose partition it is, in a pipeline of stages (absent in a one-operator
    /// pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The partition (shard).
    pub partition: Partition,
    /// The checkpoint's version (the manifest version for `lsm`).
    pub version: ManifestVersion,
    /// When it committed, ms since the Unix epoch.
    pub committed_ms: u64,
    /// How long it took (drain, flush, manifest, transaction), ms.
    pub duration_ms: u64,
    /// Bytes it uploaded.
    pub uploaded_bytes: u64,
    /// Bytes of state it references.
    pub state_bytes: u64,
    /// Next offset per input topic it recorded.
    pub offsets: BTreeMap<String, Offset>,
}

impl PipelineStats {
    /// A late record met `policy`: counted here and in `weir_late_records_total`.
    pub(crate) fn late(&self, policy: LateRecords) {
        self.late_records[policy.index()].fetch_add(1, Ordering::Relaxed);
        self.metrics.late_records(policy).increment(1);
    }

    /// `timers` timers fired: counted here and in `weir_timers_fired_total`.
    pub(crate) fn timers_fired(&self, timers: u64) {
        self.timers_fired.fetch_add(timers, Ordering::Relaxed);
        self.metrics.timers_fired.increment(timers);
    }

    /// Stats whose figures are also exported as pipeline `pipeline` of `tenant`
    /// ([`RunMetrics::new`]).
    pub fn labelled(tenant: &str, pipeline: &str) -> Self {
        Self {
            metrics: RunMetrics::new(tenant, pipeline),
            ..Self::default()
        }
    }

    /// Stats whose figures are also exported as stage `stage` of pipeline `pipeline` of
    /// `tenant` ([`RunMetrics::for_stage`]).
    pub fn labelled_stage(tenant: &str, pipeline: &str, stage: &str) -> Self {
        Self {
            metrics: RunMetrics::for_stage(tenant, pipeline, stage),
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
    pub(crate) fn record_high_watermarks(
        &self,
        partition: Partition,
        highs: BTreeMap<String, i64>,
    ) {
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
    pub(crate) fn record_resumed(&self, partition: Partition, offsets: &InputOffsets) {
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
    pub(crate) fn set_problem(&self, partition: Partition, problem: Option<PartitionProblem>) {
        let mut partitions = self.partitions.lock().expect("progress lock");
        let progress = partitions.entry(partition).or_default();
        progress.partition = partition;
        progress.problem = problem;
    }

    /// Records `partition`'s applied event-time watermark at processing time `now_ms`: in
    /// [`Self::watermarks`], its progress and `weir_watermark_lag_seconds`.
    pub(crate) fn record_watermark(&self, partition: Partition, watermark: i64, now_ms: i64) {
        self.metrics
            .watermark_lag(partition)
            .set(now_ms.saturating_sub(watermark) as f64 / 1000.0);
        self.watermarks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(partition, watermark);
        let mut partitions = self.partitions.lock().expect("progress lock");
        let progress = partitions.entry(partition).or_default();
        progress.partition = partition;
        progress.watermark_ms = Some(watermark);
    }

    /// Records the timers pending in `partition`'s shard (gauge `weir_timers_pending`, and
    /// its progress).
    pub(crate) fn record_timers_pending(&self, partition: Partition, pending: u64) {
        self.metrics.timers_pending(partition).set(pending as f64);
        let mut partitions = self.partitions.lock().expect("progress lock");
        let progress = partitions.entry(partition).or_default();
        progress.partition = partition;
        progress.timers_pending = Some(pending);
    }

    /// Forgets `partition`: it is no longer run here.
    pub(crate) fn forget_partition(&self, partition: Partition) {
        // Its new owner reports its lag: summed over hosts, the figure stays right. Its
        // watermark lag likewise (the largest over hosts is the new owner's).
        self.metrics.consumer_lag(partition).set(0.0);
        self.metrics.watermark_lag(partition).set(0.0);
        self.metrics.timers_pending(partition).set(0.0);
        self.watermarks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&partition);
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
