//! `weir bench` (host/src/pipeline_bench.rs) at a small size against the real broker: every
//! run processes all its input and measures what it claims, and the native baseline computes
//! exactly what the Wasm counter computes (the comparison is of the same logic).

use rdkafka::Message;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use std::collections::BTreeSet;
use std::time::Duration;
use weir_host::pipeline_bench::{self, Backend, Implementation, PipelineBenchOptions, Workload};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_measure_every_event_and_native_computes_what_wasm_computes()
-> anyhow::Result<()> {
    init_tracing();
    let store = tempfile::tempdir()?;
    let opts = PipelineBenchOptions {
        bootstrap_servers: kafka_bootstrap(),
        counter_operator: guest("weir_test_counter"),
        aggregate_operator: guest("flight_delays"),
        flights_csv: None,
        workloads: vec![Workload::Counter],
        implementations: vec![Implementation::Wasm, Implementation::Native],
        backends: vec![
            Backend::Memory,
            Backend::Lsm {
                cache_bytes: 1 << 20,
            },
        ],
        events: 3_000,
        keys: 300,
        partitions: 2,
        latency_rate: 500,
        latency_duration: Duration::from_secs(1),
        checkpoint_interval: Duration::from_millis(300),
        store_dir: store.path().to_owned(),
        progress: false,
    };
    let runs = pipeline_bench::run(&opts).await?;
    assert_eq!(runs.len(), 4);
    // Each run reads everything in the input: the bids, then each earlier run's latency
    // phase (2 × 500 events: a warm-up second, a measured one).
    for (i, run) in runs.iter().enumerate() {
        assert_eq!(run.events, 3_000 + 1_000 * i as u64, "{run:?}");
        assert!(run.events_per_s > 0.0, "{run:?}");
        assert_eq!(run.latency_samples, 500, "{run:?}");
        assert!(run.latency_p50_ms <= run.latency_p99_ms, "{run:?}");
        assert!(run.checkpoints >= 1, "{run:?}");
        assert!(run.store_requests["put"] >= run.checkpoints, "{run:?}");
        assert!(run.requests_per_checkpoint > 0.0 && run.request_cost_per_month_usd > 0.0);
    }
    let table = pipeline_bench::table(&runs);
    assert!(
        table.contains("wasm / native, Counter on memory"),
        "{table}"
    );
    assert!(
        table.contains("memory / lsm 1 MiB, Counter Wasm"),
        "{table}"
    );

    // The native run read all the Wasm run read (and more): every output of the Wasm run, a
    // count with the input offset it answers, is one of its outputs too.
    let wasm = read_all(&runs[0].output_topic, Duration::from_secs(3)).await?;
    let native = read_all(&runs[2].output_topic, Duration::from_secs(3)).await?;
    assert_eq!(wasm.len(), 4_000, "one output per event");
    assert_eq!(native.len(), 6_000);
    let missing: Vec<_> = wasm.difference(&native).take(3).collect();
    assert!(
        missing.is_empty(),
        "outputs only the Wasm counter gave: {missing:?}"
    );
    Ok(())
}
