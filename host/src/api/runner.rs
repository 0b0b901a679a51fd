//! Runs the tenants' pipelines on this `weir serve` host: a reconcile loop (as a Kubernetes
//! controller) that reads every pipeline definition from the catalog each
//! `reconcile_interval`, starts what should run here and is not running, stops (drains) what
//! should not, restarts what changed (a start, an operator switch) or failed (with backoff),
//! forwards checkpoint requests, and writes this host's report on each pipeline
//! ([`HostStatus`]) for `GET /v1/pipelines/{name}`.
//!
//! Every host with a `[pipelines]` section runs every running pipeline: each run is a member
//! of the pipeline's consumer group, so Kafka divides the partitions among the hosts, and a
//! host that stops hands its partitions to the others (after its last checkpoint). Each run
//! has its own operator runtime (limits from the definition), its own state caches and its
//! own Kafka clients, so one tenant's pipeline cannot read or evict another's.

use super::catalog::Catalog;
use super::pipelines::{HostPhase, HostStatus, PipelineRecord, kafka_topic};
use super::problem::ApiError;
use super::{now_ms, sha256_hex};
use crate::clock::{SharedClock, SystemClock};
use crate::config::{
    KafkaSettings, LsmStateSettings, PipelineSettings, RuntimeSettings, Settings, StateBackendKind,
    StateSettings,
};
use crate::pipeline::{self, PipelineControl, PipelineStats};
use crate::runtime::{Operator, Runtime};
use crate::state::hooked_store::{HookedStore, Metering};
use crate::state::lsm::backend::LsmBackend;
use crate::state::lsm::cache::{BlockCaches, CacheSettings};
use crate::state::lsm::shard::LsmShard;
use crate::state::lsm::tree::LsmSettings;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

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
    /// Extra librdkafka properties for the consumers (security settings, …).
    #[serde(default)]
    pub consumer: BTreeMap<String, String>,
    /// Extra librdkafka properties for the producers.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
    /// How often definitions are read and reports written; default 2 s.
    #[serde(default = "default_reconcile_interval", with = "humantime_serde")]
    pub reconcile_interval: Duration,
    /// Where operator components (`operators/`), their compiled forms (`compiled/`, so that a
    /// restarted host does not compile them again) and the state disk caches (`cache/`) are
    /// kept; default a directory under the system temporary directory.
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

/// Why a run could not start or failed.
type RunResult = Result<(), String>;

/// One pipeline as this host runs it.
struct Run {
    tenant: String,
    /// The definition being run.
    record: PipelineRecord,
    stats: Arc<PipelineStats>,
    caches: Option<Arc<BlockCaches>>,
    checkpoints: watch::Sender<u64>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<RunResult>>,
    /// Set by the task once the operator is fetched and the topics checked.
    started: Arc<AtomicBool>,
    phase: HostPhase,
    reason: Option<String>,
    restarts: u64,
    retry_at: Option<Instant>,
    backoff: Duration,
    /// When the run was started.
    launched: Instant,
    /// Records done at the previous report, and when.
    sample: (Instant, u64),
    records_per_s: f64,
}

impl Run {
    fn stopping(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if self.task.is_some() {
            self.phase = HostPhase::Stopping;
        }
    }

    fn report(&mut self, host: &str, stale_after: Duration) -> HostStatus {
        let stats = &self.stats;
        let done = stats.records_done();
        let elapsed = self.sample.0.elapsed().as_secs_f64();
        if elapsed > 0.0 {
            self.records_per_s = done.saturating_sub(self.sample.1) as f64 / elapsed;
        }
        self.sample = (Instant::now(), done);
        let cache = self.caches.as_ref().map(|c| c.stats()).unwrap_or_default();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        HostStatus {
            host: host.to_owned(),
            uid: self.record.uid.clone(),
            run_generation: self.record.run_generation,
            phase: self.phase,
            reason: self.reason.clone(),
            updated_ms: now_ms(),
            stale_after_ms: stale_after.as_millis() as u64,
            restarts: self.restarts,
            records_done: done,
            records_per_s: self.records_per_s,
            dead_lettered: load(&stats.dead_lettered),
            skipped_failed: load(&stats.records_skipped_failed),
            emitted: load(&stats.emitted),
            checkpoints: load(&stats.checkpoints),
            cache_hits: cache.memory_hits + cache.disk_hits,
            cache_misses: cache.block_gets,
            partitions: stats
                .partitions
                .lock()
                .expect("progress lock")
                .values()
                .cloned()
                .collect(),
            recent_checkpoints: stats
                .checkpoint_history
                .lock()
                .expect("history lock")
                .iter()
                .cloned()
                .collect(),
        }
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
    runs: HashMap<(String, String), Run>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("host", &self.host)
            .field("runs", &self.runs.len())
            .finish_non_exhaustive()
    }
}

/// The error and its sources, `: `-separated.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
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
        // Runs register their series when they start: the recorder must exist by then.
        crate::telemetry::prometheus();
        Ok(Self {
            catalog,
            config,
            host,
            runtime,
            compiled: CompiledOperators::with_compiled_dir(work_dir.join("compiled")),
            work_dir,
            clock: Arc::new(SystemClock),
            runs: HashMap::new(),
        })
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
                _ = ticks.tick() => self.reconcile().await,
            }
        }
        self.stop_all().await;
    }

    /// Age after which this host's reports no longer count: five reconcile intervals, at
    /// least [`HOST_STATUS_STALE`](super::pipelines::HOST_STATUS_STALE).
    fn stale_after(&self) -> Duration {
        (self.config.reconcile_interval * 5).max(super::pipelines::HOST_STATUS_STALE)
    }

    /// One pass: definitions read, runs started, stopped or restarted, reports written.
    pub async fn reconcile(&mut self) {
        match self.catalog.all_pipelines().await {
            Ok(records) => self.apply(records),
            // Runs go on as they are; the store is the only way to change them anyway.
            Err(err) => tracing::warn!(error = %err, "cannot read pipeline definitions"),
        }
        self.report().await;
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

    fn reconcile_one(&mut self, key: &(String, String), definition: Option<PipelineRecord>) {
        let want = definition
            .clone()
            .filter(|d| d.desired == super::pipelines::DesiredState::Running);
        let Some(run) = self.runs.get_mut(key) else {
            if let Some(record) = want {
                let run = self.launch(&key.0, record, 0);
                self.runs.insert(key.clone(), run);
            }
            return;
        };
        // A run that ended.
        if run.task.as_ref().is_some_and(JoinHandle::is_finished) {
            let task = run.task.take().expect("checked");
            let result = futures::FutureExt::now_or_never(task)
                .expect("finished")
                .unwrap_or_else(|panic| Err(format!("the run panicked: {panic}")));
            run.stop = None;
            match result {
                Ok(()) => {
                    run.phase = HostPhase::Stopped;
                    run.reason = None;
                }
                Err(reason) => {
                    let reason = one_line(&reason);
                    if run.launched.elapsed() >= BACKOFF_RESET_AFTER {
                        // It ran well for a long time: this is a new failure, not a loop.
                        run.backoff = RESTART_BACKOFF_MIN;
                    }
                    tracing::warn!(tenant = %key.0, pipeline = %key.1, %reason, retry_in = ?run.backoff, "pipeline run failed");
                    run.phase = HostPhase::Failed;
                    run.reason = Some(reason);
                    run.retry_at = Some(Instant::now() + run.backoff);
                    run.backoff = (run.backoff * 2).min(RESTART_BACKOFF_MAX);
                }
            }
        }
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
                if record.checkpoint_requests > run.record.checkpoint_requests {
                    run.checkpoints.send_replace(record.checkpoint_requests);
                }
                run.record = record;
                if matches!(run.phase, HostPhase::Starting | HostPhase::Failed)
                    && run.started.load(Ordering::Relaxed)
                {
                    run.phase = HostPhase::Running;
                    run.reason = None;
                }
            }
            return;
        }
        // Not running: start the wanted definition now, or after a failure's backoff.
        let due = restart
            || run.phase != HostPhase::Failed
            || run.retry_at.is_none_or(|at| Instant::now() >= at);
        if due {
            let restarts = if restart {
                0
            } else {
                run.restarts + u64::from(run.phase == HostPhase::Failed)
            };
            let backoff = if restart {
                RESTART_BACKOFF_MIN
            } else {
                run.backoff
            };
            let reason = if restart { None } else { run.reason.clone() };
            let mut next = self.launch(&key.0, record, restarts);
            next.backoff = backoff;
            if reason.is_some() {
                // Retrying: still failed (with the reason) until the new run gets going.
                next.phase = HostPhase::Failed;
                next.reason = reason;
            }
            self.runs.insert(key.clone(), next);
        }
    }

    /// Starts running `record` of `tenant` here.
    fn launch(&self, tenant: &str, record: PipelineRecord, restarts: u64) -> Run {
        tracing::info!(%tenant, pipeline = %record.name, uid = %record.uid, generation = record.run_generation, version = record.spec.operator_version, "starting pipeline run");
        let stats = Arc::new(PipelineStats::labelled(tenant, &record.name));
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
                    stats: stats.clone(),
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
                let reason = format!("cannot create the state disk cache: {err}");
                (None, tokio::spawn(async move { Err(reason) }))
            }
        };
        Run {
            tenant: tenant.to_owned(),
            record,
            stats,
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
            launched: Instant::now(),
            sample: (Instant::now(), 0),
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
                tracing::warn!(tenant = %key.0, pipeline = %key.1, error = %err, "cannot write the pipeline report");
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
                    Ok(Err(reason)) => {
                        tracing::warn!(tenant = %key.0, pipeline = %key.1, %reason, "pipeline run failed while stopping")
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
                tracing::warn!(tenant = %key.0, pipeline = %key.1, error = %err, "cannot write the last pipeline report");
            }
        }
        tracing::info!(host = %self.host, "every pipeline run stopped");
    }
}

/// The operators this host compiled, by tenant, component SHA-256 and limits, with the runtime
/// (engine and its pool of instances) of each tenant and set of limits: a component is
/// compiled once per host, tenant and limits, however many runs (restarts, switches back,
/// pipelines sharing it) use it. Tenants never share an engine, so one tenant cannot take
/// another's pooled instances.
#[derive(Clone)]
pub struct CompiledOperators {
    runtimes: moka::future::Cache<(String, String), Arc<Runtime<LsmShard>>>,
    operators: moka::future::Cache<(String, String, String), Arc<Operator<LsmShard>>>,
    compiled_dir: Option<PathBuf>,
}

impl std::fmt::Debug for CompiledOperators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledOperators")
            .field("operators", &self.operators.entry_count())
            .finish_non_exhaustive()
    }
}

impl Default for CompiledOperators {
    fn default() -> Self {
        Self::new()
    }
}

impl CompiledOperators {
    /// An empty cache: at most 64 runtimes and 256 operators.
    pub fn new() -> Self {
        Self {
            runtimes: moka::future::Cache::builder().max_capacity(64).build(),
            operators: moka::future::Cache::builder().max_capacity(256).build(),
            compiled_dir: None,
        }
    }

    /// The same, keeping compiled components in `dir` as well, so that a restarted host does
    /// not compile them again (see [`Runtime::with_compiled_dir`]).
    pub fn with_compiled_dir(dir: PathBuf) -> Self {
        Self {
            compiled_dir: Some(dir),
            ..Self::new()
        }
    }

    /// `tenant`'s operator of component `sha256` (the file at `path`) compiled with
    /// `runtime`'s limits: from the cache, or compiled now (once, however many ask at the same
    /// time).
    ///
    /// # Errors
    /// Why the runtime cannot be configured or the component cannot be loaded.
    pub async fn operator(
        &self,
        tenant: &str,
        sha256: &str,
        path: &std::path::Path,
        runtime: &RuntimeSettings,
        clock: SharedClock,
    ) -> Result<Arc<Operator<LsmShard>>, String> {
        // Every field of the limits matters to the engine or the instances: all of them key.
        let limits = format!("{runtime:?}");
        let engine = self
            .runtimes
            .try_get_with((tenant.to_owned(), limits.clone()), async {
                let runtime = Runtime::new(runtime, clock)?;
                Ok::<_, crate::runtime::RuntimeError>(Arc::new(match &self.compiled_dir {
                    Some(dir) => runtime.with_compiled_dir(dir.clone()),
                    None => runtime,
                }))
            })
            .await
            .map_err(|e| {
                format!(
                    "cannot configure the operator runtime: {}",
                    error_chain(&*e)
                )
            })?;
        self.operators
            .try_get_with((tenant.to_owned(), sha256.to_owned(), limits), async {
                let operator = engine.load_operator(path).await.map(Arc::new);
                if let Ok(operator) = &operator {
                    if operator.from_compiled_dir() {
                        tracing::info!(%sha256, "operator loaded compiled");
                    } else {
                        tracing::info!(%sha256, "operator compiled");
                    }
                }
                operator
            })
            .await
            .map_err(|e| format!("cannot load the operator: {}", error_chain(&*e)))
    }
}

/// What a run's task needs.
struct RunJob {
    catalog: Catalog,
    config: RunnerConfig,
    runtime: RuntimeSettings,
    work_dir: PathBuf,
    clock: SharedClock,
    compiled: CompiledOperators,
    tenant: String,
    record: PipelineRecord,
    caches: Arc<BlockCaches>,
    stats: Arc<PipelineStats>,
    started: Arc<AtomicBool>,
}

impl RunJob {
    async fn run(
        self,
        control: PipelineControl,
        stop: impl std::future::Future<Output = ()>,
    ) -> RunResult {
        let (path, sha256) = self.operator_file().await?;
        let settings = self.settings(path.clone())?;
        check_topics(&settings, &self.tenant).await?;
        let operator = self
            .compiled
            .operator(
                &self.tenant,
                &sha256,
                &path,
                &settings.runtime,
                self.clock.clone(),
            )
            .await?;
        // Every request of the run's state is counted under its labels.
        let store: Arc<dyn object_store::ObjectStore> = Arc::new(HookedStore::new(
            self.catalog.store().clone(),
            Arc::new(Metering::new(&self.stats.metrics)),
        ));
        let backend = Arc::new(LsmBackend::new(
            store,
            self.catalog
                .pipeline_state_prefix(&self.tenant, &self.record.uid),
            self.caches.clone(),
            LsmSettings {
                memtable_bytes_max: self.config.memtable_bytes_max,
                ..LsmSettings::default()
            },
            self.clock.clone(),
        ));
        self.started.store(true, Ordering::Relaxed);
        pipeline::run_operator(settings, backend, operator, self.stats, control, stop)
            .await
            .map_err(|err| error_chain(&err))
    }

    /// The operator's component in the work directory, fetched from the catalog and checked
    /// against its SHA-256 the first time.
    async fn operator_file(&self) -> Result<(PathBuf, String), String> {
        let spec = &self.record.spec;
        let version = self
            .catalog
            .version(&self.tenant, &spec.operator, spec.operator_version)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "operator `{}` has no version {}",
                    spec.operator, spec.operator_version
                )
            })?;
        let path = self
            .work_dir
            .join("operators")
            .join(format!("{}.wasm", version.sha256));
        if path.exists() {
            return Ok((path, version.sha256));
        }
        let bytes = self
            .catalog
            .blob(&self.tenant, &version.sha256)
            .await
            .map_err(|e: ApiError| e.to_string())?;
        if sha256_hex(&bytes) != version.sha256 {
            return Err(format!(
                "the stored component of operator `{}` version {} does not match its SHA-256",
                spec.operator, spec.operator_version
            ));
        }
        // A name of its own per write: two runs of this host may fetch the same component.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let partial = path.with_extension(format!(
            "partial-{}-{}",
            std::process::id(),
            WRITES.fetch_add(1, Ordering::Relaxed)
        ));
        tokio::fs::write(&partial, &bytes)
            .await
            .and(tokio::fs::rename(&partial, &path).await)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok((path, version.sha256))
    }

    /// The settings of `pipeline::run` for this definition.
    fn settings(&self, operator: PathBuf) -> Result<Settings, String> {
        let (tenant, record, spec) = (&self.tenant, &self.record, &self.record.spec);
        Ok(Settings {
            pipeline: PipelineSettings {
                // Tenant ids hold no `.`: no two tenants' pipelines share a name.
                name: format!("{tenant}.{}", record.name),
                operator,
                input_topics: spec
                    .input_topics
                    .iter()
                    .map(|t| kafka_topic(tenant, t))
                    .collect(),
                output_topic: kafka_topic(tenant, &spec.output_topic),
                dead_letter_topic: kafka_topic(tenant, &spec.dead_letter_topic),
                group_id: Some(format!("weir.{tenant}.{}.{}", record.name, record.uid)),
                checkpoint_interval: Duration::from_millis(spec.checkpoint_interval_ms),
                delivery: spec.delivery,
                in_flight_max: spec.in_flight_max as usize,
                failure_policy: spec.failure_policy,
            },
            kafka: KafkaSettings {
                bootstrap_servers: self.config.bootstrap_servers.clone(),
                consumer: self.config.consumer.clone(),
                producer: self.config.producer.clone(),
            },
            runtime: spec.limits.apply(&self.runtime)?,
            state: StateSettings {
                backend: StateBackendKind::Lsm,
                lsm: LsmStateSettings::default(),
                memory: Default::default(),
            },
        })
    }
}

/// Fails, naming it, when one of the pipeline's topics does not exist in the cluster, or
/// when its input topics (co-partitioned: partition `p` of each is shard `p`) do not all have
/// the same number of partitions.
async fn check_topics(settings: &Settings, tenant: &str) -> RunResult {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &settings.kafka.bootstrap_servers);
    for (k, v) in &settings.kafka.consumer {
        config.set(k, v);
    }
    let p = &settings.pipeline;
    let inputs = p.input_topics.clone();
    let mut topics = inputs.clone();
    topics.push(p.output_topic.clone());
    topics.push(p.dead_letter_topic.clone());
    let prefix = format!("{tenant}.");
    tokio::task::spawn_blocking(move || {
        let name = |topic: &str| topic.strip_prefix(&prefix).unwrap_or(topic).to_owned();
        let consumer: BaseConsumer = config
            .create()
            .map_err(|e| format!("cannot create a Kafka client: {e}"))?;
        let mut input_partitions = Vec::new();
        for topic in topics {
            let metadata = consumer
                .fetch_metadata(Some(&topic), METADATA_TIMEOUT)
                .map_err(|e| {
                    format!("cannot read the metadata of topic `{}`: {e}", name(&topic))
                })?;
            let partitions = metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none())
                .map_or(0, |t| t.partitions().len());
            if partitions == 0 {
                return Err(format!(
                    "topic `{}` (Kafka topic `{topic}`) does not exist; create it first",
                    name(&topic)
                ));
            }
            if inputs.contains(&topic) {
                input_partitions.push((name(&topic), partitions));
            }
        }
        if input_partitions
            .iter()
            .any(|(_, n)| *n != input_partitions[0].1)
        {
            let each: Vec<String> = input_partitions
                .iter()
                .map(|(topic, n)| format!("`{topic}` has {n}"))
                .collect();
            return Err(format!(
                "the input topics are co-partitioned and must have as many partitions each: {}",
                each.join(", ")
            ));
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| Err(format!("the topic check panicked: {e}")))
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
            ..limits
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
