//! The pipeline's shutdown: every worker told to finish at once, outside its queue; the
//! fetched records handed over to the workers that take them; every delivery acknowledged, a
//! last checkpoint per shard — or, for a worker held back by what does not let go (a state
//! outage, a sink that takes no more output, a refused delivery), its end without one within a
//! backoff step (docs/checkpoints.md, "Shutdown") — then the last checkpoints' offsets
//! committed to the group before the consumer leaves it. Past `shutdown_drain_max` the
//! workers still busy are stopped without committing anything they did not finish.

use super::Running;
use crate::ids::Partition;
use crate::pipeline::PipelineError;
use crate::pipeline::WorkerError;
use crate::pipeline::events::WorkerId;
use crate::pipeline::policy::{HANDOVER_SETTLE_MAX, PAUSED_RETRY_INTERVAL};
use crate::pipeline::ports::{Output, Source};
use crate::state::StateBackend;
use foldhash::HashSet;
use tokio::time::Instant;

impl<B: StateBackend, Src: Source, Out: Output> Running<B, Src, Out> {
    /// Tells every worker to finish, hands each its fetched records (unless it is held back),
    /// closes its queue after the last and waits for it to finish its batches, deliveries and
    /// last checkpoint; waits for revoked partitions' workers too, taking in what they say
    /// meanwhile. Then commits the last checkpoints of the partitions it still owns to the
    /// group, synchronously, before the consumer closes (at-least-once: exactly-once committed
    /// them in their transactions).
    ///
    /// A run that ended cleanly (`settle`) first settles the hand-overs under way
    /// ([`Self::settle_handovers`]); one that failed opens nothing more.
    pub(in crate::pipeline) async fn drain(&mut self, settle: bool) -> Result<(), PipelineError> {
        // A revoke the source reported before the shutdown reached the loop: that partition
        // closes as revoked, and nothing of it is committed here (S1).
        self.drop_revoked();
        let drain_max = self.settings.runtime.shutdown_drain_max;
        let deadline = Instant::now() + drain_max;
        // Heard at once whatever each waits on (events.rs): one held back ends now, while the
        // hand-overs settle (the queues close after the settle).
        for worker in self.workers.values() {
            worker.control.finish();
        }
        let settled = if settle {
            self.settle_handovers(Instant::now() + (drain_max / 2).min(HANDOVER_SETTLE_MAX))
                .await
        } else {
            Ok(())
        };
        for (_, opening) in self.opening.drain() {
            opening.abort();
        }
        let owned: HashSet<WorkerId> = self.workers.values().map(|w| w.id).collect();
        // The workers the settle started.
        for worker in self.workers.values() {
            worker.control.finish();
        }
        match tokio::time::timeout_at(deadline, self.drain_all()).await {
            Ok(result) => {
                // The partitions it still owns: their last checkpoints reach the group before
                // the consumer leaves it.
                self.commit_offsets(&owned, true);
                settled.and(result)
            }
            Err(_) => {
                // A worker stuck past the limit (a guest call, a store that neither answers
                // nor fails) would keep shutdown waiting. Nothing is lost by stopping it: no
                // offset is committed for records it did not finish.
                let partitions: Vec<Partition> = self.workers.keys().copied().collect();
                tracing::warn!(?partitions, max = ?self.settings.runtime.shutdown_drain_max, "shutdown: workers still busy; stopping them without finishing");
                for (_, worker) in self.workers.drain() {
                    worker.task.abort();
                }
                for (_, closing) in self.closing.drain() {
                    closing.task.abort();
                }
                Err(PipelineError::DrainTimedOut(partitions))
            }
        }
    }

    /// Settles, until `until`, the hand-overs under way when the shutdown came: shards being
    /// opened finish opening, and a partition revoked and assigned back to this host (an eager
    /// rebalance revokes every partition, then assigns) waits for its revoked worker's last
    /// checkpoint and is opened again. This host is then that partition's next owner: only
    /// its open commits the revoked worker's last checkpoint to the group (recovery step 4;
    /// the revoked worker commits nothing, S1), and a shutdown that abandoned it would leave
    /// lag on the group with every record processed (S17). Their workers then drain with the
    /// others. What has not settled by `until` is abandoned as before: its next owner commits
    /// what it recovers.
    async fn settle_handovers(&mut self, until: Instant) -> Result<(), PipelineError> {
        self.pause_assigned();
        let mut reassigned: HashSet<Partition> = self
            .closing
            .keys()
            .copied()
            .filter(|p| self.paused.contains(p))
            .collect();
        loop {
            self.reap_closed().await?;
            let now = Instant::now();
            self.hold.retain(|_, held| *held > now);
            let closed: Vec<Partition> = reassigned
                .iter()
                .copied()
                .filter(|p| !self.closing.contains_key(p))
                .collect();
            for partition in closed {
                reassigned.remove(&partition);
                if self.may_open(partition) {
                    self.start_opening(partition);
                }
            }
            self.finish_opened().await?;
            if (reassigned.is_empty() && self.opening.is_empty()) || Instant::now() >= until {
                return Ok(());
            }
            tokio::select! {
                () = self.inbox.receive() => {}
                () = tokio::time::sleep(PAUSED_RETRY_INTERVAL) => {}
            }
        }
    }

    async fn drain_all(&mut self) -> Result<(), PipelineError> {
        let partitions: Vec<Partition> = self.pending.keys().copied().collect();
        let mut result = Ok(());
        for partition in partitions {
            if let Err(err) = self.send_pending(partition, false).await {
                result = result.and(Err(err));
            }
        }
        // The last batches are handed over: closing the queues tells the workers, which end
        // side by side. Each handle stays registered until its worker ends, so that a timeout
        // above can still abort it.
        for worker in self.workers.values_mut() {
            worker.queue = None;
        }
        let partitions: Vec<Partition> = self.workers.keys().copied().collect();
        for partition in partitions {
            let Some(worker) = self.workers.get_mut(&partition) else {
                continue;
            };
            // Taking in its last checkpoint's offsets, among others.
            let ended = self.inbox.join(&mut worker.task).await;
            let outcome = drained(partition, ended);
            self.workers.remove(&partition);
            result = result.and(outcome);
        }
        let partitions: Vec<Partition> = self.closing.keys().copied().collect();
        for partition in partitions {
            let Some(closing) = self.closing.get_mut(&partition) else {
                continue;
            };
            let ended = self.inbox.join(&mut closing.task).await;
            if let Err(_panicked) = ended {
                result = result.and(Err(PipelineError::WorkerPanicked(partition)));
            }
            self.closing.remove(&partition);
        }
        result
    }

    /// The shutdown's end of a worker whose queue closed before its last batch was handed
    /// over: it ended on its own (fenced, say); awaits it and judges it as [`drained`] does.
    pub(in crate::pipeline) async fn worker_drained(
        &mut self,
        partition: Partition,
    ) -> Result<(), PipelineError> {
        let Some(mut worker) = self.workers.remove(&partition) else {
            return Ok(());
        };
        let ended = self.inbox.join(&mut worker.task).await;
        self.inbox.forget(worker.id);
        drained(partition, ended)
    }
}

/// What a worker's end means to the shutdown. Finished, fenced by the shard's next owner, its
/// transaction lost, or its state found corrupt: the partition's next owner resumes from its
/// last decided checkpoint, and the shutdown goes on. Any other failure, or a panic, is the
/// run's error.
fn drained(
    partition: Partition,
    ended: Result<Result<(), WorkerError>, tokio::task::JoinError>,
) -> Result<(), PipelineError> {
    match ended {
        Ok(
            Ok(())
            | Err(
                WorkerError::Fenced { .. }
                | WorkerError::Transaction { .. }
                | WorkerError::Corrupt { .. },
            ),
        ) => Ok(()),
        Ok(Err(err)) => Err(PipelineError::Worker(err)),
        Err(_) => Err(PipelineError::WorkerPanicked(partition)),
    }
}
