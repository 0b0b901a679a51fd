//! Crash loop (issue 4, docs/checkpoints.md): a separate `weir` process runs the `counter`
//! operator with `lsm` state on the S3 server while input keeps arriving; it is killed again
//! and again — with SIGKILL at random moments, and by the named fail points between the SST
//! upload and the manifest write and between the manifest write and the offset commit — and
//! restarted each time with the same static group membership. At the end every key's count
//! equals its number of input records: no record lost, none counted twice. Output is
//! at-least-once here (a restarted shard re-emits what it recomputes), so outputs may repeat
//! but no count may exceed the key's number of records.

use rand::Rng;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use weir_tests::process::{CounterConfig, WeirProcess};
use weir_tests::*;

const PARTITIONS: i32 = 4;
const KEYS: u64 = 64;
const RECORDS_PER_ROUND: u64 = 300;

const BEFORE_MANIFEST: &str = "checkpoint-before-manifest";
const AFTER_MANIFEST: &str = "checkpoint-after-manifest";

/// How one round ends the process.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// SIGKILL after a random delay.
    Random,
    /// The named fail point aborts the process at one checkpoint in two.
    FailPoint(&'static str),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_fifty_times_every_count_is_exact() -> anyhow::Result<()> {
    crash_loop(false).await
}

/// The same in exactly-once mode, where the second fail point sits between the manifest write
/// and the transaction commit, and a `read_committed` consumer sees each update exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_killed_and_restarted_fifty_times_outputs_each_update_once()
-> anyhow::Result<()> {
    crash_loop(true).await
}

async fn crash_loop(exactly_once: bool) -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("crash-in"), unique("crash-out"), unique("crash-dlq"));
    create_topics(&[(&input, PARTITIONS), (&output, PARTITIONS), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let mut config = CounterConfig::new(&input, &output, &dlq).await?;
    config.instance_id = Some("crash-loop-host".to_owned());
    config.session_timeout_ms = 10_000;
    config.exactly_once = exactly_once;
    let config_path = dir.path().join("weir.toml");
    config.write(&config_path)?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));

    let mut rounds: Vec<Kill> = std::iter::repeat_n(Kill::Random, 30)
        .chain(std::iter::repeat_n(Kill::FailPoint(BEFORE_MANIFEST), 12))
        .chain(std::iter::repeat_n(Kill::FailPoint(AFTER_MANIFEST), 12))
        .collect();
    let mut rng = rand::thread_rng();
    for i in (1..rounds.len()).rev() {
        rounds.swap(i, rng.gen_range(0..=i));
    }

    let mut expected = BTreeMap::new();
    let mut produced = 0;
    let mut hits: BTreeMap<&str, usize> = BTreeMap::new();
    let mut kills = 0;
    for (round, kill) in rounds.iter().enumerate() {
        produce_counter(
            &input,
            PARTITIONS,
            (produced, produced + RECORDS_PER_ROUND),
            KEYS,
            &mut expected,
        )
        .await?;
        produced += RECORDS_PER_ROUND;
        let log = dir.path().join(format!("round-{round:02}.log"));
        let started = Instant::now();
        match kill {
            Kill::Random => {
                let mut weir = WeirProcess::spawn(bin, &config_path, log, &[])?;
                let delay = Duration::from_millis(rng.gen_range(200..3000));
                if let Some(status) = weir.wait(delay).await? {
                    anyhow::bail!(
                        "round {round}: weir exited on its own ({status}):\n{}",
                        weir.tail()
                    );
                }
                weir.kill().await?;
            }
            Kill::FailPoint(name) => {
                let fail_points = format!("{name}=50%return");
                let mut weir =
                    WeirProcess::spawn(bin, &config_path, log, &[("FAILPOINTS", &fail_points)])?;
                let status = weir.wait(Duration::from_secs(10)).await?;
                if weir
                    .log_text()
                    .contains(&format!("weir fail point hit: {name}"))
                {
                    *hits.entry(name).or_default() += 1;
                } else if status.is_some() {
                    anyhow::bail!(
                        "round {round}: weir exited ({status:?}) without hitting {name}:\n{}",
                        weir.tail()
                    );
                } else {
                    weir.kill().await?; // no checkpoint came up heads in time: a plain kill
                }
            }
        }
        kills += 1;
        eprintln!("round {round}: {kill:?} after {:?}", started.elapsed());
    }

    // A last run without fail points brings every count up to date.
    let started = Instant::now();
    let mut weir = WeirProcess::spawn(bin, &config_path, dir.path().join("final.log"), &[])?;
    let counts = read_counts(&output, &expected, Duration::from_secs(180)).await;
    eprintln!("final run: {:?}", started.elapsed());
    weir.kill().await?;
    let counts = counts.map_err(|e| e.context(weir.tail()))?;

    eprintln!(
        "crash loop (exactly_once={exactly_once}): {kills} kills, fail point hits {hits:?}, {produced} records, {} outputs",
        counts.values().map(Vec::len).sum::<usize>()
    );
    assert!(kills >= 50, "{kills} kills");
    for name in [BEFORE_MANIFEST, AFTER_MANIFEST] {
        assert!(
            hits.get(name).copied().unwrap_or(0) > 0,
            "fail point {name} was never hit: {hits:?}"
        );
    }
    assert_counts_exact(&expected, &counts);
    if exactly_once {
        for (key, n) in &expected {
            let once: Vec<u64> = (1..=*n).collect();
            assert_eq!(
                counts[key], once,
                "key {key}: each update exactly once, in order"
            );
        }
    }
    Ok(())
}
