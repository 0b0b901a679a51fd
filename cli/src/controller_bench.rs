//! `weir bench-controller`: what the execution controller buys when state reads wait. Runs the
//! whole pipeline (consumer group, controller, guest calls, producer) over records already in
//! the input topic, on the `memory` backend with every read delayed as a cache miss to object
//! storage would be ([`DelayedReads`]), for several `in_flight_max` / instances-per-partition
//! settings. `in_flight_max` = `batch_records_max` with one instance is the one-batch-at-a-time
//! worker that came before the controller.
//!
//! The rate is measured from the first processed record to the last, so the consumer group
//! join is excluded. On librdkafka's mock cluster (the default) the broker is in process; pass
//! `--bootstrap-servers` for a real one.

use crate::dev::ensure_topics;
use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord, Producer};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{PipelineSettings, RuntimeSettings, Settings, StateSettings};
use weir_host::pipeline::{self, PipelineStats};
use weir_host::state::delayed::{DelayedReads, ReadDelay};
use weir_host::state::memory::MemoryBackend;

/// What `weir bench-controller` runs (its options).
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerBenchOptions {
    /// A keyed operator.
    #[arg(
        long,
        default_value = "target/wasm32-wasip2/guest/weir_test_counter.wasm"
    )]
    pub operator: PathBuf,
    /// A real broker (`host:port`); without it, librdkafka's mock cluster runs in process.
    #[arg(long)]
    pub bootstrap_servers: Option<String>,
    /// Records per run.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Input partitions.
    #[arg(long, default_value_t = 2)]
    pub partitions: i32,
    /// Delays of every state read to measure, ms.
    #[arg(long = "read-delay-ms", value_delimiter = ',', default_value = "0,10")]
    pub read_delays_ms: Vec<u64>,
    /// `in_flight_max:instances` settings to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "512:1,4096:4,4096:16",
        value_parser = in_flight_and_instances
    )]
    pub settings: Vec<(usize, usize)>,
    /// Records per guest call at most (`runtime.batch_records_max`).
    #[arg(long, default_value_t = 512)]
    pub batch_records_max: usize,
}

/// One `--settings` pair, `in_flight_max:instances`.
fn in_flight_and_instances(text: &str) -> Result<(usize, usize), String> {
    let pair = text.split_once(':').and_then(|(in_flight, instances)| {
        Some((
            in_flight.trim().parse().ok()?,
            instances.trim().parse().ok()?,
        ))
    });
    pair.ok_or_else(|| format!("`{text}` is not an `in_flight_max:instances` pair of numbers"))
}

/// One measured run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ControllerRun {
    /// Delay of every state read, ms.
    pub read_delay_ms: u64,
    /// `pipeline.in_flight_max`.
    pub in_flight_max: usize,
    /// `runtime.partition_instances_max`.
    pub instances: usize,
    /// Records processed.
    pub records: u64,
    /// Records per second from the first processed record to the last.
    pub records_per_s: f64,
    /// Most records one partition had in flight.
    pub records_in_flight_peak: u64,
    /// Most batches one partition ran at once.
    pub batches_in_flight_peak: u64,
    /// Guest calls made.
    pub guest_calls: u64,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerBenchError {
    /// Kafka (mock or real) failed.
    #[error("kafka failed")]
    Kafka(#[from] KafkaError),
    /// The pipeline failed.
    #[error("pipeline failed")]
    Pipeline(#[from] pipeline::PipelineError),
    /// The run did not finish in time.
    #[error("{done} of {records} records processed after {limit:?}")]
    Timeout {
        /// Records done.
        done: u64,
        /// Records produced.
        records: u64,
        /// The limit.
        limit: Duration,
    },
}

/// Longest a run may take.
const RUN_LIMIT: Duration = Duration::from_secs(600);

/// Runs every (read delay × setting) combination.
///
/// # Errors
/// [`ControllerBenchError`] when Kafka or a pipeline fails, or a run does not finish.
pub async fn run(
    opts: &ControllerBenchOptions,
) -> Result<Vec<ControllerRun>, ControllerBenchError> {
    let (mock, bootstrap) = cluster(opts.bootstrap_servers.as_deref())?;
    let mut runs = Vec::new();
    for &delay_ms in &opts.read_delays_ms {
        for &(in_flight_max, instances) in &opts.settings {
            let name = format!(
                "bench-controller-{}-{delay_ms}-{in_flight_max}-{instances}",
                std::process::id()
            );
            let (input, output, dlq) = (
                format!("{name}-in"),
                format!("{name}-out"),
                format!("{name}-dlq"),
            );
            let topics = [
                (input.as_str(), opts.partitions),
                (output.as_str(), opts.partitions),
                (dlq.as_str(), 1),
            ];
            create_topics(mock.as_ref(), &bootstrap, &topics).await?;
            produce(&bootstrap, &input, opts.records, opts.keys).await?;
            let settings = Settings {
                pipeline: PipelineSettings {
                    name: name.clone(),
                    operator: opts.operator.clone(),
                    input_topics: vec![input],
                    output_topic: Some(output),
                    dead_letter_topic: dlq,
                    group_id: None,
                    checkpoint_interval: Duration::from_secs(10),
                    delivery: Default::default(),
                    in_flight_max,
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
                kafka: crate::kafka::settings(&bootstrap),
                runtime: RuntimeSettings {
                    batch_records_max: opts.batch_records_max,
                    partition_instances_max: instances,
                    ..RuntimeSettings::default()
                },
                state: StateSettings::default(),
                iceberg: Default::default(),
            };
            let run = measure(settings, Duration::from_millis(delay_ms), opts.records).await?;
            runs.push(ControllerRun {
                read_delay_ms: delay_ms,
                in_flight_max,
                instances,
                ..run
            });
        }
    }
    Ok(runs)
}

/// The broker a benchmark runs against: `bootstrap_servers`, or else librdkafka's mock cluster
/// in process (returned, to keep it alive) and its address.
///
/// # Errors
/// [`KafkaError`] when the mock cluster cannot start.
pub(crate) fn cluster(
    bootstrap_servers: Option<&str>,
) -> Result<(Option<MockCluster<'static, DefaultProducerContext>>, String), KafkaError> {
    match bootstrap_servers {
        Some(servers) => Ok((None, servers.to_owned())),
        None => {
            let mock = MockCluster::new(1)?;
            let bootstrap = mock.bootstrap_servers();
            Ok((Some(mock), bootstrap))
        }
    }
}

/// Creates `topics` (name, partitions) on `mock`, or on the broker at `bootstrap`.
///
/// # Errors
/// [`KafkaError`] when a topic cannot be created.
pub(crate) async fn create_topics(
    mock: Option<&MockCluster<'static, DefaultProducerContext>>,
    bootstrap: &str,
    topics: &[(&str, i32)],
) -> Result<(), KafkaError> {
    match mock {
        // The mock cluster does not serve the CreateTopics admin API.
        Some(mock) => {
            for (topic, partitions) in topics {
                mock.create_topic(topic, *partitions, 1)?;
            }
            Ok(())
        }
        None => ensure_topics(bootstrap, topics).await,
    }
}

/// Produces `records` small records over `keys` keys (key `k{i % keys}`).
async fn produce(bootstrap: &str, topic: &str, records: u64, keys: u64) -> Result<(), KafkaError> {
    let producer: FutureProducer = crate::kafka::client(bootstrap)
        .set("linger.ms", "5")
        .create()?;
    let mut deliveries = Vec::with_capacity(records as usize);
    for i in 0..records {
        let key = format!("k{}", i % keys.max(1));
        let value = format!("payload {i}");
        let record = FutureRecord::to(topic).key(&key).payload(&value);
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

/// Waits for one produced record's acknowledgement.
///
/// # Errors
/// The delivery's [`KafkaError`].
pub(crate) async fn wait_delivery(
    delivery: rdkafka::producer::DeliveryFuture,
) -> Result<(), KafkaError> {
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((err, _))) => Err(err),
        Err(_) => Err(KafkaError::Canceled),
    }
}

/// Runs one pipeline until `records` are done and measures it.
async fn measure(
    settings: Settings,
    read_delay: Duration,
    records: u64,
) -> Result<ControllerRun, ControllerBenchError> {
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(DelayedReads::new(
        MemoryBackend::new(clock.clone()),
        ReadDelay::Fixed(read_delay),
    ));
    let stats = Arc::new(PipelineStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let pipeline = tokio::spawn(weir_host::runner::run(
        settings,
        backend,
        clock,
        stats.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let started = Instant::now();
    let mut first: Option<(Instant, u64)> = None;
    while stats.records_done() < records {
        if started.elapsed() > RUN_LIMIT || pipeline.is_finished() {
            break;
        }
        if first.is_none() && stats.records_done() > 0 {
            first = Some((Instant::now(), stats.records_done()));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let done = stats.records_done();
    let records_per_s = first.map_or(0.0, |(at, n)| {
        (done - n) as f64 / at.elapsed().as_secs_f64().max(1e-9)
    });
    let _ = stop_tx.send(());
    match pipeline.await {
        Ok(result) => result?,
        Err(_) => return Err(KafkaError::Canceled.into()),
    }
    if done < records {
        return Err(ControllerBenchError::Timeout {
            done,
            records,
            limit: RUN_LIMIT,
        });
    }
    Ok(ControllerRun {
        read_delay_ms: 0,
        in_flight_max: 0,
        instances: 0,
        records: done,
        records_per_s,
        records_in_flight_peak: stats.records_in_flight_peak.load(Ordering::Relaxed),
        batches_in_flight_peak: stats.batches_in_flight_peak.load(Ordering::Relaxed),
        guest_calls: stats.guest_calls.load(Ordering::Relaxed),
    })
}

/// The runs as a table.
pub fn table(runs: &[ControllerRun]) -> String {
    let mut out = format!(
        "{:>9} {:>10} {:>10} {:>10} {:>12} {:>12} {:>13} {:>8}\n",
        "read ms",
        "in flight",
        "instances",
        "records",
        "records/s",
        "peak records",
        "peak batches",
        "calls"
    );
    for r in runs {
        out.push_str(&format!(
            "{:>9} {:>10} {:>10} {:>10} {:>12.0} {:>12} {:>13} {:>8}\n",
            r.read_delay_ms,
            r.in_flight_max,
            r.instances,
            r.records,
            r.records_per_s,
            r.records_in_flight_peak,
            r.batches_in_flight_peak,
            r.guest_calls
        ));
    }
    out
}
