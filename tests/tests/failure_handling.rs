//! Failures that must never stop a pipeline for good (issue 16; SCENARIOS.md S5, S14, S17),
//! against the real broker: records too large for Kafka, a dead-letter topic that refuses
//! records, the group's committed offsets across hand-overs, a checkpoint while a state write
//! is held open, and test topics that keep records of any age. Corrupt checkpoints (S15) are in
//! `corrupt_checkpoints.rs`.

use rdkafka::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::{Delivery, RuntimeSettings, StateBackendKind, StateSettings};
use weir_host::ids::Offset;
use weir_host::pipeline::PartitionState;
use weir_host::sink::kafka::limits::{
    ERROR_HEADER_BYTES_MAX, HEADER_ORIGINAL_HEADERS_BYTES, HEADER_ORIGINAL_KEY_BYTES,
    HEADER_ORIGINAL_VALUE_BYTES, HEADER_TRUNCATED,
};
use weir_host::sink::kafka::{HEADER_ERROR, HEADER_ERROR_KIND, HEADER_SOURCE_OFFSET};
use weir_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);
const SETTLE: Duration = Duration::from_secs(2);

/// The counter's records for a run: 300 records over 10 keys on partition 0, except three
/// with huge keys of their own at offsets 100 (2 MiB: over every limit), 150 (1,010,000
/// bytes: over the producer's 1,000,000 but under 1 MiB) and 200 (300,000 bytes: over the
/// output topic's 200,000, under the dead-letter topic's).
fn records_with_huge_keys() -> Vec<KeyValue> {
    (0..300)
        .map(|i| {
            let key = match i {
                100 => vec![b'a'; 2 << 20],
                150 => vec![b'b'; 1_010_000],
                200 => vec![b'c'; 300_000],
                _ => format!("key{}", i % 10).into_bytes(),
            };
            (key, format!("record {i}").into_bytes())
        })
        .collect()
}

/// Runs the counter over [`records_with_huge_keys`] in `delivery` mode and checks that the
/// three huge records are dead-lettered — cut to fit where they do not — while every other
/// record is counted exactly once and the pipeline keeps running.
async fn huge_records_are_dead_lettered_in(delivery: Delivery) -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("big-in"), unique("big-out"), unique("big-dlq"));
    create_topic_with(&input, 1, &[("max.message.bytes", "26214400")]).await?;
    create_topic_with(&output, 1, &[("max.message.bytes", "200000")]).await?;
    create_topics(&[(&dlq, 1)]).await?;
    produce_large(&input, 0, &records_with_huge_keys(), 30 << 20).await?;
    let mut settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    );
    settings.pipeline.delivery = delivery;
    settings.pipeline.checkpoint_interval = Duration::from_secs(1);
    if delivery == Delivery::ExactlyOnce {
        settings.kafka.consumer =
            [("isolation.level".to_owned(), "read_committed".to_owned())].into();
        let dir = tempfile::tempdir()?;
        settings.state = StateSettings {
            backend: StateBackendKind::Memory,
            lsm: Default::default(),
            memory: weir_host::config::MemoryStateSettings {
                url: Some(format!("file://{}", dir.keep().display())),
                options: BTreeMap::new(),
            },
        };
    }
    let pipeline = RunningPipeline::start(settings);
    pipeline.wait_done(300, TIMEOUT).await?;
    let dead = read_exactly(&dlq, 3, TIMEOUT, SETTLE).await?;
    let out = read_exactly(&output, 297, TIMEOUT, SETTLE).await?;
    assert!(!pipeline.is_finished(), "the pipeline keeps running");
    let fenced = pipeline
        .stats
        .checkpoints_fenced
        .load(std::sync::atomic::Ordering::Relaxed);
    let failed = pipeline
        .stats
        .checkpoint_failures
        .load(std::sync::atomic::Ordering::Relaxed);
    let opened = pipeline
        .stats
        .shards_opened
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (fenced, failed, opened),
        (0, 0, 1),
        "no delivery failed: the shard opened once, no reopen loop"
    );

    let by_offset: BTreeMap<String, &rdkafka::message::OwnedMessage> = dead
        .iter()
        .map(|m| (header(m, HEADER_SOURCE_OFFSET).unwrap_or_default(), m))
        .collect();
    for (offset, original) in [("100", 2usize << 20), ("150", 1_010_000)] {
        let letter = by_offset[offset];
        let size = letter.key().map_or(0, <[u8]>::len) + letter.payload().map_or(0, <[u8]>::len);
        assert!(
            size < 1_000_000,
            "offset {offset}: cut to fit ({size} bytes)"
        );
        assert_eq!(
            header(letter, HEADER_TRUNCATED).as_deref(),
            Some("key"),
            "offset {offset}"
        );
        assert_eq!(
            header(letter, HEADER_ORIGINAL_KEY_BYTES),
            Some(original.to_string()),
            "offset {offset}"
        );
        assert_eq!(
            header(letter, HEADER_ORIGINAL_VALUE_BYTES).as_deref(),
            Some(format!("record {offset}").len().to_string().as_str())
        );
        assert_eq!(
            header(letter, HEADER_ORIGINAL_HEADERS_BYTES).as_deref(),
            Some("0"),
            "the input record had no headers"
        );
        assert_eq!(
            letter.payload(),
            Some(format!("record {offset}").as_bytes()),
            "the value is kept"
        );
    }
    let fits = by_offset["200"];
    assert_eq!(
        fits.key().map(<[u8]>::len),
        Some(300_000),
        "a dead letter that fits is whole"
    );
    assert_eq!(header(fits, HEADER_TRUNCATED), None);
    for letter in &dead {
        assert_eq!(
            header(letter, HEADER_ERROR_KIND).as_deref(),
            Some("rejected")
        );
        let error = header(letter, HEADER_ERROR).unwrap_or_default();
        assert!(error.contains("exceeds the limit"), "{error}");
        assert!(
            error.len() <= ERROR_HEADER_BYTES_MAX,
            "weir.error is capped"
        );
    }
    let mut counts: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        counts
            .entry(msg.key().unwrap_or_default().to_vec())
            .or_default()
            .push(v["count"].as_u64().unwrap_or_default());
    }
    assert_eq!(counts.len(), 10, "only the small keys have outputs");
    for seen in counts.values() {
        assert_eq!(seen, &(1..=seen.len() as u64).collect::<Vec<_>>());
    }
    assert_eq!(counts.values().map(Vec::len).sum::<usize>(), 297);
    pipeline.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_too_large_for_kafka_are_dead_lettered_cut_to_fit_and_the_pipeline_goes_on()
-> anyhow::Result<()> {
    huge_records_are_dead_lettered_in(Delivery::AtLeastOnce).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_too_large_for_kafka_cause_no_reopen_loop_in_exactly_once_mode()
-> anyhow::Result<()> {
    huge_records_are_dead_lettered_in(Delivery::ExactlyOnce).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_that_refuses_records_pauses_the_partition_and_loses_nothing()
-> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (
        unique("refuse-in"),
        unique("refuse-out"),
        unique("refuse-dlq"),
    );
    create_topics(&[(&input, 1), (&output, 1)]).await?;
    let records: Vec<KeyValue> = (0..200)
        .map(|i| {
            let value = if i == 100 {
                "poison:reject".to_owned()
            } else {
                format!("v{i}")
            };
            (format!("k{}", i % 5).into_bytes(), value.into_bytes())
        })
        .collect();
    produce(&input, 0, &records).await?;
    let mut settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    );
    settings.pipeline.checkpoint_interval = Duration::from_millis(500);
    // The dead-letter topic does not exist and the producer may not create it: every dead
    // letter is refused — after 2 s in librdkafka's queue, then (once librdkafka takes the
    // topic for missing, after 0.5 s) at once, when it is sent.
    settings.kafka.producer = [
        ("allow.auto.create.topics", "false"),
        ("message.timeout.ms", "2000"),
        ("topic.metadata.propagation.max.ms", "500"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let pipeline = RunningPipeline::start(settings);
    pipeline
        .wait_until(
            "the partition paused for its dead letter",
            TIMEOUT,
            |stats| {
                stats
                    .partitions
                    .lock()
                    .expect("lock")
                    .get(&0)
                    .is_some_and(|p| {
                        p.problem.as_ref().is_some_and(|problem| {
                            problem.state == PartitionState::Paused && problem.reason.contains(&dlq)
                        })
                    })
            },
        )
        .await?;
    assert!(!pipeline.is_finished(), "the pipeline keeps running");
    create_topics(&[(&dlq, 1)]).await?;
    let dead = read_exactly(&dlq, 1, TIMEOUT, SETTLE).await?;
    assert_eq!(
        header(&dead[0], HEADER_SOURCE_OFFSET).as_deref(),
        Some("100")
    );
    pipeline
        .wait_until("the partition running again", TIMEOUT, |stats| {
            stats
                .partitions
                .lock()
                .expect("lock")
                .get(&0)
                .is_some_and(|p| p.problem.is_none())
        })
        .await?;
    let expected: BTreeMap<String, u64> = (0..5)
        .map(|k| (format!("k{k}"), if k == 0 { 39 } else { 40 }))
        .collect();
    let counts = read_counts(&output, &expected, TIMEOUT).await?;
    assert_counts_exact(&expected, &counts);
    pipeline.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_follow_the_owner_never_decrease_and_show_lag_0_after_a_clean_stop()
-> anyhow::Result<()> {
    let (mut settings, output) = counter_pipeline_on_s3("handover", 4).await?;
    // No checkpoint on the interval: only hand-overs and stops write them.
    settings.pipeline.checkpoint_interval = Duration::from_secs(3600);
    let input = settings.pipeline.input_topics[0].clone();
    let group = settings
        .pipeline
        .group_id
        .clone()
        .expect("the tests name their group");
    let highs = || -> anyhow::Result<Vec<Option<i64>>> {
        Ok(high_watermarks(&input, 4)?.into_iter().map(Some).collect())
    };
    let mut expected = BTreeMap::new();

    // 1. A clean stop commits the last checkpoints: the drain's checkpoints are the only ones
    //    this run writes, so only its synchronous commit can leave the group at lag 0.
    let a = RunningPipeline::start(settings.clone());
    produce_counter(&input, 4, (0, 2_000), 40, &mut expected).await?;
    a.wait_done(2_000, TIMEOUT).await?;
    a.stop().await?;
    assert_eq!(
        committed_offsets(&group, &input, 4)?,
        highs()?,
        "after a clean stop the group's lag is 0"
    );

    // 2. The new owner commits the checkpoint it opens: with the group's offsets moved back to
    //    0 while no host runs, only that commit can bring them to the checkpoints' again.
    set_committed_offsets(&group, &input, &[0, 0, 0, 0])?;
    let b = RunningPipeline::start(settings.clone());
    let deadline = std::time::Instant::now() + TIMEOUT;
    while committed_offsets(&group, &input, 4)? != highs()? {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the new owner did not commit the checkpoints it opened: {:?}",
            committed_offsets(&group, &input, 4)?
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 3. Hand-overs B → A → B: the group's committed offsets never go down.
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // Stops the watcher however the test ends (a test runtime waits for its blocking tasks).
    struct StopWatching(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for StopWatching {
        fn drop(&mut self) {
            self.0.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let stop_watching = StopWatching(watching.clone());
    let watcher = {
        let (watching, group, input) = (watching.clone(), group.clone(), input.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<usize> {
            let mut last = vec![None; 4];
            let mut reads = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                let now = committed_offsets(&group, &input, 4)?;
                for (p, (before, after)) in last.iter().zip(&now).enumerate() {
                    anyhow::ensure!(
                        after >= before,
                        "partition {p}: the committed offset went from {before:?} to {after:?}"
                    );
                }
                last = now;
                reads += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(reads)
        })
    };
    let a = RunningPipeline::start(settings.clone());
    a.wait_until("A owns partitions", TIMEOUT, |s| {
        s.shards_opened.load(std::sync::atomic::Ordering::Relaxed) > 0
    })
    .await?;
    produce_counter(&input, 4, (2_000, 4_000), 40, &mut expected).await?;
    read_counts(&output, &expected, TIMEOUT).await?;
    a.stop().await?;
    produce_counter(&input, 4, (4_000, 6_000), 40, &mut expected).await?;
    let counts = read_counts(&output, &expected, TIMEOUT).await?;
    assert_counts_exact(&expected, &counts);
    b.stop().await?;
    drop(stop_watching);
    let reads = watcher.await??;
    assert!(reads > 10, "the offsets were watched ({reads} reads)");
    assert_eq!(
        committed_offsets(&group, &input, 4)?,
        highs()?,
        "after the last clean stop the group's lag is 0"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_topics_keep_records_whatever_their_timestamp() -> anyhow::Result<()> {
    // Outputs and dead letters carry their input's timestamp (2013 for the flights): the local
    // broker must not delete them by age in the middle of a test.
    let topic = unique("retention");
    create_topics(&[(&topic, 1)]).await?;
    assert_eq!(
        topic_config(&topic, "retention.ms").await?.as_deref(),
        Some("-1")
    );
    Ok(())
}

/// A state write held open (SCENARIOS.md S5): once armed, the next `apply` of any shard waits
/// until released.
#[derive(Debug)]
struct Gate {
    armed: std::sync::atomic::AtomicBool,
    held: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            armed: Default::default(),
            held: Default::default(),
            release: tokio::sync::Semaphore::new(0),
        }
    }
}

/// A backend whose shards' writes pass through a [`Gate`].
#[derive(Debug)]
struct HeldWrites<B> {
    inner: B,
    gate: Arc<Gate>,
}

#[derive(Debug)]
struct HeldShard<S> {
    inner: S,
    gate: Arc<Gate>,
}

impl<B: weir_host::state::StateBackend> weir_host::state::StateBackend for HeldWrites<B> {
    type Shard = HeldShard<B::Shard>;

    async fn open_shard(
        &self,
        id: &weir_host::state::ShardId,
    ) -> Result<Self::Shard, weir_host::state::StateError> {
        self.open_shard_at(id, &weir_host::state::Recovery::default())
            .await
    }

    async fn open_shard_at(
        &self,
        id: &weir_host::state::ShardId,
        recovery: &weir_host::state::Recovery,
    ) -> Result<Self::Shard, weir_host::state::StateError> {
        Ok(HeldShard {
            inner: self.inner.open_shard_at(id, recovery).await?,
            gate: self.gate.clone(),
        })
    }

    fn stored(
        &self,
        id: &weir_host::state::ShardId,
    ) -> Option<weir_host::state::stored::StoredShard> {
        self.inner.stored(id)
    }
}

impl<S: weir_host::state::Shard> weir_host::state::Shard for HeldShard<S> {
    async fn get(&self, key: &[u8]) -> Result<Option<bytes::Bytes>, weir_host::state::StateError> {
        self.inner.get(key).await
    }

    async fn get_many(
        &self,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<bytes::Bytes>>, weir_host::state::StateError> {
        self.inner.get_many(keys).await
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, bytes::Bytes)>, weir_host::state::StateError> {
        self.inner.scan(prefix, start_after, limit).await
    }

    async fn apply(
        &self,
        writes: Vec<weir_host::state::StateWrite>,
    ) -> Result<(), weir_host::state::StateError> {
        if self
            .gate
            .armed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.gate.held.notify_one();
            self.gate
                .release
                .acquire()
                .await
                .expect("the gate's semaphore is never closed")
                .forget();
        }
        self.inner.apply(writes).await
    }

    fn recovered_offsets(
        &self,
    ) -> Result<Option<weir_host::state::checkpoint::InputOffsets>, weir_host::state::StateError>
    {
        self.inner.recovered_offsets()
    }

    async fn checkpoint(
        &self,
        offsets: &weir_host::state::checkpoint::InputOffsets,
        decided_by: weir_host::state::checkpoint::DecidedBy,
    ) -> Result<
        Option<weir_host::state::checkpoint::CheckpointReport>,
        weir_host::state::checkpoint::CheckpointError,
    > {
        self.inner.checkpoint(offsets, decided_by).await
    }

    fn checkpoint_decided(&self, version: weir_host::ids::ManifestVersion) {
        self.inner.checkpoint_decided(version);
    }

    fn opened_from(&self) -> Option<weir_host::ids::ManifestVersion> {
        self.inner.opened_from()
    }

    fn corruption(&self) -> Option<weir_host::state::StateError> {
        self.inner.corruption()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_checkpoint_while_a_state_write_is_held_open_then_a_kill_counts_the_record_once()
-> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("s5-in"), unique("s5-out"), unique("s5-dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let mut settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    );
    settings.pipeline.checkpoint_interval = Duration::from_secs(3600); // only on request
    let dir = tempfile::tempdir()?;
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = |gate: &Arc<Gate>| -> anyhow::Result<Arc<HeldWrites<weir_host::state::memory::MemoryBackend>>> {
        let store: Arc<dyn object_store::ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path())?);
        Ok(Arc::new(HeldWrites {
            inner: weir_host::state::memory::MemoryBackend::durable(
                store,
                object_store::path::Path::from("s5"),
                clock.clone(),
            ),
            gate: gate.clone(),
        }))
    };
    let mut expected = BTreeMap::new();
    produce_counter(&input, 1, (0, 100), 5, &mut expected).await?;
    let mut total = 100;
    // Round 1: killed while the write is held and the requested checkpoint waits for it: the
    // record is in neither the state nor the offsets. Round 2: the write is released, the
    // checkpoint commits, then the kill: the record is in both.
    for release_before_kill in [false, true] {
        let gate = Arc::new(Gate::default());
        let (requests, control) = weir_host::pipeline::PipelineControl::new();
        let pipeline = RunningPipeline::start_controlled(
            settings.clone(),
            backend(&gate)?,
            clock.clone(),
            control,
        );
        pipeline
            .wait_until("the shard open", TIMEOUT, |s| {
                s.partitions.lock().expect("lock").contains_key(&0)
            })
            .await?;
        let resumed_at = pipeline.stats.partitions.lock().expect("lock")[&0]
            .checkpointed_offsets
            .get(&input)
            .map_or(0, |o| o.0);
        pipeline
            .wait_done(total - resumed_at as u64, TIMEOUT)
            .await?;
        requests.send_modify(|n| *n += 1);
        pipeline
            .wait_until("a checkpoint of everything so far", TIMEOUT, |s| {
                s.partitions.lock().expect("lock").get(&0).is_some_and(|p| {
                    p.checkpointed_offsets.get(&input) == Some(&Offset(total as i64))
                })
            })
            .await?;
        let checkpoints = pipeline
            .stats
            .checkpoints
            .load(std::sync::atomic::Ordering::SeqCst);
        gate.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        produce_counter(&input, 1, (total, total + 50), 5, &mut expected).await?;
        total += 50;
        gate.held.notified().await;
        requests.send_modify(|n| *n += 1);
        if release_before_kill {
            gate.release.add_permits(1);
            // The checkpoint took its offsets after the write: they include the held batch.
            pipeline
                .wait_until(
                    "the requested checkpoint, past the held write",
                    TIMEOUT,
                    |s| {
                        s.checkpoints.load(std::sync::atomic::Ordering::SeqCst) > checkpoints
                            && s.partitions.lock().expect("lock")[&0]
                                .checkpointed_offsets
                                .get(&input)
                                == Some(&Offset(total as i64))
                    },
                )
                .await?;
        } else {
            // While the write is held, the requested checkpoint cannot commit: given a
            // second, nothing is committed (the kill follows).
            let committed = pipeline
                .wait_until("a checkpoint", Duration::from_secs(1), |s| {
                    s.checkpoints.load(std::sync::atomic::Ordering::SeqCst) > checkpoints
                })
                .await;
            assert!(committed.is_err(), "a checkpoint waits for the held write");
        }
        pipeline.kill().await;
    }
    // A last run, nothing held: every key's count is its number of records — none lost, none
    // counted twice.
    let pipeline = RunningPipeline::start_on(
        settings.clone(),
        backend(&Arc::new(Gate::default()))?,
        clock.clone(),
    );
    let counts = read_counts(&output, &expected, TIMEOUT).await?;
    assert_counts_exact(&expected, &counts);
    pipeline.stop().await
}
