//! Zombie (issue 4, docs/checkpoints.md "Fencing"): host `a` owns the partition and holds
//! processed records it has not checkpointed when it is frozen with SIGSTOP past its session
//! timeout. Host `b` takes the partition over, claims the shard and checkpoints. When `a` is
//! resumed it still attempts its checkpoint — and the manifest write is refused as fenced: no
//! checkpoint of `a`'s writer epoch exists, and every count is exact. In exactly-once mode `b`'s
//! `init_transactions` has also fenced `a`'s producer and aborted its open transaction, so a
//! `read_committed` consumer sees none of `a`'s outputs: each update exactly once.

use object_store::path::Path as StorePath;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use weir_host::state::manifest::{ManifestError, ManifestKind, ManifestStore};
use weir_tests::process::{CounterConfig, WeirProcess, log_field};
use weir_tests::*;

const KEYS: u64 = 16;
const OPENED: &str = "first records processed after opening the shard";
const FENCED: &str = "checkpoint refused: another owner claimed the shard";
const COMMITTED: &str = "checkpoint committed";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_frozen_past_its_session_timeout_is_fenced_when_it_checkpoints() -> anyhow::Result<()>
{
    zombie(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_frozen_host_is_fenced_and_none_of_its_outputs_are_committed()
-> anyhow::Result<()> {
    zombie(true).await
}

async fn zombie(exactly_once: bool) -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (
        unique("zombie-in"),
        unique("zombie-out"),
        unique("zombie-dlq"),
    );
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let mut config = CounterConfig::new(&input, &output, &dlq).await?;
    config.exactly_once = exactly_once;
    // `a` never checkpoints on its own: everything it processes is uncommitted when frozen.
    config.instance_id = Some("zombie-a".to_owned());
    config.checkpoint_interval = "5min".to_owned();
    let a_config = dir.path().join("a.toml");
    config.write(&a_config)?;
    config.instance_id = Some("zombie-b".to_owned());
    config.checkpoint_interval = "300ms".to_owned();
    let b_config = dir.path().join("b.toml");
    config.write(&b_config)?;
    let debug = [("RUST_LOG", "info,rdkafka=warn,weir_host::pipeline=debug")];

    let mut expected = BTreeMap::new();
    produce_counter(&input, 1, (0, 200), KEYS, &mut expected).await?;
    let mut a = WeirProcess::spawn(bin, &a_config, dir.path().join("a.log"), &debug)?;
    a.wait_for_log(OPENED, 1, Duration::from_secs(60)).await?;
    a.signal("STOP").await?;

    produce_counter(&input, 1, (200, 400), KEYS, &mut expected).await?;
    let mut b = WeirProcess::spawn(bin, &b_config, dir.path().join("b.log"), &debug)?;
    // b gets the partition once a's session (6 s) has expired, then checkpoints.
    b.wait_for_log(OPENED, 1, Duration::from_secs(60)).await?;
    b.wait_for_log(COMMITTED, 1, Duration::from_secs(60))
        .await?;

    a.signal("CONT").await?;
    a.wait_for_log(FENCED, 1, Duration::from_secs(60)).await?;
    // `a` has shown what it is here for. Left running, it rejoins the group about a second
    // later and, its instance id sorting first, takes the partition back; its 5-minute
    // checkpoint interval would then hold the last outputs in an open transaction for longer
    // than this test reads (seen once in a full run: every key stuck at 25).
    a.kill().await?;

    // No checkpoint carries a's writer epoch (from its claim): its write never landed.
    let a_epoch = a
        .log_text()
        .lines()
        .find(|l| l.contains("claimed shard"))
        .and_then(|l| log_field(l, "writer_epoch"))
        .expect("a logged its claim");
    let url = url::Url::parse(&config.state_url)?;
    let (store, prefix) = object_store::parse_url_opts(&url, s3_options().iter())?;
    let root = StorePath::from(format!("{prefix}/pipelines/{}/shards/00000", config.name));
    let manifests = ManifestStore::new(Arc::from(store), root);
    let versions = manifests.versions().await?;
    let mut all = Vec::new();
    for v in versions {
        match manifests.read(v).await {
            Ok(manifest) => all.push(manifest),
            Err(ManifestError::NotFound(_)) => {} // collected by b's GC meanwhile
            Err(other) => return Err(other.into()),
        }
    }
    let checkpoints: Vec<(u64, u64)> = all
        .iter()
        .filter(|m| m.kind == ManifestKind::Checkpoint)
        .map(|m| (m.version.0, m.writer_epoch))
        .collect();
    assert!(!checkpoints.is_empty(), "b checkpointed");
    assert!(
        checkpoints.iter().all(|(_, epoch)| *epoch != a_epoch),
        "a checkpoint of the zombie's epoch {a_epoch} landed: {checkpoints:?}"
    );

    // `b` finishes; counts are exact.
    produce_counter(&input, 1, (400, 500), KEYS, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(120)).await;
    b.kill().await?;
    let counts = counts.map_err(|e| e.context(format!("a:\n{}\nb:\n{}", a.tail(), b.tail())))?;
    assert_counts_exact(&expected, &counts);
    if exactly_once {
        for (key, n) in &expected {
            let once: Vec<u64> = (1..=*n).collect();
            assert_eq!(counts[key], once, "key {key}: each update exactly once");
        }
    }
    Ok(())
}
