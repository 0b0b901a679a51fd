//! Checkpoints and recovery through the pipeline, in process, against the real broker and the
//! S3 server: a restarted pipeline resumes from its checkpoints (state and offsets together),
//! and a corrupt newest checkpoint falls back to the previous one *with that one's offsets*.

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir_host::config::Settings;
use weir_tests::*;

const PARTITIONS: i32 = 2;
const KEYS: u64 = 20;

async fn setup() -> anyhow::Result<(Settings, String)> {
    let (mut settings, output) = counter_pipeline_on_s3("cp", PARTITIONS).await?;
    settings.pipeline.checkpoint_interval = Duration::from_millis(200);
    Ok((settings, output))
}

/// Runs the pipeline until `n` records are done, then stops it (a last checkpoint).
async fn run_until_done(settings: &Settings, n: u64) -> anyhow::Result<RunningStats> {
    let running = RunningPipeline::start(settings.clone());
    running.wait_done(n, Duration::from_secs(60)).await?;
    let stats = running.stats.clone();
    running.stop().await?;
    Ok(RunningStats {
        records_in: stats.records_in.load(Ordering::Relaxed),
        checkpoints: stats.checkpoints.load(Ordering::Relaxed),
        shards_opened: stats.shards_opened.load(Ordering::Relaxed),
        recoveries: stats.recoveries.load(Ordering::Relaxed),
    })
}

#[derive(Debug)]
struct RunningStats {
    records_in: u64,
    checkpoints: u64,
    shards_opened: u64,
    recoveries: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_pipeline_resumes_from_its_checkpoint_and_reprocesses_nothing()
-> anyhow::Result<()> {
    let (settings, output) = setup().await?;
    restart_resumes(settings, output).await
}

/// The same with the `memory` backend writing a full snapshot per checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_pipeline_resumes_from_its_memory_snapshot_and_reprocesses_nothing()
-> anyhow::Result<()> {
    let (mut settings, output) = setup().await?;
    settings.state = memory_state_on_s3().await?;
    restart_resumes(settings, output).await
}

async fn restart_resumes(settings: Settings, output: String) -> anyhow::Result<()> {
    let input = settings.pipeline.input_topics[0].clone();
    let mut expected = BTreeMap::new();
    produce_counter(&input, PARTITIONS, (0, 300), KEYS, &mut expected).await?;
    let first = run_until_done(&settings, 300).await?;
    assert!(
        first.checkpoints >= 2,
        "each shard checkpointed at least at stop: {first:?}"
    );

    produce_counter(&input, PARTITIONS, (300, 400), KEYS, &mut expected).await?;
    let second = run_until_done(&settings, 100).await?;
    assert_eq!(
        second.records_in, 100,
        "only the new records: the checkpoint's offsets were the starting point"
    );
    assert_eq!(second.shards_opened, 2);
    assert_eq!(second.recoveries, 2);

    let counts = read_counts(&output, &expected, Duration::from_secs(30)).await?;
    for (key, n) in &expected {
        let want: Vec<u64> = (1..=*n).collect();
        assert_eq!(
            counts.get(key),
            Some(&want),
            "key {key}: one output per record, counting on across the restart"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_newest_checkpoint_resumes_from_the_previous_one_with_its_offsets()
-> anyhow::Result<()> {
    let (mut settings, output) = setup().await?;
    // Only the checkpoints taken at each stop, so that which one is "previous" is known.
    settings.pipeline.checkpoint_interval = Duration::from_secs(3600);
    let input = settings.pipeline.input_topics[0].clone();
    let mut expected = BTreeMap::new();
    produce_counter(&input, PARTITIONS, (0, 200), KEYS, &mut expected).await?;
    run_until_done(&settings, 200).await?;
    produce_counter(&input, PARTITIONS, (200, 300), KEYS, &mut expected).await?;
    run_until_done(&settings, 100).await?;

    // Truncate partition 0's newest manifest: recovery must fall back to the checkpoint
    // before it, and read partition 0 again from that checkpoint's offsets (behind the
    // offsets committed to Kafka).
    let lsm = &settings.state.lsm;
    let url = url::Url::parse(lsm.url.as_deref().expect("lsm url"))?;
    let (store, prefix) = object_store::parse_url_opts(&url, lsm.options.iter())?;
    let manifests = Path::from(format!(
        "{prefix}/pipelines/{}/shards/00000/manifest",
        settings.pipeline.name
    ));
    let mut versions: Vec<Path> =
        futures::TryStreamExt::try_collect::<Vec<_>>(store.list(Some(&manifests)))
            .await?
            .into_iter()
            .map(|m| m.location)
            .collect();
    versions.sort();
    let newest = versions.last().expect("partition 0 has manifests").clone();
    let bytes = store.get(&newest).await?.bytes().await?;
    store
        .put(&newest, bytes.slice(..bytes.len() / 2).into())
        .await?;

    produce_counter(&input, PARTITIONS, (300, 400), KEYS, &mut expected).await?;
    let partition0_second_run = expected_in_partition(200, 300, 0);
    let third = run_until_done(&settings, 100 + partition0_second_run).await?;
    assert_eq!(
        third.records_in,
        100 + partition0_second_run,
        "partition 0 re-read the records of the checkpoint that was lost, nothing else"
    );

    let counts = read_counts(&output, &expected, Duration::from_secs(30)).await?;
    assert_counts_exact(&expected, &counts);
    Ok(())
}

/// How many of records `from..to` go to `partition` (see [`produce_counter`]).
fn expected_in_partition(from: u64, to: u64, partition: u64) -> u64 {
    (from..to)
        .filter(|i| (i % KEYS) % PARTITIONS as u64 == partition)
        .count() as u64
}

/// A revoke arrives inside the consumer's poll, which returns only with a record: the loop
/// must still act on it at once — checkpoint and close the shard — when no record follows. (It
/// used to wait for one, so a zombie in exactly-once mode, whose committed offsets leave it
/// nothing to fetch, never attempted its fenced commit.) Exactly-once here because its
/// checkpoints commit the offsets to Kafka: after the rebalance there is nothing to fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partition_is_closed_even_when_no_record_follows() -> anyhow::Result<()> {
    let (mut settings, _output) = setup().await?;
    settings.pipeline.delivery = weir_host::config::Delivery::ExactlyOnce;
    let input = settings.pipeline.input_topics[0].clone();
    let mut expected = BTreeMap::new();
    produce_counter(&input, PARTITIONS, (0, 100), KEYS, &mut expected).await?;
    let running = RunningPipeline::start(settings.clone());
    running.wait_done(100, Duration::from_secs(60)).await?;
    running
        .wait_until("a checkpoint per shard", Duration::from_secs(60), |s| {
            s.checkpoints.load(Ordering::Relaxed) >= PARTITIONS as u64
        })
        .await?;

    // Another member joins the group: the eager protocol revokes every partition of the
    // pipeline; no further record is produced.
    let member: rdkafka::consumer::StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", settings.pipeline.group_id())
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    rdkafka::consumer::Consumer::subscribe(&member, &[input.as_str()])?;
    let polling = tokio::spawn(async move {
        loop {
            let _ = member.recv().await;
        }
    });
    let closed = running
        .wait_until("both revoked shards closed", Duration::from_secs(60), |s| {
            s.shards_closed.load(Ordering::Relaxed) >= PARTITIONS as u64
        })
        .await;
    polling.abort();
    closed?;
    running.stop().await
}

/// A co-partitioned second input topic none of whose records the checkpoint saw is read from
/// its start after a restart (it used to be left wherever the consumer was, after the records
/// fetched before the seek had been dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_input_topic_the_checkpoint_never_saw_is_read_from_its_start() -> anyhow::Result<()>
{
    let (mut settings, output) = setup().await?;
    let second = unique("cp-in-b");
    create_topics(&[(&second, PARTITIONS)]).await?;
    settings.pipeline.input_topics.push(second.clone());
    let first = settings.pipeline.input_topics[0].clone();
    let mut expected = BTreeMap::new();
    produce_counter(&first, PARTITIONS, (0, 20), KEYS, &mut expected).await?;
    run_until_done(&settings, 20).await?;

    // More than a batch, so that records of it are fetched before the seek.
    produce_counter(&second, PARTITIONS, (20, 1220), KEYS, &mut expected).await?;
    let again = run_until_done(&settings, 1200).await?;
    assert_eq!(
        again.records_in, 1200,
        "every record of the second topic, once"
    );
    let counts = read_counts(&output, &expected, Duration::from_secs(30)).await?;
    assert_counts_exact(&expected, &counts);
    Ok(())
}

/// Switching `delivery` keeps the state both ways: at-least-once checkpoints are decided by
/// their manifest, so an exactly-once run resumes from them (it used to start empty when Kafka's
/// offsets named no checkpoint), and an at-least-once run after an exactly-once one resumes
/// from the checkpoint Kafka's committed offsets name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_between_delivery_modes_keeps_the_state() -> anyhow::Result<()> {
    use weir_host::config::Delivery;
    let (mut settings, output) = setup().await?;
    let input = settings.pipeline.input_topics[0].clone();
    let mut expected = BTreeMap::new();
    let mut from = 0;
    for delivery in [
        Delivery::AtLeastOnce,
        Delivery::ExactlyOnce,
        Delivery::AtLeastOnce,
    ] {
        settings.pipeline.delivery = delivery;
        produce_counter(&input, PARTITIONS, (from, from + 60), KEYS, &mut expected).await?;
        from += 60;
        let run = run_until_done(&settings, 60).await?;
        assert_eq!(
            run.records_in, 60,
            "{delivery:?}: resumed where the last run stopped"
        );
    }
    let counts = read_counts(&output, &expected, Duration::from_secs(30)).await?;
    assert_counts_exact(&expected, &counts);
    Ok(())
}
