//! `weir bench-timers`: what keyed timers cost (docs/time.md, docs/bench.md "Timers"). Runs the
//! whole pipeline (consumer group, worker, guest calls) with the `counter` guest on each state
//! backend in two phases over one input partition:
//!
//! 1. **set**: `--timers` records, one per key, each setting an event-time timer (the
//!    `timer:event:t:AT` command): timers set per second, and CPU per timer;
//! 2. **fire**: one record whose timestamp moves the watermark past them all: every timer is
//!    due at once and fires in rounds of `runtime.timer_batch_max`, each `on_timer` reading the
//!    key's state and emitting one record: timers fired per second, and CPU per timer.
//!
//! CPU is the process's user + system time over the phase (`/proc/self/stat`, in 10 ms ticks),
//! so the producer and the consumer's fetches are in it: "per core" is 1 / (CPU per timer). The
//! set phase is a record's path plus the timer's two staged entries; compare it with
//! `weir bench`'s counter to see the timer's share. On librdkafka's mock cluster by default.

use crate::controller_bench::{cluster, create_topics, wait_delivery};
use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord, Producer};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{PipelineSettings, RuntimeSettings, Settings, StateSettings};
use weir_host::pipeline::{self, PipelineStats};
use weir_host::state::StateBackend;
use weir_host::state::lsm::backend::LsmBackend;
use weir_host::state::lsm::cache::{BlockCaches, CacheSettings};
use weir_host::state::lsm::tree::LsmSettings;
use weir_host::state::memory::MemoryBackend;

/// What `weir bench-timers` runs (its options).
#[derive(Debug, Clone, clap::Args)]
pub struct TimerBenchOptions {
    /// The `counter` guest (its timer commands).
    #[arg(
        long,
        default_value = "target/wasm32-wasip2/guest/weir_test_counter.wasm"
    )]
    pub operator: PathBuf,
    /// A real broker (`host:port`); without it, librdkafka's mock cluster runs in process.
    #[arg(long)]
    pub bootstrap_servers: Option<String>,
    /// Timers (and keys) per run (at most ~100,000 on the mock cluster, see [`STALL_MAX`]).
    #[arg(long, default_value_t = 100_000)]
    pub timers: u64,
    /// Timers per `on-timers` call (`runtime.timer_batch_max`).
    #[arg(long, default_value_t = 512)]
    pub timer_batch_max: usize,
    /// Where the `lsm` backend keeps its SSTs (a directory; emptied first).
    #[arg(long, default_value = "/tmp/weir-bench-timers")]
    pub store_dir: PathBuf,
}

/// One backend's measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TimerRun {
    /// `memory` or `lsm`.
    pub backend: &'static str,
    /// Timers set and fired.
    pub timers: u64,
    /// Timers set per second (one record each).
    pub set_per_s: f64,
    /// Process CPU per timer set, µs.
    pub set_cpu_us: f64,
    /// Timers fired per second.
    pub fired_per_s: f64,
    /// Process CPU per timer fired, µs.
    pub fire_cpu_us: f64,
    /// `on-timers` calls made.
    pub timer_calls: u64,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum TimerBenchError {
    /// Kafka (mock or real) failed.
    #[error("kafka failed")]
    Kafka(#[from] KafkaError),
    /// The pipeline failed.
    #[error("pipeline failed")]
    Pipeline(#[from] pipeline::PipelineError),
    /// The `lsm` backend's store could not be set up.
    #[error("cannot set up the lsm store")]
    Store(#[source] std::io::Error),
    /// A phase did not finish in time.
    #[error(
        "the {phase} phase did {done} of {timers} timers (limit {limit:?}, or no progress for a minute: librdkafka's mock cluster stalls past ~100,000 records; pass --bootstrap-servers)"
    )]
    Timeout {
        /// `set` or `fire`.
        phase: &'static str,
        /// Timers done.
        done: u64,
        /// Timers asked for.
        timers: u64,
        /// The limit.
        limit: Duration,
    },
}

/// Longest a phase may take.
const PHASE_LIMIT: Duration = Duration::from_secs(600);

/// Longest a phase may go without progress. librdkafka's mock cluster stops delivering to the
/// consumer somewhere between 100,000 and 200,000 records of this size: run more timers
/// against a real broker (`--bootstrap-servers`).
const STALL_MAX: Duration = Duration::from_secs(60);

/// When every timer is set for, and the timestamp of the records that set them, ms.
const TIMER_AT: i64 = 10_000;

/// Runs both phases on `memory` and on `lsm`.
///
/// # Errors
/// [`TimerBenchError`] when Kafka, the store or a pipeline fails, or a phase does not finish.
pub async fn run(opts: &TimerBenchOptions) -> Result<Vec<TimerRun>, TimerBenchError> {
    let (mock, bootstrap) = cluster(opts.bootstrap_servers.as_deref())?;
    let clock: SharedClock = Arc::new(SystemClock);
    let memory = Arc::new(MemoryBackend::new(clock.clone()));
    let mut runs = vec![measure(opts, &bootstrap, mock.as_ref(), "memory", memory, &clock).await?];
    let _ = std::fs::remove_dir_all(&opts.store_dir);
    std::fs::create_dir_all(&opts.store_dir).map_err(TimerBenchError::Store)?;
    let store = object_store::local::LocalFileSystem::new_with_prefix(&opts.store_dir)
        .map_err(|e| TimerBenchError::Store(std::io::Error::other(e)))?;
    let caches = BlockCaches::new(&CacheSettings {
        block_cache_bytes: 64 << 20,
        disk_cache_bytes: 0,
        disk_cache_dir: None,
    })
    .map_err(TimerBenchError::Store)?;
    let lsm = Arc::new(LsmBackend::new(
        Arc::new(store),
        "bench".into(),
        Arc::new(caches),
        LsmSettings::default(),
        clock.clone(),
    ));
    runs.push(measure(opts, &bootstrap, mock.as_ref(), "lsm", lsm, &clock).await?);
    Ok(runs)
}

/// Both phases on `backend`.
async fn measure<B: StateBackend>(
    opts: &TimerBenchOptions,
    bootstrap: &str,
    mock: Option<&MockCluster<'static, DefaultProducerContext>>,
    backend_name: &'static str,
    backend: Arc<B>,
    clock: &SharedClock,
) -> Result<TimerRun, TimerBenchError> {
    let name = format!("bench-timers-{}-{backend_name}", std::process::id());
    let (input, output, dlq) = (
        format!("{name}-in"),
        format!("{name}-out"),
        format!("{name}-dlq"),
    );
    let topics = [(input.as_str(), 1), (output.as_str(), 1), (dlq.as_str(), 1)];
    create_topics(mock, bootstrap, &topics).await?;
    let producer: FutureProducer = crate::kafka::client(bootstrap)
        .set("linger.ms", "5")
        .create()?;
    let value = format!("timer:event:t:{TIMER_AT}");
    let records: Vec<(String, &str, i64)> = (0..opts.timers)
        .map(|i| (format!("k{i}"), value.as_str(), 1))
        .collect();
    produce(&producer, &input, &records).await?;
    let settings = Settings {
        pipeline: PipelineSettings {
            name: name.clone(),
            operator: opts.operator.clone(),
            input_topics: vec![input.clone()],
            output_topic: Some(output),
            dead_letter_topic: dlq,
            group_id: None,
            checkpoint_interval: Duration::from_secs(10),
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
        kafka: crate::kafka::settings(bootstrap),
        runtime: RuntimeSettings {
            timer_batch_max: opts.timer_batch_max,
            ..RuntimeSettings::default()
        },
        state: StateSettings::default(),
        iceberg: Default::default(),
    };
    let stats = Arc::new(PipelineStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let pipeline = tokio::spawn(weir_host::runner::run(
        settings,
        backend,
        clock.clone(),
        stats.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let done = |s: &PipelineStats| s.records_ok.load(Ordering::Relaxed);
    let set = phase("set", opts.timers, &pipeline, || done(&stats), async {
        Ok(())
    })
    .await?;
    // One record past every timer: the watermark (its timestamp - 1) makes them all due.
    let fired = |s: &PipelineStats| s.timers_fired.load(Ordering::Relaxed);
    let calls_before = stats.guest_calls.load(Ordering::Relaxed);
    let fire = phase("fire", opts.timers, &pipeline, || fired(&stats), async {
        produce(&producer, &input, &[("x".to_owned(), "v", TIMER_AT + 1)]).await
    })
    .await?;
    let timer_calls = stats.guest_calls.load(Ordering::Relaxed) - calls_before;
    let _ = stop_tx.send(());
    match pipeline.await {
        Ok(result) => result?,
        Err(_) => return Err(KafkaError::Canceled.into()),
    }
    Ok(TimerRun {
        backend: backend_name,
        timers: opts.timers,
        set_per_s: set.0,
        set_cpu_us: set.1,
        fired_per_s: fire.0,
        fire_cpu_us: fire.1,
        timer_calls,
    })
}

/// Runs `start`, then waits until `count` reaches `timers`; returns (per second, CPU µs per
/// timer), timed from the first one counted to the last.
pub(crate) async fn phase(
    name: &'static str,
    timers: u64,
    pipeline: &tokio::task::JoinHandle<Result<(), pipeline::PipelineError>>,
    count: impl Fn() -> u64,
    start: impl Future<Output = Result<(), KafkaError>>,
) -> Result<(f64, f64), TimerBenchError> {
    let before = count();
    start.await?;
    let started = Instant::now();
    let mut first: Option<(Instant, f64, u64)> = None;
    let mut progress = (Instant::now(), count());
    while count() - before < timers {
        if progress.1 != count() {
            progress = (Instant::now(), count());
        }
        let stalled = progress.0.elapsed() > STALL_MAX;
        if stalled || started.elapsed() > PHASE_LIMIT || pipeline.is_finished() {
            return Err(TimerBenchError::Timeout {
                phase: name,
                done: count() - before,
                timers,
                limit: PHASE_LIMIT,
            });
        }
        if first.is_none() && count() > before {
            first = Some((Instant::now(), cpu_seconds(), count()));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (at, cpu, n) = first.unwrap_or((started, cpu_seconds(), before));
    let counted = (before + timers - n).max(1) as f64;
    Ok((
        counted / at.elapsed().as_secs_f64().max(1e-9),
        (cpu_seconds() - cpu) * 1e6 / counted,
    ))
}

/// This process's user + system CPU time, seconds (`/proc/self/stat`, in USER_HZ = 100 ticks);
/// 0 where there is no procfs.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces, inside parentheses).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// Produces `(key, value, timestamp)` records and waits for them all.
async fn produce(
    producer: &FutureProducer,
    topic: &str,
    records: &[(String, &str, i64)],
) -> Result<(), KafkaError> {
    let mut deliveries = Vec::with_capacity(records.len().min(10_000));
    for (key, value, timestamp) in records {
        let record = FutureRecord::to(topic)
            .key(key)
            .payload(*value)
            .timestamp(*timestamp);
        match producer.send_result(record) {
            Ok(delivery) => deliveries.push(delivery),
            Err((err, _)) => return Err(err),
        }
        if deliveries.len() >= 10_000 {
            for delivery in deliveries.drain(..) {
                wait_delivery(delivery).await?;
            }
        }
    }
    for delivery in deliveries {
        wait_delivery(delivery).await?;
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

/// The runs as a table.
pub fn table(runs: &[TimerRun]) -> String {
    let mut out = String::from(
        "backend  timers    set/s      CPU µs/set  fired/s    CPU µs/fire  on-timers calls\n",
    );
    for r in runs {
        out.push_str(&format!(
            "{:<8} {:<9} {:<10.0} {:<11.2} {:<10.0} {:<12.2} {}\n",
            r.backend,
            r.timers,
            r.set_per_s,
            r.set_cpu_us,
            r.fired_per_s,
            r.fire_cpu_us,
            r.timer_calls
        ));
    }
    out
}
