//! What the consumer loop does when a partition's worker ends on its own: fenced, a lost
//! transaction or corrupt state pause the partition and reopen its shard later (with backoff,
//! past the corrupt checkpoints); anything else stops the pipeline (docs/checkpoints.md,
//! "Fencing" and "Corruption").

use super::Running;
use crate::ids::Partition;
use crate::pipeline::WorkerError;
use crate::pipeline::policy::{FENCED_HOLD, OPEN_RETRY_DELAY, TRANSACTION_BACKOFF_MAX};
use crate::pipeline::ports::{Output, Source};
use crate::pipeline::{PartitionProblem, PartitionState, PipelineError};
use crate::state::StateBackend;
use tokio::time::Instant;

impl<B: StateBackend, Src: Source, Out: Output> Running<B, Src, Out> {
    /// A worker ended on its own. Fenced: another owner claimed the shard, so this host drops
    /// the partition's records and pauses it for [`FENCED_HOLD`] (a rebalance will normally
    /// revoke it meanwhile). A failed transaction: the same, for [`OPEN_RETRY_DELAY`], then the
    /// shard is reopened from its decided checkpoint. Corrupt state: the same, and the shard is
    /// reopened from a checkpoint that does not reference what was found corrupt. Anything
    /// else stops the pipeline.
    pub(in crate::pipeline) async fn worker_ended(
        &mut self,
        partition: Partition,
    ) -> Result<(), PipelineError> {
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
    pub(in crate::pipeline) async fn worker_failure(
        &mut self,
        partition: Partition,
    ) -> PipelineError {
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
