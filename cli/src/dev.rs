//! `weir dev`: the whole job on embedded defaults — librdkafka's mock cluster (or a broker you
//! name), the `flight-delays` operator, the flights table in, a summary out; or, with
//! `--input FILE.jsonl`, any operator over a file of records ([`crate::dev_input`]).

use crate::flights;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{PipelineSettings, RuntimeSettings, Settings, StateSettings};
use weir_host::pipeline::{self, PipelineStats};
use weir_host::state::memory::MemoryBackend;

/// What `weir dev` runs (its options).
#[derive(Debug, Clone, clap::Args)]
#[command(group = clap::ArgGroup::new("records").required(true).args(["flights_csv", "input"]))]
pub struct DevOptions {
    /// The operator component (with `--flights`, the `flight-delays` one).
    #[arg(long, default_value = "target/wasm32-wasip2/guest/flight_delays.wasm")]
    pub operator: PathBuf,
    /// The flights CSV (`deploy/local/flights.sh` prints its path): the flights job, with a
    /// summary.
    #[arg(long = "flights")]
    pub flights_csv: Option<PathBuf>,
    /// A JSON-lines file of records, one `{"key", "value", "timestamp_ms", "headers"}` object
    /// a line (each field optional; a non-string key or value is sent as its JSON text): runs
    /// `--operator` over them and prints every output and dead letter as JSON lines.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Use this broker instead of the mock cluster.
    #[arg(long)]
    pub bootstrap_servers: Option<String>,
    /// Partitions of the input and output topics.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
}

/// Why the dev job failed.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// Kafka (mock or real) failed.
    #[error("kafka failed")]
    Kafka(#[from] KafkaError),
    /// The flights could not be read or produced.
    #[error("flights failed")]
    Flights(#[from] flights::FlightsError),
    /// The pipeline failed.
    #[error("pipeline failed")]
    Pipeline(#[from] pipeline::PipelineError),
    /// The output did not arrive in time.
    #[error("output incomplete after {0:?}: {1}")]
    Timeout(Duration, String),
    /// The `--input` file cannot be read or has a malformed line.
    #[error("bad --input: {0}")]
    Input(String),
}

/// Creates `topics` (name, partitions) with replication 1; existing topics are left as they are.
///
/// # Errors
/// [`KafkaError`] when the admin client fails or a creation fails for another reason.
pub async fn ensure_topics(
    bootstrap_servers: &str,
    topics: &[(&str, i32)],
) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> =
        crate::kafka::client(bootstrap_servers).create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics(&new, &opts).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                tracing::error!(%topic, ?code, "cannot create topic");
                return Err(KafkaError::AdminOp(code));
            }
        }
    }
    Ok(())
}

/// The statistics `flight-delays` emits per flight.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct RouteStats {
    /// `ORIGIN-DEST`.
    pub route: String,
    /// Flights so far.
    pub flights: u64,
    /// Flights with a known arrival delay.
    pub delay_count: u64,
    /// Sum of known arrival delays, minutes.
    pub delay_sum: i64,
    /// Largest known arrival delay, minutes.
    pub delay_max: Option<i64>,
    /// Mean of known arrival delays, minutes.
    pub delay_mean: Option<f64>,
}

/// The topics of a dev run (name, partitions) on `bootstrap_servers`, created if missing, or on
/// a new librdkafka mock cluster, which lives as long as the returned handle: `(mock,
/// bootstrap)`.
///
/// # Errors
/// [`DevError::Kafka`] when the topics cannot be created.
pub(crate) async fn cluster(
    bootstrap_servers: Option<&str>,
    topics: &[(&str, i32)],
) -> Result<(Option<MockCluster<'static, DefaultProducerContext>>, String), DevError> {
    match bootstrap_servers {
        Some(b) => {
            ensure_topics(b, topics).await?;
            Ok((None, b.to_owned()))
        }
        None => {
            // The mock cluster does not serve the CreateTopics admin API: create them directly.
            let mock = MockCluster::new(1)?;
            for (topic, partitions) in topics {
                mock.create_topic(topic, *partitions, 1)?;
            }
            let bootstrap = mock.bootstrap_servers();
            Ok((Some(mock), bootstrap))
        }
    }
}

/// A dev run's pipeline `name`: `operator` from `input` to `output`, dead letters to `dlq`,
/// its own consumer group, Weir's defaults otherwise (the caller gives it heap state).
pub(crate) fn pipeline_settings(
    name: &str,
    operator: &std::path::Path,
    (input, output, dlq): (&str, &str, &str),
    bootstrap: &str,
) -> Settings {
    Settings {
        pipeline: PipelineSettings {
            name: name.into(),
            operator: operator.to_owned(),
            input_topics: vec![input.to_owned()],
            output_topic: Some(output.to_owned()),
            dead_letter_topic: dlq.to_owned(),
            group_id: Some(format!("weir-dev-{}", std::process::id())),
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
        runtime: RuntimeSettings::default(),
        state: StateSettings::default(),
        iceberg: Default::default(),
    }
}

/// Runs the job and prints a summary to stdout.
///
/// # Errors
/// [`DevError`] when any stage fails.
pub async fn run(opts: DevOptions) -> Result<(), DevError> {
    let flights_csv = match (&opts.input, &opts.flights_csv) {
        (Some(input), _) => return crate::dev_input::run(&opts, input).await,
        (None, Some(csv)) => csv.clone(),
        (None, None) => return Err(DevError::Input("give --flights or --input".into())),
    };
    let run_id = std::process::id();
    let (input, output, dlq) = (
        format!("flights-{run_id}"),
        format!("route-stats-{run_id}"),
        format!("flights-dlq-{run_id}"),
    );
    let topics = [
        (input.as_str(), opts.partitions),
        (output.as_str(), opts.partitions),
        (dlq.as_str(), 1),
    ];
    let (mock, bootstrap) = cluster(opts.bootstrap_servers.as_deref(), &topics).await?;
    if mock.is_some() {
        println!("started librdkafka's mock cluster at {bootstrap}");
    }

    let flights = flights::read_csv(&flights_csv)?;
    let loaded = flights.len() as u64;
    let settings = pipeline_settings(
        "flight-delays",
        &opts.operator,
        (&input, &output, &dlq),
        &bootstrap,
    );
    let reader = OutputReader::start(&bootstrap, &output)?;
    let clock: SharedClock = Arc::new(SystemClock);
    let stats = Arc::new(PipelineStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let pipeline = tokio::spawn(weir_host::runner::run(
        settings,
        Arc::new(MemoryBackend::new(clock.clone())),
        clock,
        stats.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));

    // librdkafka's mock cluster keeps only the last ~5 MB of each partition, so there the
    // flights are replayed at the pace at which their outputs are read back (like a generator
    // source); a real broker gets them as fast as it takes them.
    let lag_max = match opts.bootstrap_servers {
        Some(_) => u64::MAX,
        None => MOCK_LAG_RECORDS_PER_PARTITION * opts.partitions.max(1) as u64,
    };
    let limit = Duration::from_secs(600);
    let started = Instant::now();
    let mut produced = 0u64;
    // When the first records were done, and how many: the processing rate from there on
    // excludes the consumer group join.
    let mut first_done: Option<(Instant, u64)> = None;
    let mut last_report = Instant::now();
    let loader = flights::Loader::new(&bootstrap)?;
    for chunk in flights.chunks(REPLAY_CHUNK_RECORDS) {
        while produced.saturating_sub(reader.seen()) > lag_max {
            if started.elapsed() > limit || pipeline.is_finished() {
                break;
            }
            if first_done.is_none() && stats.records_done() > 0 {
                first_done = Some((Instant::now(), stats.records_done()));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        produced += loader.produce(&input, chunk).await?;
        if last_report.elapsed() >= Duration::from_secs(2) {
            last_report = Instant::now();
            println!(
                "  … {produced} of {loaded} flights replayed, {} processed",
                stats.records_done()
            );
        }
    }
    while stats.records_done() < loaded && started.elapsed() < limit && !pipeline.is_finished() {
        if first_done.is_none() && stats.records_done() > 0 {
            first_done = Some((Instant::now(), stats.records_done()));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let steady = first_done.map(|(at, done)| ((loaded - done) as f64) / at.elapsed().as_secs_f64());
    let _ = stop_tx.send(());
    match pipeline.await {
        Ok(result) => result?,
        Err(join) => return Err(DevError::Timeout(elapsed, format!("pipeline task: {join}"))),
    }
    let done = stats.records_done();
    if done < loaded {
        return Err(DevError::Timeout(
            limit,
            format!("{done} of {loaded} records processed"),
        ));
    }
    let emitted = stats.emitted.load(Ordering::Relaxed);
    let finals = reader.finish(emitted, Duration::from_secs(120)).await?;
    drop(loader);
    print_summary(&stats, loaded, elapsed, steady, &finals);
    Ok(())
}

/// Records replayed per produce call in `weir dev`.
const REPLAY_CHUNK_RECORDS: usize = 4_000;

/// Records per partition the replay may run ahead of the output reader on the mock cluster
/// (about 3 MB of flights, under its ~5 MB per-partition log).
const MOCK_LAG_RECORDS_PER_PARTITION: u64 = 8_000;

/// Reads the output topic while the job runs, keeping the latest stats per route.
struct OutputReader {
    seen: Arc<AtomicU64>,
    finals: Arc<Mutex<BTreeMap<String, RouteStats>>>,
    task: tokio::task::JoinHandle<Result<(), KafkaError>>,
}

impl OutputReader {
    fn start(bootstrap: &str, topic: &str) -> Result<Self, KafkaError> {
        let consumer: StreamConsumer = crate::kafka::client(bootstrap)
            .set(
                "group.id",
                format!("weir-dev-reader-{}", std::process::id()),
            )
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()?;
        consumer.subscribe(&[topic])?;
        let seen = Arc::new(AtomicU64::new(0));
        let finals = Arc::new(Mutex::new(BTreeMap::new()));
        let (task_seen, task_finals) = (seen.clone(), finals.clone());
        let task = tokio::spawn(async move {
            loop {
                let msg = consumer.recv().await?;
                if let Some(stats) = msg
                    .payload()
                    .and_then(|p| serde_json::from_slice::<RouteStats>(p).ok())
                {
                    task_finals
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(stats.route.clone(), stats);
                }
                task_seen.fetch_add(1, Ordering::Relaxed);
            }
        });
        Ok(Self { seen, finals, task })
    }

    fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }

    /// Waits until `expected` outputs were read, then stops and returns the final stats.
    async fn finish(
        self,
        expected: u64,
        timeout: Duration,
    ) -> Result<BTreeMap<String, RouteStats>, DevError> {
        let deadline = Instant::now() + timeout;
        while self.seen() < expected {
            if self.task.is_finished() || Instant::now() > deadline {
                self.task.abort();
                return Err(DevError::Timeout(
                    timeout,
                    format!("read {} of {expected} outputs", self.seen()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.task.abort();
        // Wait for the abort so the consumer is closed before the (mock) cluster goes away.
        let _ = self.task.await;
        let finals = std::mem::take(&mut *self.finals.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(finals)
    }
}

fn print_summary(
    stats: &PipelineStats,
    loaded: u64,
    elapsed: Duration,
    steady: Option<f64>,
    finals: &BTreeMap<String, RouteStats>,
) {
    let calls = stats.guest_calls.load(Ordering::Relaxed);
    let call_ns = stats.guest_call_ns.load(Ordering::Relaxed);
    println!();
    println!(
        "replayed and processed {loaded} flights in {elapsed:.2?}: {:.0} records/s end to end",
        loaded as f64 / elapsed.as_secs_f64()
    );
    if let Some(rate) = steady {
        println!("after the first records were done (consumer group joined): {rate:.0} records/s");
    }
    println!(
        "guest calls: {calls} ({:.0} records/call), {:.2} µs of guest-call time per record",
        loaded as f64 / calls.max(1) as f64,
        call_ns as f64 / 1000.0 / loaded.max(1) as f64
    );
    println!(
        "emitted {}, dead-lettered {}, routes {}",
        stats.emitted.load(Ordering::Relaxed),
        stats.dead_lettered.load(Ordering::Relaxed),
        finals.len()
    );
    let mut busiest: Vec<&RouteStats> = finals.values().collect();
    busiest.sort_by(|a, b| b.flights.cmp(&a.flights).then(a.route.cmp(&b.route)));
    println!();
    println!(
        "{:<10} {:>8} {:>10} {:>10} {:>10}",
        "route", "flights", "mean delay", "max delay", "with delay"
    );
    for s in busiest.iter().take(10) {
        println!(
            "{:<10} {:>8} {:>10.2} {:>10} {:>10}",
            s.route,
            s.flights,
            s.delay_mean.unwrap_or(f64::NAN),
            s.delay_max.map_or_else(|| "-".into(), |m| m.to_string()),
            s.delay_count
        );
    }
}
