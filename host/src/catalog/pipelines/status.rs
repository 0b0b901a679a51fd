//! What the hosts report of a pipeline ([`HostStatus`], written by the runner) and the status
//! the API answers with, merged from the fresh reports ([`merge_status`]).

use super::{DesiredState, PipelineRecord};
use crate::error::ErrorKind;
use crate::ids::Partition;
use crate::pipeline::{CheckpointRecord, PartitionProgress};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa::ToSchema;

/// A host's status older than this (or than its `stale_after_ms`, if longer) is ignored: the
/// host is gone (killed, or cut off).
pub const HOST_STATUS_STALE: Duration = Duration::from_secs(15);

fn default_stale_after_ms() -> u64 {
    HOST_STATUS_STALE.as_millis() as u64
}

/// What one host does with a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HostPhase {
    /// Fetching the operator, checking topics, joining the consumer group.
    Starting,
    /// Processing its partitions.
    Running,
    /// Its run failed (`reason`); the host starts it again after a backoff.
    Failed,
    /// Draining: finishing admitted records and checkpointing, before a restart or stop.
    Stopping,
    /// Not running it here.
    Stopped,
}

/// What one host reports about one pipeline, every reconcile interval.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostStatus {
    /// The host (`pipelines.host_id`).
    pub host: String,
    /// The pipeline's uid this report is about.
    pub uid: String,
    /// The run generation it runs.
    pub run_generation: u64,
    /// What it does with the pipeline.
    pub phase: HostPhase,
    /// Why it failed, when it did (the last failure while it restarts).
    pub reason: Option<String>,
    /// What kind of failure `reason` is: `invalid_input` (fix the definition, its operator
    /// or its topics), `unavailable` (a broker or the object store; it retries), `corrupt`,
    /// `fenced`, `guest_fault` (a record failed with `failure_policy = "fail"`) or `internal`.
    #[serde(default)]
    pub reason_kind: Option<ErrorKind>,
    /// When this report was written, ms since the Unix epoch.
    pub updated_ms: u64,
    /// Age after which the report no longer counts (the host is gone), ms: a few of the
    /// host's reconcile intervals, at least [`HOST_STATUS_STALE`].
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// Times this host restarted the pipeline after a failure.
    pub restarts: u64,
    /// Records processed (ok or dead-lettered) by this host's current run (by every stage of a
    /// pipeline of stages, summed; the other counts too).
    pub records_done: u64,
    /// Records per second over the last reconcile interval.
    pub records_per_s: f64,
    /// Records sent to the dead-letter topic by this run.
    pub dead_lettered: u64,
    /// Records dropped by `failure_policy = "skip"` in this run.
    pub skipped_failed: u64,
    /// Records emitted to the output topic by this run.
    pub emitted: u64,
    /// Checkpoints committed by this run.
    pub checkpoints: u64,
    /// Block reads served by the state caches (memory or disk).
    pub cache_hits: u64,
    /// Block reads fetched from object storage.
    pub cache_misses: u64,
    /// The partitions this host runs.
    pub partitions: Vec<PartitionProgress>,
    /// Its newest checkpoints, oldest first.
    pub recent_checkpoints: Vec<CheckpointRecord>,
}

/// A pipeline's state over all hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PipelineState {
    /// Should run; no host reports running it yet.
    Starting,
    /// Hosts run it.
    Running,
    /// A host's run failed (see `reason`); hosts retry with backoff.
    Failed,
    /// Stopped, but a host still drains it.
    Stopping,
    /// No host runs it.
    Stopped,
}

/// One host in a pipeline's status.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostSummary {
    /// The host.
    pub host: String,
    /// What it does.
    pub phase: HostPhase,
    /// Why it failed, if it did.
    pub reason: Option<String>,
    /// What kind of failure `reason` is (as in a host's report).
    pub reason_kind: Option<ErrorKind>,
    /// The partitions it runs, in order (of any of the stages of a pipeline of stages, whose
    /// partitions the status lists per stage).
    pub partitions: Vec<Partition>,
    /// Its records per second.
    pub records_per_s: f64,
    /// Age of its report, ms.
    pub report_age_ms: u64,
}

/// A pipeline's status, merged from the fresh reports of the hosts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PipelineStatus {
    /// Over all hosts.
    pub state: PipelineState,
    /// Why, when failed.
    pub reason: Option<String>,
    /// What kind of failure `reason` is: `invalid_input` (fix the definition, its operator
    /// or its topics), `unavailable` (a broker or the object store; hosts retry), `corrupt`,
    /// `fenced`, `guest_fault` or `internal`.
    pub reason_kind: Option<ErrorKind>,
    /// The hosts that report on it.
    pub hosts: Vec<HostSummary>,
    /// Per partition (per stage and partition, in a pipeline of stages): checkpointed
    /// offsets, high watermarks, lag, state bytes.
    pub partitions: Vec<PartitionProgress>,
    /// Records per second, summed over hosts (and stages).
    pub records_per_s: f64,
    /// Records processed by the hosts' current runs.
    pub records_done: u64,
    /// Records dead-lettered by the hosts' current runs.
    pub dead_lettered: u64,
    /// Records skipped (`failure_policy = "skip"`) by the hosts' current runs.
    pub skipped_failed: u64,
    /// Records emitted by the hosts' current runs.
    pub emitted: u64,
    /// The newest committed checkpoint of any partition.
    pub last_checkpoint: Option<CheckpointRecord>,
    /// Bytes of state the partitions' last checkpoints reference, summed.
    pub state_bytes: u64,
    /// Share of block reads the state caches served (none before any read).
    pub cache_hit_rate: Option<f64>,
}

/// A pipeline: its definition and status.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PipelineView {
    /// The definition.
    pub definition: PipelineRecord,
    /// What the hosts report.
    pub status: PipelineStatus,
}

/// Merges `reports` (with their ages) into a status for `record`: the hosts' fresh reports of
/// its current uid (not older than [`HOST_STATUS_STALE`] or their `stale_after_ms`), added up.
pub fn merge_status(record: &PipelineRecord, reports: &[(HostStatus, u64)]) -> PipelineStatus {
    let fresh: Vec<(&HostStatus, u64)> = reports
        .iter()
        .filter(|(r, age)| {
            r.uid == record.uid
                && *age <= r.stale_after_ms.max(default_stale_after_ms())
                && r.phase != HostPhase::Stopped
        })
        .map(|(r, age)| (r, *age))
        .collect();
    let failed = fresh.iter().find(|(r, _)| r.phase == HostPhase::Failed);
    let mut status = PipelineStatus {
        state: pipeline_state(record, &fresh),
        reason: failed.and_then(|(r, _)| r.reason.clone()),
        reason_kind: failed.and_then(|(r, _)| r.reason_kind),
        hosts: Vec::new(),
        partitions: Vec::new(),
        records_per_s: 0.0,
        records_done: 0,
        dead_lettered: 0,
        skipped_failed: 0,
        emitted: 0,
        last_checkpoint: None,
        state_bytes: 0,
        cache_hit_rate: None,
    };
    // By stage (none in a one-operator pipeline), then partition.
    let mut partitions: BTreeMap<(Option<String>, Partition), PartitionProgress> = BTreeMap::new();
    let (mut hits, mut misses) = (0u64, 0u64);
    for (report, age) in fresh {
        status.add(report, age);
        hits += report.cache_hits;
        misses += report.cache_misses;
        for p in &report.partitions {
            partitions.insert((p.stage.clone(), p.partition), p.clone());
        }
    }
    status.hosts.sort_by(|a, b| a.host.cmp(&b.host));
    status.state_bytes = partitions.values().map(|p| p.state_bytes).sum();
    status.partitions = partitions.into_values().collect();
    if hits + misses > 0 {
        status.cache_hit_rate = Some(hits as f64 / (hits + misses) as f64);
    }
    status
}

/// The pipeline's state from its hosts' `fresh` reports: stopped once none is left of a
/// stopped one; failed if one failed; running once one of its current run runs.
fn pipeline_state(record: &PipelineRecord, fresh: &[(&HostStatus, u64)]) -> PipelineState {
    let current_running = fresh
        .iter()
        .any(|(r, _)| r.run_generation == record.run_generation && r.phase == HostPhase::Running);
    match record.desired {
        DesiredState::Stopped if fresh.is_empty() => PipelineState::Stopped,
        DesiredState::Stopped => PipelineState::Stopping,
        DesiredState::Running if fresh.iter().any(|(r, _)| r.phase == HostPhase::Failed) => {
            PipelineState::Failed
        }
        DesiredState::Running if current_running => PipelineState::Running,
        DesiredState::Running => PipelineState::Starting,
    }
}

impl PipelineStatus {
    /// Adds a host's fresh `report` (`age` ms old): its summary, its counts and rates, its
    /// newest checkpoint if newer than the one held.
    fn add(&mut self, report: &HostStatus, age: u64) {
        self.hosts.push(HostSummary {
            host: report.host.clone(),
            phase: report.phase,
            reason: report.reason.clone(),
            reason_kind: report.reason_kind,
            // (Each number once: a pipeline of stages runs partition `p` of each stage.)
            partitions: report
                .partitions
                .iter()
                .map(|p| p.partition)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
            records_per_s: report.records_per_s,
            report_age_ms: age,
        });
        self.records_per_s += report.records_per_s;
        self.records_done += report.records_done;
        self.dead_lettered += report.dead_lettered;
        self.skipped_failed += report.skipped_failed;
        self.emitted += report.emitted;
        if let Some(newest) = report.recent_checkpoints.last()
            && self
                .last_checkpoint
                .as_ref()
                .is_none_or(|c| c.committed_ms < newest.committed_ms)
        {
            self.last_checkpoint = Some(newest.clone());
        }
    }
}
