//! `weir dev`: the whole job on embedded defaults — librdkafka's mock cluster (or a broker you
//! name), the `flight-delays` operator, the flights table in, a summary out.

use crate::clock::{SharedClock, SystemClock};
use crate::config::{KafkaSettings, PipelineSettings, RuntimeSettings, Settings, StateSettings};
use crate::flights;
use crate::pipeline::{self, PipelineStats};
use crate::state::memory::MemoryBackend;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What `weir dev` runs.
#[derive(Debug, Clone)]
pub struct DevOptions {
    /// The `flight-delays` component.
    pub operator: PathBuf,
    /// The flights CSV (from `deploy/local/flights.sh`).
    pub flights_csv: PathBuf,
    /// A real broker; `None` starts librdkafka's mock cluster.
    pub bootstrap_servers: Option<String>,
    /// Input partitions.
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
}

/// Creates `topics` (name, partitions) with replication 1; existing topics are left as they are.
///
/// # Errors
/// [`KafkaError`] when the admin client fails or a creation fails for another reason.
pub async fn ensure_topics(
    bootstrap_servers: &str,
    topics: &[(&str, i32)],
) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers)
        .create()?;
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

/// Runs the job and prints a summary to stdout.
///
/// # Errors
/// [`DevError`] when any stage fails.
pub async fn run(opts: DevOptions) -> Result<(), DevError> {
    let mock;
    let bootstrap = match &opts.bootstrap_servers {
        Some(b) => b.clone(),
        None => {
            mock = MockCluster::new(1)?;
            println!(
                "started librdkafka's mock cluster at {}",
                mock.bootstrap_servers()
            );
            mock.bootstrap_servers()
        }
    };
    let run_id = std::process::id();
    let (input, output, dlq) = (
        format!("flights-{run_id}"),
        format!("route-stats-{run_id}"),
        format!("flights-dlq-{run_id}"),
    );
    ensure_topics(
        &bootstrap,
        &[
            (&input, opts.partitions),
            (&output, opts.partitions),
            (&dlq, 1),
        ],
    )
    .await?;

    let flights = flights::read_csv(&opts.flights_csv)?;
    let started = Instant::now();
    let loaded = flights::produce(&bootstrap, &input, &flights).await?;
    println!(
        "loaded {loaded} flights into `{input}` in {:.1?}",
        started.elapsed()
    );

    let settings = Settings {
        pipeline: PipelineSettings {
            name: "flight-delays".into(),
            operator: opts.operator.clone(),
            input_topics: vec![input.clone()],
            output_topic: output.clone(),
            dead_letter_topic: dlq.clone(),
            group_id: Some(format!("weir-dev-{run_id}")),
        },
        kafka: KafkaSettings {
            bootstrap_servers: bootstrap.clone(),
            consumer: BTreeMap::new(),
            producer: BTreeMap::new(),
        },
        runtime: RuntimeSettings::default(),
        state: StateSettings::default(),
    };
    let clock: SharedClock = Arc::new(SystemClock);
    let stats = Arc::new(PipelineStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let pipeline = tokio::spawn(pipeline::run(
        settings,
        Arc::new(MemoryBackend::new(clock.clone())),
        clock,
        stats.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let limit = Duration::from_secs(600);
    while stats.records_done() < loaded {
        if started.elapsed() > limit || pipeline.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
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
    let finals = read_final_stats(&bootstrap, &output, emitted).await?;
    print_summary(&stats, loaded, elapsed, &finals);
    Ok(())
}

/// Reads `expected` records of `topic` from the beginning and keeps the last stats per route.
async fn read_final_stats(
    bootstrap: &str,
    topic: &str,
    expected: u64,
) -> Result<BTreeMap<String, RouteStats>, DevError> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("weir-dev-reader-{}", std::process::id()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut finals = BTreeMap::new();
    let mut seen = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen < expected {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let Ok(msg) = tokio::time::timeout(remaining, consumer.recv()).await else {
            return Err(DevError::Timeout(
                Duration::from_secs(120),
                format!("read {seen} of {expected} outputs"),
            ));
        };
        let msg = msg?;
        seen += 1;
        if let Some(stats) = msg
            .payload()
            .and_then(|p| serde_json::from_slice::<RouteStats>(p).ok())
        {
            finals.insert(stats.route.clone(), stats);
        }
    }
    Ok(finals)
}

fn print_summary(
    stats: &PipelineStats,
    loaded: u64,
    elapsed: Duration,
    finals: &BTreeMap<String, RouteStats>,
) {
    let calls = stats.guest_calls.load(Ordering::Relaxed);
    let call_ns = stats.guest_call_ns.load(Ordering::Relaxed);
    println!();
    println!(
        "processed {loaded} flights in {elapsed:.2?}: {:.0} records/s",
        loaded as f64 / elapsed.as_secs_f64()
    );
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
