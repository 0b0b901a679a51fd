//! Keyed state: the [`StateBackend`] seam the runtime reads and writes through, the encoding
//! of state keys, and the two backends with their checkpoints. The tools over stored
//! checkpoints (savepoints, the portable export, the switch between backends, verify,
//! queries) are `crate::checkpoints`.
//!
//! The seam and what both backends share:
//! - [`key`]           how (record key, state name, map key) become one byte string;
//! - [`checkpoint`]    what a checkpoint records (input offsets) and reports, for both backends;
//! - [`manifest`]      numbered, create-only manifest versions and the commit that fences
//!   zombie writers; recovery's walk to the newest usable checkpoint and retention;
//! - [`configured`]    the backend the settings name, behind one type;
//! - [`stored`]        a shard's place in the store and its checkpoints' format, for the tools
//!   beside the backends; which backend wrote a checkpoint, and the other's objects swept
//!   after a switch.
//!
//! The backends:
//! - [`memory`]        one map per shard in RAM (as Flink's HashMapStateBackend), checkpointed
//!   as full [`snapshot`]s;
//! - [`lsm`]           the disaggregated LSM tree on object storage (memtables, SSTs, caches,
//!   compaction, GC).
//!
//! The object store under both: [`store_guard`] (requests in flight bounded, retries
//! budgeted), [`hooked_store`] (latency, failures, metering); for tests and benchmarks
//! [`delayed`] (reads that wait) and, in unit tests only, `faulty_store` and `test_support`.
//!
//! [`lease`]s keep GC off the versions a reader outside the shard's owner reads.
//!
//! A *shard* is the state of one pipeline for one input partition. The runtime never touches a
//! backend's internals: it reads through [`Shard::get_many`] / [`Shard::get`] / [`Shard::scan`]
//! and applies the writes of successful records with [`Shard::apply`]. The disaggregated LSM
//! backend (object storage, caches) and checkpoints plug in behind the same traits.
//!
//! Invariant: a shard only ever sees writes of records whose call succeeded, applied in input
//! offset order.

pub mod checkpoint;
pub mod configured;
pub mod delayed;
#[cfg(test)]
pub(crate) mod faulty_store;
pub mod global_table;
pub mod hooked_store;
pub mod key;
pub mod lease;
pub mod lsm;
pub mod manifest;
pub mod memory;
pub mod snapshot;
pub mod store_guard;
pub mod stored;
#[cfg(test)]
pub(crate) mod test_support;

use crate::ids::{ManifestVersion, Partition};
use bytes::Bytes;
use checkpoint::{CheckpointError, CheckpointReport, DecidedBy, InputOffsets};
pub use manifest::KnownCorruption;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies a shard: pipeline name and input partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId {
    /// The pipeline's name.
    pub pipeline: String,
    /// The input partition (co-partitioned input topics share it).
    pub partition: Partition,
}

impl ShardId {
    /// The directory of every shard of the pipeline under a backend's `prefix`:
    /// `{prefix}/pipelines/{pipeline}/shards` (both backends).
    pub fn shards_under(&self, prefix: &object_store::path::Path) -> object_store::path::Path {
        let shards = format!("pipelines/{}/shards", self.pipeline);
        if prefix.as_ref().is_empty() {
            object_store::path::Path::from(shards)
        } else {
            object_store::path::Path::from(format!("{prefix}/{shards}"))
        }
    }

    /// Where this shard's objects live under a backend's `prefix`:
    /// `{prefix}/pipelines/{pipeline}/shards/{partition:05}` (both backends).
    pub fn root_under(&self, prefix: &object_store::path::Path) -> object_store::path::Path {
        let shard = format!("pipelines/{}/shards/{:05}", self.pipeline, self.partition);
        if prefix.as_ref().is_empty() {
            object_store::path::Path::from(shard)
        } else {
            object_store::path::Path::from(format!("{prefix}/{shard}"))
        }
    }
}

/// One write of a batch: a new value, or a tombstone (`value: None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    /// The encoded state key (see [`key`]).
    pub key: Vec<u8>,
    /// The new value, or `None` to delete.
    pub value: Option<Bytes>,
    /// Processing time (ms since the Unix epoch) after which the entry reads as absent, or
    /// `None` for no expiry.
    pub expires_at_ms: Option<u64>,
}

/// Why a state operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The backing store is unreachable or overloaded; retry with backoff. Never a record's
    /// fault: the partition pauses instead of dead-lettering.
    #[error("state backend unavailable. shard=`{shard}`")]
    Unavailable {
        /// The shard, as `pipeline/partition`.
        shard: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Stored state failed a check (checksum, format) after a second read from the store:
    /// retrying will not help. The shard falls back to a checkpoint that does not reference
    /// `object` (docs/checkpoints.md, "Corruption").
    #[error("state is corrupt. shard=`{shard}`{}", object.as_deref().map(|o| format!(" object=`{o}`")).unwrap_or_default())]
    Corrupt {
        /// The shard, as `pipeline/partition`.
        shard: String,
        /// The stored object found corrupt, named relative to the shard's root (an SST:
        /// `sst/{epoch}-{seq}.sst`; a snapshot), when one object is to blame.
        object: Option<String>,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StateError {
    /// A corruption of the shard `shard` that no single object is to blame for.
    pub fn corrupt(
        shard: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StateError::Corrupt {
            shard: shard.into(),
            object: None,
            source: source.into(),
        }
    }

    /// The coarse kind, for callers that branch on what to do.
    pub fn kind(&self) -> crate::error::ErrorKind {
        match self {
            StateError::Unavailable { .. } => crate::error::ErrorKind::Unavailable,
            StateError::Corrupt { .. } => crate::error::ErrorKind::Corrupt,
        }
    }
}

/// A factory of shards: one per (pipeline, partition) a host owns.
pub trait StateBackend: Send + Sync + 'static {
    /// The shard type this backend opens.
    type Shard: Shard;

    /// Opens (or creates) the state of one shard.
    ///
    /// # Errors
    /// [`StateError::Unavailable`] when the backing store cannot be reached.
    fn open_shard(
        &self,
        id: &ShardId,
    ) -> impl Future<Output = Result<Self::Shard, StateError>> + Send;

    /// Opens the state of one shard at its newest *decided* checkpoint
    /// ([`checkpoint::is_decided`]) that is usable: `recovery.committed` is the version the
    /// committed Kafka offsets' metadata names, if any (prepared but undecided versions are
    /// ignored), and checkpoints that `recovery.known_corruption` makes unusable are fallen
    /// back past (docs/checkpoints.md, "Corruption"). The default opens as
    /// [`StateBackend::open_shard`] does, which is right for backends that keep no checkpoint.
    ///
    /// # Errors
    /// As [`StateBackend::open_shard`]; [`StateError::Corrupt`] when checkpoints exist but
    /// none is usable.
    fn open_shard_at(
        &self,
        id: &ShardId,
        recovery: &Recovery,
    ) -> impl Future<Output = Result<Self::Shard, StateError>> + Send {
        let _ = recovery;
        self.open_shard(id)
    }

    /// Where shard `id`'s checkpoints are stored and in which format, for the tools that read
    /// and write them beside the backend (`crate::checkpoints`: a switch between backends
    /// converts the other backend's newest checkpoint before the shard opens); `None` for a
    /// backend that keeps no checkpoint. Required: a backend that wraps another forwards it,
    /// or the shards it opens would never be converted.
    fn stored(&self, id: &ShardId) -> Option<stored::StoredShard>;
}

/// What a shard's open knows besides the store (see [`StateBackend::open_shard_at`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The checkpoint version the committed Kafka offsets' metadata names (exactly-once).
    pub committed: Option<ManifestVersion>,
    /// What the shard's last owner on this host found corrupt.
    pub known_corruption: KnownCorruption,
    /// The shard's manifest versions, when the caller listed them just before the open
    /// (`crate::checkpoints::convert::open_converted`): the open does not list them again.
    pub listed: Option<Vec<ManifestVersion>>,
}

/// The state of one shard: an ordered map from encoded state key to value bytes.
///
/// Reads may suspend (a remote block fetch); the runtime calls them from async host imports, so
/// a waiting read suspends only that guest instance.
pub trait Shard: Send + Sync + 'static {
    /// Reads one key; `None` when absent or expired.
    ///
    /// # Errors
    /// [`StateError::Unavailable`].
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Bytes>, StateError>> + Send;

    /// Reads several keys concurrently; one result per key, in order. Used to prefetch a
    /// batch's declared states before the guest call.
    ///
    /// # Errors
    /// [`StateError::Unavailable`].
    fn get_many(
        &self,
        keys: &[Vec<u8>],
    ) -> impl Future<Output = Result<Vec<Option<Bytes>>, StateError>> + Send;

    /// Returns at most `limit` live entries whose keys start with `prefix` and sort after
    /// `start_after` (from the first when `None`), in ascending key order; keys are full
    /// encoded keys.
    ///
    /// # Errors
    /// [`StateError::Unavailable`].
    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Vec<u8>, Bytes)>, StateError>> + Send;

    /// Applies the writes of successful records, in order, atomically with respect to readers.
    ///
    /// # Errors
    /// [`StateError::Unavailable`]; nothing was applied.
    fn apply(&self, writes: Vec<StateWrite>)
    -> impl Future<Output = Result<(), StateError>> + Send;

    /// The input offsets of the checkpoint this shard was opened from: where the consumer must
    /// resume. `None` for a shard without a checkpoint (new, or a backend that keeps none).
    ///
    /// The default is for shards that keep no durable state (`memory`, a bare LSM tree).
    /// Its version is [`CheckpointReport::version`]; see [`Shard::checkpoint_decided`].
    ///
    /// # Errors
    /// [`StateError::Corrupt`] when the checkpoint's offsets do not decode.
    fn recovered_offsets(&self) -> Result<Option<InputOffsets>, StateError> {
        Ok(None)
    }

    /// Makes the state written so far durable together with `offsets`, in one atomic commit
    /// (docs/checkpoints.md), marked as decided by `decided_by`. The caller applies no writes meanwhile, so the checkpoint holds
    /// exactly the effects of the records before `offsets`. `Ok(None)` when the shard keeps no
    /// durable state (the default: `memory`, a bare LSM tree); such a shard is rebuilt by
    /// re-reading its input from the consumer group's start position.
    ///
    /// # Errors
    /// [`CheckpointError::State`] (retry at the next interval) or [`CheckpointError::Fenced`]
    /// (another owner claimed the shard: close it).
    fn checkpoint(
        &self,
        offsets: &InputOffsets,
        decided_by: DecidedBy,
    ) -> impl Future<Output = Result<Option<CheckpointReport>, CheckpointError>> + Send {
        let _ = (offsets, decided_by);
        async { Ok(None) }
    }

    /// Corruption found in the shard's stored state off the read path (compaction, a
    /// background scrub), if any: the shard must fall back. `None` by default.
    fn corruption(&self) -> Option<StateError> {
        None
    }

    /// The version of the checkpoint the shard was opened from, if it keeps checkpoints and
    /// was opened from one: the one blamed for corruption no object is named for.
    fn opened_from(&self) -> Option<ManifestVersion> {
        None
    }

    /// The checkpoint whose state and offsets the shard resumed from: [`Shard::opened_from`],
    /// or, when a backend switch's conversion wrote that one, the checkpoint it was converted
    /// from (`crate::state::manifest::converted_from`). `None` by default.
    fn resumed_from(&self) -> Option<ManifestVersion> {
        None
    }

    /// The version the shard's next checkpoint will have if it commits (its last version, the
    /// claim or a checkpoint, plus one; a failed attempt does not use it up), for a shard that
    /// keeps checkpoints. A sink labels what it prepares for that checkpoint with it (the
    /// Iceberg sink's pending files, docs/iceberg.md).
    fn next_checkpoint_version(&self) -> impl Future<Output = Option<ManifestVersion>> + Send {
        async { None }
    }

    /// Tells the shard that checkpoint `version` is decided: recovery would resume from it
    /// now (at-least-once: its manifest write; exactly-once: the Kafka transaction naming it
    /// committed). The shard keeps it from GC until a later one is decided.
    fn checkpoint_decided(&self, version: ManifestVersion) {
        let _ = version;
    }

    /// Waits up to `max` for background work a closing owner should not cut short — the GC
    /// pass of its last checkpoint, which an owner that lives a few seconds would otherwise
    /// never finish (SCENARIOS.md S18). Nothing to wait for by default.
    fn settle(&self, max: std::time::Duration) -> impl Future<Output = ()> + Send {
        let _ = max;
        async {}
    }

    /// The shard's byte quota, for a shard that has one (`memory` state of a `weir serve`
    /// pipeline, `state_bytes_max`); `None` (the default) without.
    fn quota(&self) -> Option<Arc<StateQuota>> {
        None
    }

    /// The length of the value stored under `key`, expired or not, if the shard can say
    /// without a read (a shard with a quota: what an overwrite grows it by). `None` (the
    /// default): absent, or not known.
    fn stored_value_len(&self, key: &[u8]) -> Option<u64> {
        let _ = key;
        None
    }
}

/// A shard's byte quota: what the shard holds, and what calls in flight have reserved for
/// their writes. The runtime reserves each write's growth before staging it and fails the
/// record (`too-large`) when it does not fit; the reservation ([`QuotaReservation`]) lasts
/// until the call's writes are applied or dropped, so calls running side by side cannot
/// together pass the quota.
#[derive(Debug)]
pub struct StateQuota {
    max_bytes: u64,
    /// Keys, values and [`ENTRY_OVERHEAD_BYTES`](crate::runtime::batch::ENTRY_OVERHEAD_BYTES)
    /// per entry, expired entries included until they are overwritten or deleted.
    used_bytes: AtomicU64,
    reserved_bytes: AtomicU64,
}

impl StateQuota {
    /// A quota of `max_bytes`, holding nothing.
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            used_bytes: AtomicU64::new(0),
            reserved_bytes: AtomicU64::new(0),
        }
    }

    /// The most the shard may hold, bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// What the shard holds, bytes, as of its last applied writes.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    /// Sets what the shard holds (the backend, after applying writes).
    pub fn set_used_bytes(&self, bytes: u64) {
        self.used_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Reserves `bytes` for writes about to be staged, if they fit beside what the shard
    /// holds and what others have reserved; `None` when they do not.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<QuotaReservation> {
        self.reserved_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |reserved| {
                let total = self
                    .used_bytes()
                    .saturating_add(reserved)
                    .saturating_add(bytes);
                (total <= self.max_bytes).then(|| reserved + bytes)
            })
            .ok()
            .map(|_| QuotaReservation {
                quota: self.clone(),
                bytes,
            })
    }
}

/// Bytes reserved in a [`StateQuota`], released when dropped.
#[derive(Debug)]
pub struct QuotaReservation {
    quota: Arc<StateQuota>,
    bytes: u64,
}

impl QuotaReservation {
    /// Takes `other`'s bytes into this reservation (both must be of one quota).
    pub fn absorb(&mut self, mut other: QuotaReservation) {
        debug_assert!(Arc::ptr_eq(&self.quota, &other.quota));
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for QuotaReservation {
    fn drop(&mut self) {
        self.quota
            .reserved_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}
