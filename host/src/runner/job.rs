//! One run of a pipeline on this host (what its task does), the operators compiled for runs,
//! and why a run failed, by kind.

use super::RunnerConfig;
use super::topics::{check_stage_topics, check_topics};
use crate::catalog::Catalog;
use crate::catalog::logs::SegmentWriter;
use crate::catalog::pipelines::{PipelineRecord, kafka_topic};
use crate::catalog::sha256_hex;
use crate::clock::SharedClock;
use crate::config::stages::StagePlan;
use crate::config::{
    LsmStateSettings, PipelineSettings, PipelineTable, RuntimeSettings, Settings, StateSettings,
};
use crate::error::{Chain, ErrorKind};
use crate::pipeline::{PipelineControl, PipelineStats};
use crate::runtime::{Operator, Runtime};
use crate::sink::iceberg::{LakehouseError, TableTarget};
use crate::state::configured::{ConfiguredBackend, ConfiguredShard};
use crate::state::hooked_store::{HookedStore, Metering};
use crate::state::lsm::backend::LsmBackend;
use crate::state::lsm::cache::BlockCaches;
use crate::state::lsm::tree::LsmSettings;
use crate::state::memory::MemoryBackend;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Why a run could not start or failed: what kind of failure (what to do about it) and the
/// reason, one line for the pipeline's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFailure {
    /// What to do about it.
    pub kind: ErrorKind,
    /// What happened.
    pub reason: String,
}

impl RunFailure {
    /// A failure of `kind` for `reason`.
    pub fn new(kind: ErrorKind, reason: impl Into<String>) -> Self {
        Self {
            kind,
            reason: reason.into(),
        }
    }

    /// `context`, then `err` and its sources.
    fn of(kind: ErrorKind, context: &str, err: &(dyn std::error::Error + 'static)) -> Self {
        Self::new(kind, format!("{context}: {}", Chain(err)))
    }
}

/// A run's failure to read its operator from the catalog: of the error's kind; a store that
/// failed reads as storage being unavailable, as the API says it.
fn catalog_failure(err: crate::catalog::CatalogError) -> RunFailure {
    match err.kind() {
        ErrorKind::Unavailable => RunFailure::new(
            ErrorKind::Unavailable,
            format!("storage unavailable: {}", Chain(&err)),
        ),
        kind => RunFailure::new(kind, Chain(&err).to_string()),
    }
}

/// How a run ended.
pub(super) type RunResult = Result<(), RunFailure>;

/// The operators this host compiled, by tenant, component SHA-256 and limits, with the runtime
/// (engine and its pool of instances) of each tenant and set of limits: a component is
/// compiled once per host, tenant and limits, however many runs (restarts, switches back,
/// pipelines sharing it) use it. Tenants never share an engine, so one tenant cannot take
/// another's pooled instances.
#[derive(Clone)]
pub struct CompiledOperators {
    runtimes: moka::future::Cache<(String, String), Arc<Runtime<ConfiguredShard>>>,
    operators: moka::future::Cache<(String, String, String), Arc<Operator<ConfiguredShard>>>,
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
    ) -> Result<Arc<Operator<ConfiguredShard>>, RunFailure> {
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
            .map_err(|e| RunFailure::of(e.kind(), "cannot configure the operator runtime", &*e))?;
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
            .map_err(|e| RunFailure::of(e.kind(), "cannot load the operator", &*e))
    }
}

/// What a run's task needs.
pub(super) struct RunJob {
    pub catalog: Catalog,
    pub config: RunnerConfig,
    pub runtime: RuntimeSettings,
    pub work_dir: PathBuf,
    pub clock: SharedClock,
    pub compiled: CompiledOperators,
    pub tenant: String,
    pub record: PipelineRecord,
    pub caches: Arc<BlockCaches>,
    /// The service's `pipeline_state_bytes_max`: a `memory` pipeline's default quota.
    pub state_bytes_cap: u64,
    pub stats: Arc<PipelineStats>,
    /// A pipeline of stages: each stage's stats, by stage name (none for one operator).
    pub stage_stats: Vec<(String, Arc<PipelineStats>)>,
    /// Set once the operator is fetched and the topics checked.
    pub started: Arc<AtomicBool>,
}

impl RunJob {
    /// Fetches the operator, checks the topics and runs the pipeline until `stop`.
    pub async fn run(
        self,
        control: PipelineControl,
        stop: impl std::future::Future<Output = ()>,
    ) -> RunResult {
        if self.record.spec.is_staged() {
            return self.run_staged(control, stop).await;
        }
        let spec = &self.record.spec;
        let (path, sha256) = self
            .operator_file(&spec.operator, spec.operator_version)
            .await?;
        let settings = self.settings(path.clone())?;
        let partitions = check_topics(&settings, &self.tenant).await?;
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
        let (backend, store, prefix) = self.backend(partitions);
        // The operator's log lines, for the tenant: this host's segments of the pipeline's log.
        let (log, log_task) = self.log_writer();
        let table = match &spec.iceberg {
            Some(table) => Some(self.table_target(table, &settings, &store, &prefix).await?),
            None => None,
        };
        let control = super::RunControl {
            pipeline: PipelineControl {
                log_sink: Some(log),
                ..control
            },
            table,
        };
        self.started.store(true, Ordering::Relaxed);
        let ran = super::run_operator(settings, backend, operator, self.stats, control, stop)
            .await
            .map_err(|err| RunFailure::new(err.kind(), Chain(&err).to_string()));
        log_task.close().await;
        ran
    }

    /// A pipeline of stages (docs/topologies.md): every stage's operator fetched and compiled,
    /// the topics of the tenant's it names checked, then its stages run as `weir run` runs
    /// them ([`super::run_loaded_stages`]: internal topics created, every stage a run of its
    /// own over one backend), until `stop`.
    async fn run_staged(
        self,
        control: PipelineControl,
        stop: impl std::future::Future<Output = ()>,
    ) -> RunResult {
        let spec = &self.record.spec;
        let mut files = Vec::with_capacity(spec.stages.len());
        for stage in &spec.stages {
            files.push(
                self.operator_file(&stage.operator, stage.operator_version)
                    .await?,
            );
        }
        let mut settings = self.settings(PathBuf::new())?;
        let pipeline = &mut settings.pipeline;
        pipeline.name = crate::catalog::pipelines::staged_run_name(
            &self.tenant,
            &self.record.name,
            &self.record.uid,
        );
        pipeline.input_topics = Vec::new();
        pipeline.output_topic = None;
        pipeline.iceberg = None;
        pipeline.parameters = Default::default();
        pipeline.edges.generation = self.record.edge_generation;
        let paths: Vec<PathBuf> = files.iter().map(|(path, _)| path.clone()).collect();
        pipeline.stages = spec.stage_settings(&self.tenant, &paths);
        let mut plan = match settings.stage_plan() {
            Some(Ok(plan)) => plan,
            Some(Err(problems)) => {
                return Err(RunFailure::new(
                    ErrorKind::InvalidInput,
                    problems.join("; "),
                ));
            }
            None => unreachable!("a pipeline of stages has stages"),
        };
        for run in &mut plan.runs {
            run.settings.runtime = spec
                .stage_runtime(&run.stage, &self.runtime)
                .map_err(|e| RunFailure::new(ErrorKind::InvalidInput, e.to_string()))?;
        }
        let shards = check_stage_topics(&plan, &self.tenant).await?;
        let (operators, stats) = self.stage_operators(&plan, &files).await?;
        let (backend, _, _) = self.backend(shards);
        let (log, log_task) = self.log_writer();
        let control = PipelineControl {
            log_sink: Some(log),
            ..control
        };
        self.started.store(true, Ordering::Relaxed);
        let stages = super::LoadedStages {
            plan,
            operators,
            stats,
        };
        let ran = super::run_loaded_stages(&settings.kafka, stages, backend, control, stop)
            .await
            .map_err(|err| RunFailure::new(err.kind(), Chain(&err).to_string()));
        log_task.close().await;
        ran
    }

    /// Each stage's operator compiled (from `files`, the spec's stages' components, as
    /// [`Self::operator_file`] fetched them) and its stats, in `plan`'s order.
    async fn stage_operators(
        &self,
        plan: &StagePlan,
        files: &[(PathBuf, String)],
    ) -> Result<(Vec<Arc<Operator<ConfiguredShard>>>, Vec<Arc<PipelineStats>>), RunFailure> {
        let spec = &self.record.spec;
        let mut operators = Vec::with_capacity(plan.runs.len());
        let mut stats = Vec::with_capacity(plan.runs.len());
        for run in &plan.runs {
            let i = spec
                .stages
                .iter()
                .position(|s| s.name == run.stage)
                .expect("the plan's stages are the spec's");
            let (path, sha256) = &files[i];
            let operator = self
                .compiled
                .operator(
                    &self.tenant,
                    sha256,
                    path,
                    &run.settings.runtime,
                    self.clock.clone(),
                )
                .await
                .map_err(|f| {
                    RunFailure::new(f.kind, format!("stage `{}`: {}", run.stage, f.reason))
                })?;
            operators.push(operator);
            let stage_stats = self
                .stage_stats
                .iter()
                .find(|(name, _)| *name == run.stage)
                .map(|(_, stats)| stats.clone())
                .expect("the runner made stats for every stage");
            stats.push(stage_stats);
        }
        Ok((operators, stats))
    }

    /// The run's state backend over the pipeline's prefix in the catalog's store (every
    /// request counted under the run's labels), with the store and prefix: `memory` with the
    /// pipeline's quota divided over its `shards`, or `lsm`.
    fn backend(
        &self,
        shards: usize,
    ) -> (
        Arc<ConfiguredBackend>,
        Arc<dyn object_store::ObjectStore>,
        object_store::path::Path,
    ) {
        let store: Arc<dyn object_store::ObjectStore> = Arc::new(HookedStore::new(
            self.catalog.store().clone(),
            Arc::new(Metering::new(&self.stats.metrics)),
        ));
        let prefix = self
            .catalog
            .pipeline_state_prefix(&self.tenant, &self.record.uid);
        let spec = &self.record.spec;
        let backend = Arc::new(
            match spec.shard_state_bytes_max(self.state_bytes_cap, shards) {
                // `memory`: each partition holds its share of the pipeline's quota.
                Some(shard_bytes_max) => ConfiguredBackend::Memory(
                    MemoryBackend::durable(store.clone(), prefix.clone(), self.clock.clone())
                        .with_shard_bytes_max(shard_bytes_max),
                ),
                None => ConfiguredBackend::Lsm(Box::new(LsmBackend::new(
                    store.clone(),
                    prefix.clone(),
                    self.caches.clone(),
                    LsmSettings {
                        memtable_bytes_max: self.config.memtable_bytes_max,
                        ..LsmSettings::default()
                    },
                    self.clock.clone(),
                ))),
            },
        );
        (backend, store, prefix)
    }

    /// The writer of this host's segments of the pipeline's operator log, and its task.
    fn log_writer(
        &self,
    ) -> (
        Arc<dyn crate::runtime::guest_log::LogSink>,
        crate::catalog::logs::WriterTask,
    ) {
        let (log, task) = SegmentWriter::spawn(
            self.catalog.store().clone(),
            self.catalog
                .pipeline_logs_prefix(&self.tenant, &self.record.uid),
            &self.config.host_id(),
            self.config.logs.clone(),
        );
        (log, task)
    }

    /// Version `version` of `operator`'s component in the work directory, fetched from the
    /// catalog and checked against its SHA-256 the first time.
    async fn operator_file(
        &self,
        operator: &str,
        version: u64,
    ) -> Result<(PathBuf, String), RunFailure> {
        let (name, number) = (operator, version);
        let version = self
            .catalog
            .version(&self.tenant, name, number)
            .await
            .map_err(catalog_failure)?
            .ok_or_else(|| {
                RunFailure::new(
                    ErrorKind::InvalidInput,
                    format!("operator `{name}` has no version {number}"),
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
            .map_err(catalog_failure)?;
        if sha256_hex(&bytes) != version.sha256 {
            return Err(RunFailure::new(
                ErrorKind::Corrupt,
                format!(
                    "the stored component of operator `{name}` version {number} does not match its SHA-256"
                ),
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
            .map_err(|e| {
                RunFailure::new(
                    ErrorKind::Internal,
                    format!("cannot write {}: {e}", path.display()),
                )
            })?;
        Ok((path, version.sha256))
    }

    /// Where the pipeline's Iceberg table is, and its committer's reads (docs/iceberg.md).
    async fn table_target(
        &self,
        table: &crate::catalog::pipelines::TableSpec,
        settings: &Settings,
        store: &Arc<dyn object_store::ObjectStore>,
        prefix: &object_store::path::Path,
    ) -> Result<TableTarget, RunFailure> {
        let schema = table
            .schema()
            .map_err(|e| RunFailure::new(ErrorKind::InvalidInput, e.to_string()))?;
        TableTarget::open(
            &self.config.iceberg,
            (&self.tenant, &table.table),
            schema,
            &self.record.uid,
            settings,
            (store.clone(), prefix),
            self.clock.clone(),
        )
        .await
        .map_err(|e| {
            let kind = match e {
                LakehouseError::NotConfigured => ErrorKind::InvalidInput,
                _ => ErrorKind::Unavailable,
            };
            RunFailure::new(kind, Chain(&e).to_string())
        })
    }

    /// The settings of `super::run` for this definition.
    fn settings(&self, operator: PathBuf) -> Result<Settings, RunFailure> {
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
                output_topic: spec.output_topic.as_ref().map(|t| kafka_topic(tenant, t)),
                dead_letter_topic: kafka_topic(tenant, &spec.dead_letter_topic),
                group_id: Some(crate::catalog::pipelines::consumer_group(
                    tenant,
                    &record.name,
                    &record.uid,
                )),
                checkpoint_interval: Duration::from_millis(spec.checkpoint_interval_ms),
                delivery: spec.delivery,
                in_flight_max: spec.in_flight_max as usize,
                failure_policy: spec.failure_policy,
                max_out_of_orderness: Duration::from_millis(spec.max_out_of_orderness_ms),
                idle_timeout: spec.idle_timeout_ms.map(Duration::from_millis),
                idle_advance: spec.idle_advance,
                late_records: spec.late_records,
                // Described here too; the run's table is the control's `TableTarget`.
                iceberg: spec.iceberg.as_ref().map(|t| PipelineTable {
                    namespace: tenant.clone(),
                    table: t.table.clone(),
                    columns: t.columns.clone(),
                }),
                stages: Vec::new(),
                edges: Default::default(),
                outputs: Default::default(),
                parameters: spec.parameters.clone(),
                tables: Default::default(),
                global_tables: Default::default(),
            },
            kafka: self.config.kafka(),
            runtime: spec
                .limits
                .apply(&self.runtime)
                .map_err(|e| RunFailure::new(ErrorKind::InvalidInput, e.to_string()))?,
            state: StateSettings {
                backend: spec.state_backend.kind(),
                lsm: LsmStateSettings::default(),
                memory: Default::default(),
            },
            iceberg: self.config.iceberg.clone(),
        })
    }
}
