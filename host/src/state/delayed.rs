//! [`DelayedReads`]: a state backend whose reads wait first, as reads that miss the caches and
//! go to object storage do. For the execution-controller benchmark and tests: the delay is
//! the only thing it adds, besides an outage a test can switch on per partition (its reads
//! fail as unavailable); writes and checkpoints pass straight through.

use super::checkpoint::{CheckpointError, CheckpointReport, DecidedBy, InputOffsets};
use super::{Recovery, Shard, ShardId, StateBackend, StateError, StateWrite};
use crate::ids::{ManifestVersion, Partition};
use bytes::Bytes;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long each read (`get`, `get_many`, `scan`) waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadDelay {
    /// The same delay every time.
    Fixed(Duration),
    /// A pseudo-random delay of 0..=max ms (whole milliseconds), the same sequence every run
    /// (SplitMix64 of a per-shard counter).
    UpTo(Duration),
}

/// `inner` with every read delayed by `delay`.
#[derive(Debug)]
pub struct DelayedReads<B> {
    inner: B,
    delay: ReadDelay,
    /// Partitions whose reads fail as [`StateError::Unavailable`].
    unavailable: Arc<Mutex<BTreeSet<i32>>>,
}

impl<B> DelayedReads<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, delay: ReadDelay) -> Self {
        Self {
            inner,
            delay,
            unavailable: Arc::default(),
        }
    }

    /// Makes the reads of `partition`'s shards fail as [`StateError::Unavailable`] (after
    /// their delay) while `down`, as a store outage does.
    pub fn set_unavailable(&self, partition: impl Into<Partition>, down: bool) {
        let partition: Partition = partition.into();
        let mut unavailable = self.unavailable.lock().unwrap_or_else(|e| e.into_inner());
        if down {
            unavailable.insert(partition.0);
        } else {
            unavailable.remove(&partition.0);
        }
    }
}

/// A shard of [`DelayedReads`].
#[derive(Debug)]
pub struct DelayedShard<S> {
    inner: S,
    delay: ReadDelay,
    reads: AtomicU64,
    partition: Partition,
    unavailable: Arc<Mutex<BTreeSet<i32>>>,
}

impl<S> DelayedShard<S> {
    /// Waits the read's delay, then fails it if the partition is in an outage.
    async fn wait(&self) -> Result<(), StateError> {
        self.delay().await;
        let down = self
            .unavailable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&self.partition.0);
        match down {
            true => Err(StateError::Unavailable {
                shard: format!("delayed/{}", self.partition),
                source: "injected outage".into(),
            }),
            false => Ok(()),
        }
    }

    async fn delay(&self) {
        let delay = match self.delay {
            ReadDelay::Fixed(delay) => delay,
            ReadDelay::UpTo(max) => {
                let n = self.reads.fetch_add(1, Ordering::Relaxed);
                let max_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
                Duration::from_millis(splitmix64(n) % max_ms.saturating_add(1))
            }
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a fixed, well-mixed pseudo-random sequence from a
/// counter, for injected faults and latencies that are irregular yet the same every run.
pub fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<B: StateBackend> StateBackend for DelayedReads<B> {
    type Shard = DelayedShard<B::Shard>;

    async fn open_shard(&self, id: &ShardId) -> Result<Self::Shard, StateError> {
        self.open_shard_at(id, &Recovery::default()).await
    }

    async fn open_shard_at(
        &self,
        id: &ShardId,
        recovery: &Recovery,
    ) -> Result<Self::Shard, StateError> {
        Ok(DelayedShard {
            inner: self.inner.open_shard_at(id, recovery).await?,
            delay: self.delay,
            // Each partition its own sequence.
            reads: AtomicU64::new(u64::from(id.partition.0.unsigned_abs()) << 32),
            partition: id.partition,
            unavailable: self.unavailable.clone(),
        })
    }

    fn stored(&self, id: &ShardId) -> Option<super::stored::StoredShard> {
        self.inner.stored(id)
    }
}

impl<S: Shard> Shard for DelayedShard<S> {
    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        self.wait().await?;
        self.inner.get(key).await
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, StateError> {
        self.wait().await?;
        self.inner.get_many(keys).await
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StateError> {
        self.wait().await?;
        self.inner.scan(prefix, start_after, limit).await
    }

    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        self.inner.apply(writes).await
    }

    fn recovered_offsets(&self) -> Result<Option<InputOffsets>, StateError> {
        self.inner.recovered_offsets()
    }

    fn opened_from(&self) -> Option<ManifestVersion> {
        self.inner.opened_from()
    }

    fn resumed_from(&self) -> Option<ManifestVersion> {
        self.inner.resumed_from()
    }

    async fn next_checkpoint_version(&self) -> Option<ManifestVersion> {
        self.inner.next_checkpoint_version().await
    }

    fn corruption(&self) -> Option<StateError> {
        self.inner.corruption()
    }

    async fn checkpoint(
        &self,
        offsets: &InputOffsets,
        decided_by: DecidedBy,
    ) -> Result<Option<CheckpointReport>, CheckpointError> {
        self.inner.checkpoint(offsets, decided_by).await
    }

    fn checkpoint_decided(&self, version: ManifestVersion) {
        self.inner.checkpoint_decided(version);
    }

    async fn settle(&self, max: std::time::Duration) {
        self.inner.settle(max).await;
    }

    fn quota(&self) -> Option<Arc<super::StateQuota>> {
        self.inner.quota()
    }

    fn stored_value_len(&self, key: &[u8]) -> Option<u64> {
        self.inner.stored_value_len(key)
    }
}
