//! Crash loop (issue 4, docs/checkpoints.md), 50 kills in the long tier and 6 in the short
//! one (`weir_tests::long_tier`): a separate `weir` process runs the `counter`
//! operator with `lsm` state on the S3 server while input keeps arriving; it is killed again
//! and again — with SIGKILL at random moments, and by the named fail points between the SST
//! upload and the manifest write and between the manifest write and the offset commit — and
//! restarted each time with the same static group membership. At the end every key's count
//! equals its number of input records: no record lost, none counted twice. Output is
//! at-least-once here (a restarted shard re-emits what it recomputes), so outputs may repeat
//! but no count may exceed the key's number of records.
//!
//! The same for timers (issue 18): `airport-hours` (hourly windows closed by event-time timers)
//! exactly-once, also killed at the fail points inside a timer round; every hour is emitted
//! exactly once and equals an oracle.

use rand::Rng;
use rand::rngs::ThreadRng;
use rdkafka::Message;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use weir_cli::flights::{FlightRecord, KeyBy};
use weir_tests::process::{CounterConfig, WeirProcess};
use weir_tests::*;

const PARTITIONS: i32 = 4;
const KEYS: u64 = 64;
const RECORDS_PER_ROUND: u64 = 300;

pub(crate) const BEFORE_MANIFEST: &str = "checkpoint-before-manifest";
pub(crate) const AFTER_MANIFEST: &str = "checkpoint-after-manifest";
pub(crate) const TIMERS_BEFORE_APPLY: &str = "timers-before-apply";
pub(crate) const TIMERS_AFTER_EMIT: &str = "timers-after-emit";

/// How one round ends the process.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kill {
    /// SIGKILL after a random delay.
    Random,
    /// The named fail point aborts the process at one checkpoint in two.
    FailPoint(&'static str),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_again_and_again_every_count_is_exact() -> anyhow::Result<()> {
    crash_loop(false).await
}

/// The same in exactly-once mode, where the second fail point sits between the manifest write
/// and the transaction commit, and a `read_committed` consumer sees each update exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_killed_and_restarted_again_and_again_outputs_each_update_once()
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
    let mut rng = rand::thread_rng();
    let (random, per_point) = tiered((4, 1), (30, 12));
    let rounds = shuffled_rounds(
        random,
        &[BEFORE_MANIFEST, AFTER_MANIFEST],
        per_point,
        &mut rng,
    );
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
        run_and_kill(
            bin,
            &config_path,
            log,
            round,
            // Every partition gets records each round and checkpoints them: at least
            // PARTITIONS evaluations of a checkpoint's fail points.
            (*kill, PARTITIONS.unsigned_abs()),
            &mut rng,
            &mut hits,
        )
        .await?;
        kills += 1;
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
    assert!(kills >= tiered(6, 50), "{kills} kills");
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

/// `random` rounds of SIGKILL at a random moment and `per_point` rounds at each fail point,
/// shuffled.
pub(crate) fn shuffled_rounds(
    random: usize,
    points: &[&'static str],
    per_point: usize,
    rng: &mut ThreadRng,
) -> Vec<Kill> {
    let mut rounds: Vec<Kill> = std::iter::repeat_n(Kill::Random, random)
        .chain(
            points
                .iter()
                .flat_map(|p| std::iter::repeat_n(Kill::FailPoint(p), per_point)),
        )
        .collect();
    for i in (1..rounds.len()).rev() {
        rounds.swap(i, rng.gen_range(0..=i));
    }
    rounds
}

/// The `FAILPOINTS` entry that arms `name` to abort the process at its `skip + 1`-th
/// evaluation (the fail crate's `N*off->return`): deterministic, unlike a percentage. A fail
/// point is evaluated only where its step runs (a checkpoint only when its shard is dirty), and
/// a round that catches up in one batch per partition evaluates it about once per partition:
/// armed at 50 %, four partitions all came up tails one round in sixteen, and a short tier that
/// arms each point once failed "never hit" (more often beside a CPU hog, whose bigger batches
/// mean fewer checkpoints).
pub(crate) fn arm(name: &str, skip: u32) -> String {
    if skip == 0 {
        format!("{name}=return")
    } else {
        format!("{name}={skip}*off->return")
    }
}

/// One evaluation of the fail point the test below arms: whether it fired.
fn evaluate_armed_point() -> bool {
    fail::fail_point!("crash-loop-arm-test", |_| true);
    false
}

#[test]
fn an_armed_point_aborts_at_the_evaluation_after_those_it_skips() -> anyhow::Result<()> {
    let scenario = fail::FailScenario::setup();
    for skip in 0..4 {
        let entry = arm("crash-loop-arm-test", skip);
        let (name, actions) = entry.split_once('=').expect("name=actions");
        fail::cfg(name, actions).map_err(anyhow::Error::msg)?;
        let fired: Vec<bool> = (0..6).map(|_| evaluate_armed_point()).collect();
        let want: Vec<bool> = (0..6).map(|i| i >= skip).collect();
        assert_eq!(fired, want, "{entry}");
        fail::remove(name);
    }
    scenario.teardown();
    Ok(())
}

/// Starts `weir` on `config_path` and ends it as `kill` says: SIGKILL after a random delay, or
/// the fail point aborting it at one of its first `skip_below` evaluations (drawn; a round must
/// make at least that many), counted in `hits` (a plain SIGKILL if it does not come up within
/// 60 s).
pub(crate) async fn run_and_kill(
    bin: &Path,
    config_path: &Path,
    log: std::path::PathBuf,
    round: usize,
    (kill, skip_below): (Kill, u32),
    rng: &mut ThreadRng,
    hits: &mut BTreeMap<&'static str, usize>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    match kill {
        Kill::Random => {
            let mut weir = WeirProcess::spawn(bin, config_path, log, &[])?;
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
            let fail_points = arm(name, rng.gen_range(0..skip_below.max(1)));
            let mut weir =
                WeirProcess::spawn(bin, config_path, log, &[("FAILPOINTS", &fail_points)])?;
            // The round ends at its fail point: wait for the hit (within the evaluations every
            // round makes) or an exit, not for a fixed time — on a loaded machine a first
            // checkpoint can take longer than 10 s.
            let needle = format!("weir fail point hit: {name}");
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut status = None;
            while !weir.log_text().contains(&needle) && Instant::now() < deadline {
                status = weir.wait(Duration::from_millis(100)).await?;
                if status.is_some() {
                    break;
                }
            }
            if weir.log_text().contains(&needle) {
                *hits.entry(name).or_default() += 1;
            } else if status.is_some() {
                anyhow::bail!(
                    "round {round}: weir exited ({status:?}) without hitting {name}:\n{}",
                    weir.tail()
                );
            } else {
                // Not heads in time: a plain kill. An armed point that never comes up in 60 s
                // means no checkpoint in 60 s — the log says what the process did instead.
                eprintln!(
                    "round {round}: {name} not hit in 60 s; its log ends:\n{}",
                    weir.tail()
                );
                weir.kill().await?;
            }
        }
    }
    eprintln!("round {round}: {kill:?} after {:?}", started.elapsed());
    Ok(())
}

/// The rounds of a crash loop over the flights: before each, the next `per_round` of
/// `flights` go to `input`; then `weir` runs on `config` and is ended as the round says
/// ([`run_and_kill`], fail points hit at one of their first `skip_below` evaluations), its
/// log in `dir`. Returns the fail points' hits.
pub(crate) async fn flights_rounds(
    (bin, config, dir): (&Path, &Path, &Path),
    rounds: &[Kill],
    (input, flights, per_round): (&str, &[FlightRecord], usize),
    skip_below: u32,
    rng: &mut ThreadRng,
) -> anyhow::Result<BTreeMap<&'static str, usize>> {
    // The first slice through `produce`, which turns off the topic's time-based retention (the
    // records carry 2013 timestamps).
    let loader = weir_cli::flights::Loader::new(&kafka_bootstrap())?;
    let mut hits = BTreeMap::new();
    for (round, (kill, slice)) in rounds.iter().zip(flights.chunks(per_round)).enumerate() {
        if round == 0 {
            weir_cli::flights::produce(&kafka_bootstrap(), input, slice).await?;
        } else {
            loader.produce(input, slice).await?;
        }
        let log = dir.join(format!("round-{round:02}.log"));
        run_and_kill(bin, config, log, round, (*kill, skip_below), rng, &mut hits).await?;
    }
    Ok(hits)
}

/// One (origin, hour) of the windows oracle.
#[derive(Debug, Default, PartialEq)]
struct Hour {
    flights: u64,
    delay_count: u64,
    delay_sum: i64,
    delay_max: Option<i64>,
}

/// `airport-hours` exactly-once on `lsm` on the S3 server over the first flights of the year,
/// fed a slice per round while it is killed and restarted at least 50 times (6 in the short
/// tier) — with SIGKILL at
/// random moments and at the fail points inside a timer round (after the `on-timers` call,
/// before its effects apply; after they apply and its emits are sent, before a checkpoint holds
/// them) and around the checkpoint. A last run with `idle_advance` closes the last hours. Every
/// (origin, hour) is emitted exactly once (read_committed), equal to the oracle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_killed_and_restarted_again_and_again_close_each_hour_exactly_once()
-> anyhow::Result<()> {
    const FLIGHTS_PER_ROUND: usize = 150;
    init_tracing();
    let mut rng = rand::thread_rng();
    let points = [
        BEFORE_MANIFEST,
        AFTER_MANIFEST,
        TIMERS_BEFORE_APPLY,
        TIMERS_AFTER_EMIT,
    ];
    let (random, per_point) = tiered((2, 1), (30, 6));
    let rounds = shuffled_rounds(random, &points, per_point, &mut rng);
    let flights: Vec<FlightRecord> =
        weir_cli::flights::read_csv_keyed(&flights_csv(), KeyBy::Origin)?
            .into_iter()
            .take(rounds.len() * FLIGHTS_PER_ROUND)
            .collect();
    let mut want: BTreeMap<(String, i64), Hour> = BTreeMap::new();
    for f in &flights {
        let start = f.timestamp_ms - f.timestamp_ms.rem_euclid(3_600_000);
        let v: serde_json::Value = serde_json::from_slice(&f.json)?;
        let h = want.entry((f.key.clone(), start)).or_default();
        h.flights += 1;
        if let Some(d) = v["arr_delay"].as_i64() {
            h.delay_count += 1;
            h.delay_sum += d;
            h.delay_max = Some(h.delay_max.map_or(d, |m| m.max(d)));
        }
    }

    let (input, output, dlq) = (unique("hours-in"), unique("hours-out"), unique("hours-dlq"));
    create_topics(&[(&input, PARTITIONS), (&output, PARTITIONS), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let mut config = CounterConfig::new(&input, &output, &dlq).await?;
    config.operator = guest("airport_hours");
    config.instance_id = Some("timers-crash-loop-host".to_owned());
    config.session_timeout_ms = 10_000;
    config.exactly_once = true;
    config.pipeline_extra = "late_records = \"process\"\n".to_owned();
    let config_path = dir.path().join("weir.toml");
    config.write(&config_path)?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));

    let hits = flights_rounds(
        (bin, &config_path, dir.path()),
        &rounds,
        (&input, &flights, FLIGHTS_PER_ROUND),
        // Three origins over four partitions: a round may feed only one partition, and its
        // timer rounds and checkpoints may come once. Each point at its first evaluation.
        1,
        &mut rng,
    )
    .await?;

    // The last run: once its consumer has caught up and the input is quiet for 2 s, the
    // watermark follows the clock and every hour left closes.
    config.pipeline_extra += "idle_timeout = \"2s\"\nidle_advance = true\n";
    config.write(&config_path)?;
    let started = Instant::now();
    let mut weir = WeirProcess::spawn(bin, &config_path, dir.path().join("final.log"), &[])?;
    let out = read_exactly(
        &output,
        want.len(),
        Duration::from_secs(180),
        Duration::from_secs(5),
    )
    .await;
    eprintln!("final run: {:?}", started.elapsed());
    weir.kill().await?;
    let out = out.map_err(|e| e.context(weir.tail()))?;
    eprintln!(
        "timers crash loop: {} kills, fail point hits {hits:?}, {} flights, {} hours",
        rounds.len(),
        flights.len(),
        want.len()
    );
    assert!(rounds.len() >= tiered(6, 50));
    for name in points {
        assert!(
            hits.get(name).copied().unwrap_or(0) > 0,
            "fail point {name} was never hit: {hits:?}"
        );
    }
    let mut got: BTreeMap<(String, i64), serde_json::Value> = BTreeMap::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let key = (
            v["origin"].as_str().unwrap_or_default().to_owned(),
            v["hour_start_ms"].as_i64().unwrap_or_default(),
        );
        assert_eq!(v["update"], serde_json::Value::Bool(false), "{key:?}");
        assert!(
            got.insert(key.clone(), v).is_none(),
            "{key:?} emitted twice"
        );
    }
    for (key, want) in &want {
        let v = got.get(key).unwrap_or_else(|| panic!("{key:?} missing"));
        assert_eq!(v["flights"].as_u64(), Some(want.flights), "{key:?}");
        assert_eq!(v["delay_count"].as_u64(), Some(want.delay_count), "{key:?}");
        assert_eq!(v["delay_max"].as_i64(), want.delay_max, "{key:?}");
        if want.delay_count > 0 {
            let mean = want.delay_sum as f64 / want.delay_count as f64;
            let got_mean = v["delay_mean"].as_f64().unwrap_or(f64::NAN);
            assert!(
                (got_mean - mean).abs() <= 1e-9,
                "{key:?}: {got_mean} vs {mean}"
            );
        }
    }
    Ok(())
}
