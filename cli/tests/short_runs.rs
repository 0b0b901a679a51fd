//! SCENARIOS.md S18, history that grows with every restart: one `lsm` shard (static membership,
//! 1 s checkpoints, 3,000 keys) started and ended again and again, each run living through one
//! checkpoint — SIGKILL and SIGTERM in turn — 12 runs in the short tier, 500 in the long one.
//! Retention makes progress even though no run lives long: the manifest directory stays
//! bounded, and every count is exact at the end. The time from a run's assignment to its
//! shard's open (the `shard opened` line) is printed for the first and last runs: with a
//! bounded history it does not grow (docs/reliability.md quotes the long tier's).

use futures::StreamExt as _;
use object_store::ObjectStore as _;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use weir_host::state::manifest::ManifestStore;
use weir_tests::process::{CounterConfig, WeirProcess, log_field, log_lines};
use weir_tests::*;

const KEYS: u64 = 3_000;
const OPENED: &str = "shard opened; partition resumes";
const COMMITTED: &str = "checkpoint committed";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_every_run_is_short_keeps_its_history_bounded() -> anyhow::Result<()> {
    init_tracing();
    let runs = tiered(12, 500);
    let (input, output, dlq) = (unique("short-in"), unique("short-out"), unique("short-dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let mut config = CounterConfig::new(&input, &output, &dlq).await?;
    config.instance_id = Some("short-runs-host".to_owned());
    config.checkpoint_interval = "1s".to_owned();
    let path = dir.path().join("weir.toml");
    config.write(&path)?;
    let debug = [("RUST_LOG", "info,rdkafka=warn,weir_host::pipeline=debug")];
    let mut expected = BTreeMap::new();
    let mut open_ms = Vec::with_capacity(runs);
    for run in 0..runs {
        // Something new for each run's checkpoint: 300 records over the 3,000 keys.
        let from = run as u64 * 300;
        produce_counter(&input, 1, (from, from + 300), KEYS, &mut expected).await?;
        let mut weir = WeirProcess::spawn(
            bin,
            &path,
            dir.path().join(format!("run-{run:03}.log")),
            &debug,
        )?;
        weir.wait_for_log(COMMITTED, 1, Duration::from_secs(60))
            .await?;
        let log = weir.log_text();
        if let Some(ms) = log_lines(&log, OPENED)
            .first()
            .and_then(|l| log_field(l, "ms"))
        {
            open_ms.push(ms);
        }
        if run % 2 == 0 {
            weir.kill().await?;
        } else {
            weir.signal("TERM").await?;
            weir.wait(Duration::from_secs(60))
                .await?
                .ok_or_else(|| anyhow::anyhow!("run {run}: no exit on SIGTERM: {}", weir.tail()))?;
        }
    }
    // What the runs left: a bounded history, read straight from the store.
    let (store, prefix) =
        weir_host::state::lsm::backend::object_store_from_url(&config.state_url, &s3_options())?;
    let root = weir_host::state::ShardId {
        pipeline: config.name.clone(),
        partition: weir_host::ids::Partition(0),
    }
    .root_under(&prefix);
    let versions = ManifestStore::new(store.clone(), root.clone())
        .versions()
        .await?;
    let ssts = store
        .list(Some(&object_store::path::Path::from(format!("{root}/sst"))))
        .count()
        .await;
    let median = |ms: &[u64]| {
        let mut ms = ms.to_vec();
        ms.sort_unstable();
        ms.get(ms.len() / 2).copied().unwrap_or_default()
    };
    // The baseline is the scenario's run 10 (runs 10–19): by then 3,000 records have reached
    // every key, so first and last open a shard of the same size and differ only in history
    // (the first runs open a shard that is still filling). A short tier has too few runs for
    // that and compares its halves.
    let n = open_ms.len();
    let (first, last) = if n >= 40 {
        (10..20, n - 10..n)
    } else {
        (0..n / 2, n - n / 2..n)
    };
    eprintln!(
        "{runs} short runs: {} manifest versions and {ssts} SSTs stored; assignment → open, median of runs {first:?} {} ms, of runs {last:?} {} ms",
        versions.len(),
        median(&open_ms[first.clone()]),
        median(&open_ms[last.clone()]),
    );
    // The last retained checkpoints, the claims between them and the last runs' own: the
    // history of a handful of runs, not of all of them.
    assert!(
        versions.len() <= 12,
        "{} manifest versions after {runs} runs: {versions:?}",
        versions.len()
    );
    // Every count exact: a last run brings the output up to date.
    let mut last = WeirProcess::spawn(bin, &path, dir.path().join("last.log"), &[])?;
    let counts = read_counts(&output, &expected, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", last.tail()))?;
    last.kill().await?;
    assert_counts_exact(&expected, &counts);
    Ok(())
}
