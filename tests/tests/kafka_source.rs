//! The pipeline's Kafka source against the real broker.

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use weir_host::config::RuntimeSettings;
use weir_host::error::Chain;
use weir_host::pipeline::Source;
use weir_host::runtime::InputRecord;
use weir_host::source::kafka::KafkaSource;
use weir_host::state::checkpoint::InputOffsets;
use weir_tests::*;

const PARTITIONS: i32 = 3;

/// A partition is seeked to its shard's checkpoint the moment the rebalance hands it over,
/// before its fetcher has started, and its records resume at the checkpoint's next one:
/// - with committed offsets in the group, librdkafka refuses a seek until the coordinator has
///   answered for them (`Local: Erroneous state`): the seek waits for the fetcher (refused, it
///   had made the pipeline reopen the shard, once for minutes in a test run);
/// - without, librdkafka may go back on a seek made while it resolves `auto.offset.reset` and
///   fetch from the partition's beginning again (seen in a debug log): records below the
///   checkpoint may come, and the worker skips them (`records_skipped`), but none at or after
///   it may be missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_seeks_to_its_checkpoint_the_moment_it_is_assigned() -> anyhow::Result<()> {
    init_tracing();
    for round in 0..3 {
        seek_at_assignment(round, true).await?;
        seek_at_assignment(round, false).await?;
    }
    Ok(())
}

/// One round on a new topic and group of 20 records per partition; `commit`: the group has
/// committed offsets (2) of its own.
async fn seek_at_assignment(round: usize, commit: bool) -> anyhow::Result<()> {
    let (input, output, dlq) = (unique("src-in"), unique("src-out"), unique("src-dlq"));
    create_topics(&[(&input, PARTITIONS)]).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..20)
        .map(|i| (format!("k{i}").into_bytes(), format!("v{i}").into_bytes()))
        .collect();
    for partition in 0..PARTITIONS {
        produce(&input, partition, &records).await?;
    }
    let settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    );
    if commit {
        let committer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", kafka_bootstrap())
            .set("group.id", settings.pipeline.group_id())
            .create()?;
        let mut committed = TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            committed.add_partition_offset(&input, partition, Offset::Offset(2))?;
        }
        committer.commit(&committed, CommitMode::Sync)?;
    }

    let source = KafkaSource::new(&settings)?;
    source.subscribe()?;
    let mut fetched: Vec<InputRecord> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seeked = BTreeSet::new();
    // Each partition's first record at or after the checkpoint, fetched after its seek.
    let mut first = BTreeMap::new();
    while first.len() < PARTITIONS as usize {
        anyhow::ensure!(
            Instant::now() < deadline,
            "round {round} (commit {commit}): seeked {seeked:?}, first records {first:?}"
        );
        source
            .fetch(100, &mut fetched)
            .map_err(|e| anyhow::anyhow!(e))?;
        for record in fetched.drain(..) {
            if seeked.contains(&record.partition) && record.offset >= 10 {
                first.entry(record.partition).or_insert(record.offset);
            }
        }
        for partition in source.take_assigned() {
            // The checkpoint's offsets: the record at offset 9 was the last processed.
            let mut offsets = InputOffsets::new();
            offsets.advance(&input, weir_host::ids::Offset(9));
            source
                .seek(partition, &offsets)
                .map_err(|e| anyhow::anyhow!("round {round} (commit {commit}): {}", Chain(&e)))?;
            // As the pipeline does: an assigned partition stays paused until its seek.
            source
                .set_paused(partition, false)
                .map_err(|e| anyhow::anyhow!("round {round} (commit {commit}): {}", Chain(&e)))?;
            seeked.insert(partition);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let want: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, 10)).collect();
    assert_eq!(
        first, want,
        "round {round} (commit {commit}): each partition's first record after its seek"
    );
    Ok(())
}

/// Under `auto.offset.reset = latest`, a partition seeked without a checkpoint starts at its end
/// as it is at the seek, and one with a checkpoint at the checkpoint: none of the records
/// produced after the seeks is missing, and none from before the end where there is no
/// checkpoint is handed out. The group has no committed offsets, so librdkafka resolves a
/// start offset itself while Weir seeks; its own reset stays `earliest`, so a lookup that
/// overtakes a seek can only go back, never past the checkpoint (it had skipped to the end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_latest_a_partition_starts_at_its_end_or_its_checkpoint_and_misses_nothing()
-> anyhow::Result<()> {
    init_tracing();
    for round in 0..2 {
        let (input, output, dlq) = (
            unique("latest-in"),
            unique("latest-out"),
            unique("latest-dlq"),
        );
        create_topics(&[(&input, PARTITIONS)]).await?;
        let batch = |from: usize| -> Vec<(Vec<u8>, Vec<u8>)> {
            (from..from + 20)
                .map(|i| (format!("k{i}").into_bytes(), format!("v{i}").into_bytes()))
                .collect()
        };
        for partition in 0..PARTITIONS {
            produce(&input, partition, &batch(0)).await?;
        }
        let mut settings = settings(
            guest("weir_test_counter"),
            &input,
            &output,
            &dlq,
            RuntimeSettings::default(),
        );
        settings
            .kafka
            .consumer
            .insert("auto.offset.reset".to_owned(), "latest".to_owned());
        let source = KafkaSource::new(&settings)?;
        source.subscribe()?;
        let mut fetched: Vec<InputRecord> = Vec::new();
        let mut got: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
        let mut seeked = BTreeSet::new();
        let mut produced = false;
        let deadline = Instant::now() + Duration::from_secs(60);
        // Partition 0 has a checkpoint after offset 9; the others have none.
        let complete = |got: &BTreeMap<i32, BTreeSet<i64>>| {
            (0..PARTITIONS).all(|p| {
                let from = if p == 0 { 10 } else { 20 };
                (from..40).all(|o| got.get(&p).is_some_and(|s| s.contains(&o)))
            })
        };
        while !complete(&got) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "round {round}: seeked {seeked:?}, fetched {got:?}"
            );
            source
                .fetch(100, &mut fetched)
                .map_err(|e| anyhow::anyhow!(e))?;
            for record in fetched.drain(..) {
                got.entry(record.partition)
                    .or_default()
                    .insert(record.offset);
            }
            for partition in source.take_assigned() {
                let mut offsets = InputOffsets::new();
                if partition.0 == 0 {
                    offsets.advance(&input, weir_host::ids::Offset(9));
                }
                source
                    .seek(partition, &offsets)
                    .map_err(|e| anyhow::anyhow!("round {round}: {}", Chain(&e)))?;
                source
                    .set_paused(partition, false)
                    .map_err(|e| anyhow::anyhow!("round {round}: {}", Chain(&e)))?;
                seeked.insert(partition);
            }
            if !produced && seeked.len() == PARTITIONS as usize {
                for partition in 0..PARTITIONS {
                    produce(&input, partition, &batch(20)).await?;
                }
                produced = true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for partition in 1..PARTITIONS {
            let below: Vec<i64> = got[&partition]
                .iter()
                .copied()
                .filter(|o| *o < 20)
                .collect();
            assert!(
                below.is_empty(),
                "round {round}: partition {partition} had no checkpoint and started at its end, \
                 yet {below:?} came"
            );
        }
    }
    Ok(())
}
