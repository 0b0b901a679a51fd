//! What the pipeline needs from the outside world, as traits: a [`Source`] of records that is
//! a member of a consumer group (assignments, revokes, pause and resume, seek, committed
//! offsets with their metadata), and an [`Output`] that opens one [`ShardSink`] per partition
//! (emits, dead letters, and — exactly-once — a transaction committed with the checkpoint).
//!
//! `source/` and `sink/` implement them for Kafka; `source::memory` and `sink::memory`
//! implement them in memory, so that the pipeline can be tested whole with no broker. Nothing
//! here names a Kafka client type: the errors carry their cause as a boxed error.

pub use super::events::DeliveryGuard;
use crate::ids::{ManifestVersion, Offset, Partition};
use crate::runtime::{InputRecord, StagedEmit};
use crate::state::StateWrite;
use crate::state::checkpoint::InputOffsets;
use std::collections::BTreeMap;
use std::future::Future;

/// A boxed error cause.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Offsets to commit to a consumer group: (topic, partition) → the next offset to read.
pub type GroupOffsets = BTreeMap<(String, Partition), i64>;

/// Why a source operation failed.
#[derive(Debug, thiserror::Error)]
#[error("source failed: {what}")]
pub struct SourceError {
    /// What was being done.
    pub what: String,
    /// The cause.
    #[source]
    pub source: Cause,
}

/// What a partition's consumer group committed ([`Source::committed_checkpoint`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// The checkpoint version the offsets' metadata names (exactly-once), if any.
    pub version: Option<ManifestVersion>,
    /// The committed offsets, per input topic (the next offset).
    pub offsets: InputOffsets,
}

/// A member of the pipeline's consumer group over its input topics (co-partitioned: partition
/// `p` of every input topic belongs to shard `p`).
///
/// Records are taken in rounds, a bounded number per partition each ([`Source::fetch`]), so
/// that a partition with a large backlog already fetched cannot hold back the others (with
/// one queue for all partitions, as a Kafka consumer's, a prefetch of 100,000 records of two
/// partitions kept the other two waiting for seconds).
///
/// Rule the loop relies on: a rebalance is reported (by [`Source::take_revoked`] and
/// [`Source::take_assigned`]) before any record fetched after it is returned.
pub trait Source: Send + Sync + 'static {
    /// Completes when the source may have something new: fetched records, an error, or a
    /// rebalance. May complete when there is nothing; never misses something that arrived
    /// after the last [`Source::fetch`] that left nothing behind.
    fn ready(&self) -> impl Future<Output = ()> + Send + '_;

    /// Takes records already fetched, without waiting: at most `per_partition_max` of each
    /// assigned partition that is not paused, each partition's in offset order, appended to
    /// `records`. Returns early, before taking any record fetched after it, when it comes upon
    /// a rebalance (the loop applies it first). Returns whether records may have been left
    /// behind (the loop then calls again without waiting for [`Source::ready`]).
    ///
    /// # Errors
    /// A transient error the source reports while it keeps trying on its own (a broker down);
    /// `records` keeps what was taken before it.
    fn fetch(
        &self,
        per_partition_max: usize,
        records: &mut Vec<InputRecord>,
    ) -> Result<bool, Cause>;

    /// Joins the consumer group: the input topics' partitions are assigned from then on.
    /// Called once per run, after its global tables loaded, so that a host loading a large
    /// table holds no partition meanwhile, and cannot be dropped from the group for not
    /// polling (Kafka Streams starts its stream threads once its global stream thread has
    /// restored).
    ///
    /// # Errors
    /// [`SourceError`] when the subscription is refused; the run fails.
    fn subscribe(&self) -> Result<(), SourceError>;

    /// The partitions revoked since the last call.
    fn take_revoked(&self) -> Vec<Partition>;

    /// The partitions assigned since the last call. They may come paused (the Kafka source
    /// pauses them as they are assigned): the loop seeks each and then resumes it
    /// ([`Source::set_paused`]).
    fn take_assigned(&self) -> Vec<Partition>;

    /// Stops (or resumes) fetching partition `partition` of every input topic.
    ///
    /// # Errors
    /// [`SourceError`]; the caller logs it.
    fn set_paused(&self, partition: Partition, paused: bool) -> Result<(), SourceError>;

    /// Sets where partition `partition` of each input topic is read next: `offsets`' offset
    /// for a topic it has one for, else where a new consumer group starts (the source's reset
    /// policy) — never left where the source happens to be.
    ///
    /// # Errors
    /// [`SourceError`]; the caller reopens the shard.
    fn seek(&self, partition: Partition, offsets: &InputOffsets) -> Result<(), SourceError>;

    /// Commits `offsets` ((topic, partition) → next offset) to the consumer group, waiting
    /// for the broker when `wait`. Informational in at-least-once mode (lag, tooling).
    ///
    /// # Errors
    /// [`SourceError`]; the caller logs it.
    fn commit(&self, offsets: &GroupOffsets, wait: bool) -> Result<(), SourceError>;

    /// The group's committed offsets of `partition`, once no transaction is pending on them,
    /// and the checkpoint version their metadata names (exactly-once; docs/checkpoints.md,
    /// "Recovery" step 3).
    ///
    /// # Errors
    /// [`SourceError`]; the open is retried.
    fn committed_checkpoint(
        &self,
        partition: Partition,
    ) -> impl Future<Output = Result<Committed, SourceError>> + Send;

    /// `topic`'s high watermark (the offset the next record gets) of `partition` as last seen,
    /// if known — what the partition's lag counts to. At the partition's end, the offset after
    /// the last record handed out when that is lower: transaction markers and aborted records
    /// there are nothing to process.
    fn high_watermark(&self, topic: &str, partition: Partition) -> Option<i64>;

    /// Whether the consumer has handed out every record of `topic` `partition` up to the end
    /// it last fetched: it is caught up (librdkafka's partition EOF, which steps over
    /// transaction markers). False until known. `idle_advance` waits for it (docs/time.md).
    fn at_end(&self, topic: &str, partition: Partition) -> bool;

    /// Reads `topic`'s `partition` outside the consumer group, from `from` (its beginning when
    /// `None`) to the end it has when the read begins, handing the records to `chunks` in
    /// offset order; returns the offset after the last one read, where the group's consumer
    /// goes on. A table input's load at a shard's open (docs/topologies.md, "Tables"), as Kafka
    /// Streams' restore consumer reads a changelog. Ends with an error once `chunks` is closed.
    ///
    /// # Errors
    /// [`SourceError`] when the partition cannot be read.
    fn read_table(
        &self,
        topic: &str,
        partition: Partition,
        from: Option<Offset>,
        chunks: tokio::sync::mpsc::Sender<Vec<InputRecord>>,
    ) -> impl Future<Output = Result<Offset, SourceError>> + Send;

    /// Reads every partition of `topic` outside the consumer group, each from its offset in
    /// `from` (its beginning when absent), handing the records to `updates` as they come:
    /// first up to the end each partition has when the read begins, then
    /// [`TableUpdate::CaughtUp`], then every later record, until `updates` is closed (then
    /// `Ok`). When an offset of `from` is past its partition's end, [`TableUpdate::Reset`]
    /// first and every partition from its beginning. A global table's reader
    /// (docs/topologies.md, "Global tables"), as Kafka Streams' global stream thread.
    ///
    /// # Errors
    /// [`SourceError`] when the topic cannot be read before the reader caught up (a missing
    /// topic, a broker out of reach); later errors are logged and the read goes on.
    fn follow_table(
        &self,
        topic: &str,
        from: BTreeMap<i32, i64>,
        updates: tokio::sync::mpsc::Sender<TableUpdate>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;
}

/// What a global table's reader hands over ([`Source::follow_table`]).
#[derive(Debug)]
pub enum TableUpdate {
    /// Records of any of the topic's partitions, each partition's in offset order.
    Records(Vec<InputRecord>),
    /// Every partition is read up to the end it had when the read began; partition → the
    /// reader's position (past transaction markers it hands out nothing of).
    CaughtUp(BTreeMap<i32, i64>),
    /// An offset of `from` is past its partition's end: the topic is not the one the table
    /// was read from (deleted and made again). The reader reads every partition from its
    /// beginning instead; sent before any record.
    Reset,
}

/// Why a record was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// The operator returned `reject`.
    Rejected,
    /// The operator trapped on this record alone.
    Trapped,
    /// The operator ran past its CPU deadline on this record alone.
    Deadline,
    /// The destination refused an output emitted for this record as too large (its limit was
    /// lowered after the pipeline started): the output is dead-lettered in its place, naming
    /// the record it was emitted for.
    OutputRefused,
    /// The record is behind the watermark and the pipeline's `late_records` is `dead_letter`.
    Late,
}

impl DeadLetterKind {
    /// Every kind, in [`DeadLetterKind::index`] order.
    pub const ALL: [DeadLetterKind; 5] = [
        DeadLetterKind::Rejected,
        DeadLetterKind::Trapped,
        DeadLetterKind::Deadline,
        DeadLetterKind::OutputRefused,
        DeadLetterKind::Late,
    ];

    /// The kind's position in [`DeadLetterKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name (the `weir.error.kind` header, the metric's `kind` label).
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::Rejected => "rejected",
            DeadLetterKind::Trapped => "trapped",
            DeadLetterKind::Deadline => "deadline",
            DeadLetterKind::OutputRefused => "output-refused",
            DeadLetterKind::Late => "late",
        }
    }
}

/// Why producing failed for good.
#[derive(Debug, thiserror::Error)]
#[error("delivery failed. topic=`{topic}`")]
pub struct SinkError {
    /// The destination.
    pub topic: String,
    /// The cause.
    #[source]
    pub source: Cause,
}

/// Why an exactly-once commit did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Another owner took the shard's transactional identity over: stop writing the shard.
    #[error("the transaction was fenced by another owner")]
    Fenced(#[source] Cause),
    /// The transaction is lost (aborted, timed out): reopen the shard from its decided
    /// checkpoint.
    #[error("the transaction did not commit")]
    Failed(#[source] Cause),
    /// The transaction stayed open past `transaction.timeout.ms` (a checkpoint slower than
    /// that): the broker aborted it. Not another owner, whatever the error looks like.
    #[error(
        "the transaction stayed open {open_ms} ms, past transaction.timeout.ms = {timeout_ms}: the broker aborted it"
    )]
    TimedOut {
        /// How long it was open, ms.
        open_ms: u64,
        /// `transaction.timeout.ms`.
        timeout_ms: u64,
        /// The commit's error.
        #[source]
        source: Cause,
    },
}

/// Opens the sink of each partition the pipeline runs.
pub trait Output: Send + Sync + 'static {
    /// The sink of one partition.
    type Sink: ShardSink;

    /// The sink of `partition`, reporting failing deliveries to `guard`. At-least-once: ready
    /// at once. Exactly-once (`transactional`): the previous owner's transactions fenced
    /// (Kafka's `init_transactions`) and one begun.
    ///
    /// # Errors
    /// [`SinkError`] when the sink cannot be set up (the open is retried).
    fn open(
        &self,
        partition: Partition,
        transactional: bool,
        guard: DeliveryGuard,
    ) -> impl Future<Output = Result<Self::Sink, SinkError>> + Send;
}

/// One partition's sink: the operator's emits to the output, failed records to the
/// dead-letter destination.
pub trait ShardSink: Send + 'static {
    /// The largest output record, as the destination counts it: an emit over it fails its
    /// record as too large.
    fn output_bytes_max(&self) -> u64;

    /// The table every emit must be a row of, when the sink writes one (docs/iceberg.md): the
    /// `emit` import fails the record of an emit that is not. Default none.
    fn emit_table(&self) -> Option<std::sync::Arc<crate::row::RowSchema>> {
        None
    }

    /// Whether its outputs are transactional (exactly-once): they are committed by
    /// [`ShardSink::commit`], not acknowledged one by one.
    fn transactional(&self) -> bool;

    /// Sends an operator emit, with the timestamp of `source`, the input record it was
    /// emitted for.
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    fn emit(
        &mut self,
        emit: &StagedEmit,
        source: &InputRecord,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Sends a failed input record to the dead-letter destination with why.
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    fn dead_letter(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Whether [`ShardSink::watermark`] writes anything (its output is an internal topic,
    /// docs/topologies.md): the worker then also checkpoints when only its watermark moved.
    /// Default false.
    fn writes_watermarks(&self) -> bool {
        false
    }

    /// The offsets, per input topic, below which this shard's outputs may have been sent
    /// before (its group's committed offsets, read as it opened): each emit to an internal
    /// topic for an input record below them says where it came from (`crate::time::edge`).
    /// Nothing by default.
    fn replay_below(&mut self, committed: &InputOffsets) {
        let _ = committed;
    }

    /// Writes the shard's watermark, as `marker`, with the `frontier` its checkpoint reached
    /// if given (`time::edge`), to every partition of its output when that is an internal
    /// topic, with the checkpoint's outputs (docs/topologies.md); nothing by default.
    ///
    /// # Errors
    /// [`SinkError`] when an earlier delivery failed for good.
    fn watermark(
        &mut self,
        marker: crate::time::watermark::Marker,
        frontier: Option<&crate::time::edge::Frontier>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        let _ = (marker, frontier);
        async { Ok(()) }
    }

    /// Waits until everything sent so far is acknowledged.
    ///
    /// # Errors
    /// [`SinkError`] for the first delivery that failed for good.
    fn drain(&mut self) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Exactly-once (docs/checkpoints.md step 8): commits the open transaction — the
    /// outputs since the last checkpoint — with the input `offsets` of `partition` and the
    /// checkpoint `version` that decides, then begins the next one. At-least-once: nothing.
    ///
    /// # Errors
    /// [`CommitError`].
    fn commit(
        &mut self,
        partition: Partition,
        offsets: &InputOffsets,
        version: ManifestVersion,
    ) -> impl Future<Output = Result<(), CommitError>> + Send;

    /// The reserved state key under which the sink keeps what it must recover with the
    /// shard (the Iceberg sink's pending files, docs/iceberg.md), if any; default none.
    /// Exactly-once: the `transaction.timeout.ms` after which the broker aborts the open
    /// transaction; `None` by default (no transaction, or none that times out).
    fn transaction_timeout(&self) -> Option<std::time::Duration> {
        None
    }

    fn state_key(&self) -> Option<&'static [u8]> {
        None
    }

    /// Takes the value of [`ShardSink::state_key`] the opened shard holds (`None`: absent),
    /// and the input offsets the shard resumes at (`resume`: what its checkpoint covers).
    ///
    /// # Errors
    /// [`SinkError`] when it does not decode (the open fails and is retried).
    fn restore(&mut self, value: Option<&[u8]>, resume: &InputOffsets) -> Result<(), SinkError> {
        let _ = (value, resume);
        Ok(())
    }

    /// Whether the sink takes no more output for now: an Iceberg table's pending list holds
    /// `iceberg.pending_checkpoints_max` checkpoints (its commits lag, e.g. a catalog outage).
    /// The worker then admits no record — its partition pauses once the queue is full — and
    /// checkpoints every interval, which lets the sink look at the table again, until this
    /// turns false. Default: never.
    fn held_back(&self) -> bool {
        false
    }

    /// The input offsets the shard has processed up to (exact: nothing is in flight), before
    /// a timer round's emits, which carry no input offset of their own. Default: nothing.
    fn position(&mut self, offsets: &InputOffsets) {
        let _ = offsets;
    }

    /// Before the shard's checkpoint `version` of input `offsets` with the event-time timers
    /// through `timers_through_ms` fired (docs/checkpoints.md step 2, docs/iceberg.md):
    /// closes what the checkpoint must hold (an Iceberg sink's data files) and returns the
    /// state write that records it, to apply to the shard before the checkpoint. Default:
    /// nothing.
    ///
    /// # Errors
    /// [`SinkError`]: what was open is lost; the shard reopens from its checkpoint.
    fn prepare(
        &mut self,
        version: ManifestVersion,
        offsets: &InputOffsets,
        timers_through_ms: Option<i64>,
    ) -> impl Future<Output = Result<Option<StateWrite>, SinkError>> + Send {
        let _ = (version, offsets, timers_through_ms);
        async { Ok(None) }
    }
}
