//! Runs the tenants' pipelines on this `weir serve` host: a reconcile loop (as a Kubernetes
//! controller) that reads every pipeline definition from the catalog each
//! `reconcile_interval` (when they changed: [`Definitions`]), starts what should run here and
//! is not running, stops (drains) what should not, restarts what changed (a start, an operator
//! switch) or failed (with backoff), forwards checkpoint requests, and writes this host's
//! report on each pipeline ([`HostStatus`]) for `GET /v1/pipelines/{name}`.
//!
//! Every host with a `[pipelines]` section runs every running pipeline: each run is a member
//! of the pipeline's consumer group, so Kafka divides the partitions among the hosts, and a
//! host that stops hands its partitions to the others (after its last checkpoint). Each run
//! has its own operator runtime (limits from the definition), its own state caches and its
//! own Kafka clients, so one tenant's pipeline cannot read or evict another's.

use crate::catalog::Catalog;
use crate::catalog::logs;
use crate::catalog::pipelines::{Definitions, HostPhase, PipelineRecord};
use crate::clock::{SharedClock, SystemClock};
use crate::config::RuntimeSettings;
use crate::error::ErrorKind;
use crate::pipeline::{PipelineControl, PipelineStats};
use crate::state::lsm::cache::{BlockCaches, CacheSettings};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

mod job;
mod run;
pub mod stages;
mod topics;
mod wiring;

pub use stages::{LoadedStages, StagesError, run_loaded_stages, run_stages};
pub use wiring::{RunControl, run, run_controlled, run_operator};

use job::RunJob;
pub use job::{CompiledOperators, RunFailure};
use run::{Relaunch, Run};

/// First delay before a failed run is started again; doubles per failure up to
/// [`RESTART_BACKOFF_MAX`] (as Flink's exponential-delay restart strategy).
const RESTART_BACKOFF_MIN: Duration = Duration::from_secs(1);

/// Longest delay between restarts of a failing run.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// A run that fails after running this long starts again after [`RESTART_BACKOFF_MIN`].
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);

/// Longest failure reason reported, bytes.
const REASON_BYTES_MAX: usize = 1000;

/// The first line of `reason` (a wasm backtrace follows a trap's cause), at most
/// [`REASON_BYTES_MAX`] bytes.
fn one_line(reason: &str) -> String {
    let line = reason.lines().next().unwrap_or_default();
    let mut end = line.len().min(REASON_BYTES_MAX);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_owned()
}

/// How long a metadata request for the topics may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The `[pipelines]` section of serve.toml: this host runs pipelines.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerConfig {
    /// This host's name in pipeline reports, unique among the hosts (`[A-Za-z0-9._-]`);
    /// default `$HOSTNAME` (the pod name on Kubernetes), else the kernel's host name. Set it
    /// when several hosts run on one machine.
    #[serde(default)]
    pub host_id: Option<String>,
    /// The Kafka cluster: `host:port[,host:port…]`.
    pub bootstrap_servers: String,
    /// TLS and SASL of every client (`[pipelines.security]`, as `[kafka.security]` of
    /// `weir run`: [`crate::config::KafkaSecurity`]).
    #[serde(default)]
    pub security: crate::config::KafkaSecurity,
    /// Extra librdkafka properties for the consumers, checked when the config loads.
    #[serde(default, deserialize_with = "crate::config::client_properties")]
    pub consumer: BTreeMap<String, String>,
    /// Extra librdkafka properties for the producers, checked as `consumer`'s.
    #[serde(default, deserialize_with = "crate::config::client_properties")]
    pub producer: BTreeMap<String, String>,
    /// How often definitions are read and reports written; default 2 s.
    #[serde(default = "default_reconcile_interval", with = "humantime_serde")]
    pub reconcile_interval: Duration,
    /// Where operator components (`operators/`), their compiled forms (`compiled/`, so that a
    /// restarted host does not compile them again; `[runtime] compiled_dir` instead when set)
    /// and the state disk caches (`cache/`) are kept; default a directory under the system
    /// temporary directory.
    #[serde(default)]
    pub work_dir: Option<PathBuf>,
    /// Memtable size of each shard, bytes; default 64 MiB.
    #[serde(default = "default_memtable_bytes_max")]
    pub memtable_bytes_max: usize,
    /// Memory block cache of each pipeline run, bytes; default 64 MiB.
    #[serde(default = "default_block_cache_bytes")]
    pub block_cache_bytes: u64,
    /// Disk cache of each pipeline run, bytes; default 256 MiB.
    #[serde(default = "default_disk_cache_bytes")]
    pub disk_cache_bytes: u64,
    /// How the operators' log lines are kept for their tenants (`[pipelines.logs]`).
    #[serde(default)]
    pub logs: crate::catalog::logs::OperatorLogSettings,
    /// The Iceberg catalog and warehouse the pipelines' tables go to (`[pipelines.iceberg]`,
    /// docs/iceberg.md); without it a pipeline with an `iceberg` output fails to start.
    #[serde(default)]
    pub iceberg: crate::sink::iceberg::LakehouseSettings,
}

fn default_reconcile_interval() -> Duration {
    Duration::from_secs(2)
}

fn default_memtable_bytes_max() -> usize {
    64 << 20
}

fn default_block_cache_bytes() -> u64 {
    64 << 20
}

fn default_disk_cache_bytes() -> u64 {
    256 << 20
}

impl RunnerConfig {
    /// The Kafka settings every pipeline run here gets.
    pub fn kafka(&self) -> crate::config::KafkaSettings {
        crate::config::KafkaSettings {
            bootstrap_servers: self.bootstrap_servers.clone(),
            security: self.security.clone(),
            consumer: self.consumer.clone(),
            producer: self.producer.clone(),
        }
    }

    /// `host_id`, else `$HOSTNAME`, else the kernel's host name, else `weir-{pid}`. Several
    /// hosts on one machine need a `host_id` each.
    pub fn host_id(&self) -> String {
        self.host_id
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| {
                !h.is_empty()
                    && h.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            })
            .unwrap_or_else(|| format!("weir-{}", std::process::id()))
    }
}

/// The reconcile loop of one host.
pub struct Runner {
    catalog: Catalog,
    config: RunnerConfig,
    host: String,
    runtime: RuntimeSettings,
    work_dir: PathBuf,
    clock: SharedClock,
    compiled: CompiledOperators,
    /// The service's `pipeline_state_bytes_max` ([`Runner::with_pipeline_state_bytes_max`]).
    state_bytes_cap: u64,
    runs: HashMap<(String, String), Run>,
    /// When the last sweep of expired operator log segments started, and its task.
    log_sweep: Option<(Instant, JoinHandle<()>)>,
    /// Wakes a reconcile before the next tick ([`Runner::with_wake`]).
    wake: Arc<tokio::sync::Notify>,
    /// The definitions, read again when they may have changed.
    definitions: Definitions,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("host", &self.host)
            .field("runs", &self.runs.len())
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// A runner over `catalog`, running pipelines with the host's `runtime` limits as
    /// defaults.
    ///
    /// # Errors
    /// When the work directory cannot be created.
    pub fn new(
        catalog: Catalog,
        config: RunnerConfig,
        runtime: RuntimeSettings,
    ) -> std::io::Result<Self> {
        if let Some(id) = &config.host_id
            && (id.is_empty()
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("pipelines.host_id must be [A-Za-z0-9._-]+. host_id=`{id}`"),
            ));
        }
        let host = config.host_id();
        let work_dir = config
            .work_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("weir-serve-{host}")));
        std::fs::create_dir_all(work_dir.join("operators"))?;
        std::fs::create_dir_all(work_dir.join("cache"))?;
        std::fs::create_dir_all(work_dir.join("compiled"))?;
        // `[runtime] compiled_dir` when set, so that the API's check of an upload and the runs
        // share one compile of each component.
        let compiled_dir = runtime
            .compiled_dir
            .clone()
            .unwrap_or_else(|| work_dir.join("compiled"));
        // Runs register their series when they start: the recorder must exist by then.
        crate::telemetry::prometheus();
        Ok(Self {
            catalog,
            config,
            host,
            runtime,
            compiled: CompiledOperators::with_compiled_dir(compiled_dir),
            state_bytes_cap: crate::api::DEFAULT_PIPELINE_STATE_BYTES_MAX,
            work_dir,
            clock: Arc::new(SystemClock),
            runs: HashMap::new(),
            log_sweep: None,
            wake: Arc::new(tokio::sync::Notify::new()),
            definitions: Definitions::default(),
        })
    }

    /// The same, reconciling also whenever `wake` is notified: hand the API's catalog the same
    /// notify ([`Catalog::with_changes`]) and a pipeline changed through this host's API is
    /// acted on at once, not at the next `reconcile_interval` tick.
    #[must_use]
    pub fn with_wake(mut self, wake: Arc<tokio::sync::Notify>) -> Self {
        self.wake = wake;
        self
    }

    /// The same, with `bytes` as the default quota of `memory` pipelines (the service's
    /// `pipeline_state_bytes_max`; default [`crate::api::DEFAULT_PIPELINE_STATE_BYTES_MAX`]).
    pub fn with_pipeline_state_bytes_max(mut self, bytes: u64) -> Self {
        self.state_bytes_cap = bytes;
        self
    }

    /// Reconciles every `reconcile_interval` until `shutdown` completes, then drains every
    /// run (a last checkpoint each) and reports them stopped.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tracing::info!(host = %self.host, work_dir = %self.work_dir.display(), "running pipelines");
        let mut ticks = tokio::time::interval(self.config.reconcile_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = ticks.tick() => self.reconcile_with(false).await,
                () = self.wake.notified() => {
                    self.reconcile_with(true).await;
                    ticks.reset();
                }
            }
        }
        self.stop_all().await;
    }

    /// Age after which this host's reports no longer count: five reconcile intervals, at
    /// least [`HOST_STATUS_STALE`](crate::catalog::pipelines::HOST_STATUS_STALE).
    fn stale_after(&self) -> Duration {
        (self.config.reconcile_interval * 5).max(crate::catalog::pipelines::HOST_STATUS_STALE)
    }

    /// One pass: definitions read (when they changed: [`Definitions`]), runs started, stopped
    /// or restarted, reports written.
    pub async fn reconcile(&mut self) {
        self.reconcile_with(false).await;
    }

    /// One pass, reading the definitions whatever their change marker says when `fresh`.
    async fn reconcile_with(&mut self, fresh: bool) {
        match self.definitions.read(&self.catalog, fresh).await {
            Ok(records) => {
                let records = records.to_vec();
                self.sweep_logs(&records);
                self.apply(records);
            }
            // Runs go on as they are; the store is the only way to change them anyway.
            Err(err) => {
                tracing::warn!(error = %crate::error::Chain(&err), "cannot read pipeline definitions")
            }
        }
        self.report().await;
    }

    /// Every [`logs::SWEEP_INTERVAL`] (the first time at once), deletes the expired operator log
    /// segments of every pipeline, running or stopped, in a task of its own (one at a time).
    fn sweep_logs(&mut self, records: &[(String, PipelineRecord)]) {
        let due = self
            .log_sweep
            .as_ref()
            .is_none_or(|(at, task)| at.elapsed() >= logs::SWEEP_INTERVAL && task.is_finished());
        if !due {
            return;
        }
        let dirs: Vec<_> = records
            .iter()
            .map(|(tenant, record)| self.catalog.pipeline_logs_prefix(tenant, &record.uid))
            .collect();
        let store = self.catalog.store().clone();
        let retention = self.config.logs.retention;
        let task = tokio::spawn(async move {
            for dir in dirs {
                logs::sweep_expired(&*store, &dir, retention).await;
            }
        });
        self.log_sweep = Some((crate::clock::monotonic_now(), task));
    }

    fn apply(&mut self, records: Vec<(String, PipelineRecord)>) {
        let mut wanted: HashMap<(String, String), PipelineRecord> = records
            .into_iter()
            .map(|(tenant, record)| ((tenant, record.name.clone()), record))
            .collect();
        let keys: HashSet<(String, String)> =
            self.runs.keys().chain(wanted.keys()).cloned().collect();
        for key in keys {
            let definition = wanted.remove(&key);
            self.reconcile_one(&key, definition);
        }
    }

    /// Brings the run of `key` (tenant, pipeline) in line with its `definition` (none: the
    /// pipeline was deleted): collects an ended run, stops one that is no longer wanted or
    /// whose definition changed, starts one that is wanted (after a failure's backoff).
    fn reconcile_one(&mut self, key: &(String, String), definition: Option<PipelineRecord>) {
        let want =
            definition.filter(|d| d.desired == crate::catalog::pipelines::DesiredState::Running);
        let Some(run) = self.runs.get_mut(key) else {
            if let Some(record) = want {
                let run = self.launch(&key.0, record, 0);
                self.runs.insert(key.clone(), run);
            }
            return;
        };
        run.collect_ended(key);
        let Some(record) = want else {
            // Stopped or deleted: drain, then forget.
            run.stopping();
            if run.task.is_none() {
                run.phase = HostPhase::Stopped;
                run.reason = None;
            }
            return;
        };
        let restart =
            record.uid != run.record.uid || record.run_generation != run.record.run_generation;
        if run.task.is_some() {
            if restart {
                run.stopping();
            } else {
                run.follow(record);
            }
            return;
        }
        // Not running: start the wanted definition now, or after a failure's backoff.
        let Some(Relaunch {
            restarts,
            backoff,
            reason,
        }) = run.relaunch(restart)
        else {
            return;
        };
        let mut next = self.launch(&key.0, record, restarts);
        next.backoff = backoff;
        if reason.is_some() {
            // Retrying: still failed (with the reason) until the new run gets going.
            next.phase = HostPhase::Failed;
            next.reason = reason;
        }
        self.runs.insert(key.clone(), next);
    }

    /// Starts running `record` of `tenant` here.
    fn launch(&self, tenant: &str, record: PipelineRecord, restarts: u64) -> Run {
        tracing::info!(%tenant, pipeline = %record.name, uid = %record.uid, generation = record.run_generation, version = record.spec.operator_version, "starting pipeline run");
        let stats = Arc::new(PipelineStats::labelled(tenant, &record.name));
        let stage_stats: Vec<(String, Arc<PipelineStats>)> = record
            .spec
            .stages
            .iter()
            .map(|s| {
                let stats = PipelineStats::labelled_stage(tenant, &record.name, &s.name);
                (s.name.clone(), Arc::new(stats))
            })
            .collect();
        let (checkpoints, control) = PipelineControl::new();
        checkpoints.send_replace(record.checkpoint_requests);
        let (stop, stopped) = oneshot::channel::<()>();
        let started = Arc::new(AtomicBool::new(false));
        let caches = BlockCaches::new(&CacheSettings {
            block_cache_bytes: self.config.block_cache_bytes,
            disk_cache_bytes: self.config.disk_cache_bytes,
            disk_cache_dir: Some(self.work_dir.join("cache")),
        })
        .map(|caches| Arc::new(caches.labelled(&stats.metrics)));
        let (caches, task) = match caches {
            Ok(caches) => {
                let job = RunJob {
                    catalog: self.catalog.clone(),
                    config: self.config.clone(),
                    runtime: self.runtime.clone(),
                    work_dir: self.work_dir.clone(),
                    clock: self.clock.clone(),
                    compiled: self.compiled.clone(),
                    tenant: tenant.to_owned(),
                    record: record.clone(),
                    caches: caches.clone(),
                    state_bytes_cap: self.state_bytes_cap,
                    stats: stats.clone(),
                    stage_stats: stage_stats.clone(),
                    started: started.clone(),
                };
                let span = tracing::info_span!("pipeline", %tenant, pipeline = %record.name);
                let task = tokio::spawn(tracing::Instrument::instrument(
                    job.run(control, async {
                        let _ = stopped.await;
                    }),
                    span,
                ));
                (Some(caches), task)
            }
            Err(err) => {
                let failure = RunFailure::new(
                    ErrorKind::Internal,
                    format!("cannot create the state disk cache: {err}"),
                );
                (None, tokio::spawn(async move { Err(failure) }))
            }
        };
        Run {
            tenant: tenant.to_owned(),
            record,
            stats,
            stage_stats,
            caches,
            checkpoints,
            stop: Some(stop),
            task: Some(task),
            started,
            phase: HostPhase::Starting,
            reason: None,
            restarts,
            retry_at: None,
            backoff: RESTART_BACKOFF_MIN,
            launched: crate::clock::monotonic_now(),
            sample: (crate::clock::monotonic_now(), 0),
            records_per_s: 0.0,
        }
    }

    /// Writes this host's report on each of its runs; forgets stopped runs once reported
    /// (and removes the report of a deleted pipeline).
    async fn report(&mut self) {
        let mut done = Vec::new();
        let stale_after = self.stale_after();
        for (key, run) in &mut self.runs {
            let status = run.report(&self.host, stale_after);
            if let Err(err) = self
                .catalog
                .put_host_status(&run.tenant, &key.1, &status)
                .await
            {
                tracing::warn!(tenant = %key.0, pipeline = %key.1, error = %crate::error::Chain(&err), "cannot write the pipeline report");
                continue;
            }
            if run.phase == HostPhase::Stopped && run.task.is_none() {
                done.push(key.clone());
            }
        }
        for key in done {
            self.runs.remove(&key);
            // A deleted pipeline's report would be left behind: look whether it still exists.
            if let Ok(None) = self.catalog.pipeline(&key.0, &key.1).await {
                let _ = self
                    .catalog
                    .delete_host_status(&key.0, &key.1, &self.host)
                    .await;
            }
        }
    }

    /// Stops every run, waits for each to drain, and reports them stopped.
    async fn stop_all(&mut self) {
        for run in self.runs.values_mut() {
            run.stopping();
        }
        let stale_after = self.stale_after();
        for (key, run) in &mut self.runs {
            if let Some(task) = run.task.take() {
                match task.await {
                    Ok(Ok(())) => {}
                    Ok(Err(failure)) => {
                        tracing::warn!(tenant = %key.0, pipeline = %key.1, kind = ?failure.kind, reason = %failure.reason, "pipeline run failed while stopping")
                    }
                    Err(err) => {
                        tracing::error!(tenant = %key.0, pipeline = %key.1, error = %err, "pipeline run panicked")
                    }
                }
            }
            run.phase = HostPhase::Stopped;
            let status = run.report(&self.host, stale_after);
            if let Err(err) = self
                .catalog
                .put_host_status(&run.tenant, &key.1, &status)
                .await
            {
                tracing::warn!(tenant = %key.0, pipeline = %key.1, error = %crate::error::Chain(&err), "cannot write the last pipeline report");
            }
        }
        tracing::info!(host = %self.host, "every pipeline run stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_component_is_compiled_once_per_tenant_and_set_of_limits() {
        let path = crate::testing::guest("weir_test_counter");
        let compiled = CompiledOperators::new();
        let clock: SharedClock = Arc::new(SystemClock);
        let limits = RuntimeSettings::default();
        let first = compiled
            .operator("t1", "sha-a", &path, &limits, clock.clone())
            .await
            .expect("compiles");
        let again = compiled
            .operator("t1", "sha-a", &path, &limits, clock.clone())
            .await
            .expect("cached");
        assert!(
            Arc::ptr_eq(&first, &again),
            "the same limits reuse the compiled operator"
        );
        let smaller = RuntimeSettings {
            instance_memory_bytes_max: 32 << 20,
            ..limits.clone()
        };
        let other = compiled
            .operator("t1", "sha-a", &path, &smaller, clock.clone())
            .await
            .expect("compiles");
        assert!(!Arc::ptr_eq(&first, &other), "other limits compile again");
        let other_tenant = compiled
            .operator("t2", "sha-a", &path, &limits, clock)
            .await
            .expect("compiles");
        assert!(
            !Arc::ptr_eq(&first, &other_tenant),
            "tenants never share an engine"
        );
    }
}
