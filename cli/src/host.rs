//! `weir run` and `weir serve`: one pipeline from a config file, or the multi-tenant HTTP API
//! with the pipelines it runs, in this process until SIGINT (or SIGTERM for `serve`).

use anyhow::Context as _;
use std::path::PathBuf;
use std::sync::Arc;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{EnvVars, Settings};
use weir_host::health::{KafkaProbe, PROBE_INTERVAL};
use weir_host::pipeline::{self, PipelineStats};
use weir_host::state::configured::ConfiguredBackend;

/// Runs `weir serve`: the API on `listen`, and the pipeline runner if `[pipelines]` is set,
/// until SIGINT or SIGTERM, then drains the pipelines run here.
///
/// # Errors
/// An unreadable or invalid config, a missing or short `WEIR_ADMIN_KEY`, a store or listener
/// that cannot be opened.
pub async fn serve(config: PathBuf) -> anyhow::Result<()> {
    use weir_host::api;
    let mut signals = StopSignals::listen()?;
    let env = EnvVars::from_process();
    let settings = api::ServeSettings::load(&config, &env)?;
    // Before any store is opened: this host's bound on object-store requests in flight.
    weir_host::state::store_guard::StoreGuard::configure(
        settings.runtime.store_requests_in_flight_max,
    );
    let admin_key = env.get("WEIR_ADMIN_KEY").unwrap_or_default().to_owned();
    anyhow::ensure!(
        admin_key.len() >= api::ADMIN_KEY_BYTES_MIN,
        "set WEIR_ADMIN_KEY to an admin key of at least {} bytes (e.g. `openssl rand -hex 32`)",
        api::ADMIN_KEY_BYTES_MIN
    );
    let (store, prefix) = weir_host::state::lsm::backend::object_store_from_url(
        &settings.store_url,
        &settings.store_options,
    )
    .context("cannot open the catalog store")?;
    // What the API writes wakes this host's runner at once (Catalog::with_changes).
    let wake = Arc::new(tokio::sync::Notify::new());
    let state = api::ApiState::new(
        weir_host::catalog::Catalog::new(store.clone(), prefix.clone()).with_changes(wake.clone()),
        api::ApiSettings {
            operator_bytes_max: settings.operator_bytes_max,
            admin_key_sha256: weir_host::catalog::sha256(admin_key.as_bytes()),
            runtime: settings.runtime.clone(),
            pipelines_per_tenant_max: settings.pipelines_per_tenant_max,
            pipeline_state_bytes_max: settings.pipeline_state_bytes_max,
            status_sample_interval: settings.status_sample_interval,
        },
    )?;
    let state = match &settings.pipelines {
        Some(pipelines) => state.with_kafka_probe(Arc::new(KafkaProbe::spawn(
            &pipelines.kafka(),
            PROBE_INTERVAL,
        ))),
        None => state,
    };
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    // SIGINT or SIGTERM (Kubernetes) stops the API and drains the pipelines run here.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        signals.received().await;
        tracing::info!("shutting down: draining the pipelines run here");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let runner = match &settings.pipelines {
        Some(config) => {
            let runner = weir_host::runner::Runner::new(
                weir_host::catalog::Catalog::new(store.clone(), prefix.clone()),
                config.clone(),
                settings.runtime.clone(),
            )
            .context("cannot set up the pipeline runner")?
            .with_pipeline_state_bytes_max(settings.pipeline_state_bytes_max)
            .with_wake(wake);
            Some(tokio::spawn(runner.run(stopped(stop_rx.clone()))))
        }
        None => None,
    };
    api::serve(listener, state, stopped(stop_rx)).await?;
    if let Some(runner) = runner {
        runner.await.context("the pipeline runner panicked")?;
    }
    Ok(())
}

/// SIGINT (Ctrl-C) and SIGTERM, listened for from its creation on: a signal that comes before
/// [`StopSignals::received`] is first awaited is kept, not lost to the default action (which
/// ended a `weir run` stopped in its first half second with code 143 and no log line).
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Starts listening: from here on the two signals stop the process cleanly.
    fn listen() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
        })
    }

    /// Completes at the first SIGINT or SIGTERM (at once for one received already).
    async fn received(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Serves `weir run`'s admin endpoints on `address` until the returned task is dropped.
async fn admin(address: &str, settings: &Settings) -> anyhow::Result<AbortOnDrop> {
    // The recorder before the pipeline registers its series.
    weir_host::telemetry::prometheus();
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address} (--admin-listen)"))?;
    tracing::info!(
        address,
        "admin endpoints listening: /healthz /readyz /metrics"
    );
    let probe = Arc::new(KafkaProbe::spawn(&settings.kafka, PROBE_INTERVAL));
    let upkeep = weir_host::telemetry::spawn_upkeep();
    Ok(AbortOnDrop(vec![
        upkeep,
        tokio::spawn(async move {
            if let Err(err) = weir_host::health::serve_admin(listener, probe).await {
                tracing::error!(error = %err, "the admin listener failed");
            }
        }),
    ]))
}

/// Aborts its tasks when dropped.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Lists the state's object store once, so that wrong credentials or a missing bucket stop
/// `weir run` at start with the store's own answer (`SignatureDoesNotMatch`,
/// `InvalidAccessKeyId`, `NoSuchBucket`) rather than fail every shard's opening later.
async fn check_state_store(settings: &Settings) -> anyhow::Result<()> {
    use object_store::ObjectStore as _;
    let Some((store, prefix, url)) = state_store(settings)? else {
        return Ok(());
    };
    store
        .list_with_delimiter(Some(&prefix))
        .await
        .with_context(|| format!("cannot read the state store {url}"))?;
    Ok(())
}

/// An object store, the prefix under it and its URL.
type StoreAt<'a> = (
    Arc<dyn object_store::ObjectStore>,
    object_store::path::Path,
    &'a str,
);

/// The state backend's object store, the prefix under it and its URL, if it has one.
fn state_store(settings: &Settings) -> anyhow::Result<Option<StoreAt<'_>>> {
    use weir_host::config::StateBackendKind;
    let state = &settings.state;
    let (url, options) = match state.backend {
        StateBackendKind::Lsm => (state.lsm.url.as_deref(), &state.lsm.options),
        StateBackendKind::Memory => (state.memory.url.as_deref(), &state.memory.options),
    };
    let Some(url) = url else { return Ok(None) };
    let (store, prefix) = weir_host::state::lsm::backend::object_store_from_url(url, options)
        .with_context(|| format!("cannot open the state store {url}"))?;
    Ok(Some((store, prefix, url)))
}

/// `pipeline.iceberg`'s table, if set: its catalog opened, the pipeline's id read from (or
/// made in) the state store, the committer reading the checkpoints there.
async fn table_target(
    settings: &Settings,
    clock: &SharedClock,
) -> anyhow::Result<Option<weir_host::sink::iceberg::TableTarget>> {
    use weir_host::sink::iceberg::{TableSchema, TableTarget, output::stored_pipeline_uid};
    let Some(table) = &settings.pipeline.iceberg else {
        return Ok(None);
    };
    let schema = TableSchema::new(&table.columns).context("pipeline.iceberg.columns")?;
    let (store, prefix, url) =
        state_store(settings)?.context("pipeline.iceberg needs a state store")?;
    let uid = stored_pipeline_uid(store.as_ref(), &prefix, &settings.pipeline.name)
        .await
        .with_context(|| format!("cannot read or write the pipeline's id in {url}"))?;
    let target = TableTarget::open(
        &settings.iceberg,
        (&table.namespace, &table.table),
        schema,
        &uid,
        settings,
        (store, &prefix),
        clock.clone(),
    )
    .await
    .context("cannot open the Iceberg catalog")?;
    Ok(Some(target))
}

/// How long `weir run` waits for the cluster's first metadata answer at start.
const KAFKA_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Runs `weir run`: one pipeline from a TOML config (with the environment's settings over it)
/// until SIGINT or SIGTERM, then drains it and checkpoints. With `admin_listen`, serves
/// `/healthz`, `/readyz` (503 while the brokers do not answer) and `/metrics` there.
///
/// # Errors
/// An invalid config, brokers or a state store that cannot be reached at start, a state
/// backend that cannot be set up, an admin address that cannot be bound, or the pipeline's
/// failure.
pub async fn run(config: PathBuf, admin_listen: Option<String>) -> anyhow::Result<()> {
    // Before anything slow: a stop from now on drains cleanly, or ends the start with 0.
    let mut signals = StopSignals::listen()?;
    tracing::info!(config = %config.display(), "weir run starting");
    let start = start_run(&config, admin_listen.as_deref());
    let started = tokio::select! {
        started = start => started?,
        () = signals.received() => {
            tracing::info!("stopped before the pipeline started");
            return Ok(());
        }
    };
    let Started {
        settings,
        clock,
        backend,
        admin,
        stats,
        table,
    } = started;
    let shutdown = async move {
        signals.received().await;
        tracing::info!("shutting down: draining partitions and checkpointing");
    };
    if let Some(plan) = settings.stage_plan() {
        // Validated with the settings: the graph has no problem left.
        let plan = plan.map_err(|problems| anyhow::anyhow!(problems.join("; ")))?;
        let stats: Vec<_> = plan
            .runs
            .iter()
            .map(|run| {
                Arc::new(match admin {
                    Some(_) => {
                        PipelineStats::labelled_stage("", &settings.pipeline.name, &run.stage)
                    }
                    None => PipelineStats::default(),
                })
            })
            .collect();
        weir_host::runner::run_stages(
            &settings.kafka,
            plan,
            stats.clone(),
            backend,
            clock,
            shutdown,
        )
        .await
        .context("pipeline failed")?;
        let records: u64 = stats.iter().map(|s| s.records_done()).sum();
        tracing::info!(records, stages = stats.len(), "pipeline stopped");
        return Ok(());
    }
    let (_checkpoint_requests, control) = pipeline::PipelineControl::new();
    let control = weir_host::runner::RunControl {
        pipeline: control,
        table,
    };
    weir_host::runner::run_controlled(settings, backend, clock, stats.clone(), control, shutdown)
        .await
        .context("pipeline failed")?;
    tracing::info!(records = stats.records_done(), "pipeline stopped");
    Ok(())
}

/// What `weir run` sets up before its pipeline runs.
struct Started {
    settings: Settings,
    clock: SharedClock,
    backend: Arc<ConfiguredBackend>,
    admin: Option<AbortOnDrop>,
    stats: Arc<PipelineStats>,
    table: Option<weir_host::sink::iceberg::TableTarget>,
}

/// `weir run`'s start: the settings, the brokers and the state store checked, the backend, the
/// admin endpoints and the Iceberg table.
async fn start_run(
    config: &std::path::Path,
    admin_listen: Option<&str>,
) -> anyhow::Result<Started> {
    let settings = Settings::load(config, &EnvVars::from_process())?;
    // Before any store is opened: this host's bound on object-store requests in flight.
    weir_host::state::store_guard::StoreGuard::configure(
        settings.runtime.store_requests_in_flight_max,
    );
    // Wrong credentials, an untrusted certificate or an unreachable cluster: said at once, with
    // the cause librdkafka reported, rather than retried in the logs.
    let kafka = settings.kafka.clone();
    tokio::task::spawn_blocking(move || {
        weir_host::source::kafka::broker::check_reachable(&kafka, KAFKA_CHECK_TIMEOUT)
    })
    .await
    .context("the Kafka check panicked")??;
    check_state_store(&settings).await?;
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(
        ConfiguredBackend::from_settings(&settings.state, clock.clone())
            .context("cannot set up the state backend")?,
    );
    let admin = match admin_listen {
        Some(address) => Some(admin(address, &settings).await?),
        None => None,
    };
    // With the admin endpoint, the pipeline's series are exported there (tenant empty), after
    // the recorder is installed.
    // A pipeline of stages labels each stage's run instead.
    let stats = Arc::new(match admin_listen {
        Some(_) if settings.pipeline.stages.is_empty() => {
            PipelineStats::labelled("", &settings.pipeline.name)
        }
        _ => PipelineStats::default(),
    });
    let table = table_target(&settings, &clock).await?;
    Ok(Started {
        settings,
        clock,
        backend,
        admin,
        stats,
        table,
    })
}
