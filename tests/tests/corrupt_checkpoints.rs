//! A corrupt checkpoint must not stop a pipeline for good (issue 16; SCENARIOS.md S15),
//! against the real broker: a flipped byte in an SST of the newest checkpoint falls back to an
//! older one while the other partition runs, and with no usable checkpoint left only that
//! partition stops, failed in its status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use weir_host::config::{RuntimeSettings, Settings, StateBackendKind, StateSettings};
use weir_host::pipeline::PartitionState;
use weir_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Settings of a `counter` pipeline over new topics `{prefix}-in` (2 partitions), `-out` and
/// `-dlq`, checkpointing every 300 ms; with its input and output topics.
async fn counter_in(prefix: &str) -> anyhow::Result<(Settings, String, String)> {
    init_tracing();
    let (input, output, dlq) = (
        unique(&format!("{prefix}-in")),
        unique(&format!("{prefix}-out")),
        unique(&format!("{prefix}-dlq")),
    );
    create_topics(&[(&input, 2), (&output, 2), (&dlq, 1)]).await?;
    let mut settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    );
    settings.pipeline.checkpoint_interval = Duration::from_millis(300);
    Ok((settings, input, output))
}

/// [`counter_in`] with `lsm` state in `dir` (`file://`) and a small memtable so that state
/// goes through SSTs.
async fn counter_on_lsm_in(
    prefix: &str,
    dir: &std::path::Path,
) -> anyhow::Result<(Settings, String, String)> {
    let (mut settings, input, output) = counter_in(prefix).await?;
    settings.state = StateSettings {
        backend: StateBackendKind::Lsm,
        lsm: weir_host::config::LsmStateSettings {
            url: Some(format!("file://{}", dir.display())),
            memtable_bytes_max: 4 << 10,
            block_size_bytes: 1 << 10,
            block_cache_bytes: 0,
            disk_cache_bytes: 0,
            ..Default::default()
        },
        memory: Default::default(),
    };
    Ok((settings, input, output))
}

/// Waits until both partitions of `pipeline` checkpointed `input` through `next` (the offset
/// after the last record their checkpoints cover).
async fn both_checkpointed_through(
    pipeline: &RunningPipeline,
    input: &str,
    next: i64,
) -> anyhow::Result<()> {
    pipeline
        .wait_until("both partitions checkpointed", TIMEOUT, |s| {
            s.partitions
                .lock()
                .expect("lock")
                .values()
                .filter(|p| {
                    p.checkpointed_offsets
                        .get(input)
                        .is_some_and(|o| *o == next)
                })
                .count()
                == 2
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_an_sst_of_the_newest_checkpoint_falls_back_while_the_other_partition_runs()
-> anyhow::Result<()> {
    use weir_host::state::manifest::ManifestStore;
    let dir = tempfile::tempdir()?;
    let (mut settings, input, output) = counter_on_lsm_in("flip", dir.path()).await?;
    // A name of its own, so that its shard's audit lines are told from other tests'.
    settings.pipeline.name = unique("flip");
    let shard_root = format!("pipelines/{}/shards/00000", settings.pipeline.name);
    let mut expected = BTreeMap::new();

    // Two checkpointed rounds; then the newest checkpoint of partition 0 gets a flipped byte
    // in every SST that only it references.
    let first = RunningPipeline::start(settings.clone());
    produce_counter(&input, 2, (0, 1_000), 20, &mut expected).await?;
    first.wait_done(1_000, TIMEOUT).await?;
    both_checkpointed_through(&first, &input, 500).await?;
    produce_counter(&input, 2, (1_000, 2_000), 20, &mut expected).await?;
    first.wait_done(2_000, TIMEOUT).await?;
    first.stop().await?;
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(dir.path())?,
    );
    let root = object_store::path::Path::from(shard_root.as_str());
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let versions = manifests.versions().await?;
    let mut checkpoints = Vec::new();
    for v in versions.iter().rev() {
        let m = manifests.read(*v).await?;
        if m.kind == weir_host::state::manifest::ManifestKind::Checkpoint {
            checkpoints.push(m);
        }
    }
    let (newest, previous) = (&checkpoints[0], &checkpoints[1]);
    assert_eq!(
        newest
            .metadata
            .get(&format!("offset/{input}"))
            .map(String::as_str),
        Some("1000")
    );
    let older: std::collections::HashSet<_> =
        previous.levels.iter().flatten().map(|r| r.id()).collect();
    let damaged: Vec<_> = newest
        .levels
        .iter()
        .flatten()
        .filter(|r| !older.contains(&r.id()))
        .collect();
    assert!(
        !damaged.is_empty(),
        "the second round flushed SSTs of its own"
    );
    for sst in &damaged {
        let path = dir.path().join(&shard_root).join(sst.id().object_name());
        let mut bytes = std::fs::read(&path)?;
        for b in &mut bytes[4..12] {
            *b ^= 0xff;
        }
        std::fs::write(&path, bytes)?;
    }

    // The restarted pipeline meets the damage (a read or the scrub) and falls back on
    // partition 0, to the previous checkpoint's offsets; partition 1 goes on meanwhile.
    let fallbacks_before = fallbacks();
    let second = RunningPipeline::start(settings.clone());
    produce_counter(&input, 2, (2_000, 3_000), 20, &mut expected).await?;
    let counts = read_counts(&output, &expected, TIMEOUT).await?;
    assert_counts_exact(&expected, &counts);
    assert!(!second.is_finished(), "the pipeline never stopped");
    let versions = manifests.versions().await?;
    let mut claims = Vec::new();
    for v in &versions {
        if let Ok(m) = manifests.read(*v).await
            && m.kind == weir_host::state::manifest::ManifestKind::Claim
        {
            claims.push(m);
        }
    }
    let fallback = claims
        .iter()
        .find(|c| c.rejects(newest.version))
        .expect("a claim records the rejected version");
    assert_eq!(
        fallback.parent,
        Some(previous.version),
        "it resumed from the previous checkpoint"
    );
    assert_eq!(
        fallback.metadata, previous.metadata,
        "with that checkpoint's offsets"
    );
    assert!(
        fallbacks() > fallbacks_before,
        "weir_checkpoint_fallbacks_total counted it"
    );
    let audited: Vec<String> = audit_lines()
        .into_iter()
        .filter(|l| l.contains(&format!("shard={shard_root}")))
        .collect();
    assert!(
        audited.iter().any(|l| {
            l.contains(&format!("version={}", newest.version)) && l.contains("found corrupt")
        }),
        "an audit line names the rejected checkpoint: {audited:?}"
    );
    second.stop().await
}

/// `weir_checkpoint_fallbacks_total` of this process.
fn fallbacks() -> f64 {
    weir_host::telemetry::prometheus()
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix("weir_checkpoint_fallbacks_total ")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_usable_checkpoint_left_only_that_partition_stops_failed_in_its_status()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (settings, input, output) = counter_on_lsm_in("lost", dir.path()).await?;
    let mut expected = BTreeMap::new();
    let first = RunningPipeline::start(settings.clone());
    produce_counter(&input, 2, (0, 400), 8, &mut expected).await?;
    first.wait_done(400, TIMEOUT).await?;
    first.stop().await?;
    // Every manifest of partition 0 is torn: no checkpoint of it is usable any more.
    let manifests = dir.path().join(format!(
        "pipelines/{}/shards/00000/manifest",
        settings.pipeline.name
    ));
    for entry in std::fs::read_dir(&manifests)? {
        std::fs::write(entry?.path(), b"WEIRMAN1 torn")?;
    }
    let second = RunningPipeline::start(settings.clone());
    second
        .wait_until("partition 0 failed in its status", TIMEOUT, |s| {
            s.partitions.lock().expect("lock").get(&0).is_some_and(|p| {
                p.problem.as_ref().is_some_and(|problem| {
                    problem.state == PartitionState::Failed
                        && problem.reason.contains("no usable checkpoint")
                })
            })
        })
        .await?;
    // Partition 1 goes on: its keys count on exactly.
    let mut more = BTreeMap::new();
    produce_counter(&input, 2, (400, 800), 8, &mut more).await?;
    let odd: BTreeMap<String, u64> = expected
        .iter()
        .filter(|(k, _)| {
            k.trim_start_matches("key")
                .parse::<u64>()
                .is_ok_and(|n| n % 2 == 1)
        })
        .map(|(k, n)| (k.clone(), n + more[k]))
        .collect();
    let counts = read_counts(&output, &odd, TIMEOUT).await?;
    assert_counts_exact(&odd, &counts);
    assert!(!second.is_finished(), "the pipeline keeps running");
    second.stop().await
}

/// Exactly-once, a shard that falls back to an older checkpoint processes the records since it
/// again but sends none of their outputs that went out before: its group's committed offsets say
/// which ones a committed transaction carried (docs/checkpoints.md). A `read_committed` consumer
/// sees every key's counts once each, in order; before, it saw those since the older checkpoint
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_fallback_sends_no_output_that_went_out_before_again() -> anyhow::Result<()>
{
    use futures::TryStreamExt as _;
    use object_store::ObjectStoreExt as _;
    use weir_host::state::manifest::{ManifestKind, ManifestStore};
    let (mut settings, input, output) = counter_in("eos-fall").await?;
    settings.pipeline.name = unique("eos-fall");
    settings.pipeline.delivery = weir_host::config::Delivery::ExactlyOnce;
    settings.state = memory_state_on_s3().await?;
    let mut expected = BTreeMap::new();

    // Two rounds, each checkpointed on both partitions.
    let first = RunningPipeline::start(settings.clone());
    for (round, through) in [((0, 1_000), 500), ((1_000, 2_000), 1_000)] {
        produce_counter(&input, 2, round, 20, &mut expected).await?;
        first.wait_done(round.1, TIMEOUT).await?;
        both_checkpointed_through(&first, &input, through).await?;
    }
    first.stop().await?;

    // Every checkpoint of partition 0 past its oldest retained one loses its snapshot: recovery
    // falls back to that one.
    let url = settings.state.memory.url.clone().unwrap_or_default();
    let (store, prefix) =
        weir_host::state::lsm::backend::object_store_from_url(&url, &s3_options())?;
    let objects: Vec<object_store::ObjectMeta> = store.list(Some(&prefix)).try_collect().await?;
    let shard = format!(
        "pipelines/{}/shards/00000/manifest/",
        settings.pipeline.name
    );
    let manifest = objects
        .iter()
        .map(|o| o.location.to_string())
        .find(|p| p.contains(&shard))
        .ok_or_else(|| anyhow::anyhow!("no manifest of partition 0"))?;
    let root = manifest[..manifest.find("/manifest/").unwrap_or(manifest.len())].to_owned();
    let manifests =
        ManifestStore::new(store.clone(), object_store::path::Path::from(root.as_str()));
    let mut checkpoints = Vec::new();
    for version in manifests.versions().await? {
        let m = manifests.read(version).await?;
        if m.kind == ManifestKind::Checkpoint
            && let Some(offset) = m.metadata.get(&format!("offset/{input}"))
        {
            let snapshot = m.metadata["snapshot"].clone();
            checkpoints.push((offset.parse::<i64>()?, snapshot, version));
        }
    }
    checkpoints.sort();
    let (oldest, kept, _) = checkpoints[0].clone();
    let Some((newest, _, newest_version)) = checkpoints.last().cloned() else {
        anyhow::bail!("no checkpoint of partition 0");
    };
    anyhow::ensure!(
        oldest < newest,
        "the retained checkpoints of partition 0 all cover {newest} records: {checkpoints:?}"
    );
    for (_, snapshot, _) in checkpoints
        .iter()
        .filter(|(o, s, _)| *o > oldest && *s != kept)
    {
        store
            .delete(&object_store::path::Path::from(format!(
                "{root}/{snapshot}"
            )))
            .await?;
    }

    let second = RunningPipeline::start(settings.clone());
    produce_counter(&input, 2, (2_000, 3_000), 20, &mut expected).await?;
    let counts = read_counts(&output, &expected, TIMEOUT).await?;
    second.stop().await?;
    let mut fell_back = false;
    for version in manifests.versions().await? {
        if let Ok(m) = manifests.read(version).await
            && m.kind == ManifestKind::Claim
        {
            fell_back |= m.rejects(newest_version);
        }
    }
    assert!(
        fell_back,
        "partition 0 fell back past version {newest_version}"
    );
    for (key, n) in &expected {
        let seen = &counts[key];
        let twice: Vec<&u64> = seen
            .iter()
            .enumerate()
            .filter(|(i, c)| seen[..*i].contains(c))
            .map(|(_, c)| c)
            .collect();
        assert!(twice.is_empty(), "key {key}: counts seen twice: {twice:?}");
        let want: Vec<u64> = (1..=*n).collect();
        assert_eq!(*seen, want, "key {key}: each count once, in order");
    }
    Ok(())
}
