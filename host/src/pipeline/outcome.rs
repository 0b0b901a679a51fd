//! What the consumer loop does when a partition's worker ends on its own: fenced, a lost
//! transaction or corrupt state pause the partition and reopen its shard later (with backoff,
//! past the corrupt checkpoints); anything else stops the pipeline (docs/checkpoints.md,
//! "Fencing" and "Corruption").

use super::consumer_loop::Running;
use super::policy::{FENCED_HOLD, OPEN_RETRY_DELAY, TRANSACTION_BACKOFF_MAX};
use super::ports::{Cause, SinkError};
use super::ports::{Output, Source};
use super::{PartitionProblem, PartitionState, PipelineError};
use crate::error::ErrorKind;
use crate::state::StateBackend;
use crate::state::StateError;
use tokio::time::Instant;

/// Why a worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Producing output or dead letters failed for good.
    #[error("partition {partition}: output failed")]
    Sink {
        /// The partition.
        partition: i32,
        /// The failure.
        #[source]
        source: SinkError,
    },
    /// The shard's stored state is corrupt: retrying cannot help. The shard is reopened from
    /// a checkpoint that does not reference what was found corrupt (docs/checkpoints.md,
    /// "Corruption"); the other partitions go on.
    #[error("partition {partition}: state is corrupt")]
    Corrupt {
        /// The partition.
        partition: i32,
        /// The checkpoint the shard was opened from (blamed when no object is named).
        opened_from: Option<u64>,
        /// The failure.
        #[source]
        source: StateError,
    },
    /// Another owner claimed the shard (its checkpoint was refused): this host must stop
    /// writing it. Not a pipeline failure: the partition has moved.
    #[error("partition {partition}: fenced by a newer owner of the shard")]
    Fenced {
        /// The partition.
        partition: i32,
    },
    /// A record's call failed for good and `failure_policy = "fail"`: the pipeline stops
    /// before committing anything after it.
    #[error("partition {partition}: the record at offset {offset} of `{topic}` failed: {reason}")]
    RecordFailed {
        /// The partition.
        partition: i32,
        /// The record's topic.
        topic: String,
        /// The record's offset.
        offset: i64,
        /// Why its call failed.
        reason: String,
    },
    /// The checkpoint's transaction did not commit, or a delivery in it failed (exactly-once
    /// mode): the state holds effects whose outputs are not committed, so the shard must be
    /// reopened from its last decided checkpoint.
    #[error("partition {partition}: the checkpoint's transaction failed")]
    Transaction {
        /// The partition.
        partition: i32,
        /// Why.
        #[source]
        source: Cause,
    },
}

impl WorkerError {
    /// What kind of failure this is: the loop reopens the shard of a fenced, corrupt or
    /// transaction-lost worker; the others stop the pipeline.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Sink { .. } | Self::Transaction { .. } => ErrorKind::Unavailable,
            Self::Corrupt { .. } => ErrorKind::Corrupt,
            Self::Fenced { .. } => ErrorKind::Fenced,
            Self::RecordFailed { .. } => ErrorKind::GuestFault,
        }
    }
}

impl<B: StateBackend, Src: Source, Out: Output> Running<B, Src, Out> {
    /// A worker ended on its own. Fenced: another owner claimed the shard, so this host drops
    /// the partition's records and pauses it for [`FENCED_HOLD`] (a rebalance will normally
    /// revoke it meanwhile). A failed transaction: the same, for [`OPEN_RETRY_DELAY`], then the
    /// shard is reopened from its decided checkpoint. Corrupt state: the same, and the shard is
    /// reopened from a checkpoint that does not reference what was found corrupt. Anything
    /// else stops the pipeline.
    pub(super) async fn worker_ended(&mut self, partition: i32) -> Result<(), PipelineError> {
        match self.worker_failure(partition).await {
            PipelineError::Worker(WorkerError::Corrupt {
                opened_from,
                source,
                ..
            }) => {
                let known = self.corruption.entry(partition).or_default();
                known.add(&source, opened_from);
                self.stats.set_problem(
                    partition,
                    Some(PartitionProblem {
                        state: PartitionState::Paused,
                        reason: format!(
                            "falling back to an older checkpoint: {}",
                            crate::error::Chain(&source)
                        ),
                    }),
                );
                self.pending.remove(&partition);
                self.hold
                    .insert(partition, Instant::now() + OPEN_RETRY_DELAY);
                if self.paused.insert(partition) {
                    self.set_paused(partition, true);
                }
                Ok(())
            }
            PipelineError::Worker(
                ref err @ (WorkerError::Fenced { .. } | WorkerError::Transaction { .. }),
            ) => {
                let hold = match err {
                    WorkerError::Fenced { .. } => FENCED_HOLD,
                    _ => {
                        // A transaction that keeps failing (its outputs refused) reopens the
                        // shard less and less often, and says so in the partition's status.
                        let now = Instant::now();
                        let (wait, last) = self
                            .transaction_backoff
                            .get(&partition)
                            .copied()
                            .unwrap_or((OPEN_RETRY_DELAY, now));
                        let wait = if now.duration_since(last) < TRANSACTION_BACKOFF_MAX * 2 {
                            wait
                        } else {
                            OPEN_RETRY_DELAY
                        };
                        self.transaction_backoff
                            .insert(partition, ((wait * 2).min(TRANSACTION_BACKOFF_MAX), now));
                        self.stats.set_problem(
                            partition,
                            Some(PartitionProblem {
                                state: PartitionState::Paused,
                                reason: format!(
                                    "the exactly-once transaction was lost ({}); reopening from the last decided checkpoint in {wait:?}",
                                    crate::error::Chain(err)
                                ),
                            }),
                        );
                        wait
                    }
                };
                self.pending.remove(&partition);
                self.hold.insert(partition, Instant::now() + hold);
                if self.paused.insert(partition) {
                    self.set_paused(partition, true);
                }
                Ok(())
            }
            other => Err(other),
        }
    }

    /// Why the worker of `partition` ended: awaits its task (it ended, or is about to).
    pub(super) async fn worker_failure(&mut self, partition: i32) -> PipelineError {
        let Some(mut worker) = self.workers.remove(&partition) else {
            return PipelineError::WorkerPanicked(partition);
        };
        let ended = self.inbox.join(&mut worker.task).await;
        self.inbox.forget(worker.id);
        match ended {
            Ok(Err(err)) => PipelineError::Worker(err),
            Ok(Ok(())) | Err(_) => PipelineError::WorkerPanicked(partition),
        }
    }
}
