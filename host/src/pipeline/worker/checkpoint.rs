//! A partition worker's checkpoint (docs/checkpoints.md, "Taking a checkpoint", steps 1–8):
//! nothing in flight, outputs acknowledged (at-least-once), the shard's checkpoint with the
//! offsets of the records processed, then — exactly-once — the transaction committed with
//! them, naming the checkpoint's version.

use super::PartitionWorker;
use crate::clock::{Clock, SystemClock};
use crate::ids::ManifestVersion;
use crate::pipeline::CheckpointRecord;
use crate::pipeline::WorkerError;
use crate::pipeline::ports::{CommitError, ShardSink};
use crate::state::Shard;
use crate::state::checkpoint::{CheckpointError, CheckpointReport, DecidedBy};
use crate::time::edge::Frontier;
use crate::time::watermark::Marker;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// Checkpoints the shard if records were processed since the last checkpoint, or if the
    /// checkpoint was `requested` (through the API) (docs/checkpoints.md steps 1–7). A failed
    /// checkpoint leaves the previous one current and is retried at the next tick; at the
    /// `last` one (queue closed) it is only logged: the records since the previous checkpoint
    /// will be read again by the next owner.
    pub(in crate::pipeline) async fn checkpoint(
        &mut self,
        last: bool,
        requested: bool,
    ) -> Result<(), WorkerError> {
        // Corruption compaction or the scrub found in the background ends the worker at the
        // next tick, busy or idle: the shard falls back (docs/checkpoints.md, "Corruption").
        if let Some(corruption) = self.shard.corruption() {
            return Err(self.corrupt(corruption));
        }
        // A sink held back looks again at every interval (its prepare drops what landed); with
        // nothing new and nothing dropped there is nothing to write. A watermark that moved is
        // new to the stage downstream of an internal output.
        let marker = self.marker_now();
        let writes_markers = self.sink.writes_watermarks();
        let frontier = writes_markers.then(|| self.frontier_now()).flatten();
        let watermark_moved =
            writes_markers && (marker != self.marked || frontier != self.edges.marked_frontier);
        let only_looking = !self.dirty && !requested && !watermark_moved;
        if only_looking && !self.sink.held_back() {
            return Ok(());
        }
        let started = Instant::now();
        tracing::debug!(partition = self.partition.0, last, "checkpoint starting");
        // At-least-once output: every output of the records the checkpoint covers is
        // acknowledged before the checkpoint commits their offsets — and before the marker
        // that names their frontier is sent, so that no record from below it can be missing
        // (`crate::time::edge`). (Exactly-once: the transaction commit flushes them, the
        // marker's in it; waiting here could hang on a fenced producer whose deliveries only
        // fail at `message.timeout.ms`.)
        let transactional = self.sink.transactional();
        if !transactional {
            self.drain_sink().await?;
        }
        // Every checkpoint with a marker writes it, changed or not: one lost with an aborted
        // transaction is written again by the next (the stage downstream may otherwise keep
        // an idle marker of this shard's while it emits).
        let frontier_moved = frontier != self.edges.marked_frontier;
        if writes_markers && (marker.is_some() || frontier_moved) {
            self.write_watermark(marker, frontier).await?;
            if !transactional {
                self.drain_sink().await?;
            }
        }
        if self.sink.state_key().is_some() && !self.prepare_sink(only_looking).await? {
            return Ok(());
        }
        let decided_by = if transactional {
            DecidedBy::Transaction
        } else {
            DecidedBy::Manifest
        };
        let state_started = Instant::now();
        let checkpointed = self.shard.checkpoint(&self.offsets, decided_by).await;
        let state_took = state_started.elapsed();
        if transactional {
            self.warn_if_slow(state_took);
        }
        let report = match checkpointed {
            Ok(report) => report,
            Err(err) => return self.checkpoint_failed(err, last),
        };
        // docs/checkpoints.md step 7: the manifest is written, Kafka not yet told.
        fail::fail_point!("checkpoint-after-manifest", |_| {
            crate::fail_points::crash("checkpoint-after-manifest")
        });
        let Some(report) = report else {
            self.dirty = false;
            return Ok(()); // the shard keeps no durable state
        };
        if transactional {
            // docs/checkpoints.md step 8: the transaction decides.
            self.commit_transaction(report.version, (started, state_took))
                .await?;
        }
        self.checkpoint_committed(&report, started, transactional)
            .await;
        Ok(())
    }

    /// The marker the shard would write now (docs/topologies.md): the time through which it
    /// has emitted, and whether its inputs are idle; an idle shard with no watermark yet says
    /// so with [`i64::MIN`]. None while it can say neither.
    fn marker_now(&self) -> Option<Marker> {
        let idle = self.timers.watermarks().inputs_idle(self.timers.now_ms());
        let watermark_ms = match self.timers.emitted_through() {
            Some(watermark_ms) => watermark_ms,
            None if idle => i64::MIN,
            None => return None,
        };
        Some(Marker {
            shard: self.partition.0,
            watermark_ms,
            idle,
        })
    }

    /// `marker` — the shard's watermark — and `frontier` — how far its checkpoint got — to
    /// its internal outputs, with the checkpoint's outputs (docs/topologies.md): acknowledged
    /// before the checkpoint commits (at-least-once), in its transaction (exactly-once). A
    /// frontier without a watermark goes in a marker of [`i64::MIN`], which moves no
    /// watermark downstream. Nothing when both are `None`.
    async fn write_watermark(
        &mut self,
        marker: Option<Marker>,
        frontier: Option<Frontier>,
    ) -> Result<(), WorkerError> {
        if !self.sink.writes_watermarks() {
            return Ok(());
        }
        let written = match (marker, &frontier) {
            (Some(marker), _) => marker,
            (None, Some(_)) => Marker {
                shard: self.partition.0,
                watermark_ms: i64::MIN,
                idle: false,
            },
            (None, None) => return Ok(()),
        };
        if let Err(source) = self.sink.watermark(written, frontier.as_ref()).await {
            return Err(self.sink_failed(source));
        }
        if marker.is_some() {
            self.marked = marker;
        }
        self.edges.marked_frontier = frontier;
        self.edges.announced = true;
        Ok(())
    }

    /// Before the shard emits again after its last marker said it was idle — or for the first
    /// time since it started: its last marker before may have said so, and the stage
    /// downstream keeps that in its checkpoints — a marker that says it is active, so that the
    /// stage downstream counts it again before its records arrive. (One with no watermark
    /// yet says the lowest time: downstream it makes an idle shard active at the watermark it
    /// had, and moves nothing else.)
    pub(in crate::pipeline) async fn mark_active(&mut self) -> Result<(), WorkerError> {
        let frontier = self.edges.marked_frontier.clone();
        match self.marked {
            Some(marker) if marker.idle => {
                let active = Marker {
                    idle: false,
                    ..marker
                };
                self.write_watermark(Some(active), frontier).await
            }
            None if !self.edges.announced && self.sink.writes_watermarks() => {
                let active = Marker {
                    shard: self.partition.0,
                    watermark_ms: i64::MIN,
                    idle: false,
                };
                self.write_watermark(Some(active), frontier).await?;
                // Not the shard's watermark: its next checkpoint writes that when it has one.
                self.marked = None;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The sink's part of the checkpoint (an Iceberg table's data files closed and listed in
    /// the shard's state), labelled with the version the checkpoint will have. Whether the
    /// checkpoint goes on: not when the sink was `only_looking` and dropped nothing.
    async fn prepare_sink(&mut self, only_looking: bool) -> Result<bool, WorkerError> {
        let Some(version) = self.shard.next_checkpoint_version().await else {
            // A table sink's files are exactly-once only through checkpoints.
            return Err(self.sink_failed(crate::pipeline::ports::SinkError {
                topic: "iceberg".to_owned(),
                source: "the pipeline's Iceberg table needs a state backend that keeps checkpoints (lsm, or memory with checkpoint storage)".into(),
            }));
        };
        let timers_through = self.timers.fired_through();
        match self
            .sink
            .prepare(version, &self.offsets, timers_through)
            .await
        {
            Ok(Some(write)) => {
                // The list is the sink's record of files it closed: a shard that could not
                // keep it must not checkpoint offsets past their rows. Reopening replays them
                // from the last checkpoint.
                if let Err(err) = self.shard.apply(vec![write]).await {
                    self.stats
                        .checkpoint_failures
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(self.sink_failed(crate::pipeline::ports::SinkError {
                        topic: "iceberg".to_owned(),
                        source: Box::new(err),
                    }));
                }
                Ok(true)
            }
            Ok(None) => Ok(!only_looking),
            Err(source) => Err(self.sink_failed(source)),
        }
    }

    /// Exactly-once: commits the checkpoint's transaction with the input offsets, naming
    /// manifest `version` (docs/checkpoints.md step 8). `started` and `state_took` (the
    /// checkpoint's start, the state's part of it) name what was slow when the transaction
    /// outlived its timeout.
    async fn commit_transaction(
        &mut self,
        version: ManifestVersion,
        (started, state_took): (Instant, std::time::Duration),
    ) -> Result<(), WorkerError> {
        let partition = self.partition;
        match self.sink.commit(partition, &self.offsets, version).await {
            Ok(()) => Ok(()),
            Err(CommitError::Fenced(source)) => {
                self.stats
                    .checkpoints_fenced
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(partition = partition.0, error = %source, "transaction refused: another owner took the shard's transactional identity over; closing it");
                Err(WorkerError::Fenced { partition })
            }
            Err(CommitError::Failed(source)) => {
                self.stats
                    .checkpoint_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(partition = partition.0, error = %source, "checkpoint transaction failed; reopening the shard from its last decided checkpoint");
                Err(WorkerError::Transaction { partition, source })
            }
            Err(timed_out @ CommitError::TimedOut { .. }) => {
                self.stats
                    .checkpoint_failures
                    .fetch_add(1, Ordering::Relaxed);
                // SCENARIOS.md S19: not another owner; name what was slow.
                let (checkpoint_ms, state_ms) = (
                    started.elapsed().as_millis() as u64,
                    state_took.as_millis() as u64,
                );
                tracing::warn!(partition = partition.0, checkpoint_ms, state_checkpoint_ms = state_ms, error = %timed_out, "the checkpoint's transaction outlived transaction.timeout.ms while the state's checkpoint (memtable flush and manifest write) took {state_ms} ms; reopening the shard from its last decided checkpoint");
                Err(WorkerError::Transaction {
                    partition,
                    source: Box::new(timed_out),
                })
            }
        }
    }

    /// The checkpoint `report` is decided: the worker is clean, the figures and the status
    /// page's history record it, and (at-least-once) the consumer loop hears its offsets to
    /// commit to the group (informational: recovery reads the checkpoint).
    async fn checkpoint_committed(
        &mut self,
        report: &CheckpointReport,
        started: Instant,
        transactional: bool,
    ) {
        self.dirty = false;
        self.shard.checkpoint_decided(report.version);
        let elapsed = started.elapsed();
        self.stats.record_checkpoint(elapsed, report.uploaded_bytes);
        self.stats.record_checkpoint_of(CheckpointRecord {
            stage: None,
            partition: self.partition,
            version: report.version,
            committed_ms: SystemClock.now_ms(),
            duration_ms: elapsed.as_millis() as u64,
            uploaded_bytes: report.uploaded_bytes,
            state_bytes: report.state_bytes,
            offsets: self
                .offsets
                .iter()
                .map(|(t, o)| (t.to_owned(), o))
                .collect(),
        });
        tracing::debug!(
            partition = self.partition.0,
            version = report.version.0,
            ms = elapsed.as_millis() as u64,
            uploaded_bytes = report.uploaded_bytes,
            state_bytes = report.state_bytes,
            "checkpoint committed"
        );
        if !transactional {
            self.events.checkpointed(self.offsets.clone()).await;
        }
    }

    /// The shard's checkpoint failed with `err`: fenced ends the worker, corruption makes the
    /// shard fall back; any other failure leaves the previous checkpoint current (retried at
    /// the next tick, or, at the `last` one, logged as the worker ends without it).
    fn checkpoint_failed(&mut self, err: CheckpointError, last: bool) -> Result<(), WorkerError> {
        match err {
            CheckpointError::Fenced { shard } => {
                self.stats
                    .checkpoints_fenced
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(partition = self.partition.0, %shard, "checkpoint refused: another owner claimed the shard; closing it");
                Err(WorkerError::Fenced {
                    partition: self.partition,
                })
            }
            CheckpointError::State(err) if err.kind() == crate::error::ErrorKind::Corrupt => {
                Err(self.corrupt(err))
            }
            CheckpointError::State(err) => {
                self.stats
                    .checkpoint_failures
                    .fetch_add(1, Ordering::Relaxed);
                if last {
                    self.ended_without_checkpoint(&format_args!(
                        "the checkpoint failed: {}",
                        crate::error::Chain(&err)
                    ));
                } else {
                    tracing::warn!(partition = self.partition.0, error = %err, "checkpoint failed; the previous one stays current");
                }
                Ok(())
            }
        }
    }

    /// Saves the watermark and the timer count to the shard ([`Self::save_time`]), then
    /// checkpoints as [`Self::checkpoint`] does. When they cannot be saved, no checkpoint is
    /// taken (it would keep a timer count its timers do not match): counted as a failed
    /// checkpoint, the previous one stays current.
    pub(in crate::pipeline) async fn checkpoint_with_time(
        &mut self,
        last: bool,
        requested: bool,
    ) -> Result<(), WorkerError> {
        let saved = match self.save_time().await {
            Ok(()) => self.save_edges().await,
            Err(err) => Err(err),
        };
        if let Err(err) = saved {
            if err.kind() == crate::error::ErrorKind::Corrupt {
                return Err(self.corrupt(err));
            }
            self.stats
                .checkpoint_failures
                .fetch_add(1, Ordering::Relaxed);
            if last {
                self.ended_without_checkpoint(&format_args!(
                    "the watermark and timer count could not be saved: {}",
                    crate::error::Chain(&err)
                ));
            } else {
                tracing::warn!(partition = self.partition.0, error = %err, "checkpoint failed: the watermark and timer count could not be saved; the previous one stays current");
            }
            return Ok(());
        }
        self.checkpoint(last, requested).await
    }

    /// Warns when the state's checkpoint (memtable flush, manifest write) took more than half
    /// of the sink's `transaction.timeout.ms`: past the timeout the broker aborts the
    /// checkpoint's transaction (SCENARIOS.md S19), and this line names the slow write first.
    fn warn_if_slow(&self, state_took: std::time::Duration) {
        let Some(timeout) = self.sink.transaction_timeout() else {
            return;
        };
        if state_took * 2 > timeout {
            tracing::warn!(
                partition = self.partition.0,
                state_checkpoint_ms = state_took.as_millis() as u64,
                transaction_timeout_ms = timeout.as_millis() as u64,
                "slow checkpoint: the state's checkpoint (memtable flush and manifest write) took {} ms, more than half of transaction.timeout.ms ({} ms); past it the broker aborts the checkpoint's transaction",
                state_took.as_millis(),
                timeout.as_millis()
            );
        }
    }

    pub(in crate::pipeline) async fn drain_sink(&mut self) -> Result<(), WorkerError> {
        match self.sink.drain().await {
            Ok(()) => Ok(()),
            Err(source) => Err(self.sink_failed(source)),
        }
    }
}
