//! SCENARIOS.md S19, a checkpoint slower than the transaction timeout: exactly-once, with
//! `transaction.timeout.ms` at 3 s and one checkpoint's manifest write held for 8 s (the
//! `checkpoint-before-manifest` fail point sleeping), the broker aborts the checkpoint's
//! transaction. `weir run` says so — the slow write and `transaction.timeout.ms` — instead of
//! taking the abort for another owner's fencing, reopens the shard from its last decided
//! checkpoint by itself, and a `read_committed` reader sees every count once.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use weir_tests::process::{CounterConfig, WeirProcess};
use weir_tests::*;

const KEYS: u64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_slower_than_the_transaction_timeout_is_named_as_such_not_as_a_fencing()
-> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("slow-in"), unique("slow-out"), unique("slow-dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let mut config = CounterConfig::new(&input, &output, &dlq).await?;
    config.exactly_once = true;
    config.checkpoint_interval = "1s".to_owned();
    config.producer_extra = "\"transaction.timeout.ms\" = \"3000\"\n".to_owned();
    let path = dir.path().join("weir.toml");
    config.write(&path)?;
    // A checkpoint writes a manifest only with new records: the first two rounds' go through,
    // the third round's waits 8 s before its manifest is written.
    let mut run = WeirProcess::spawn(
        bin,
        &path,
        dir.path().join("run.log"),
        &[(
            "FAILPOINTS",
            "checkpoint-before-manifest=2*off->1*sleep(8000)->off",
        )],
    )?;
    let mut expected = BTreeMap::new();
    for round in 0..3 {
        produce_counter(
            &input,
            1,
            (round * 50, round * 50 + 50),
            KEYS,
            &mut expected,
        )
        .await?;
        read_counts(&output, &expected, Duration::from_secs(120))
            .await
            .map_err(|e| anyhow::anyhow!("round {round}: {e}\n{}", run.tail()))?;
    }
    // Read again once the last round is committed: each key's counts once, in order.
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    for (key, n) in &expected {
        assert_eq!(
            counts[key],
            (1..=*n).collect::<Vec<_>>(),
            "key {key}: every count once, read_committed"
        );
    }
    run.signal("TERM").await?;
    run.wait(Duration::from_secs(60)).await?;
    let log = run.log_text();
    assert!(
        log.contains("slow checkpoint") && log.contains("transaction.timeout.ms"),
        "the log names the slow write and the timeout: {}",
        run.tail()
    );
    assert!(
        log.contains("the broker aborted it"),
        "the log says the broker aborted the transaction: {}",
        run.tail()
    );
    for fencing in ["another owner", "fenced by a newer"] {
        assert!(
            !log.contains(fencing),
            "no fencing is reported (`{fencing}`): {}",
            run.tail()
        );
    }
    Ok(())
}
