//! Outages are not poison: a state backend that fails reads and writes now and then (as an
//! object store answering 503 would) makes the partition pause and retry; no record is
//! dead-lettered, and every record is counted exactly once.

use bytes::Bytes;
use rdkafka::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::RuntimeSettings;
use weir_host::ids::Partition;
use weir_host::pipeline::PipelineStats;
use weir_host::state::memory::{MemoryBackend, MemoryShard};
use weir_host::state::{Shard, ShardId, StateBackend, StateError, StateWrite};
use weir_tests::*;

/// Wraps the memory backend; about one operation in `every` fails as unavailable, chosen by a
/// fixed pseudo-random sequence (not periodically: a period matching a retry's length would
/// fail every retry at the same step).
#[derive(Debug)]
struct FlakyBackend {
    inner: MemoryBackend,
    every: u64,
}

#[derive(Debug)]
struct FlakyShard {
    inner: MemoryShard,
    calls: AtomicU64,
    every: u64,
}

impl FlakyShard {
    fn maybe_fail(&self) -> Result<(), StateError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        if splitmix64(n).is_multiple_of(self.every) {
            return Err(StateError::Unavailable {
                shard: "test/0".into(),
                source: "injected 503 Slow Down".into(),
            });
        }
        Ok(())
    }
}

impl StateBackend for FlakyBackend {
    type Shard = FlakyShard;
    async fn open_shard(&self, id: &ShardId) -> Result<FlakyShard, StateError> {
        Ok(FlakyShard {
            inner: self.inner.open_shard(id).await?,
            calls: AtomicU64::new(0),
            every: self.every,
        })
    }

    fn stored(&self, id: &ShardId) -> Option<weir_host::state::stored::StoredShard> {
        self.inner.stored(id)
    }
}

impl Shard for FlakyShard {
    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        self.maybe_fail()?;
        self.inner.get(key).await
    }
    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, StateError> {
        self.maybe_fail()?;
        self.inner.get_many(keys).await
    }
    async fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StateError> {
        self.maybe_fail()?;
        self.inner.scan(prefix, after, limit).await
    }
    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        self.maybe_fail()?;
        self.inner.apply(writes).await
    }
}

/// Runs `guest` over `records` (one partition) on a backend failing one operation in four and
/// returns the stats and the output.
async fn run_on_flaky_backend(
    guest_name: &str,
    records: &[(Vec<u8>, Vec<u8>)],
    expected_outputs: usize,
    runtime: RuntimeSettings,
) -> anyhow::Result<(Arc<PipelineStats>, Vec<rdkafka::message::OwnedMessage>)> {
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    produce(&input, 0, records).await?;
    let settings = settings(guest(guest_name), &input, &output, &dlq, runtime);
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(FlakyBackend {
        inner: MemoryBackend::new(clock.clone()),
        every: 4,
    });
    let pipeline = RunningPipeline::start_on(settings, backend, clock);
    pipeline
        .wait_done(records.len() as u64, Duration::from_secs(120))
        .await?;
    let stats = pipeline.stats.clone();
    let out = read_exactly(
        &output,
        expected_outputs,
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
    .await?;
    assert!(
        read_exactly(&dlq, 0, Duration::from_secs(1), Duration::from_secs(1))
            .await?
            .is_empty()
    );
    assert!(
        stats.outage_retries.load(Ordering::Relaxed) > 3,
        "outages were injected and retried"
    );
    assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 0);
    pipeline.stop().await?;
    Ok((stats, out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_backend_outage_pauses_and_retries_without_dead_lettering() -> anyhow::Result<()> {
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..600)
        .map(|i| (format!("k{}", i % 7).into_bytes(), b"v".to_vec()))
        .collect();
    // Small batches so that many prefetches and applies happen, one in four failing.
    let runtime = RuntimeSettings {
        batch_records_max: 20,
        outage_backoff_min: Duration::from_millis(1),
        ..RuntimeSettings::default()
    };
    let (_, out) = run_on_flaky_backend("weir_test_counter", &records, 600, runtime).await?;
    let mut counts: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        counts
            .entry(msg.key().unwrap_or_default().to_vec())
            .or_default()
            .push(v["count"].as_u64().unwrap_or(0));
    }
    for (key, seen) in counts {
        let n = seen.len() as u64;
        assert_eq!(
            seen,
            (1..=n).collect::<Vec<u64>>(),
            "key {}",
            String::from_utf8_lossy(&key)
        );
    }
    Ok(())
}

/// Map reads are not prefetched: they reach the shard from inside the guest call, so an outage
/// aborts the call midway. The instance is replaced and the record retried, never dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_during_a_guest_call_aborts_and_retries_the_record() -> anyhow::Result<()> {
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..150)
        .map(|_| (b"doc".to_vec(), b"a b".to_vec()))
        .collect();
    let runtime = RuntimeSettings {
        batch_records_max: 1,
        outage_backoff_min: Duration::from_millis(1),
        ..RuntimeSettings::default()
    };
    let (stats, out) = run_on_flaky_backend("word_count", &records, 300, runtime).await?;
    assert_eq!(
        stats.traps.load(Ordering::Relaxed),
        0,
        "an outage is not a trap"
    );
    let a: Vec<u64> = out
        .iter()
        .filter_map(|m| {
            serde_json::from_slice::<serde_json::Value>(m.payload().unwrap_or_default()).ok()
        })
        .filter(|v| v["word"] == "a")
        .map(|v| v["count"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(a, (1..=150).collect::<Vec<u64>>());
    Ok(())
}

/// A backend whose partition-0 shard fails every operation while `down` is set, or, with
/// `hang`, does not answer until `down` is cleared (a store that stops responding).
#[derive(Debug)]
struct OutageBackend {
    inner: MemoryBackend,
    down: Arc<std::sync::atomic::AtomicBool>,
    hang: bool,
}

#[derive(Debug)]
struct OutageShard {
    inner: MemoryShard,
    down: Option<Arc<std::sync::atomic::AtomicBool>>,
    hang: bool,
}

impl OutageShard {
    async fn check(&self) -> Result<(), StateError> {
        let Some(down) = &self.down else {
            return Ok(());
        };
        if self.hang {
            while down.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            return Ok(());
        }
        if down.load(Ordering::SeqCst) {
            return Err(StateError::Unavailable {
                shard: "test/0".into(),
                source: "injected outage".into(),
            });
        }
        Ok(())
    }
}

impl StateBackend for OutageBackend {
    type Shard = OutageShard;
    async fn open_shard(&self, id: &ShardId) -> Result<OutageShard, StateError> {
        Ok(OutageShard {
            inner: self.inner.open_shard(id).await?,
            down: (id.partition == Partition(0)).then(|| self.down.clone()),
            hang: self.hang,
        })
    }

    fn stored(&self, id: &ShardId) -> Option<weir_host::state::stored::StoredShard> {
        self.inner.stored(id)
    }
}

impl Shard for OutageShard {
    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        self.check().await?;
        self.inner.get(key).await
    }
    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, StateError> {
        self.check().await?;
        self.inner.get_many(keys).await
    }
    async fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StateError> {
        self.check().await?;
        self.inner.scan(prefix, after, limit).await
    }
    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        self.check().await?;
        self.inner.apply(writes).await
    }
}

/// A backend whose partition 0 is down (failing, or with `hang` not answering) until the
/// returned flag is cleared; with the clock it was built on.
fn outage_backend(
    hang: bool,
) -> (
    Arc<OutageBackend>,
    Arc<std::sync::atomic::AtomicBool>,
    SharedClock,
) {
    let clock: SharedClock = Arc::new(SystemClock);
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let backend = Arc::new(OutageBackend {
        inner: MemoryBackend::new(clock.clone()),
        down: down.clone(),
        hang,
    });
    (backend, down, clock)
}

/// A state read that hangs inside a guest call hits the call's wall-clock cap while the host
/// waits on storage: that is an outage (retried), never the record's fault (dead-lettered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_read_that_hangs_is_retried_not_dead_lettered() -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> =
        (0..20).map(|_| (b"doc".to_vec(), b"a".to_vec())).collect();
    produce(&input, 0, &records).await?;
    let runtime = RuntimeSettings {
        record_deadline: Duration::from_millis(20),
        batch_deadline_max: Duration::from_millis(100),
        call_io_allowance: Duration::from_millis(200),
        outage_backoff_min: Duration::from_millis(10),
        ..RuntimeSettings::default()
    };
    let settings = settings(guest("word_count"), &input, &output, &dlq, runtime);
    let (backend, down, clock) = outage_backend(true);
    let pipeline = RunningPipeline::start_on(settings, backend, clock);
    pipeline
        .wait_until("two aborted calls", Duration::from_secs(60), |s| {
            s.calls_aborted.load(Ordering::Relaxed) >= 2
        })
        .await?;
    down.store(false, Ordering::SeqCst);
    pipeline.wait_done(20, Duration::from_secs(60)).await?;
    let stats = pipeline.stats.clone();
    let out = read_exactly(&output, 20, Duration::from_secs(60), Duration::from_secs(2)).await?;
    assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 0);
    assert_eq!(stats.traps.load(Ordering::Relaxed), 0);
    let counts: Vec<u64> = out
        .iter()
        .filter_map(|m| {
            serde_json::from_slice::<serde_json::Value>(m.payload().unwrap_or_default()).ok()
        })
        .map(|v| v["count"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(counts, (1..=20).collect::<Vec<u64>>());
    pipeline.stop().await?;
    Ok(())
}

/// While partition 0's state is down for good, its fetching is paused and partition 1 runs to
/// the end; when the outage ends, partition 0 resumes and loses or repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_on_one_partition_pauses_it_while_the_others_go_on() -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 2), (&output, 2), (&dlq, 1)]).await?;
    let per_partition = 3_000;
    for partition in 0..2 {
        let records: Vec<(Vec<u8>, Vec<u8>)> = (0..per_partition)
            .map(|i| {
                (
                    format!("p{partition}-k{}", i % 5).into_bytes(),
                    b"v".to_vec(),
                )
            })
            .collect();
        produce(&input, partition, &records).await?;
    }
    let runtime = RuntimeSettings {
        batch_records_max: 50,
        partition_queue_batches_max: 2,
        ..RuntimeSettings::default()
    };
    let settings = settings(guest("weir_test_counter"), &input, &output, &dlq, runtime);
    let (backend, down, clock) = outage_backend(false);
    let pipeline = RunningPipeline::start_on(settings, backend, clock);
    let stats = pipeline.stats.clone();
    // Partition 1 finishes although partition 0 cannot make progress.
    pipeline
        .wait_done(per_partition as u64, Duration::from_secs(120))
        .await?;
    assert_eq!(
        stats.records_done(),
        per_partition as u64,
        "partition 0 made no progress while down"
    );
    down.store(false, Ordering::SeqCst);
    pipeline
        .wait_done(2 * per_partition as u64, Duration::from_secs(120))
        .await?;
    let out = read_exactly(
        &output,
        2 * per_partition,
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
    .await?;
    assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 0);
    let mut counts: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        counts
            .entry(msg.key().unwrap_or_default().to_vec())
            .or_default()
            .push(v["count"].as_u64().unwrap_or(0));
    }
    assert_eq!(counts.len(), 10);
    for (key, seen) in counts {
        assert_eq!(
            seen,
            (1..=600).collect::<Vec<u64>>(),
            "key {}",
            String::from_utf8_lossy(&key)
        );
    }
    pipeline.stop().await?;
    Ok(())
}

/// A shutdown during a state outage does not wait for the store: the held partition's waiting
/// batches are tried once more, fail again, and its worker ends without its last checkpoint
/// (docs/checkpoints.md, "Shutdown"); the run stops cleanly, well within
/// `shutdown_drain_max`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_an_outage_ends_the_held_partition_without_its_last_checkpoint()
-> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..50)
        .map(|i| (format!("k{i}").into_bytes(), b"v".to_vec()))
        .collect();
    produce(&input, 0, &records).await?;
    let runtime = RuntimeSettings {
        shutdown_drain_max: Duration::from_secs(60),
        ..RuntimeSettings::default()
    };
    let settings = settings(guest("weir_test_counter"), &input, &output, &dlq, runtime);
    let (backend, _down, clock) = outage_backend(false);
    let pipeline = RunningPipeline::start_on(settings, backend, clock);
    pipeline
        .wait_until("an outage retry", Duration::from_secs(60), |s| {
            s.outage_retries.load(Ordering::Relaxed) > 0
        })
        .await?;
    let stats = pipeline.stats.clone();
    // Waiting out the 60 s limit would end the stop with `DrainTimedOut`.
    pipeline.stop().await?;
    assert_eq!(
        stats.closed_without_checkpoint.load(Ordering::Relaxed),
        1,
        "the held partition ended without its last checkpoint"
    );
    assert_eq!(stats.records_done(), 0, "nothing was processed");
    Ok(())
}

/// A store that neither answers nor fails (every read of partition 0 hangs) holds a worker in
/// a read it cannot give up: the shutdown stops it at `shutdown_drain_max`, committing nothing
/// it did not finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_a_state_read_hangs_gives_up_draining_after_its_limit() -> anyhow::Result<()>
{
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..50)
        .map(|i| (format!("k{i}").into_bytes(), b"v".to_vec()))
        .collect();
    produce(&input, 0, &records).await?;
    let runtime = RuntimeSettings {
        shutdown_drain_max: Duration::from_secs(1),
        ..RuntimeSettings::default()
    };
    let settings = settings(guest("weir_test_counter"), &input, &output, &dlq, runtime);
    let (backend, _down, clock) = outage_backend(true);
    let pipeline = RunningPipeline::start_on(settings, backend, clock);
    pipeline
        .wait_until("records admitted", Duration::from_secs(60), |s| {
            s.records_in.load(Ordering::Relaxed) > 0
        })
        .await?;
    let stopped = tokio::time::timeout(Duration::from_secs(30), pipeline.stop()).await?;
    let err = stopped.expect_err("draining gave up");
    assert!(
        format!("{err:#}").contains("gave up draining partitions [0]"),
        "{err:#}"
    );
    Ok(())
}
