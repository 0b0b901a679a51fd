//! Opening a partition's shard (docs/checkpoints.md, "Recovery"): in the background, the sink
//! is opened (exactly-once: the previous owner fenced, a transaction begun), the committed
//! offsets' metadata read, the shard recovered from its newest usable decided checkpoint and
//! claimed; then the source is seeked to the checkpoint's offsets, the worker starts and the
//! partition resumes. A shard with no usable checkpoint left stays paused, failed in its
//! status, and is tried again with backoff.

use super::Running;
use crate::config::Delivery;
use crate::ids::Partition;
use crate::pipeline::events::{Assignment, DeliveryGuard, WorkerControl, WorkerId};
use crate::pipeline::policy::{NO_CHECKPOINT_RETRY_MAX, NO_CHECKPOINT_RETRY_MIN, OPEN_RETRY_DELAY};
use crate::pipeline::ports::{Output, ShardSink, SinkError, Source, SourceError};
use crate::pipeline::{PartitionProblem, PartitionState, PipelineError};
use crate::state::{Recovery, Shard, ShardId, StateBackend, StateError};
use std::sync::atomic::Ordering;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A shard being opened (recovered and claimed) in the background; its partition is paused.
/// The worker's id and control exist already: the sink opened here reports as that worker, and
/// gives up once told to (the partition revoked meanwhile, or the pipeline stopping).
pub(super) struct Opening<S, K> {
    task: JoinHandle<Result<Opened<S, K>, OpenError>>,
    pub(super) started: Instant,
    worker: WorkerId,
    control: (WorkerControl, Assignment),
}

impl<S, K> Opening<S, K> {
    /// Whether the open has ended.
    pub(in crate::pipeline) fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Gives the open up (the partition was revoked, or the pipeline stops).
    pub(in crate::pipeline) fn abort(&self) {
        self.control.0.revoke();
        self.task.abort();
    }
}

/// An opened shard with its sink.
pub(crate) struct Opened<S, K> {
    pub shard: S,
    pub sink: K,
    /// What the shard's checkpoint kept of its edges (`crate::time::edge::EDGES_KEY`), read
    /// for a stage with an edge input: `None` for another, `Some(None)` for none kept.
    pub edges: Option<Option<bytes::Bytes>>,
    /// What the open loaded of the run's tables ([`crate::pipeline::tables`]).
    pub tables: crate::pipeline::tables::Loaded,
}

/// Why opening a shard failed.
#[derive(Debug, thiserror::Error)]
enum OpenError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("cannot load the tables")]
    Table(#[from] crate::pipeline::tables::LoadError),
}

impl<B: StateBackend, Src: Source, Out: Output> Running<B, Src, Out> {
    /// Opens `partition`'s shard in the background (recovery and claim read the store): opens
    /// its sink — exactly-once, fencing the previous owner and beginning a transaction — and
    /// reads the committed offsets' metadata, which may name the checkpoint to open
    /// (docs/checkpoints.md, "Recovery" step 3).
    pub(in crate::pipeline) fn start_opening(&mut self, partition: Partition) {
        let id = ShardId {
            pipeline: self.settings.pipeline.name.clone(),
            partition,
        };
        let (backend, source, output) = (
            self.backend.clone(),
            self.source.clone(),
            self.output.clone(),
        );
        let known_corruption = self.corruption.get(&partition).cloned().unwrap_or_default();
        let transactional = self.settings.pipeline.delivery == Delivery::ExactlyOnce;
        let has_edges = !self.settings.pipeline.edges.inputs.is_empty();
        let tables = self.settings.pipeline.tables.clone();
        let worker = self.next_worker(partition);
        let control = WorkerControl::new();
        // The partition's status says why its sink waits; refused outputs dead-lettered are
        // counted; the sink gives up once the partition is revoked or the pipeline stops.
        let guard = DeliveryGuard::new(
            partition,
            self.stats.clone(),
            self.inbox.sender(worker),
            control.1.clone(),
        );
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
            let sink = output.open(partition, transactional, guard).await?;
            // At-least-once: the group names a checkpoint only if an exactly-once run
            // committed one (the pipeline switched modes); manifest-decided ones count anyway.
            let committed = source.committed_checkpoint(partition).await?;
            let recovery = Recovery {
                committed: committed.version,
                known_corruption,
                listed: None,
            };
            // A checkpoint the other backend wrote (the pipeline switched) is converted first.
            let shard =
                crate::checkpoints::convert::open_converted(&*backend, &id, &recovery).await?;
            let mut sink = sink;
            // Outputs of records below the group's committed offsets may have been sent: a
            // shard that falls back behind them names where its emits to an edge come from
            // (and, exactly-once, withholds the rest). Not after a reset to a savepoint.
            if !reset_to_savepoint(committed.version, shard.resumed_from()) {
                sink.replay_below(&committed.offsets);
            }
            if let Some(key) = sink.state_key() {
                let value = shard.get(key).await?;
                // Offsets that do not decode fail the open below, where they are read again.
                let resume = shard.recovered_offsets().ok().flatten().unwrap_or_default();
                sink.restore(value.as_deref(), &resume)?;
            }
            let edges = if has_edges {
                Some(shard.get(&crate::time::edge::EDGES_KEY).await?)
            } else {
                None
            };
            // The tables to their ends before any stream record runs (offsets that do not
            // decode fail the open below).
            let resume = shard.recovered_offsets().ok().flatten().unwrap_or_default();
            let started = Instant::now();
            let tables =
                crate::pipeline::tables::load_tables(&*source, &shard, partition, &tables, &resume)
                    .await?;
            if !tables.ends.is_empty() {
                tracing::info!(partition = partition.0, records = tables.records, ms = started.elapsed().as_millis() as u64, ends = ?tables.ends, "tables loaded");
            }
            Ok(Opened {
                shard,
                sink,
                edges,
                tables,
            })
        }));
        self.opening.insert(
            partition,
            Opening {
                task,
                started: Instant::now(),
                worker,
                control,
            },
        );
    }

    /// No usable checkpoint is left for `partition`'s shard: starting empty would lose its
    /// state. The partition stays assigned and paused, failed in its status with `err`, and is
    /// tried again with backoff; the others go on.
    fn no_usable_checkpoint(&mut self, partition: Partition, err: &StateError) {
        let wait = self
            .open_backoff
            .get(&partition)
            .copied()
            .unwrap_or(NO_CHECKPOINT_RETRY_MIN);
        self.open_backoff
            .insert(partition, (wait * 2).min(NO_CHECKPOINT_RETRY_MAX));
        tracing::error!(partition = partition.0, error = %err, retry_in = ?wait, "no usable checkpoint is left for the shard; the partition stays paused");
        self.stats.set_problem(
            partition,
            Some(PartitionProblem {
                state: PartitionState::Failed,
                reason: format!("{}", crate::error::Chain(err)),
            }),
        );
        self.hold.insert(partition, Instant::now() + wait);
    }

    /// Takes an opened shard: seeks the source to its checkpoint's offsets (dropping what was
    /// fetched before), starts its worker and resumes the partition.
    pub(in crate::pipeline) async fn finish_opening(
        &mut self,
        partition: Partition,
    ) -> Result<(), PipelineError> {
        let Some(opening) = self.opening.remove(&partition) else {
            return Ok(());
        };
        let opened = match opening.task.await {
            Ok(Ok(opened)) => opened,
            Ok(Err(OpenError::State(err))) if err.kind() == crate::error::ErrorKind::Corrupt => {
                self.no_usable_checkpoint(partition, &err);
                return Ok(());
            }
            Ok(Err(err)) => {
                tracing::warn!(partition = partition.0, error = %crate::error::Chain(&err), retry_in = ?OPEN_RETRY_DELAY, "cannot open shard; retrying");
                self.hold
                    .insert(partition, Instant::now() + OPEN_RETRY_DELAY);
                return Ok(());
            }
            Err(_) => return Err(PipelineError::WorkerPanicked(partition)),
        };
        self.stats.shards_opened.fetch_add(1, Ordering::Relaxed);
        self.open_backoff.remove(&partition);
        // The fallback is recorded in the claim: what was found corrupt is known durably.
        self.corruption.remove(&partition);
        let offsets = match opened.shard.recovered_offsets() {
            Ok(offsets) => offsets.unwrap_or_default(),
            Err(err) => {
                self.no_usable_checkpoint(partition, &err);
                return Ok(());
            }
        };
        // Every input topic's partition to the checkpoint's offset, a topic without one (the
        // checkpoint saw none of its records, or there is none) to where a new group starts —
        // never left where the source happens to be, which may be past records the state does
        // not reflect (a shard reopened after a failed transaction, records fetched and dropped
        // meanwhile). A table to where its load ended.
        let mut position = offsets.clone();
        for (topic, end) in opened.tables.ends.iter() {
            position.advance_to(topic, end);
        }
        if let Err(err) = self.source.seek(partition, &position) {
            tracing::warn!(partition = partition.0, error = %crate::error::Chain(&err), retry_in = ?OPEN_RETRY_DELAY, "cannot seek to the checkpoint's offsets; reopening");
            self.hold
                .insert(partition, Instant::now() + OPEN_RETRY_DELAY);
            return Ok(());
        }
        // Fetched from wherever the source was: the seek fetches what counts again.
        self.pending.remove(&partition);
        if self.settings.pipeline.delivery == Delivery::AtLeastOnce && !offsets.is_empty() {
            // The group's committed offsets follow the owner: the previous one committed
            // nothing after its revoke, so what it checkpointed last reaches the group here
            // (lag dashboards and autoscalers read it; recovery reads the checkpoint).
            self.inbox
                .checkpointed
                .push((opening.worker, offsets.clone()));
        }
        tracing::info!(
            partition = partition.0,
            ms = opening.started.elapsed().as_millis() as u64,
            ?offsets,
            "shard opened; partition resumes"
        );
        self.stats.record_resumed(partition, &offsets);
        self.start_worker(
            opening.worker,
            opened,
            opening.control,
            position,
            opening.started,
        );
        if self.paused.remove(&partition) {
            self.set_paused(partition, false);
        }
        Ok(())
    }
}

/// Whether a shard that resumed from checkpoint `opened` ([`Shard::resumed_from`]: a backend
/// switch's conversion counts as the checkpoint it converted) while its group's committed
/// offsets name checkpoint `named` (exactly-once) was reset to a savepoint: a reset writes its
/// checkpoint above every earlier one, decided by its manifest, and leaves the group naming
/// the run's last, whose offsets are ahead of the savepoint's. Then the records after the
/// savepoint are processed again and their outputs sent again (docs/api.md, "Savepoints"), not
/// withheld as a fallback's are: a fallback resumes from a checkpoint below the one the group
/// names, converted or not. (Two conversions after a fallback with no transaction committed
/// between them would look like a reset: the second names the first, not what it held.)
fn reset_to_savepoint(
    named: Option<crate::ids::ManifestVersion>,
    opened: Option<crate::ids::ManifestVersion>,
) -> bool {
    matches!((named, opened), (Some(named), Some(opened)) if opened > named)
}

#[cfg(test)]
mod tests {
    use super::reset_to_savepoint;
    use crate::ids::ManifestVersion;

    /// Only a checkpoint above the one the group names is a reset's; the group's own, an
    /// older one (a fallback) or no version on either side is not.
    #[test]
    fn a_shard_opened_above_the_groups_checkpoint_was_reset_and_its_replay_is_sent_again() {
        let v = ManifestVersion;
        assert!(reset_to_savepoint(Some(v(11)), Some(v(12))));
        assert!(!reset_to_savepoint(Some(v(11)), Some(v(11))));
        assert!(!reset_to_savepoint(Some(v(11)), Some(v(9))));
        assert!(!reset_to_savepoint(None, Some(v(12))));
        assert!(!reset_to_savepoint(Some(v(11)), None));
    }
}
