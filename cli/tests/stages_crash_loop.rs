//! A crash loop over a pipeline of stages (docs/topologies.md): `examples/busiest-origin`
//! exactly-once on `lsm` on the S3 server, one `weir run` process running both stages, fed a
//! slice of the flights per round while it is killed and restarted at least 50 times (6 in the
//! short tier) — with SIGKILL at random moments and at the fail points around the checkpoint
//! and inside a timer round, which both stages pass: between an upstream's produce to the
//! internal topic and its checkpoint (after the manifest, before the transaction commits; after
//! a timer round's emits), and between a downstream's read and its checkpoint (before the
//! manifest). A last run with `idle_advance` closes the last hours. A `read_committed` consumer
//! sees every hour's busiest origin exactly once and every late departure exactly once, equal
//! to the oracle.

use crate::crash_loop::{
    AFTER_MANIFEST, BEFORE_MANIFEST, TIMERS_AFTER_EMIT, TIMERS_BEFORE_APPLY, flights_rounds,
    shuffled_rounds,
};
use std::path::Path;
use std::time::Instant;
use weir_cli::flights::{FlightRecord, KeyBy};
use weir_tests::busiest::{
    BusiestTopics, busiest_oracle, busiest_process_config, check_busiest, oracle_flights,
    read_busiest,
};
use weir_tests::process::WeirProcess;
use weir_tests::*;

const FLIGHTS_PER_ROUND: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_killed_and_restarted_again_and_again_emit_each_hour_and_late_flight_once()
-> anyhow::Result<()> {
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
    let (want, want_late) = busiest_oracle(&oracle_flights(&flights)?);

    let (topics, mut config) = busiest_process_config("stages-crash").await?;
    let BusiestTopics {
        input,
        busiest,
        late,
    } = topics;
    let dir = tempfile::tempdir()?;
    config.instance_id = Some("stages-crash-loop-host".to_owned());
    config.session_timeout_ms = 10_000;
    let config_path = dir.path().join("weir.toml");
    config.write(&config_path)?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));

    let hits = flights_rounds(
        (bin, &config_path, dir.path()),
        &rounds,
        (&input, &flights, FLIGHTS_PER_ROUND),
        // A round may feed one partition only, and each stage's timer rounds and checkpoints
        // may come once: each point at its first evaluation.
        1,
        &mut rng,
    )
    .await?;

    // The last run: once the first stage's consumer has caught up and its input is quiet for
    // 2 s, its watermark follows the clock, every hour left closes there, and its markers close
    // them in the second stage.
    config.pipeline_extra = "idle_timeout = \"2s\"\nidle_advance = true\n".to_owned();
    config.write(&config_path)?;
    let started = Instant::now();
    let mut weir = WeirProcess::spawn(bin, &config_path, dir.path().join("final.log"), &[])?;
    let outputs = read_busiest((&busiest, &late), (&want, &want_late)).await;
    eprintln!("final run: {:?}", started.elapsed());
    weir.kill().await?;
    let (out, late_out) = outputs.map_err(|e| e.context(weir.tail()))?;
    eprintln!(
        "stages crash loop: {} kills, fail point hits {hits:?}, {} flights, {} hours, {} late departures",
        rounds.len(),
        flights.len(),
        want.len(),
        late_out.len()
    );
    assert!(rounds.len() >= tiered(6, 50));
    for name in points {
        assert!(
            hits.get(name).copied().unwrap_or(0) > 0,
            "fail point {name} was never hit: {hits:?}"
        );
    }
    check_busiest("stages crash loop", (&out, &late_out), (&want, &want_late))
}
