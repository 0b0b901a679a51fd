//! One pipeline as this host runs it ([`Run`]): its task, its phase and failure, its restarts
//! and their backoff, and the report it writes for the API.

use super::job::{RunFailure, RunResult};
use super::{BACKOFF_RESET_AFTER, RESTART_BACKOFF_MAX, RESTART_BACKOFF_MIN, one_line};
use crate::catalog::pipelines::{HostPhase, HostStatus, PipelineRecord};
use crate::clock::wall_now_ms;
use crate::error::ErrorKind;
use crate::pipeline::{CheckpointRecord, PartitionProgress, PipelineStats};
use crate::state::lsm::cache::BlockCaches;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// One pipeline as this host runs it.
pub(super) struct Run {
    pub(super) tenant: String,
    /// The definition being run.
    pub(super) record: PipelineRecord,
    pub(super) stats: Arc<PipelineStats>,
    /// A pipeline of stages: each stage's stats (none for one operator).
    pub(super) stage_stats: Vec<(String, Arc<PipelineStats>)>,
    pub(super) caches: Option<Arc<BlockCaches>>,
    pub(super) checkpoints: watch::Sender<u64>,
    pub(super) stop: Option<oneshot::Sender<()>>,
    pub(super) task: Option<JoinHandle<RunResult>>,
    /// Set by the task once the operator is fetched and the topics checked.
    pub(super) started: Arc<AtomicBool>,
    pub(super) phase: HostPhase,
    /// Why it failed (its reason cut to one line), while it is failed.
    pub(super) reason: Option<RunFailure>,
    pub(super) restarts: u64,
    pub(super) retry_at: Option<Instant>,
    pub(super) backoff: Duration,
    /// When the run was started.
    pub(super) launched: Instant,
    /// Records done at the previous report, and when.
    pub(super) sample: (Instant, u64),
    pub(super) records_per_s: f64,
}

/// How a run starts again: its count of restarts, its next backoff, and the reason it failed
/// (shown until the new run gets going).
pub(super) struct Relaunch {
    pub(super) restarts: u64,
    pub(super) backoff: Duration,
    pub(super) reason: Option<RunFailure>,
}

impl Run {
    /// Takes the result of a run that ended (of `key`, for the log): stopped, or failed with
    /// its reason and the next retry after a backoff that doubles (reset after a long run).
    pub(super) fn collect_ended(&mut self, key: &(String, String)) {
        let Some(mut task) = self.task.take_if(|task| task.is_finished()) else {
            return;
        };
        // Finished, yet its result may not be ready to take when the reconcile's cooperative
        // budget is spent: then it is looked at again at the next reconcile.
        let Some(joined) = futures::FutureExt::now_or_never(&mut task) else {
            self.task = Some(task);
            return;
        };
        let result = joined.unwrap_or_else(|panic| {
            Err(RunFailure::new(
                ErrorKind::Internal,
                format!("the run panicked: {panic}"),
            ))
        });
        self.stop = None;
        match result {
            Ok(()) => {
                self.phase = HostPhase::Stopped;
                self.reason = None;
            }
            Err(failure) => {
                let reason = one_line(&failure.reason);
                if self.launched.elapsed() >= BACKOFF_RESET_AFTER {
                    // It ran well for a long time: this is a new failure, not a loop.
                    self.backoff = RESTART_BACKOFF_MIN;
                }
                tracing::warn!(tenant = %key.0, pipeline = %key.1, kind = ?failure.kind, %reason, retry_in = ?self.backoff, "pipeline run failed");
                self.phase = HostPhase::Failed;
                self.reason = Some(RunFailure::new(failure.kind, reason));
                self.retry_at = Some(crate::clock::monotonic_now() + self.backoff);
                self.backoff = (self.backoff * 2).min(RESTART_BACKOFF_MAX);
            }
        }
    }

    /// A running run's definition changed in what needs no restart: its checkpoint requests
    /// are passed on; once it got going, it is running.
    pub(super) fn follow(&mut self, record: PipelineRecord) {
        if record.checkpoint_requests > self.record.checkpoint_requests {
            self.checkpoints.send_replace(record.checkpoint_requests);
        }
        self.record = record;
        if matches!(self.phase, HostPhase::Starting | HostPhase::Failed)
            && self.started.load(Ordering::Relaxed)
        {
            self.phase = HostPhase::Running;
            self.reason = None;
        }
    }

    /// Whether this run, not running, starts again now (a `restart` of a changed definition
    /// always; after a failure, once its backoff passed), and how.
    pub(super) fn relaunch(&self, restart: bool) -> Option<Relaunch> {
        if restart {
            return Some(Relaunch {
                restarts: 0,
                backoff: RESTART_BACKOFF_MIN,
                reason: None,
            });
        }
        let failed = self.phase == HostPhase::Failed;
        let due = !failed
            || self
                .retry_at
                .is_none_or(|at| crate::clock::monotonic_now() >= at);
        due.then(|| Relaunch {
            restarts: self.restarts + u64::from(failed),
            backoff: self.backoff,
            reason: self.reason.clone(),
        })
    }

    pub(super) fn stopping(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if self.task.is_some() {
            self.phase = HostPhase::Stopping;
        }
    }

    /// Its stats, each with its stage: the run's, or each stage's of a pipeline of stages.
    fn stats_by_stage(&self) -> Vec<(Option<&str>, &PipelineStats)> {
        if self.stage_stats.is_empty() {
            vec![(None, &*self.stats)]
        } else {
            self.stage_stats
                .iter()
                .map(|(stage, stats)| (Some(stage.as_str()), &**stats))
                .collect()
        }
    }

    /// This host's report: its phase, its counts (over every stage of a pipeline of stages),
    /// each partition's progress and its recent checkpoints (each naming its stage).
    pub(super) fn report(&mut self, host: &str, stale_after: Duration) -> HostStatus {
        let by_stage = self.stats_by_stage();
        let load = |c: fn(&PipelineStats) -> &std::sync::atomic::AtomicU64| -> u64 {
            by_stage
                .iter()
                .map(|(_, s)| c(s).load(Ordering::Relaxed))
                .sum()
        };
        let done: u64 = by_stage.iter().map(|(_, s)| s.records_done()).sum();
        let (dead_lettered, skipped_failed, emitted, checkpoints) = (
            load(|s| &s.dead_lettered),
            load(|s| &s.records_skipped_failed),
            load(|s| &s.emitted),
            load(|s| &s.checkpoints),
        );
        let mut partitions = Vec::new();
        let mut recent_checkpoints = Vec::new();
        for (stage, stats) in &by_stage {
            let stage = stage.map(str::to_owned);
            let progress = stats.partitions.lock().expect("progress lock");
            partitions.extend(progress.values().map(|p| PartitionProgress {
                stage: stage.clone(),
                ..p.clone()
            }));
            let history = stats.checkpoint_history.lock().expect("history lock");
            recent_checkpoints.extend(history.iter().map(|c| CheckpointRecord {
                stage: stage.clone(),
                ..c.clone()
            }));
        }
        recent_checkpoints.sort_by_key(|c| c.committed_ms);
        drop(by_stage);
        let elapsed = self.sample.0.elapsed().as_secs_f64();
        if elapsed > 0.0 {
            self.records_per_s = done.saturating_sub(self.sample.1) as f64 / elapsed;
        }
        self.sample = (crate::clock::monotonic_now(), done);
        let cache = self.caches.as_ref().map(|c| c.stats()).unwrap_or_default();
        HostStatus {
            host: host.to_owned(),
            uid: self.record.uid.clone(),
            run_generation: self.record.run_generation,
            phase: self.phase,
            reason: self.reason.as_ref().map(|f| f.reason.clone()),
            reason_kind: self.reason.as_ref().map(|f| f.kind),
            updated_ms: wall_now_ms(),
            stale_after_ms: stale_after.as_millis() as u64,
            restarts: self.restarts,
            records_done: done,
            records_per_s: self.records_per_s,
            dead_lettered,
            skipped_failed,
            emitted,
            checkpoints,
            cache_hits: cache.memory_hits + cache.disk_hits,
            cache_misses: cache.block_gets,
            partitions,
            recent_checkpoints,
        }
    }
}
