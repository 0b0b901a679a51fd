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
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
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
    init_tracing();
    let (input, output, dlq) = (unique("crash-in"), unique("crash-out"), unique("crash-dlq"));
    create_topics(&[(&input, PARTITIONS), (&output, PARTITIONS), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let config = write_config(dir.path(), &input, &output, &dlq).await?;

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
        let fail_points = match kill {
            Kill::Random => None,
            Kill::FailPoint(name) => Some(format!("{name}=50%return")),
        };
        let started = std::time::Instant::now();
        let mut child = spawn_weir(&config, &log, fail_points.as_deref())?;
        match kill {
            Kill::Random => {
                let delay = Duration::from_millis(rng.gen_range(200..3000));
                tokio::time::sleep(delay).await;
                if let Some(status) = child.try_wait()? {
                    anyhow::bail!(
                        "round {round}: weir exited on its own ({status}):\n{}",
                        tail(&log)
                    );
                }
                child.kill().await?;
            }
            Kill::FailPoint(name) => {
                let status = wait_exit(&mut child, Duration::from_secs(10)).await?;
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains(&format!("weir fail point hit: {name}")) {
                    *hits.entry(name).or_default() += 1;
                } else if status.is_some() {
                    anyhow::bail!(
                        "round {round}: weir exited ({status:?}) without hitting {name}:\n{}",
                        tail(&log)
                    );
                }
            }
        }
        kills += 1;
        eprintln!("round {round}: {kill:?} after {:?}", started.elapsed());
    }

    // A last run without fail points brings every count up to date.
    let log = dir.path().join("final.log");
    let started = std::time::Instant::now();
    let mut child = spawn_weir(&config, &log, None)?;
    let counts = read_counts(&output, &expected, Duration::from_secs(180)).await;
    eprintln!("final run: {:?}", started.elapsed());
    child.kill().await?;
    let counts = counts.map_err(|e| e.context(tail(&log)))?;

    eprintln!(
        "crash loop: {kills} kills, fail point hits {hits:?}, {produced} records, {} outputs",
        counts.values().map(Vec::len).sum::<usize>()
    );
    assert!(kills >= 50, "{kills} kills");
    for name in [BEFORE_MANIFEST, AFTER_MANIFEST] {
        assert!(
            hits.get(name).copied().unwrap_or(0) > 0,
            "fail point {name} was never hit: {hits:?}"
        );
    }
    for (key, n) in &expected {
        let seen = &counts[key];
        assert_eq!(seen.iter().max(), Some(n), "key {key}: final count");
        for want in 1..=*n {
            assert!(
                seen.contains(&want),
                "key {key}: count {want} never emitted"
            );
        }
    }
    Ok(())
}

/// The pipeline's config: counter operator, `lsm` state on a new bucket with a 16 KiB memtable
/// (so checkpoints upload SSTs), checkpoints every 300 ms, static group membership so a
/// restarted process gets its partitions back at once.
async fn write_config(dir: &Path, input: &str, output: &str, dlq: &str) -> anyhow::Result<PathBuf> {
    let bucket = create_s3_bucket().await?;
    let options: String = s3_options()
        .iter()
        .map(|(k, v)| format!("{k} = \"{v}\"\n"))
        .collect();
    let config = format!(
        r#"[pipeline]
name = "{name}"
operator = "{operator}"
input_topics = ["{input}"]
output_topic = "{output}"
dead_letter_topic = "{dlq}"
group_id = "{group}"
checkpoint_interval = "300ms"

[kafka]
bootstrap_servers = "{bootstrap}"
[kafka.consumer]
"group.instance.id" = "crash-loop-host"
"session.timeout.ms" = "10000"

[state]
backend = "lsm"
[state.lsm]
url = "s3://{bucket}/weir"
memtable_bytes_max = 16384
block_size_bytes = 4096
block_cache_bytes = 8388608
disk_cache_bytes = 16777216
[state.lsm.options]
{options}"#,
        name = unique("crash"),
        operator = guest("weir_test_counter").display(),
        group = unique("crash-group"),
        bootstrap = kafka_bootstrap(),
    );
    let path = dir.join("weir.toml");
    std::fs::write(&path, config)?;
    Ok(path)
}

fn spawn_weir(config: &Path, log: &Path, fail_points: Option<&str>) -> anyhow::Result<Child> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    command
        .arg("run")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info,rdkafka=warn")
        .env_remove("FAILPOINTS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .kill_on_drop(true);
    if let Some(fail_points) = fail_points {
        command.env("FAILPOINTS", fail_points);
    }
    Ok(command.spawn()?)
}

/// Waits up to `timeout` for `child` to exit; kills it if it does not. `None` when killed.
async fn wait_exit(
    child: &mut Child,
    timeout: Duration,
) -> anyhow::Result<Option<std::process::ExitStatus>> {
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => Ok(Some(status?)),
        Err(_) => {
            child.kill().await?;
            Ok(None)
        }
    }
}

/// The last lines of a log, for a failure message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
