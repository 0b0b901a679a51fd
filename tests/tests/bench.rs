//! `weir bench` (cli/src/pipeline_bench/) at a small size against the real broker: every
//! run processes all its input and measures what it claims, and the native baseline computes
//! exactly what the Wasm counter computes (the comparison is of the same logic).

use rdkafka::Message;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use std::collections::BTreeSet;
use std::time::Duration;
use weir_cli::pipeline_bench::{self, Backend, Implementation, PipelineBenchOptions, Workload};
use weir_tests::*;

/// Every `(key, value)` in `topic` (read from the start until `timeout` passes without one).
async fn read_all(topic: &str, timeout: Duration) -> anyhow::Result<BTreeSet<(Vec<u8>, Vec<u8>)>> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("bench-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut out = BTreeSet::new();
    while let Ok(message) = tokio::time::timeout(timeout, consumer.recv()).await {
        let message = message?;
        out.insert((
            message.key().unwrap_or_default().to_vec(),
            message.payload().unwrap_or_default().to_vec(),
        ));
    }
    Ok(out)
}

/// Bids each run reads: a slice in the short tier.
fn events() -> u64 {
    tiered(1_000, 3_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_measure_every_event_and_native_computes_what_wasm_computes()
-> anyhow::Result<()> {
    init_tracing();
    let store = tempfile::tempdir()?;
    let opts = PipelineBenchOptions {
        bootstrap_servers: kafka_bootstrap(),
        counter_operator: guest("weir_test_counter"),
        aggregate_operator: guest("flight_delays"),
        aggregate_python_operator: guest("flight_delays_py"),
        flights_csv: None,
        workloads: vec![Workload::Counter],
        // The counter has no Python port: `python` runs only the aggregate workload.
        implementations: vec![
            Implementation::Wasm,
            Implementation::Native,
            Implementation::Python,
        ],
        backends: vec![
            Backend::Memory,
            Backend::Lsm {
                cache_bytes: 1 << 20,
            },
        ],
        events: events(),
        keys: 300,
        partitions: 2,
        latency_rate: 500,
        latency_duration: Duration::from_secs(1),
        checkpoint_interval: Duration::from_millis(300),
        store_dir: store.path().to_owned(),
        repeats: 1,
        // Kept to compare the outputs below.
        keep_topics: true,
        trap_rates: vec![0.0, 0.1],
        progress: false,
    };
    let runs = pipeline_bench::run(&opts).await?;
    assert!(
        store.path().read_dir()?.next().is_none(),
        "the store directory is left as it was (the runs' own subdirectory removed)"
    );
    // Trap-free, the four runs; with 10 % of the input trapping, the component alone.
    let (trapping, runs): (Vec<_>, Vec<_>) = runs.into_iter().partition(|r| r.trap_rate > 0.0);
    assert_eq!(runs.len(), 4);
    assert_eq!(trapping.len(), 2, "Wasm on each backend");
    for run in &trapping {
        assert_eq!(run.implementation, Implementation::Wasm);
        assert_eq!(
            run.events,
            events(),
            "every event, trapping or not, is measured: {run:?}"
        );
    }
    let all: Vec<_> = runs.iter().chain(&trapping).cloned().collect();
    assert!(
        pipeline_bench::table(&all).contains("10 % traps / none, counter wasm on memory: "),
        "{}",
        pipeline_bench::table(&all)
    );
    // Every run reads exactly the preloaded bids, then its own latency phase (a warm-up
    // second and a measured one, 500 events each).
    for run in &runs {
        assert_eq!(run.events, events(), "{run:?}");
        assert!(run.events_per_s > 0.0, "{run:?}");
        assert_eq!(run.latency_samples, 500, "{run:?}");
        assert!(run.latency_p50_ms <= run.latency_p99_ms, "{run:?}");
        assert!(run.checkpoints >= 1, "{run:?}");
        assert!(run.store_requests["put"] >= run.checkpoints, "{run:?}");
        assert!(run.requests_per_checkpoint > 0.0 && run.request_cost_per_month_usd > 0.0);
    }
    assert_eq!(
        runs.iter()
            .map(|r| (r.implementation, r.backend))
            .collect::<Vec<_>>(),
        vec![
            (Implementation::Wasm, Backend::Memory),
            (Implementation::Native, Backend::Memory),
            (
                Implementation::Wasm,
                Backend::Lsm {
                    cache_bytes: 1 << 20
                }
            ),
            (
                Implementation::Native,
                Backend::Lsm {
                    cache_bytes: 1 << 20
                }
            ),
        ],
        "wasm and native of one backend run back to back"
    );
    let table = pipeline_bench::table(&runs);
    assert!(
        table.contains("wasm / native, counter on memory: "),
        "{table}"
    );
    assert!(
        table.contains("memory / lsm 1 MiB, counter wasm: "),
        "{table}"
    );

    // Both read the same input: the native counter gave exactly the Wasm counter's outputs
    // (a count with the input offset it answers).
    let wasm = read_all(&runs[0].output_topic, Duration::from_secs(3)).await?;
    let native = read_all(&runs[1].output_topic, Duration::from_secs(3)).await?;
    // One output per event: the preloaded bids, then the latency phase's two seconds at 500/s.
    assert_eq!(
        wasm.len(),
        events() as usize + 1_000,
        "one output per event"
    );
    assert!(
        wasm == native,
        "the native counter's outputs differ from the Wasm counter's"
    );
    Ok(())
}
