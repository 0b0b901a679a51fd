//! Shared harness of Weir's end-to-end tests: where the real services are, unique topic names,
//! producing and reading topics, running a pipeline in process, and the guest components.
//!
//! The services are started by the test command (`deploy/test.sh`) through
//! `deploy/local/kafka.sh` and `deploy/local/s3.sh`; these helpers only connect.

// Tests measure and wait in real time; the host's code reads time only through its clock seam
// (clippy.toml).
#![allow(clippy::disallowed_methods)]

pub mod api;
pub mod busiest;
pub mod flight_weather;
pub mod iceberg;
mod kafka;
pub mod process;
pub mod proxy;
mod stages;
mod tier;

pub use kafka::*;
use kafka::{committed_reader, produce_to_partitions};
pub use stages::{RunningStages, stages_of};
pub use tier::*;

use anyhow::{Context as _, bail};
use rdkafka::message::Message;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing_subscriber::Layer as _;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{
    KafkaSettings, LsmStateSettings, PipelineSettings, RuntimeSettings, Settings, StateBackendKind,
    StateSettings,
};
use weir_host::pipeline::{self, PipelineError, PipelineStats};
use weir_host::state::StateBackend;
use weir_host::state::configured::ConfiguredBackend;

/// The real Kafka broker (`WEIR_KAFKA_BOOTSTRAP`, default `127.0.0.1:9092`).
pub fn kafka_bootstrap() -> String {
    std::env::var("WEIR_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// The real S3-compatible server (`WEIR_S3_ENDPOINT`, default `http://127.0.0.1:9000`).
pub fn s3_endpoint() -> String {
    std::env::var("WEIR_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:9000".into())
}

/// Creates a fresh bucket on the local S3 server with a plain `CreateBucket` (`object_store`
/// cannot create buckets) and returns its name.
///
/// # Errors
/// When the server is down or refuses.
pub async fn create_s3_bucket() -> anyhow::Result<String> {
    // One process-wide TLS provider for reqwest (unused on plain HTTP, but required to build).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let name = unique("weir-test").to_lowercase();
    let status = reqwest::Client::new()
        .put(format!("{}/{name}", s3_endpoint()))
        .send()
        .await?
        .status();
    anyhow::ensure!(
        status.is_success(),
        "CreateBucket answered {status}; is deploy/local/s3.sh up?"
    );
    Ok(name)
}

/// `object_store` options that reach the local S3 server.
pub fn s3_options() -> BTreeMap<String, String> {
    [
        ("aws_endpoint", s3_endpoint()),
        ("aws_region", "us-east-1".to_owned()),
        ("aws_access_key_id", "test".to_owned()),
        ("aws_secret_access_key", "test".to_owned()),
        ("aws_allow_http", "true".to_owned()),
        ("aws_virtual_hosted_style_request", "false".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// `lsm` state on a fresh bucket of the local S3 server, with a memtable of
/// `memtable_bytes_max` and small caches, so that a test's state really goes through SSTs.
///
/// # Errors
/// When the bucket cannot be created.
pub async fn lsm_state_on_s3(memtable_bytes_max: usize) -> anyhow::Result<StateSettings> {
    let bucket = create_s3_bucket().await?;
    Ok(StateSettings {
        backend: StateBackendKind::Lsm,
        lsm: LsmStateSettings {
            url: Some(format!("s3://{bucket}/weir")),
            options: s3_options(),
            memtable_bytes_max,
            block_size_bytes: 4 << 10,
            block_cache_bytes: 8 << 20,
            disk_cache_bytes: 16 << 20,
            disk_cache_dir: None,
            ..LsmStateSettings::default()
        },
        memory: Default::default(),
    })
}

/// `memory` state whose checkpoints (full snapshots) go to a fresh bucket of the local S3
/// server.
///
/// # Errors
/// When the bucket cannot be created.
pub async fn memory_state_on_s3() -> anyhow::Result<StateSettings> {
    let bucket = create_s3_bucket().await?;
    Ok(StateSettings {
        backend: StateBackendKind::Memory,
        lsm: Default::default(),
        memory: weir_host::config::MemoryStateSettings {
            url: Some(format!("s3://{bucket}/weir")),
            options: s3_options(),
        },
    })
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives inside the workspace")
        .to_owned()
}

/// The build directory: `CARGO_TARGET_DIR`, or the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"))
}

/// Where the tests keep compiled components (`runtime.compiled_dir`), shared by every test and
/// test binary of a build: a component is compiled once, not once per pipeline that runs it (a
/// Python one costs ~15 s of CPU in the test build).
pub fn compiled_dir() -> PathBuf {
    target_dir().join("weir-tests/compiled")
}

/// The default runtime settings, with compiled components kept in [`compiled_dir`].
pub fn runtime_settings() -> RuntimeSettings {
    RuntimeSettings {
        compiled_dir: Some(compiled_dir()),
        ..RuntimeSettings::default()
    }
}

/// A guest component built by `cargo build --profile guest --target wasm32-wasip2`.
///
/// # Panics
/// When the file is missing, naming the command that builds it.
pub fn guest(name: &str) -> PathBuf {
    let path = target_dir()
        .join("wasm32-wasip2/guest")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "guest component missing: {}; build guests with `cargo build --profile guest --target wasm32-wasip2 -p flight-delays -p word-count -p weir-test-counter` and the Python one with `bash guest-sdk/python/componentize.sh examples/flight-delays-py flight_delays target/wasm32-wasip2/guest/flight_delays_py.wasm`",
        path.display()
    );
    path
}

/// A topic (or group) name unique to this test run.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The tests that push every flight through a pipeline share the broker, (some) the S3 server
/// and the cores; run two at once and each starves the other's output reader. One at a time.
pub static FULL_FLIGHT_RUNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Settings for a pipeline on the real broker; compiled components are kept in
/// [`compiled_dir`] unless `runtime` names a directory.
pub fn settings(
    operator: PathBuf,
    input: &str,
    output: &str,
    dlq: &str,
    runtime: RuntimeSettings,
) -> Settings {
    Settings {
        pipeline: PipelineSettings {
            // Unique: a shard's transactional.id is named after its pipeline, and two
            // exactly-once tests running at once under one name fenced each other's producers.
            name: unique("test"),
            operator,
            input_topics: vec![input.to_owned()],
            output_topic: Some(output.to_owned()),
            dead_letter_topic: dlq.to_owned(),
            group_id: Some(unique("group")),
            checkpoint_interval: std::time::Duration::from_secs(10),
            delivery: Default::default(),
            in_flight_max: weir_host::config::DEFAULT_IN_FLIGHT_MAX,
            failure_policy: Default::default(),
            max_out_of_orderness: Default::default(),
            idle_timeout: None,
            idle_advance: false,
            late_records: Default::default(),
            iceberg: None,
            stages: Vec::new(),
            edges: Default::default(),
            outputs: Default::default(),
            parameters: Default::default(),
            tables: Default::default(),
            global_tables: Default::default(),
        },
        kafka: KafkaSettings {
            bootstrap_servers: kafka_bootstrap(),
            security: Default::default(),
            consumer: BTreeMap::new(),
            producer: BTreeMap::new(),
        },
        runtime: RuntimeSettings {
            compiled_dir: runtime
                .compiled_dir
                .clone()
                .or_else(|| Some(compiled_dir())),
            ..runtime
        },
        state: StateSettings::default(),
        iceberg: Default::default(),
    }
}

/// A pipeline running in this process.
#[derive(Debug)]
pub struct RunningPipeline {
    /// Live counters.
    pub stats: Arc<PipelineStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), PipelineError>>,
}

impl RunningPipeline {
    /// Starts `settings` in the background on the backend `settings.state` names.
    pub fn start(settings: Settings) -> Self {
        let clock: SharedClock = Arc::new(SystemClock);
        let backend = ConfiguredBackend::from_settings(&settings.state, clock.clone())
            .expect("the state backend sets up");
        Self::start_on(settings, Arc::new(backend), clock)
    }

    /// Starts `settings` in the background, its figures exported as pipeline `pipeline` of
    /// `tenant` (in [`weir_host::telemetry::prometheus`]'s recorder).
    pub fn start_labelled(settings: Settings, tenant: &str, pipeline: &str) -> Self {
        let _ = weir_host::telemetry::prometheus();
        let clock: SharedClock = Arc::new(SystemClock);
        let backend = ConfiguredBackend::from_settings(&settings.state, clock.clone())
            .expect("the state backend sets up");
        let (_requests, control) = pipeline::PipelineControl::new();
        let stats = Arc::new(PipelineStats::labelled(tenant, pipeline));
        Self::start_with_stats(settings, Arc::new(backend), clock, control.into(), stats)
    }

    /// Starts `settings` in the background on `backend`.
    pub fn start_on<B: StateBackend>(
        settings: Settings,
        backend: Arc<B>,
        clock: SharedClock,
    ) -> Self {
        let (_requests, control) = pipeline::PipelineControl::new();
        Self::start_controlled(settings, backend, clock, control)
    }

    /// Starts `settings` in the background on `backend`, asked for checkpoints by `control`
    /// (a [`pipeline::PipelineControl`], or a [`weir_host::runner::RunControl`] that also
    /// names an Iceberg table).
    pub fn start_controlled<B: StateBackend>(
        settings: Settings,
        backend: Arc<B>,
        clock: SharedClock,
        control: impl Into<weir_host::runner::RunControl>,
    ) -> Self {
        Self::start_with_stats(
            settings,
            backend,
            clock,
            control.into(),
            Arc::new(PipelineStats::default()),
        )
    }

    fn start_with_stats<B: StateBackend>(
        settings: Settings,
        backend: Arc<B>,
        clock: SharedClock,
        control: weir_host::runner::RunControl,
        stats: Arc<PipelineStats>,
    ) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(weir_host::runner::run_controlled(
            settings,
            backend,
            clock,
            stats.clone(),
            control,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            stats,
            stop: Some(stop),
            task,
        }
    }

    /// Waits until `done` holds for the stats, failing if the pipeline ends or `timeout`
    /// passes first.
    ///
    /// # Errors
    /// When the pipeline ends early or `timeout` passes.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&PipelineStats) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !done(&self.stats) {
            if self.task.is_finished() {
                bail!("pipeline ended before {what}");
            }
            if Instant::now() > deadline {
                bail!(
                    "no {what} after {timeout:?} ({} records done)",
                    self.stats.records_done()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Kills the pipeline as SIGKILL would a process: no drain, no last checkpoint (its
    /// consumer and producers are dropped).
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Whether the pipeline task has ended (it should not, until stopped).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits until `n` records reached a final disposition.
    ///
    /// # Errors
    /// When the pipeline ends early or `timeout` passes.
    pub async fn wait_done(&self, n: u64, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while self.stats.records_done() < n {
            if self.task.is_finished() {
                bail!(
                    "pipeline ended after {} of {n} records",
                    self.stats.records_done()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} of {n} records done after {timeout:?}; stats: {:?}",
                    self.stats.records_done(),
                    self.stats
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Stops the pipeline (draining every worker) and returns its result.
    ///
    /// # Errors
    /// The pipeline's error, if it failed.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await??;
        Ok(())
    }
}

/// Installs a test tracing subscriber once (respects `RUST_LOG`), which also keeps every
/// `audit = true` line for [`audit_lines`].
pub fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "warn,weir_host=info".into()),
                ),
        )
        // Only warnings: audit and dead-letter lines are warnings, and a layer that saw every
        // level would make every `log` record (cranelift's trace lines) be formatted.
        .with(AuditLines.with_filter(tracing_subscriber::filter::LevelFilter::WARN))
        .try_init();
}

/// The `audit = true` log lines of this process so far (once [`init_tracing`] ran), each as
/// its fields `name=value` joined by spaces.
pub fn audit_lines() -> Vec<String> {
    KEPT.lock().expect("unpoisoned").0.clone()
}

/// The "record dead-lettered" log lines of this process so far (once [`init_tracing`] ran),
/// as [`audit_lines`].
pub fn dead_letter_lines() -> Vec<String> {
    KEPT.lock().expect("unpoisoned").1.clone()
}

/// Audit lines, dead-letter lines.
static KEPT: std::sync::Mutex<(Vec<String>, Vec<String>)> =
    std::sync::Mutex::new((Vec::new(), Vec::new()));

/// Keeps the events that carry `audit = true` and the dead-letter lines in [`KEPT`].
struct AuditLines;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AuditLines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(Vec<String>, bool);
        impl tracing::field::Visit for Fields {
            fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
                self.1 |= field.name() == "audit" && value;
                self.0.push(format!("{}={value}", field.name()));
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push(format!("{}={value:?}", field.name()));
            }
        }
        let mut fields = Fields(Vec::new(), false);
        event.record(&mut fields);
        let line = fields.0.join(" ");
        let mut kept = KEPT.lock().expect("unpoisoned");
        if fields.1 {
            kept.0.push(line);
        } else if line.contains("message=record dead-lettered") {
            kept.1.push(line);
        }
    }
}

/// The `count` of each output record of the `counter` test operator, per key, in the order
/// read (`read_committed`, from the beginning): reads until every key of `expected` has shown
/// its expected count, failing after `timeout` with what was seen.
///
/// # Errors
/// When a key's expected count does not show up in time, or an output is not counter JSON.
pub async fn read_counts(
    topic: &str,
    expected: &BTreeMap<String, u64>,
    timeout: Duration,
) -> anyhow::Result<BTreeMap<String, Vec<u64>>> {
    let consumer = committed_reader(topic)?;
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut missing: std::collections::BTreeSet<&String> = expected.keys().collect();
    let deadline = Instant::now() + timeout;
    while !missing.is_empty() {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let msg = match tokio::time::timeout(remaining, consumer.recv()).await {
            Ok(msg) => msg?,
            Err(_) => {
                let last: BTreeMap<&String, Option<&u64>> = missing
                    .iter()
                    .map(|k| (*k, counts.get(*k).and_then(|c| c.last())))
                    .collect();
                bail!(
                    "after {timeout:?}, {} keys of `{topic}` never showed their expected count; last counts seen: {last:?}",
                    missing.len()
                );
            }
        };
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
        let value: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())
            .context("counter output is JSON")?;
        let count = value["count"]
            .as_u64()
            .context("counter output has a count")?;
        if expected.get(&key) == Some(&count) {
            missing.remove(&key);
        }
        counts.entry(key).or_default().push(count);
    }
    Ok(counts)
}

/// Reads the counter's outputs of `topic` from the beginning (read_committed) — every count
/// emitted per key, in order — until `done` holds of what was read, failing after `timeout`.
///
/// # Errors
/// When `done` does not hold in time, or an output is not the counter's.
pub async fn read_counts_until(
    topic: &str,
    timeout: Duration,
    done: impl Fn(&BTreeMap<String, Vec<u64>>) -> bool,
) -> anyhow::Result<BTreeMap<String, Vec<u64>>> {
    let consumer = committed_reader(topic)?;
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let deadline = Instant::now() + timeout;
    while !done(&counts) {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let Ok(msg) = tokio::time::timeout(remaining, consumer.recv()).await else {
            bail!("after {timeout:?}, the outputs of `{topic}` were not as expected: {counts:?}");
        };
        let msg = msg?;
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
        let value: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())
            .context("counter output is JSON")?;
        let count = value["count"]
            .as_u64()
            .context("counter output has a count")?;
        counts.entry(key).or_default().push(count);
    }
    Ok(counts)
}

/// A record's key and value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Produces records `from..to` for the `counter` operator to `topic`: record `i` has key
/// `key{i % keys}` and goes to partition `(i % keys) % partitions`, so a key lives in one shard;
/// adds each to `expected` (key → number of records).
///
/// # Errors
/// When a delivery fails.
pub async fn produce_counter(
    topic: &str,
    partitions: i32,
    (from, to): (u64, u64),
    keys: u64,
    expected: &mut BTreeMap<String, u64>,
) -> anyhow::Result<()> {
    let mut records: Vec<(i32, KeyValue)> = Vec::new();
    for i in from..to {
        let k = i % keys;
        let key = format!("key{k}");
        *expected.entry(key.clone()).or_default() += 1;
        let partition = i32::try_from(k % u64::try_from(partitions)?)?;
        records.push((
            partition,
            (key.into_bytes(), format!("record {i}").into_bytes()),
        ));
    }
    let records: Vec<(i32, &KeyValue)> = records.iter().map(|(p, r)| (*p, r)).collect();
    produce_to_partitions(topic, &records).await
}

/// Asserts what at-least-once output of the `counter` operator over exactly-once state
/// shows: each key's highest count is its number of input records (none lost, none counted
/// twice) and every count from 1 up was emitted.
///
/// # Panics
/// When a key's counts say otherwise.
pub fn assert_counts_exact(expected: &BTreeMap<String, u64>, counts: &BTreeMap<String, Vec<u64>>) {
    for (key, n) in expected {
        let seen = &counts[key];
        assert_eq!(seen.iter().max(), Some(n), "key {key}: final count");
        for want in 1..=*n {
            assert!(
                seen.contains(&want),
                "key {key}: count {want} never emitted"
            );
        }
    }
}

/// Settings of a `counter` pipeline over new topics `{prefix}-in` (`partitions` partitions),
/// `-out` and `-dlq`, with `lsm` state on a new bucket of the S3 server (4 KiB memtable, so
/// state goes through SSTs); returns them with the output topic.
///
/// # Errors
/// When the topics or the bucket cannot be created.
pub async fn counter_pipeline_on_s3(
    prefix: &str,
    partitions: i32,
) -> anyhow::Result<(Settings, String)> {
    init_tracing();
    let (input, output, dlq) = (
        unique(&format!("{prefix}-in")),
        unique(&format!("{prefix}-out")),
        unique(&format!("{prefix}-dlq")),
    );
    create_topics(&[(&input, partitions), (&output, partitions), (&dlq, 1)]).await?;
    let mut settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    );
    settings.state = lsm_state_on_s3(4 << 10).await?;
    Ok((settings, output))
}

pub use weir_host::state::delayed::splitmix64;

/// A command installed by `deploy/local/py-tool.sh NAME … COMMAND` (the test command runs it):
/// the path in `env_var`, else its default place under `WEIR_SERVICES_DIR`.
///
/// # Panics
/// When the command is not installed.
pub fn py_tool(env_var: &str, name: &str, command: &str) -> PathBuf {
    let path = std::env::var_os(env_var).map_or_else(
        || {
            let services = std::env::var_os("WEIR_SERVICES_DIR").map_or_else(
                || {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/weir/services")
                },
                PathBuf::from,
            );
            services.join(name).join("venv/bin").join(command)
        },
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} is missing: run `bash deploy/local/py-tool.sh {name} <spec> {command}` (deploy/test.sh does)",
        path.display()
    );
    path
}
