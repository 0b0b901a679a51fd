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
use weir_host::pipeline::{self, PipelineStats};
use weir_host::state::memory::{MemoryBackend, MemoryShard};
use weir_host::state::{Shard, ShardId, StateBackend, StateError, StateWrite};
use weir_tests::*;

/// Wraps the memory backend; every `every`-th operation fails as unavailable.
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
        if self.calls.fetch_add(1, Ordering::Relaxed) % self.every == self.every - 1 {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_backend_outage_pauses_and_retries_without_dead_lettering() -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..600)
        .map(|i| (format!("k{}", i % 7).into_bytes(), b"v".to_vec()))
        .collect();
    produce(&input, 0, &records).await?;

    // Small batches so that many prefetches and applies happen, one in three failing.
    let runtime = RuntimeSettings {
        batch_records_max: 20,
        ..RuntimeSettings::default()
    };
    let settings = settings(guest("weir_test_counter"), &input, &output, &dlq, runtime);
    let clock: SharedClock = Arc::new(SystemClock);
    let stats = Arc::new(PipelineStats::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let backend = Arc::new(FlakyBackend {
        inner: MemoryBackend::new(clock.clone()),
        every: 3,
    });
    let task = tokio::spawn(pipeline::run(
        settings,
        backend,
        clock,
        stats.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while stats.records_done() < 600 {
        anyhow::ensure!(!task.is_finished(), "pipeline ended early");
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "timed out at {}",
            stats.records_done()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = read_exactly(
        &output,
        600,
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
        stats.outage_retries.load(Ordering::Relaxed) > 10,
        "outages were injected and retried"
    );
    assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 0);
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
    let _ = stop.send(());
    task.await??;
    Ok(())
}
