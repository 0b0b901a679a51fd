//! The pipeline whole — consumer loop, shard opens, workers, checkpoints — over the in-memory
//! source and output, the `counter` guest and the memory backend checkpointing to an in-memory
//! object store. No broker, and tokio's paused time: every run takes the same steps.
//!
//! The counter emits `{"count": n, "offset": o}` per record, `n` being how many records of
//! that key the partition has up to `o`. So an output whose count is not exactly that shows
//! state and offsets that disagree: a record counted twice or lost, a checkpoint whose state
//! is ahead of or behind its offsets.

use super::*;
use crate::clock::{SharedClock, SystemClock};
use crate::config::Settings;
use crate::ids::{ManifestVersion, Partition};
use crate::runtime::Runtime;
use crate::sink::memory::{MemoryOutput, Written};
use crate::source::memory::{MemorySource, MemorySourceHandle};
use crate::state::delayed::{DelayedReads, ReadDelay};
use crate::state::memory::MemoryBackend;
use crate::state::{Recovery, Shard, ShardId};
use futures::StreamExt;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::JoinHandle;

mod global_tables;
mod joins;
mod shutdown;
mod stalls;
mod table;
mod table_inputs;
mod timers;
mod traps;

const TOPIC: &str = "in";

type Backend = DelayedReads<MemoryBackend>;

/// Settings of the test pipelines: small batches and queues so that records queue up behind
/// a busy worker, short checkpoint intervals.
fn settings(delivery: &str) -> Settings {
    Settings::from_toml(&format!(
        r#"
        [pipeline]
        name = "counter"
        operator = "counter.wasm"
        input_topics = ["{TOPIC}"]
        output_topic = "out"
        dead_letter_topic = "dlq"
        checkpoint_interval = "200ms"
        in_flight_max = 32
        delivery = "{delivery}"

        [kafka]
        bootstrap_servers = "in-memory:9092"

        [runtime]
        batch_records_max = 8
        partition_queue_batches_max = 2
        outage_backoff_min = "100ms"

        [state]
        backend = "memory"
        memory.url = "memory:///"
        "#
    ))
    .expect("valid test settings")
}

/// What outlives a test pipeline's runs: its input (`per_partition` records in each partition,
/// keys `k0`…`k19`), its output (exactly-once commits set the source's committed offsets, as
/// Kafka's transactions do) and the store its checkpoints go to.
struct World {
    source: MemorySource,
    handle: MemorySourceHandle,
    output: MemoryOutput,
    store: Arc<InMemory>,
    delivery: &'static str,
}

impl World {
    fn new(partitions: i32, per_partition: usize, delivery: &'static str) -> Self {
        let (source, handle) = MemorySource::new(&[TOPIC]);
        for partition in 0..partitions {
            for i in 0..per_partition {
                let key = format!("k{}", i % 20);
                handle.produce(TOPIC, partition, key.as_bytes(), b"v", i as i64);
            }
        }
        Self {
            source,
            output: MemoryOutput::new(1 << 20, Some(handle.clone())),
            handle,
            store: Arc::new(InMemory::new()),
            delivery,
        }
    }

    /// Starts a pipeline over this world, each state read delayed by `delay`; returns the
    /// run and its backend.
    async fn start(&self, delay: ReadDelay) -> (Run, Arc<Backend>) {
        start(
            settings(self.delivery),
            self.source.clone(),
            self.output.clone(),
            self.store.clone(),
            delay,
        )
        .await
    }

    /// Starts a pipeline over this world's two partitions of 1,000 records with partition 0's
    /// deliveries refused; returns the run once partition 1 is done and partition 0 paused.
    async fn start_refusing_partition_0(&self) -> Run {
        self.output.refuse(0, true);
        let (run, _) = self
            .start(ReadDelay::Fixed(Duration::from_millis(10)))
            .await;
        self.handle.assign(&[0, 1]);
        until("partition 1 is done", || {
            outputs_of(&self.output, 1) == 1000
        })
        .await;
        until("partition 0 is paused", || {
            self.handle.paused().contains(&0)
        })
        .await;
        run
    }

    /// Starts a pipeline over this world with `partitions` assigned; once each has a
    /// checkpoint, a state outage of partition 0: records pile up in its worker's queue and in
    /// the loop until the partition is paused. Returns the run then, and its backend (whose
    /// `set_unavailable(0, false)` ends the outage).
    async fn start_holding_partition_0_in_an_outage(
        &self,
        partitions: &[i32],
    ) -> (Run, Arc<Backend>) {
        let (run, backend) = self
            .start(ReadDelay::Fixed(Duration::from_millis(10)))
            .await;
        self.handle.assign(partitions);
        until("a checkpoint of each partition", || {
            run.stats.checkpoints.load(Ordering::Relaxed) >= partitions.len() as u64
        })
        .await;
        backend.set_unavailable(0, true);
        until("partition 0 is paused with records queued", || {
            self.handle.paused().contains(&0)
        })
        .await;
        (run, backend)
    }
}

/// One pipeline run, and what drives it.
struct Run {
    stats: Arc<PipelineStats>,
    /// Each change asks every partition for a checkpoint now.
    requests: tokio::sync::watch::Sender<u64>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<Result<(), PipelineError>>,
}

/// Starts a pipeline with `settings` over `source`, `output` and a backend checkpointing to
/// `store`, each read delayed by `delay`; returns the run and its backend.
async fn start(
    settings: Settings,
    source: MemorySource,
    output: MemoryOutput,
    store: Arc<InMemory>,
    delay: ReadDelay,
) -> (Run, Arc<Backend>) {
    let clock: SharedClock = Arc::new(SystemClock);
    start_with(
        settings,
        (source, output, store),
        delay,
        "weir_test_counter",
        clock,
    )
    .await
}

/// As [`start`], running the guest component `guest` with processing time from `clock`, its
/// emits to `output` (a [`MemoryOutput`], or one around it).
async fn start_with<O: Output>(
    settings: Settings,
    parts: (MemorySource, O, Arc<InMemory>),
    delay: ReadDelay,
    guest: &str,
    clock: SharedClock,
) -> (Run, Arc<Backend>) {
    start_logging(settings, parts, (delay, guest, clock), None).await
}

/// As [`start_with`], the operator's log lines also going to `log_sink`.
async fn start_logging<O: Output>(
    settings: Settings,
    (source, output, store): (MemorySource, O, Arc<InMemory>),
    (delay, guest, clock): (ReadDelay, &str, SharedClock),
    log_sink: Option<Arc<dyn crate::runtime::guest_log::LogSink>>,
) -> (Run, Arc<Backend>) {
    let backend = Arc::new(DelayedReads::new(
        MemoryBackend::durable(store, "weir".into(), clock.clone()),
        delay,
    ));
    let runtime = Runtime::<<Backend as StateBackend>::Shard>::new(&settings.runtime, clock)
        .expect("runtime");
    let operator = Arc::new(
        runtime
            .load_operator(&crate::testing::guest(guest))
            .await
            .expect("the guest compiles"),
    );
    let stats = Arc::new(PipelineStats::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (requests, mut control) = PipelineControl::new();
    control.log_sink = log_sink;
    let task = tokio::spawn(run_with(
        settings,
        backend.clone(),
        operator,
        stats.clone(),
        control,
        Arc::new(source),
        Arc::new(output),
        async move {
            let _ = stopped.await;
        },
    ));
    (
        Run {
            stats,
            requests,
            stop,
            task,
        },
        backend,
    )
}

impl Run {
    /// Shuts the pipeline down (draining) and returns how it ended.
    async fn stop(self) -> Result<(), PipelineError> {
        let _ = self.stop.send(());
        self.task.await.expect("the pipeline does not panic")
    }

    /// The process dies: nothing is drained, checkpointed or committed.
    async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Waits, in paused time, until `done` holds (panics after ten virtual minutes).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..60_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("gave up waiting until {what}");
}

/// The offsets of `partition` with outputs, each with how many outputs it has.
fn outputs_per_offset(output: &MemoryOutput, partition: i32) -> BTreeMap<i64, usize> {
    let mut seen = BTreeMap::new();
    for written in output
        .log()
        .outputs
        .iter()
        .filter(|w| w.partition == Partition(partition))
    {
        *seen.entry(written.source.1).or_insert(0) += 1;
    }
    seen
}

/// Asserts that every output of `partition` carries the exact running count of its key at its
/// offset, and returns how many outputs it has.
fn assert_counts_exact(handle: &MemorySourceHandle, output: &MemoryOutput, partition: i32) {
    let records = handle.records(TOPIC, partition);
    let mut running: BTreeMap<&[u8], u64> = BTreeMap::new();
    let mut expected = Vec::with_capacity(records.len());
    for record in &records {
        let count = running.entry(&record.key).or_insert(0);
        *count += 1;
        expected.push(*count);
    }
    let log = output.log();
    let written: Vec<&Written> = log
        .outputs
        .iter()
        .filter(|w| w.partition == Partition(partition))
        .collect();
    for w in written {
        let value: serde_json::Value = serde_json::from_slice(&w.value).expect("counter JSON");
        let offset = value["offset"].as_i64().expect("offset");
        assert_eq!(offset, w.source.1, "an output names its input record");
        let index = usize::try_from(offset).expect("offsets from 0");
        assert_eq!(
            value["count"].as_u64(),
            Some(expected[index]),
            "partition {partition} offset {offset}: the count must be the key's running count"
        );
    }
}

fn outputs_of(output: &MemoryOutput, partition: i32) -> usize {
    output
        .log()
        .outputs
        .iter()
        .filter(|w| w.partition == Partition(partition))
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_revoke_in_the_middle_of_batches_drops_the_queued_records_without_changing_state_or_offsets()
 {
    let world = World::new(2, 1000, "at_least_once");
    let (handle, output) = (&world.handle, &world.output);
    // The worker of partition 0 stuck on a state outage. Then the revoke, and the outage ends.
    let (run, backend) = world.start_holding_partition_0_in_an_outage(&[0, 1]).await;
    handle.revoke(&[0]);
    backend.set_unavailable(0, false);
    until("partition 0's shard is closed", || {
        run.stats.shards_closed.load(Ordering::Relaxed) == 1
    })
    .await;
    let checkpointed = run
        .stats
        .checkpoint_history
        .lock()
        .expect("history")
        .iter()
        .rev()
        .find(|c| c.partition == Partition(0))
        .map(|c| c.offsets[TOPIC].0)
        .expect("the revoke's checkpoint");
    assert!(
        handle.position(TOPIC, 0) > checkpointed,
        "records past the last checkpoint were fetched and queued when the revoke came: \
         fetched to {}, checkpointed to {checkpointed}",
        handle.position(TOPIC, 0)
    );
    let done = outputs_per_offset(output, 0);
    assert_eq!(
        done.keys().copied().collect::<Vec<_>>(),
        (0..checkpointed).collect::<Vec<_>>(),
        "the outputs are those of the records the checkpoint covers: the queued ones were dropped"
    );
    until("partition 1 is done", || outputs_of(output, 1) == 1000).await;
    assert_eq!(
        outputs_of(output, 0),
        done.values().sum::<usize>(),
        "nothing of a revoked partition runs after its close"
    );
    // Assigned back, it resumes from the checkpoint: every record once, counts exact.
    handle.assign(&[0]);
    until("partition 0 is done", || outputs_of(output, 0) >= 1000).await;
    run.stop().await.expect("clean stop");
    assert_eq!(
        run_count(output, 0),
        1000,
        "every record of partition 0 has one output"
    );
    assert_counts_exact(handle, output, 0);
    assert_counts_exact(handle, output, 1);
}

#[tokio::test(start_paused = true)]
async fn a_revoke_between_two_fetched_batches_reopens_from_the_checkpoint() {
    let world = World::new(1, 400, "at_least_once");
    let (handle, output) = (&world.handle, &world.output);
    let (run, _) = world
        .start(ReadDelay::Fixed(Duration::from_millis(2)))
        .await;
    handle.assign(&[0]);
    until("a first batch has run", || outputs_of(output, 0) >= 8).await;
    // Taken away and given back at once: the second assignment arrives while the first
    // owner's worker is still closing.
    handle.revoke(&[0]);
    handle.assign(&[0]);
    until("partition 0 is done", || outputs_of(output, 0) >= 400).await;
    run.stop().await.expect("clean stop");
    assert_eq!(run_count(output, 0), 400, "no record is lost or run twice");
    assert_counts_exact(handle, output, 0);
}

#[tokio::test(start_paused = true)]
async fn no_partition_waits_behind_the_backlog_of_others() {
    // A record in each partition first, so that all four shards are open before the backlog.
    let world = World::new(4, 1, "at_least_once");
    let (handle, output) = (&world.handle, &world.output);
    let (run, _) = world
        .start(ReadDelay::Fixed(Duration::from_millis(1)))
        .await;
    handle.assign(&[0, 1, 2, 3]);
    until("every shard ran its first record", || {
        (0..4).all(|p| outputs_of(output, p) == 1)
    })
    .await;
    // A backlog of partitions 0 and 1, all fetched before a few records of 2 and 3 (as a
    // consumer's prefetch of 100,000 records holds them).
    let start = output.log().outputs.len();
    for i in 1..=4000 {
        let key = format!("k{}", i % 20);
        for partition in [0, 1] {
            handle.produce(TOPIC, partition, key.as_bytes(), b"v", i);
        }
    }
    for i in 1..=10 {
        for partition in [2, 3] {
            handle.produce(TOPIC, partition, b"k0", b"v", i);
        }
    }
    until("partitions 2 and 3 are done", || {
        outputs_of(output, 2) == 11 && outputs_of(output, 3) == 11
    })
    .await;
    let in_flight_max = settings("at_least_once").pipeline.in_flight_max;
    {
        let log = output.log();
        let outputs = &log.outputs[start..];
        for partition in [2, 3] {
            let first = outputs
                .iter()
                .position(|w| w.partition == Partition(partition))
                .expect("an output of the partition");
            assert!(
                first <= in_flight_max * 4,
                "partition {partition} waited while {first} records of others ran (at most in_flight_max × partitions = {})",
                in_flight_max * 4
            );
        }
    }
    until("the backlog is done", || {
        outputs_of(output, 0) == 4001 && outputs_of(output, 1) == 4001
    })
    .await;
    run.stop().await.expect("clean stop");
    for partition in 0..4 {
        assert_counts_exact(handle, output, partition);
    }
}

/// How many distinct offsets of `partition` have exactly one output (panics on duplicates).
fn run_count(output: &MemoryOutput, partition: i32) -> usize {
    let seen = outputs_per_offset(output, partition);
    assert!(
        seen.values().all(|n| *n == 1),
        "a record ran twice: {seen:?}"
    );
    seen.len()
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_drains_in_flight_batches_so_a_crash_resumes_with_exact_state() {
    let world = World::new(2, 1000, "at_least_once");
    let (handle, output) = (&world.handle, &world.output);
    let (run, _) = world
        .start(
            // Irregular read times: batches finish out of order.
            ReadDelay::UpTo(Duration::from_millis(20)),
        )
        .await;
    handle.assign(&[0, 1]);
    until("a few checkpoints", || {
        run.stats.checkpoints.load(Ordering::Relaxed) >= 4
    })
    .await;
    assert!(
        run.stats.batches_in_flight_peak.load(Ordering::Relaxed) > 1,
        "batches ran concurrently"
    );
    run.crash().await;
    handle.crash();
    let (run, _) = world
        .start(ReadDelay::UpTo(Duration::from_millis(20)))
        .await;
    handle.assign(&[0, 1]);
    until("both partitions are done", || {
        outputs_per_offset(output, 0).len() == 1000 && outputs_per_offset(output, 1).len() == 1000
    })
    .await;
    run.stop().await.expect("clean stop");
    assert_counts_exact(handle, output, 0);
    assert_counts_exact(handle, output, 1);
}

#[tokio::test(start_paused = true)]
async fn exactly_once_commits_outputs_offsets_and_the_manifest_version_together() {
    let world = World::new(2, 1000, "exactly_once");
    let (handle, output) = (&world.handle, &world.output);
    let (run, backend) = world
        .start(ReadDelay::Fixed(Duration::from_millis(10)))
        .await;
    handle.assign(&[0, 1]);
    until("two commits per partition", || {
        let log = output.log();
        (0..2).all(|p| log.commits.iter().filter(|c| c.0 == p).count() >= 2)
    })
    .await;
    run.crash().await;
    handle.crash();
    // What is visible is exactly what the last commit of each partition covers, and the
    // group's offsets and the stored checkpoint agree with it.
    for partition in 0..2 {
        let (offsets, version) = {
            let log = output.log();
            let last = log
                .commits
                .iter()
                .rev()
                .find(|c| c.0 == partition)
                .expect("a commit");
            (last.1.clone(), last.2)
        };
        let next = offsets
            .next(TOPIC)
            .expect("the commit has the topic's offset")
            .0;
        assert_eq!(
            run_count(output, partition),
            usize::try_from(next).expect("offset"),
            "the visible outputs are those of the committed offsets"
        );
        assert_eq!(
            outputs_per_offset(output, partition).keys().max().copied(),
            Some(next - 1)
        );
        let (group_next, metadata) = handle.committed()[&(TOPIC.to_owned(), partition)].clone();
        assert_eq!(group_next, next, "the group's offset is the transaction's");
        assert_eq!(
            crate::state::checkpoint::parse_manifest_metadata(&metadata),
            Some(ManifestVersion(version)),
            "the group's offset names the checkpoint's version"
        );
        let shard = backend
            .open_shard_at(
                &ShardId {
                    pipeline: "counter".to_owned(),
                    partition: Partition(partition),
                },
                &Recovery {
                    committed: Some(ManifestVersion(version)),
                    ..Recovery::default()
                },
            )
            .await
            .expect("the committed checkpoint opens");
        assert_eq!(
            shard.recovered_offsets().expect("offsets"),
            Some(offsets),
            "the checkpoint the offsets name holds the same offsets"
        );
    }
    assert!(
        world.store.list(None).next().await.is_some(),
        "checkpoints are in the store"
    );
    let (run, _) = world
        .start(ReadDelay::Fixed(Duration::from_millis(10)))
        .await;
    handle.assign(&[0, 1]);
    until("both partitions are committed to the end", || {
        (0..2).all(|p| outputs_per_offset(output, p).len() == 1000)
    })
    .await;
    run.stop().await.expect("clean stop");
    for partition in 0..2 {
        assert_eq!(run_count(output, partition), 1000, "every output once");
        assert_counts_exact(handle, output, partition);
    }
}
