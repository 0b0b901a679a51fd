//! The consumer loop of one pipeline run: takes records and rebalances from the
//! [`Source`], hands each partition's records to its worker in batches, pauses a partition
//! whose worker is stalled, opens shards of assigned partitions ([`super::open`]), closes
//! those of revoked ones, commits checkpointed offsets to the consumer group, and drains at
//! shutdown (docs/checkpoints.md, "Recovery" and "Rebalance").

use super::WorkerError;
use super::events::{Assignment, Batch, Inbox, WorkerControl, WorkerId};
use crate::ids::Partition;
mod open;
mod outcome;
mod shutdown;

use super::policy::{CONSUMER_ERROR_WAIT, PAUSED_RETRY_INTERVAL, WATERMARKS_INTERVAL};
use super::ports::{GroupOffsets, Output, Source};
use super::worker::{PartitionWorker, WorkerStart};
use super::{PipelineControl, PipelineError, PipelineStats};
use crate::config::Settings;
use crate::runtime::{InputRecord, Operator};
use crate::state::StateBackend;
use crate::state::checkpoint::InputOffsets;
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
pub(super) use open::Opened;
use open::Opening;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running worker, as the loop holds it.
pub(super) struct WorkerHandle {
    pub(super) id: WorkerId,
    /// The loop's end of the partition's queue; `None` once closed after the last batch
    /// (shutdown).
    pub(super) queue: Option<mpsc::Sender<Batch>>,
    /// The loop's end of the worker's control: finish, revoke ([`super::events`]).
    pub(super) control: WorkerControl,
    pub(super) task: JoinHandle<Result<(), WorkerError>>,
    /// Whether the partition's consumer is caught up, for the worker (`read_high_watermarks`
    /// keeps it).
    pub(super) caught_up: Arc<AtomicBool>,
}

/// The worker of a revoked partition, finishing its last checkpoint.
pub(super) struct Closing {
    pub(super) revoked_at: Instant,
    pub(super) id: WorkerId,
    pub(super) task: JoinHandle<Result<(), WorkerError>>,
}

/// Everything a running pipeline holds.
///
/// A partition's life on this host (docs/checkpoints.md, "Recovery" and "Rebalance"): its first
/// fetched record finds no worker → the partition is paused and its shard opened in the
/// background ([`Opening`]) → the consumer is seeked to the checkpoint's offsets, the worker
/// starts and the partition resumes → on revoke the worker drops what is queued, checkpoints
/// and ends ([`Running::closing`]); the partition is not opened again here before that ends.
pub(super) struct Running<B: StateBackend, Src: Source, Out: Output> {
    pub(super) settings: Settings,
    pub(super) backend: Arc<B>,
    pub(super) operator: Arc<Operator<B::Shard>>,
    pub(super) stats: Arc<PipelineStats>,
    /// Where records and rebalances come from.
    pub(super) source: Arc<Src>,
    /// Where each partition's outputs go.
    pub(super) output: Arc<Out>,
    pub(super) workers: HashMap<Partition, WorkerHandle>,
    opening: HashMap<Partition, Opening<B::Shard, Out::Sink>>,
    /// Workers of revoked partitions, finishing their last checkpoint, and when they were
    /// revoked.
    pub(super) closing: HashMap<Partition, Closing>,
    /// Partitions not to open before the instant (fenced, or a failed open).
    pub(super) hold: HashMap<Partition, Instant>,
    /// Records fetched but not yet handed to their partition's worker.
    pub(super) pending: HashMap<Partition, Vec<InputRecord>>,
    /// Partitions paused at the consumer: their worker's queue is full, or it is not running
    /// yet.
    pub(super) paused: HashSet<Partition>,
    /// What the workers tell the loop: stalls, checkpoints' offsets to commit to the group,
    /// their ends (so that a fenced or failed shard is reopened without waiting for a record).
    pub(super) inbox: Inbox,
    /// The incarnation of the next worker started (or shard opened).
    pub(super) incarnations: u64,
    pub(super) control: PipelineControl,
    /// When the input's high watermarks were last copied into the partitions' progress.
    pub(super) watermarks_read: Instant,
    /// What each partition's last worker here found corrupt: its next open falls back past
    /// the checkpoints it makes unusable (docs/checkpoints.md, "Corruption").
    pub(super) corruption: HashMap<Partition, crate::state::KnownCorruption>,
    /// The next wait of partitions whose open found no usable checkpoint.
    pub(super) open_backoff: HashMap<Partition, Duration>,
    /// The next wait before reopening a partition whose transaction failed, and when it last
    /// did (exactly-once).
    pub(super) transaction_backoff: HashMap<Partition, (Duration, Instant)>,
    /// The run's global tables on this host, which every worker's calls read.
    pub(super) global_tables: crate::runtime::GlobalTables,
}

impl<B: StateBackend, Src: Source, Out: Output> Running<B, Src, Out> {
    /// A pipeline run over `source` and `output`, with nothing assigned yet.
    pub(super) fn new(
        settings: Settings,
        backend: Arc<B>,
        operator: Arc<Operator<B::Shard>>,
        stats: Arc<PipelineStats>,
        control: PipelineControl,
        source: Arc<Src>,
        output: Arc<Out>,
    ) -> Self {
        Self {
            settings,
            backend,
            operator,
            stats,
            source,
            output,
            workers: HashMap::new(),
            opening: HashMap::new(),
            closing: HashMap::new(),
            hold: HashMap::new(),
            pending: HashMap::new(),
            paused: HashSet::new(),
            inbox: Inbox::new(),
            incarnations: 0,
            control,
            watermarks_read: Instant::now(),
            corruption: HashMap::new(),
            open_backoff: HashMap::new(),
            transaction_backoff: HashMap::new(),
            global_tables: Default::default(),
        }
    }
}

impl<B: StateBackend, Src: Source, Out: Output> Running<B, Src, Out> {
    /// Takes records and rebalances from the source until `shutdown` completes or a worker
    /// fails.
    ///
    /// Each round takes at most `batch_records_max` records of every partition from the source
    /// and hands them to the workers, so that no partition waits behind another's backlog.
    /// Rebalances the source reports are applied before the records fetched after them.
    pub(super) async fn consume(
        &mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), PipelineError> {
        let batch_max = self.settings.runtime.batch_records_max;
        let mut shutdown = std::pin::pin!(shutdown);
        let source = self.source.clone();
        let mut fetched = Vec::with_capacity(batch_max);
        // Whether the last fetch may have left records behind: fetch again without waiting.
        let mut more = false;
        loop {
            // While a partition is paused or a shard is changing hands, wake up now and then.
            let retry = !self.paused.is_empty() || !self.closing.is_empty();
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                // A worker's end, a stall, a checkpoint's offsets to commit to the group while
                // the input is quiet.
                () = self.inbox.receive() => {}
                () = std::future::ready(()), if more => {}
                () = source.ready() => {}
                () = tokio::time::sleep(PAUSED_RETRY_INTERVAL), if retry => {}
                // Now and then, to refresh the partitions' lag while the input is quiet.
                () = tokio::time::sleep_until(self.watermarks_read + WATERMARKS_INTERVAL) => {}
            }
            // Rebalances reported so far, before the records fetched after them.
            self.drop_revoked();
            self.pause_assigned();
            more = match source.fetch(batch_max, &mut fetched) {
                Ok(more) => more,
                Err(err) => {
                    // The source reports broker trouble here and keeps retrying on its own.
                    tracing::warn!(error = %crate::error::Chain(&*err), "consumer error");
                    tokio::time::sleep(CONSUMER_ERROR_WAIT).await;
                    // Events may wait behind the error, and a queue that never went empty
                    // wakes no one: look again.
                    true
                }
            };
            for record in fetched.drain(..) {
                self.pending
                    .entry(Partition(record.partition))
                    .or_default()
                    .push(record);
            }
            // A rebalance the fetch came upon: its records fetched before it were queued
            // above, and a revoke drops them.
            self.drop_revoked();
            self.pause_assigned();
            self.tend_shards().await?;
            if self.watermarks_read.elapsed() >= WATERMARKS_INTERVAL {
                self.watermarks_read = Instant::now();
                self.read_high_watermarks();
            }
            let partitions: Vec<Partition> = self.pending.keys().copied().collect();
            for partition in partitions {
                self.send_pending(partition, true).await?;
            }
        }
    }

    /// Forgets revoked partitions: fetched records dropped, a shard being opened abandoned, a
    /// running worker told to drop its queue, checkpoint and end (it moves to `closing`).
    pub(super) fn drop_revoked(&mut self) {
        for partition in self.source.take_revoked() {
            self.pending.remove(&partition);
            self.paused.remove(&partition);
            self.hold.remove(&partition);
            self.open_backoff.remove(&partition);
            if let Some(opening) = self.opening.remove(&partition) {
                opening.abort();
            }
            if let Some(worker) = self.workers.remove(&partition) {
                // The revoke itself (events.rs): the worker and its sink hear it at once,
                // whatever they wait on.
                worker.control.revoke();
                let closing = Closing {
                    revoked_at: Instant::now(),
                    id: worker.id,
                    task: worker.task,
                };
                if let Some(older) = self.closing.insert(partition, closing) {
                    self.inbox.forget(older.id);
                    older.task.abort();
                }
            } else if !self.closing.contains_key(&partition) {
                // Nothing of it runs here any more (its worker ended on its own, fenced or its
                // transaction lost, or its shard was still opening): its progress goes now, or
                // this host's reports would name it running for as long as the run lasts.
                self.stats.forget_partition(partition);
            }
        }
    }

    /// Pauses newly assigned partitions that have no shard yet: `tend_shards` opens their
    /// shards right away (recovery does not wait for a first record) and resumes them after
    /// the seek.
    pub(super) fn pause_assigned(&mut self) {
        for partition in self.source.take_assigned() {
            let busy =
                self.workers.contains_key(&partition) || self.opening.contains_key(&partition);
            if !busy && self.paused.insert(partition) {
                self.set_paused(partition, true);
            }
        }
    }

    /// Moves shards along their life: reaps closed and failed workers, starts opening shards
    /// for paused partitions that have none, finishes opens (seek, start the worker, resume),
    /// and commits checkpointed offsets to Kafka.
    async fn tend_shards(&mut self) -> Result<(), PipelineError> {
        self.reap_closed().await?;
        // A worker that said it ends is about to: awaiting it is short.
        let ended: Vec<Partition> = self
            .workers
            .iter()
            .filter(|(_, w)| w.task.is_finished() || self.inbox.ended.contains(&w.id))
            .map(|(p, _)| *p)
            .collect();
        for partition in ended {
            self.worker_ended(partition).await?;
        }
        let now = Instant::now();
        self.hold.retain(|_, until| *until > now);
        let waiting: Vec<Partition> = self
            .paused
            .iter()
            .copied()
            .filter(|p| self.may_open(*p))
            .collect();
        for partition in waiting {
            self.start_opening(partition);
        }
        self.finish_opened().await?;
        self.commit_checkpointed();
        Ok(())
    }

    /// Whether `partition` (assigned, paused) may start opening its shard now: no worker,
    /// open or revoked worker of it here, and not held back.
    pub(super) fn may_open(&self, partition: Partition) -> bool {
        !self.workers.contains_key(&partition)
            && !self.opening.contains_key(&partition)
            && !self.closing.contains_key(&partition)
            && !self.hold.contains_key(&partition)
    }

    /// Takes the shards whose open ended: their workers start, or they are held back.
    pub(super) async fn finish_opened(&mut self) -> Result<(), PipelineError> {
        let opened: Vec<Partition> = self
            .opening
            .iter()
            .filter(|(_, o)| o.is_finished())
            .map(|(p, _)| *p)
            .collect();
        for partition in opened {
            self.finish_opening(partition).await?;
        }
        Ok(())
    }

    /// Reaps the revoked partitions' workers that ended.
    pub(super) async fn reap_closed(&mut self) -> Result<(), PipelineError> {
        let closed: Vec<Partition> = self
            .closing
            .iter()
            .filter(|(_, c)| c.task.is_finished() || self.inbox.ended.contains(&c.id))
            .map(|(p, _)| *p)
            .collect();
        for partition in closed {
            if let Some(Closing {
                revoked_at,
                id,
                mut task,
            }) = self.closing.remove(&partition)
            {
                let ended = self.inbox.join(&mut task).await;
                self.inbox.forget(id);
                let ms = revoked_at.elapsed().as_millis() as u64;
                self.stats.shards_closed.fetch_add(1, Ordering::Relaxed);
                self.stats.forget_partition(partition);
                match ended {
                    Ok(Ok(())) => {
                        tracing::info!(partition = partition.0, ms, "revoked partition closed")
                    }
                    Ok(Err(err)) => {
                        tracing::warn!(partition = partition.0, ms, error = %err, "revoked partition closed with an error; the next owner resumes from its last checkpoint")
                    }
                    Err(_) => return Err(PipelineError::WorkerPanicked(partition)),
                }
            }
        }
        Ok(())
    }

    /// Copies the input topics' high watermarks of the partitions run here into their
    /// progress (as the source last saw them: no request is made), and tells each worker
    /// whether its consumer is caught up ([`Source::at_end`] of every input topic).
    fn read_high_watermarks(&self) {
        for (&partition, worker) in &self.workers {
            let caught_up = self
                .settings
                .pipeline
                .input_topics
                .iter()
                .all(|topic| self.source.at_end(topic, partition));
            worker.caught_up.store(caught_up, Ordering::Release);
            let highs = self
                .settings
                .pipeline
                .input_topics
                .iter()
                .map(|topic| {
                    let high = self.source.high_watermark(topic, partition).unwrap_or(-1);
                    (topic.clone(), high)
                })
                .collect();
            self.stats.record_high_watermarks(partition, highs);
        }
    }

    /// Commits (asynchronously) the offsets of checkpoints committed since the last call, for
    /// partitions still owned — never one whose revoke reached this loop: its next owner
    /// commits what it recovers (S1). Informational — lag and tooling read them; recovery reads
    /// the checkpoint — so a failure is only logged.
    fn commit_checkpointed(&mut self) {
        let owned: HashSet<WorkerId> = self.workers.values().map(|w| w.id).collect();
        self.commit_offsets(&owned, false);
    }

    /// Commits the newest checkpointed offsets received from the `owned` workers (later
    /// checkpoints replace earlier ones) and forgets the others'.
    pub(super) fn commit_offsets(&mut self, owned: &HashSet<WorkerId>, wait: bool) {
        self.inbox.receive_ready();
        let mut newest = GroupOffsets::new();
        for (worker, offsets) in std::mem::take(&mut self.inbox.checkpointed) {
            if owned.contains(&worker) {
                for (topic, next) in offsets.iter() {
                    newest.insert((topic.to_owned(), worker.partition), next.0);
                }
            }
        }
        if !newest.is_empty()
            && let Err(err) = self.source.commit(&newest, wait)
        {
            tracing::warn!(error = %crate::error::Chain(&err), "cannot commit checkpointed offsets to the consumer group");
        }
    }

    /// Hands the partition's pending records to its worker in batches of at most
    /// `batch_records_max`. A partition without a running worker is paused and keeps its
    /// records until its shard is open. A busy worker gets plain backpressure (this waits for
    /// room); a worker backing off from a state outage gets its partition paused at the
    /// consumer instead, the records stay pending and the other partitions go on; it is resumed
    /// once everything is handed over. Not `live` (when draining), waits for room as long as
    /// it takes.
    pub(super) async fn send_pending(
        &mut self,
        partition: Partition,
        live: bool,
    ) -> Result<(), PipelineError> {
        let Some(worker) = self.workers.get(&partition) else {
            if live && self.paused.insert(partition) {
                self.set_paused(partition, true);
            }
            return Ok(());
        };
        let Some(tx) = worker.queue.clone() else {
            // Closed after the last batch (shutdown): nothing more is handed over.
            self.pending.remove(&partition);
            return Ok(());
        };
        let id = worker.id;
        let Some(mut records) = self.pending.remove(&partition) else {
            return Ok(());
        };
        let batch_max = self.settings.runtime.batch_records_max;
        while !records.is_empty() {
            let permit = match live {
                false => loop {
                    // Shutdown: a worker held back takes nothing more (it was told to finish
                    // and ends on its own), so its records stay unprocessed.
                    if self.inbox.is_stalled(id) {
                        return Ok(());
                    }
                    tokio::select! {
                        permit = tx.reserve() => break permit.ok(),
                        // A stall (above), or a worker's last checkpoint's offsets.
                        () = self.inbox.receive() => {}
                    }
                },
                true if self.paused.contains(&partition) => match tx.try_reserve() {
                    Ok(permit) => Some(permit),
                    Err(mpsc::error::TrySendError::Full(())) => {
                        self.pending.insert(partition, records);
                        return Ok(());
                    }
                    Err(mpsc::error::TrySendError::Closed(())) => None,
                },
                true => loop {
                    match tx.try_reserve() {
                        Ok(permit) => break Some(permit),
                        Err(mpsc::error::TrySendError::Closed(())) => break None,
                        Err(mpsc::error::TrySendError::Full(())) => {}
                    }
                    // A full queue: backpressure, unless the worker is held back (an outage,
                    // a refused delivery), when the partition pauses and the others go on.
                    if self.inbox.is_stalled(id) {
                        self.pending.insert(partition, records);
                        self.paused.insert(partition);
                        self.set_paused(partition, true);
                        return Ok(());
                    }
                    tokio::select! {
                        permit = tx.reserve() => break permit.ok(),
                        // A stall of this worker (above) or anything else a worker says.
                        () = self.inbox.receive() => {}
                    }
                },
            };
            let Some(permit) = permit else {
                // The worker's queue is closed: it ended. Find out why.
                return if live {
                    self.worker_ended(partition).await
                } else {
                    self.worker_drained(partition).await
                };
            };
            let rest = records.split_off(records.len().min(batch_max));
            permit.send(std::mem::replace(&mut records, rest));
        }
        if live && self.paused.remove(&partition) {
            self.set_paused(partition, false);
        }
        Ok(())
    }

    /// Pauses or resumes fetching of `partition` of every input topic.
    pub(super) fn set_paused(&self, partition: Partition, paused: bool) {
        let result = self.source.set_paused(partition, paused);
        if paused {
            self.stats.partition_pauses.fetch_add(1, Ordering::Relaxed);
        }
        match result {
            Ok(()) => tracing::debug!(
                partition = partition.0,
                paused,
                "partition fetch state changed"
            ),
            Err(err) => {
                tracing::warn!(partition = partition.0, paused, error = %crate::error::Chain(&err), "cannot change partition fetch state")
            }
        }
    }

    /// Starts the worker of `partition` over its opened shard and sink, resuming from
    /// `offsets`: `worker` is the id and `control` the control its sink's guard already hears.
    pub(super) fn start_worker(
        &mut self,
        worker: WorkerId,
        opened: Opened<B::Shard, Out::Sink>,
        (control, assignment): (WorkerControl, Assignment),
        offsets: InputOffsets,
        opened_at: Instant,
    ) {
        let partition = worker.partition;
        let (tx, rx) = mpsc::channel(self.settings.runtime.partition_queue_batches_max);
        let events = self.inbox.sender(worker);
        let caught_up = Arc::new(AtomicBool::new(false));
        let worker_state = PartitionWorker::new(
            &self.settings,
            WorkerStart {
                partition,
                operator: self.operator.clone(),
                opened,
                stats: self.stats.clone(),
                control: self.control.clone(),
                events: events.clone(),
                assignment,
                offsets,
                opened_at,
                caught_up: caught_up.clone(),
                global_tables: self.global_tables.clone(),
            },
        );
        // In the run's span (its pipeline, its stage): every line the worker logs names them.
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
            let result = worker_state.run(rx).await;
            events.ended().await;
            result
        }));
        self.workers.insert(
            partition,
            WorkerHandle {
                id: worker,
                queue: Some(tx),
                control,
                task,
                caught_up,
            },
        );
    }

    /// A new worker id for `partition`.
    pub(super) fn next_worker(&mut self, partition: Partition) -> WorkerId {
        self.incarnations += 1;
        WorkerId {
            partition,
            incarnation: self.incarnations,
        }
    }
}
