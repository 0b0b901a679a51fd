//! How the consumer loop and a partition's worker talk: one bounded, typed channel each way,
//! and the loop's control beside the records.
//!
//! - **Loop → worker, records**: the partition's queue of [`Batch`]es of records in offset
//!   order, bounded by `runtime.partition_queue_batches_max` batches. A full queue is
//!   backpressure: the loop waits for room, or pauses the partition at the source while the
//!   worker is stalled. The loop closes the queue (drops its end) after the last batch.
//! - **Loop → worker, control** ([`WorkerControl`] → [`Assignment`]): [`Control::Finish`] at
//!   shutdown, [`Control::Revoke`] when the partition was revoked. It travels outside the
//!   queue, so that a worker hears it whatever it waits on — a full queue it cannot take from,
//!   a backoff after a state outage, a refused delivery, a sink that takes no more output —
//!   and so that a drain or a revoke completes within one backoff step (docs/checkpoints.md,
//!   "Rebalance" and "Shutdown"). The worker's sink hears it too, through its
//!   [`DeliveryGuard`], and stops retrying.
//! - **Worker → loop**: the [`WorkerEvent`]s of every worker of a run, on one channel of
//!   [`EVENTS_MAX`]: a stall and its end, each committed checkpoint's offsets (for the consumer
//!   group) and the worker's end. The loop takes them whenever it waits (for input, for room
//!   in a queue, for a worker to finish), so a worker never waits long to send one. Each event
//!   names the worker's [`WorkerId`]: a revoked partition's worker still finishing is not
//!   taken for its successor.

use super::PipelineStats;
use super::ports::DeadLetterKind;
use super::stats::{PartitionProblem, PartitionState};
use crate::ids::Partition;
use crate::runtime::InputRecord;
use crate::state::checkpoint::InputOffsets;
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, watch};

/// Capacity of the worker → loop channel, in events. A worker sends a handful per checkpoint
/// interval; the loop takes them whenever it waits.
pub(super) const EVENTS_MAX: usize = 256;

/// Records of a partition, in offset order (at most `batch_records_max`): what the consumer
/// loop queues for the partition's worker.
pub(crate) type Batch = Vec<InputRecord>;

/// What the consumer loop asks of a partition's worker besides processing its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Control {
    /// Process the records as they come.
    #[default]
    Run,
    /// Shutdown: process what the loop hands over until it closes the queue, checkpoint a last
    /// time and end. A worker held back (a state outage, a sink that takes no more output)
    /// takes nothing more: its waiting batches are tried once more at once, and if the store
    /// still fails it ends without its last checkpoint.
    Finish,
    /// The partition was revoked: drop every record not yet admitted, finish the admitted ones
    /// (waiting batches tried once more at once, as for [`Control::Finish`]), checkpoint a
    /// last time and end.
    Revoke,
}

impl Control {
    /// How log lines name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Control::Run => "run",
            Control::Finish => "finish",
            Control::Revoke => "revoke",
        }
    }
}

/// The consumer loop's end of a worker's control ([`Control`]).
#[derive(Debug)]
pub(super) struct WorkerControl(watch::Sender<Control>);

impl WorkerControl {
    /// A worker's control, at [`Control::Run`], and the worker's (and its sink's) end of it.
    pub fn new() -> (Self, Assignment) {
        let (tx, rx) = watch::channel(Control::Run);
        (Self(tx), Assignment(rx))
    }

    /// Tells the worker to finish (shutdown); a revoke already told stays.
    pub fn finish(&self) {
        self.0.send_if_modified(|control| {
            let changed = *control == Control::Run;
            if changed {
                *control = Control::Finish;
            }
            changed
        });
    }

    /// Tells the worker its partition was revoked.
    pub fn revoke(&self) {
        self.0.send_replace(Control::Revoke);
    }
}

/// One worker of a run: its partition, and which of the partition's workers on this host it
/// is (a partition revoked and assigned again gets a new one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct WorkerId {
    pub partition: Partition,
    pub incarnation: u64,
}

/// What holds a worker back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stall {
    /// It backs off from a state backend outage, retrying the records.
    StateOutage,
    /// Its sink waits to send a refused delivery again.
    DeliveryRefused,
    /// Its sink takes no more output until earlier output is committed (an Iceberg table's
    /// pending list is full).
    SinkBacklog,
}

/// What a worker (or its sink) tells the consumer loop.
#[derive(Debug)]
pub(super) enum WorkerEvent {
    /// The worker is held back by `cause` (or no longer, `stalled: false`): while it is, a full
    /// queue pauses its partition at the source instead of holding up the loop.
    Stall {
        worker: WorkerId,
        cause: Stall,
        stalled: bool,
    },
    /// A checkpoint of the worker's shard committed with these offsets (at-least-once: the
    /// loop commits them to the consumer group).
    Checkpointed {
        worker: WorkerId,
        offsets: InputOffsets,
    },
    /// The worker's task is about to end: the loop finds out why.
    Ended { worker: WorkerId },
}

/// A worker's end of the worker → loop channel.
#[derive(Debug, Clone)]
pub(crate) struct EventSender {
    worker: WorkerId,
    tx: mpsc::Sender<WorkerEvent>,
}

impl EventSender {
    async fn send(&self, event: WorkerEvent) {
        // Only a finished run drops the loop's end; nobody is left to tell.
        let _ = self.tx.send(event).await;
    }

    /// The worker is held back by `cause`, or no longer.
    pub async fn stalled(&self, cause: Stall, stalled: bool) {
        let worker = self.worker;
        self.send(WorkerEvent::Stall {
            worker,
            cause,
            stalled,
        })
        .await;
    }

    /// A checkpoint committed with `offsets`.
    pub async fn checkpointed(&self, offsets: InputOffsets) {
        let worker = self.worker;
        self.send(WorkerEvent::Checkpointed { worker, offsets })
            .await;
    }

    /// The worker ends.
    pub async fn ended(&self) {
        let worker = self.worker;
        self.send(WorkerEvent::Ended { worker }).await;
    }
}

/// What the consumer loop asks of a worker ([`Control`]), as the worker and its sink see it:
/// whether the partition is still assigned here and the run goes on.
#[derive(Debug, Clone)]
pub(crate) struct Assignment(watch::Receiver<Control>);

impl Assignment {
    /// What the loop asks now.
    pub fn control(&self) -> Control {
        *self.0.borrow()
    }

    /// Whether the partition was revoked.
    pub fn is_revoked(&self) -> bool {
        self.control() == Control::Revoke
    }

    /// Whether the worker was told to finish or revoked.
    pub fn is_closing(&self) -> bool {
        self.control() != Control::Run
    }

    /// Completes once the worker is told to finish or revoked (at once if it was). A
    /// [`WorkerControl`] dropped without telling never completes it.
    pub async fn closing(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|c| *c != Control::Run).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Waits for the loop to ask something else; `false` once it never will (the loop dropped
    /// its [`WorkerControl`]).
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await.is_ok()
    }

    /// Sleeps for `duration`, or less if the worker is told to finish or revoked meanwhile
    /// (a backoff cut short: [`Control`]).
    pub async fn sleep(&self, duration: std::time::Duration) {
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            () = self.closing() => {}
        }
    }
}

/// The loop's end of the worker → loop channel, and what it learned from it.
pub(super) struct Inbox {
    tx: mpsc::Sender<WorkerEvent>,
    rx: mpsc::Receiver<WorkerEvent>,
    /// What holds each worker back now: a state outage, a refused delivery, its sink's
    /// backlog (several at once are possible).
    stalls: HashMap<WorkerId, (bool, bool, bool)>,
    /// Committed checkpoints' offsets, oldest first, not yet committed to the group.
    pub checkpointed: Vec<(WorkerId, InputOffsets)>,
    /// Workers that said they end, not yet reaped.
    pub ended: Vec<WorkerId>,
    /// Per partition, the newest incarnation forgotten: what it and older ones still say (an
    /// event queued before it was reaped, or sent by an aborted one) is stale. Workers of a
    /// partition are reaped oldest first (a new one starts only once the last has closed).
    forgotten: HashMap<Partition, u64>,
}

impl Inbox {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::channel(EVENTS_MAX);
        Self {
            tx,
            rx,
            stalls: HashMap::new(),
            checkpointed: Vec::new(),
            ended: Vec::new(),
            forgotten: HashMap::new(),
        }
    }

    /// The sending end for `worker`.
    pub fn sender(&self, worker: WorkerId) -> EventSender {
        EventSender {
            worker,
            tx: self.tx.clone(),
        }
    }

    /// Waits for the next event and takes it in. Never ends on its own (the inbox holds a
    /// sender): for `select!` beside what the loop waits for.
    pub async fn receive(&mut self) {
        if let Some(event) = self.rx.recv().await {
            self.take(event);
        }
    }

    /// Waits for a worker's `task` to end, taking in events meanwhile: a worker may be sending
    /// one as it ends, and must not wait on the loop that waits on it.
    pub async fn join<T>(
        &mut self,
        task: &mut tokio::task::JoinHandle<T>,
    ) -> Result<T, tokio::task::JoinError> {
        loop {
            tokio::select! {
                ended = &mut *task => return ended,
                () = self.receive() => {}
            }
        }
    }

    /// Takes in every event already sent.
    pub fn receive_ready(&mut self) {
        while let Ok(event) = self.rx.try_recv() {
            self.take(event);
        }
    }

    fn take(&mut self, event: WorkerEvent) {
        let worker = match &event {
            WorkerEvent::Stall { worker, .. }
            | WorkerEvent::Checkpointed { worker, .. }
            | WorkerEvent::Ended { worker } => *worker,
        };
        if self.is_forgotten(worker) {
            return;
        }
        match event {
            WorkerEvent::Stall {
                worker,
                cause,
                stalled,
            } => {
                let stalls = self.stalls.entry(worker).or_default();
                match cause {
                    Stall::StateOutage => stalls.0 = stalled,
                    Stall::DeliveryRefused => stalls.1 = stalled,
                    Stall::SinkBacklog => stalls.2 = stalled,
                }
            }
            WorkerEvent::Checkpointed { worker, offsets } => {
                self.checkpointed.push((worker, offsets));
            }
            WorkerEvent::Ended { worker } => self.ended.push(worker),
        }
    }

    /// Whether `worker` is held back now.
    pub fn is_stalled(&self, worker: WorkerId) -> bool {
        self.stalls
            .get(&worker)
            .is_some_and(|(outage, refused, backlog)| *outage || *refused || *backlog)
    }

    /// Forgets what `worker` and the older workers of its partition said, and ignores what
    /// they still say: it ended and was reaped (or aborted). Its checkpoints' offsets go too:
    /// the partition is no longer its to commit.
    pub fn forget(&mut self, worker: WorkerId) {
        let floor = self.forgotten.entry(worker.partition).or_default();
        *floor = (*floor).max(worker.incarnation);
        self.stalls
            .retain(|w, _| !Self::stale(*w, worker.partition, *floor));
        self.ended
            .retain(|w| !Self::stale(*w, worker.partition, *floor));
        self.checkpointed
            .retain(|(w, _)| !Self::stale(*w, worker.partition, *floor));
    }

    fn is_forgotten(&self, worker: WorkerId) -> bool {
        self.forgotten
            .get(&worker.partition)
            .is_some_and(|floor| Self::stale(worker, worker.partition, *floor))
    }

    fn stale(worker: WorkerId, partition: Partition, floor: u64) -> bool {
        worker.partition == partition && worker.incarnation <= floor
    }
}

/// How a sink tells its owner that deliveries keep failing, and learns that it should stop
/// retrying: the partition pauses while a refused delivery waits to be sent again, its status
/// says why, and a revoke ends the retries.
#[derive(Debug, Default)]
pub struct DeliveryGuard {
    partition: Partition,
    stats: Option<Arc<PipelineStats>>,
    events: Option<EventSender>,
    assignment: Option<Assignment>,
}

impl DeliveryGuard {
    /// The guard of `partition`'s sink, reporting to `stats` and through `events`, giving up
    /// once `assignment` is revoked.
    pub(super) fn new(
        partition: Partition,
        stats: Arc<PipelineStats>,
        events: EventSender,
        assignment: Assignment,
    ) -> Self {
        Self {
            partition,
            stats: Some(stats),
            events: Some(events),
            assignment: Some(assignment),
        }
    }

    /// A failed delivery waits to be sent again, for `Some(reason)`; one went through after
    /// such a wait, for `None`.
    pub async fn stalled(&self, reason: Option<String>) {
        let stalled = reason.is_some();
        if let Some(stats) = &self.stats {
            stats.set_problem(
                self.partition,
                reason.map(|reason| PartitionProblem {
                    state: PartitionState::Paused,
                    reason,
                }),
            );
        }
        if let Some(events) = &self.events {
            events.stalled(Stall::DeliveryRefused, stalled).await;
        }
    }

    /// Whether the owner no longer wants the deliveries (the partition was revoked, or the
    /// pipeline is shutting down): retrying stops and the failure is returned.
    pub fn given_up(&self) -> bool {
        self.assignment.as_ref().is_some_and(Assignment::is_closing)
    }

    /// Waits `duration` before a refused delivery is sent again, less if the owner gives up
    /// meanwhile ([`DeliveryGuard::given_up`]).
    pub async fn wait(&self, duration: std::time::Duration) {
        match &self.assignment {
            Some(assignment) => assignment.sleep(duration).await,
            None => tokio::time::sleep(duration).await,
        }
    }

    /// An output the destination refused as too large was dead-lettered in its place (counted
    /// as [`DeadLetterKind::OutputRefused`]).
    pub fn output_refused(&self) {
        if let Some(stats) = &self.stats {
            stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
            stats
                .metrics
                .dead_lettered(DeadLetterKind::OutputRefused)
                .increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(partition: Partition, incarnation: u64) -> WorkerId {
        WorkerId {
            partition,
            incarnation,
        }
    }

    #[tokio::test]
    async fn what_a_reaped_worker_and_its_elders_still_say_is_ignored() {
        let mut inbox = Inbox::new();
        let (old, reaped, next, other) = (
            id(Partition(0), 1),
            id(Partition(0), 2),
            id(Partition(0), 3),
            id(Partition(1), 1),
        );
        inbox.sender(reaped).stalled(Stall::StateOutage, true).await;
        inbox
            .sender(other)
            .stalled(Stall::DeliveryRefused, true)
            .await;
        inbox.receive_ready();
        assert!(inbox.is_stalled(reaped) && inbox.is_stalled(other));
        inbox.forget(reaped);
        assert!(!inbox.is_stalled(reaped), "forgotten");
        assert!(inbox.is_stalled(other), "another partition's worker is not");
        // Queued before it was reaped, or sent by an aborted elder: stale.
        inbox.sender(reaped).ended().await;
        inbox.sender(old).stalled(Stall::StateOutage, true).await;
        inbox.sender(reaped).checkpointed(InputOffsets::new()).await;
        // Its successor is heard.
        inbox.sender(next).stalled(Stall::StateOutage, true).await;
        inbox.sender(next).ended().await;
        inbox.receive_ready();
        assert!(!inbox.is_stalled(old) && !inbox.is_stalled(reaped));
        assert!(inbox.is_stalled(next));
        assert_eq!(inbox.ended, vec![next]);
        assert!(inbox.checkpointed.is_empty());
    }
}
