//! Rescale 1 → 2 → 1 (issue 4, docs/checkpoints.md "Rebalance"): two `weir` processes share a
//! pipeline through the consumer group while input keeps arriving. The second host joins (the
//! first checkpoints and closes the partitions it loses, the second opens them from those
//! checkpoints), then leaves with Ctrl-C (a last checkpoint; the first opens them again). Every
//! key's count is exact at the end; each handover is reported from the hosts' logs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir_tests::process::{CounterConfig, WeirProcess, log_field, log_lines};
use weir_tests::*;

const PARTITIONS: i32 = 4;
const KEYS: u64 = 64;
const OPENED: &str = "first records processed after opening the shard";
const CLOSED: &str = "revoked partition closed";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_to_two_to_one_hosts_keeps_every_count_exact() -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (
        unique("rescale-in"),
        unique("rescale-out"),
        unique("rescale-dlq"),
    );
    create_topics(&[(&input, PARTITIONS), (&output, PARTITIONS), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let config = CounterConfig::new(&input, &output, &dlq).await?;
    let config_path = dir.path().join("weir.toml");
    config.write(&config_path)?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));

    // Input arrives all along: 100 records every 50 ms until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (input, stop) = (input.clone(), stop.clone());
        async move {
            let mut expected = BTreeMap::new();
            let mut next = 0;
            while !stop.load(Ordering::Relaxed) {
                produce_counter(&input, PARTITIONS, (next, next + 100), KEYS, &mut expected)
                    .await?;
                next += 100;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(expected)
        }
    });

    let mut a = WeirProcess::spawn(bin, &config_path, dir.path().join("a.log"), &[])?;
    a.wait_for_log(OPENED, PARTITIONS as usize, Duration::from_secs(60))
        .await?;

    // 1 → 2: b takes some partitions over.
    let mut b = WeirProcess::spawn(bin, &config_path, dir.path().join("b.log"), &[])?;
    // The range assignor gives each of two members half of the partitions.
    let b_opened = PARTITIONS as usize / 2;
    b.wait_for_log(OPENED, b_opened, Duration::from_secs(60))
        .await?;
    a.wait_for_log(
        OPENED,
        PARTITIONS as usize + b_opened,
        Duration::from_secs(60),
    )
    .await?;
    let a_opened = log_lines(&a.log_text(), OPENED).len();

    // 2 → 1: b leaves; a opens b's partitions again.
    b.signal("INT").await?;
    let status = b.wait(Duration::from_secs(60)).await?;
    assert!(
        status.is_some_and(|s| s.success()),
        "b stops cleanly on Ctrl-C ({status:?}):\n{}",
        b.tail()
    );
    a.wait_for_log(OPENED, a_opened + b_opened, Duration::from_secs(60))
        .await?;

    stop.store(true, Ordering::Relaxed);
    let expected = producer.await??;
    let counts = read_counts(&output, &expected, Duration::from_secs(120)).await;
    a.kill().await?;
    let counts = counts.map_err(|e| e.context(a.tail()))?;
    assert_counts_exact(&expected, &counts);

    let (a_log, b_log) = (a.log_text(), b.log_text());
    let ms = |log: &str, what: &str| -> Vec<u64> {
        log_lines(log, what)
            .iter()
            .filter_map(|l| log_field(l, "ms"))
            .collect()
    };
    eprintln!(
        "rescale: {} records; 1→2: a closed revoked partitions in {:?} ms, b opened {} in {:?} ms; 2→1: b closed in {:?} ms, a reopened in {:?} ms",
        expected.values().sum::<u64>(),
        ms(&a_log, CLOSED),
        b_opened,
        ms(&b_log, OPENED),
        ms(&b_log, CLOSED),
        &ms(&a_log, OPENED)[PARTITIONS as usize..],
    );
    Ok(())
}

/// The log line of a shard opened (of either stage), records or not.
const SHARD_OPENED: &str = "shard opened; partition resumes";

/// Rescale 1 → 2 → 1 of a pipeline of two stages (docs/topologies.md): `busiest-origin`
/// exactly-once, flights arriving all along. Each stage is a consumer group of its own, so the
/// second host takes half of each stage's partitions — upstream shards whose markers then come
/// from another process, downstream shards that resume their edge's watermark — and gives them
/// back when it leaves. Every hour's busiest origin and every late departure comes out once,
/// equal to the oracle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_of_stages_rescaled_one_to_two_to_one_emits_every_hour_once()
-> anyhow::Result<()> {
    use weir_cli::flights::{FlightRecord, KeyBy};
    use weir_tests::busiest::{
        BusiestTopics, busiest_oracle, busiest_process_config, check_busiest, oracle_flights,
        read_busiest,
    };
    const PER_SLICE: usize = 150;
    init_tracing();
    let (topics, mut config) = busiest_process_config("rescale-busiest").await?;
    let BusiestTopics {
        input,
        busiest,
        late,
    } = topics;
    let dir = tempfile::tempdir()?;
    let config_path = dir.path().join("weir.toml");
    config.write(&config_path)?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));

    // Flights arrive all along, a slice every 100 ms, in departure order, until told to stop.
    let flights: Vec<FlightRecord> =
        weir_cli::flights::read_csv_keyed(&flights_csv(), KeyBy::Origin)?;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (input, stop) = (input.clone(), stop.clone());
        async move {
            let loader = weir_cli::flights::Loader::new(&kafka_bootstrap())?;
            let mut sent = 0;
            for (i, slice) in flights.chunks(PER_SLICE).enumerate() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if i == 0 {
                    weir_cli::flights::produce(&kafka_bootstrap(), &input, slice).await?;
                } else {
                    loader.produce(&input, slice).await?;
                }
                sent += slice.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(flights.into_iter().take(sent).collect::<Vec<_>>())
        }
    });

    // Each of the two stages opens a shard per partition.
    let shards = 2 * PARTITIONS as usize;
    let mut a = WeirProcess::spawn(bin, &config_path, dir.path().join("a.log"), &[])?;
    a.wait_for_log(SHARD_OPENED, shards, Duration::from_secs(60))
        .await?;
    // 1 → 2: b takes half of each stage's partitions.
    let mut b = WeirProcess::spawn(bin, &config_path, dir.path().join("b.log"), &[])?;
    b.wait_for_log(SHARD_OPENED, shards / 2, Duration::from_secs(60))
        .await?;
    // 2 → 1: b leaves; a opens b's shards again.
    b.signal("INT").await?;
    let status = b.wait(Duration::from_secs(60)).await?;
    assert!(
        status.is_some_and(|s| s.success()),
        "b stops cleanly on Ctrl-C ({status:?}):\n{}",
        b.tail()
    );
    a.wait_for_log(SHARD_OPENED, shards + shards / 2, Duration::from_secs(60))
        .await?;
    stop.store(true, Ordering::Relaxed);
    let sent = producer.await??;
    a.signal("INT").await?;
    let status = a.wait(Duration::from_secs(60)).await?;
    assert!(
        status.is_some_and(|s| s.success()),
        "a stops cleanly on Ctrl-C ({status:?}):\n{}",
        a.tail()
    );

    let (want, want_late) = busiest_oracle(&oracle_flights(&sent)?);
    // A last run with `idle_advance` (not before: a pause of the producer would have let the
    // first stage's watermark jump to the clock, and every flight after it would be late):
    // once its input is quiet, the first stage's watermark follows the clock and closes the
    // last hours, and its markers close them downstream.
    config.pipeline_extra = "idle_timeout = \"2s\"\nidle_advance = true\n".to_owned();
    config.write(&config_path)?;
    let mut last = WeirProcess::spawn(bin, &config_path, dir.path().join("last.log"), &[])?;
    let outputs = read_busiest((&busiest, &late), (&want, &want_late)).await;
    last.kill().await?;
    let (out, late_out) = outputs.map_err(|e| e.context(last.tail()))?;
    eprintln!(
        "stages rescale: {} flights, {} hours, {} late departures",
        sent.len(),
        want.len(),
        late_out.len()
    );
    check_busiest("stages rescale", (&out, &late_out), (&want, &want_late))
}
