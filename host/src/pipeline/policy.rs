//! The pipeline's waits and retries in one place: how long each kind of trouble holds a
//! partition back before it is tried again, and the bounds of the backoffs (docs/checkpoints.md
//! and docs/reliability.md say what each trouble is). All of them are pipeline-time
//! (`tokio::time`), so paused-time tests run them in no real time.

use std::time::Duration;

// The consumer loop.

/// How often a paused partition's pending records are offered to its worker again, and how
/// often the loop looks at shards being opened or closed while it has nothing else to do.
pub(super) const PAUSED_RETRY_INTERVAL: Duration = Duration::from_millis(5);

/// How often the partitions' high watermarks are read for their progress (lag).
pub(super) const WATERMARKS_INTERVAL: Duration = Duration::from_secs(1);

/// How long the loop waits after a consumer error before it fetches again (the source reports
/// broker trouble there and keeps retrying on its own).
pub(super) const CONSUMER_ERROR_WAIT: Duration = Duration::from_millis(100);

// Opening a partition's shard.

/// How long after a failed shard open (store unavailable) it is tried again.
pub(super) const OPEN_RETRY_DELAY: Duration = Duration::from_secs(1);

/// How long a partition whose shard another owner claimed stays paused before this host tries
/// to open it again (a rebalance that revokes it ends the wait sooner).
pub(super) const FENCED_HOLD: Duration = Duration::from_secs(10);

/// First wait before a shard with no usable checkpoint left is tried again; doubles up to
/// [`NO_CHECKPOINT_RETRY_MAX`].
pub(super) const NO_CHECKPOINT_RETRY_MIN: Duration = Duration::from_secs(5);

/// Longest wait between tries of a shard with no usable checkpoint left.
pub(super) const NO_CHECKPOINT_RETRY_MAX: Duration = Duration::from_secs(300);

/// Longest wait before a shard whose transactions keep failing is reopened (exactly-once).
pub(super) const TRANSACTION_BACKOFF_MAX: Duration = Duration::from_secs(60);

// A worker.

/// Longest retry delay of a batch after a state outage (it starts at the runtime's
/// `outage_backoff_min` and doubles).
pub(super) const OUTAGE_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Longest wait at a worker's end for its shard's background work ([`Shard::settle`](crate::state::Shard::settle)).
pub(super) const SHARD_SETTLE_MAX: Duration = Duration::from_secs(5);

/// Longest retry delay of a timer round after an outage (it starts at [`ROUND_BACKOFF_MIN`]
/// and doubles).
pub(super) const ROUND_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// First retry delay of a timer round after an outage.
pub(super) const ROUND_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// Longest wait between two looks at the clock while a processing-time timer is pending (the
/// clock may jump).
pub(super) const CLOCK_LOOK_MAX: Duration = Duration::from_secs(1);

// Shutdown.

/// The longest a shutdown waits for the hand-overs under way to settle (shards opening, a
/// partition assigned back waiting for its revoked worker), and at most half of
/// `shutdown_drain_max`: the drain itself gets the rest.
pub(super) const HANDOVER_SETTLE_MAX: Duration = Duration::from_secs(5);
