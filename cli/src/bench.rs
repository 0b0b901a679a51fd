//! `weir bench-call`: the per-record cost of calling an operator, in process, without Kafka:
//! prefetch → guest call → apply state, over batches of several sizes, on the `memory` backend.
//! Emits are staged and dropped. This isolates the Wasm boundary from the broker.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::RuntimeSettings;
use weir_host::ids::Partition;
use weir_host::pipeline::prefetch;
use weir_host::runtime::{InputRecord, Runtime, RuntimeError};
use weir_host::state::memory::{MemoryBackend, MemoryShard};
use weir_host::state::{Shard, ShardId, StateBackend, StateError};

/// What `weir bench-call` measures (its options).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchCallOptions {
    /// The component to measure.
    #[arg(long, default_value = "target/wasm32-wasip2/guest/flight_delays.wasm")]
    pub operator: PathBuf,
    /// Use the first `--records` flights of this CSV as input (else synthetic flights).
    #[arg(long)]
    pub flights: Option<PathBuf>,
    /// Records per batch size.
    #[arg(long, default_value_t = 200_000)]
    pub records: usize,
    /// Batch sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,16,128,512")]
    pub batch: Vec<usize>,
}

/// One measured batch size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CallCost {
    /// Records per guest call.
    pub batch_records: usize,
    /// Records processed.
    pub records: usize,
    /// Wall time, ns per record (prefetch + call + apply).
    pub ns_per_record: f64,
    /// Records per second on one core.
    pub records_per_s: f64,
}

/// What it costs to start an operator.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct StartCost {
    /// Compiling the component, checking its world and calling `describe` (what an upload and
    /// a pipeline start pay once per host), ms.
    pub load_ms: f64,
    /// The same from the compiled directory ([`Runtime::with_compiled_dir`]), as a restarted
    /// host loads it, ms.
    pub load_compiled_ms: f64,
    /// Mean time to create an instance from the pre-instantiated operator (pooling allocator),
    /// µs.
    pub instantiate_us: f64,
}

/// Loads the operator at `path` once and instantiates it `n` times.
///
/// # Errors
/// [`BenchError::Operator`] when loading or instantiating fails.
pub async fn start_cost(path: &Path, n: u32) -> Result<StartCost, BenchError> {
    let clock: SharedClock = Arc::new(SystemClock);
    let compiled = tempfile::tempdir().map_err(BenchError::Compiled)?;
    let runtime = || {
        Runtime::<MemoryShard>::new(&RuntimeSettings::default(), clock.clone())
            .map(|r| r.with_compiled_dir(compiled.path().to_owned()))
    };
    let started = Instant::now();
    let operator = runtime()?.load_operator(path).await?;
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let restarted = runtime()?.load_operator(path).await?;
    let load_compiled_ms = started.elapsed().as_secs_f64() * 1e3;
    if !restarted.from_compiled_dir() {
        return Err(BenchError::Compiled(std::io::Error::other(
            "the compiled component was not kept (see the warning logged)",
        )));
    }
    let started = Instant::now();
    for _ in 0..n {
        drop(operator.instantiate(None, "bench/0".into()).await?);
    }
    Ok(StartCost {
        load_ms,
        load_compiled_ms,
        instantiate_us: started.elapsed().as_secs_f64() * 1e6 / f64::from(n.max(1)),
    })
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The operator could not be loaded.
    #[error("cannot load operator")]
    Operator(#[from] RuntimeError),
    /// A call failed.
    #[error("guest call failed: {0}")]
    Call(String),
    /// The state backend failed.
    #[error("state failed")]
    State(#[from] StateError),
    /// The temporary compiled directory could not be made or used.
    #[error("cannot use a compiled directory")]
    Compiled(#[source] std::io::Error),
}

/// Measures the operator at `path` on `inputs` (key, value) records, for each batch size.
///
/// # Errors
/// [`BenchError`] when loading fails or a call fails.
pub async fn call_cost(
    path: &Path,
    inputs: &[(Vec<u8>, Vec<u8>)],
    batch_sizes: &[usize],
) -> Result<Vec<CallCost>, BenchError> {
    let clock: SharedClock = Arc::new(SystemClock);
    let settings = RuntimeSettings {
        record_deadline: Duration::from_secs(1),
        batch_deadline_max: Duration::from_secs(60),
        ..RuntimeSettings::default()
    };
    let runtime = Runtime::<MemoryShard>::new(&settings, clock.clone())?;
    let operator = runtime.load_operator(path).await?;
    let mut results = Vec::new();
    for &batch_records in batch_sizes {
        let backend = MemoryBackend::new(clock.clone());
        let id = ShardId {
            pipeline: "bench".into(),
            partition: Partition(0),
        };
        let shard = Arc::new(backend.open_shard(&id).await?);
        let mut instance = operator
            .instantiate(Some(shard.clone()), "bench/0".into())
            .await?;
        let batches: Vec<Arc<Vec<InputRecord>>> = inputs
            .chunks(batch_records)
            .enumerate()
            .map(|(b, chunk)| {
                Arc::new(
                    chunk
                        .iter()
                        .enumerate()
                        .map(|(i, (key, value))| InputRecord {
                            key: key.clone(),
                            value: value.clone(),
                            timestamp_ms: 0,
                            headers: Vec::new(),
                            topic: "bench".into(),
                            partition: 0,
                            offset: (b * batch_records + i) as i64,
                            input: 0,
                        })
                        .collect(),
                )
            })
            .collect();
        let started = Instant::now();
        for records in batches {
            let batch = prefetch(&*shard, &operator.meta().value_states, records).await?;
            let (_, batch) = instance
                .call_batch(batch, settings.batch_deadline_max)
                .await
                .map_err(|e| BenchError::Call(e.to_string()))?;
            let (writes, emits) = batch.into_effects();
            shard.apply(writes).await?;
            drop(emits);
        }
        let elapsed = started.elapsed();
        let ns_per_record = elapsed.as_nanos() as f64 / inputs.len() as f64;
        results.push(CallCost {
            batch_records,
            records: inputs.len(),
            ns_per_record,
            records_per_s: 1e9 / ns_per_record,
        });
    }
    Ok(results)
}

/// Runs `weir bench-call` and prints its report.
///
/// # Errors
/// An operator or flights file that cannot be read or loaded, or a failed call.
pub async fn command(opts: &BenchCallOptions, output: crate::Output) -> anyhow::Result<()> {
    let BenchCallOptions {
        operator,
        flights,
        records,
        batch,
    } = opts;
    let (operator, records) = (operator.as_path(), *records);
    let inputs: Vec<(Vec<u8>, Vec<u8>)> = match flights {
        Some(csv) => crate::flights::read_csv(csv)?
            .into_iter()
            .take(records)
            .map(|f| (f.key.into_bytes(), f.json))
            .collect(),
        None => (0..records)
            .map(|i| {
                let (origin, dest) = (["JFK", "LGA", "EWR"][i % 3], format!("D{:02}", i % 97));
                let value = format!(
                    r#"{{"origin":"{origin}","dest":"{dest}","arr_delay":{}}}"#,
                    (i % 120) as i64 - 20
                );
                (format!("{origin}-{dest}").into_bytes(), value.into_bytes())
            })
            .collect(),
    };
    let results = call_cost(operator, &inputs, batch).await?;
    let start = start_cost(operator, 200).await?;
    let size_bytes = std::fs::metadata(operator)?.len();
    if output.json {
        let report = serde_json::json!({
            "operator": operator.display().to_string(),
            "component_bytes": size_bytes,
            "load_ms": start.load_ms,
            "load_compiled_ms": start.load_compiled_ms,
            "instantiate_us": start.instantiate_us,
            "batches": results,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {size_bytes} bytes, {:.0} ms to load (compile, check, describe), {:.0} ms compiled (a restarted host), {:.1} µs to instantiate (mean of 200)",
            operator.display(),
            start.load_ms,
            start.load_compiled_ms,
            start.instantiate_us
        );
        println!(
            "{:>8} {:>10} {:>14} {:>14}",
            "batch", "records", "ns/record", "records/s"
        );
        for r in &results {
            println!(
                "{:>8} {:>10} {:>14.0} {:>14.0}",
                r.batch_records, r.records, r.ns_per_record, r.records_per_s
            );
        }
    }
    Ok(())
}
