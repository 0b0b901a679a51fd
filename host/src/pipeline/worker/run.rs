//! The worker's loop (module docs of `worker`): what it keeps between its turns, and each
//! turn's steps — take in what the end asks for, admit, act when idle (checkpoint, end, run a
//! round of timers), then wait for the next thing to happen.

use super::PartitionWorker;
use super::backlog::Backlog;
use crate::pipeline::WorkerError;
use crate::pipeline::attempt::{Ended, Running};
use crate::pipeline::events::{Assignment, Batch};
use crate::pipeline::policy::SHARD_SETTLE_MAX;
use crate::pipeline::ports::ShardSink;
use crate::state::Shard;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Interval, MissedTickBehavior};

/// What the worker's loop keeps between its turns.
struct Turns<S: Shard> {
    /// The attempts and the round of timers under way.
    running: Running<S>,
    /// What was received and is not admitted yet.
    backlog: Backlog,
    /// The checkpoint interval's ticks.
    ticks: Interval,
    /// A checkpoint is due: admit nothing until every admitted record finished (step 1).
    checkpoint_due: bool,
    /// The due checkpoint was asked for: it is written even with nothing new.
    checkpoint_requested: bool,
    /// Asks for a checkpoint now, besides the interval's (closed: `requests_open` false).
    requests: watch::Receiver<u64>,
    requests_open: bool,
    /// A timer round just ran: admit what waits before the next one (docs/time.md).
    after_round: bool,
    /// The loop's control, heard whatever the worker waits on ([`crate::pipeline::events::Control`]).
    control: Assignment,
    control_open: bool,
}

/// What a turn found once it admitted: whether a timer is due, and whether the sink holds
/// back (an Iceberg table's pending list is full).
#[derive(Clone, Copy)]
struct Found {
    timers_due: bool,
    sink_held: bool,
}

/// What the idle step did.
enum Idle {
    /// It acted (a checkpoint): the next turn starts at once.
    Again,
    /// The queue is closed and everything finished: the loop ends.
    Closed,
    /// Go on to wait.
    Wait,
}

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// The loop: turns until the queue is closed and everything admitted finished, then the
    /// last checkpoint (module docs). Ends early, without it, when the worker gave up.
    pub(super) async fn run_until_closed(
        &mut self,
        queue: &mut mpsc::Receiver<Batch>,
    ) -> Result<(), WorkerError> {
        let mut turns = self.turns();
        loop {
            if self.assignment.is_closing() {
                if self.gave_up {
                    self.abandon(&mut turns.running);
                    return Ok(());
                }
                // Nothing more is taken in by a revoked partition, nor by one whose sink takes
                // no more output (the shutdown must not wait for it).
                if !turns.backlog.closed && (self.assignment.is_revoked() || self.sink.held_back())
                {
                    turns.backlog.close(queue);
                }
            }
            let found = self.admit_turn(&mut turns, queue.is_empty()).await?;
            match self.idle_turn(&mut turns, found).await? {
                Idle::Again => continue,
                Idle::Closed => break,
                Idle::Wait => self.wait_turn(&mut turns, queue, found).await?,
            }
        }
        self.checkpoint_with_time(true, false).await?;
        // A short-lived owner still finishes the GC pass its last checkpoint started.
        self.shard.settle(SHARD_SETTLE_MAX).await;
        Ok(())
    }

    /// The loop's state at its start: the first tick one interval away.
    fn turns(&self) -> Turns<S> {
        let start = Instant::now() + self.checkpoint_interval;
        let mut ticks = tokio::time::interval_at(start, self.checkpoint_interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut requests = self.checkpoint_requests.clone();
        requests.mark_unchanged();
        Turns {
            running: FuturesUnordered::new(),
            backlog: Backlog::default(),
            ticks,
            checkpoint_due: false,
            checkpoint_requested: false,
            requests,
            requests_open: true,
            after_round: false,
            control: self.assignment.clone(),
            control_open: true,
        }
    }

    /// Goes on with a round of timers, reports stalls and waiting inputs, admits what may be
    /// admitted and dispatches it.
    async fn admit_turn(
        &mut self,
        turns: &mut Turns<S>,
        queue_empty: bool,
    ) -> Result<Found, WorkerError> {
        // A round of timers that goes on (one timer at a time, or after an outage) first:
        // it runs, so nothing below takes the partition for idle.
        self.continue_round(&mut turns.running);
        self.report_stall().await;
        self.note_waiting_inputs(&mut turns.backlog, queue_empty);
        // A due timer stops admission, as a due checkpoint does, until every admitted
        // record finished ([`crate::pipeline::timers`]).
        let timers_due = self.timers.due();
        // A sink whose earlier output is not committed yet takes no more (an Iceberg
        // table's pending list is full): admit nothing; checkpoints let it look again.
        let sink_held = self.sink.held_back();
        if sink_held {
            // Nothing is admitted, nor a round run (its rows would add to the list).
            turns.after_round = false;
        }
        if !turns.checkpoint_due && !sink_held && (!timers_due || turns.after_round) {
            self.admit_backlog(&mut turns.backlog).await?;
            turns.after_round = false;
        }
        self.dispatch(&mut turns.running);
        Ok(Found {
            timers_due,
            sink_held,
        })
    }

    /// With nothing running and nothing admitted: the due checkpoint, the end once the queue is
    /// closed, or a round of due timers.
    async fn idle_turn(&mut self, turns: &mut Turns<S>, found: Found) -> Result<Idle, WorkerError> {
        if !turns.running.is_empty() || !self.execution.controller.is_idle() {
            return Ok(Idle::Wait);
        }
        if turns.checkpoint_due {
            self.checkpoint_with_time(false, turns.checkpoint_requested)
                .await?;
            turns.checkpoint_due = false;
            turns.checkpoint_requested = false;
            self.execution.release_instances();
            return Ok(Idle::Again);
        }
        if turns.backlog.closed {
            return Ok(Idle::Closed);
        }
        if found.timers_due && !turns.after_round && !found.sink_held {
            self.timer_round(&mut turns.running).await?;
            turns.after_round = true;
            // A backlog of rounds whose calls and writes never wait would hold the
            // runtime's thread: let its other tasks (partitions, the consumer loop) in.
            tokio::task::yield_now().await;
        }
        Ok(Idle::Wait)
    }

    /// Waits for the next thing to happen — the checkpoint's tick or request, the control, an
    /// ended attempt or round, records, the next processing-time timer — and takes it.
    async fn wait_turn(
        &mut self,
        turns: &mut Turns<S>,
        queue: &mut mpsc::Receiver<Batch>,
        found: Found,
    ) -> Result<(), WorkerError> {
        // Looks at the clock again at the next processing-time timer (not while one is
        // due: then finishing records is what the worker waits for).
        let wake = if found.timers_due || found.sink_held {
            None
        } else {
            self.timers.next_wake()
        };
        // Intake only with an empty backlog: what waits for room in flight stays in the
        // queue (which then fills and pauses the partition).
        let intake =
            !turns.backlog.closed && turns.backlog.records.is_empty() && !turns.checkpoint_due;
        tokio::select! {
            // The tick first: a partition with a full queue must still checkpoint.
            biased;
            _ = turns.ticks.tick(), if !turns.checkpoint_due => turns.checkpoint_due = true,
            changed = turns.requests.changed(), if !turns.checkpoint_due && turns.requests_open => match changed {
                Ok(()) => (turns.checkpoint_due, turns.checkpoint_requested) = (true, true),
                Err(_) => turns.requests_open = false,
            },
            // Told to finish or revoked: the top of the loop takes it.
            open = turns.control.changed(), if turns.control_open => turns.control_open = open,
            Some(ended) = turns.running.next() => match ended {
                Ended::Batch(attempted) => self.attempted(attempted).await?,
                Ended::Timers(called) => self.timers_called(called).await?,
            },
            // The whole queue at once: behind a steady stream of finishing attempts (served
            // first), one batch per intake kept the in-flight window from filling under CPU
            // load.
            message = queue.recv(), if intake => turns.backlog.receive(message, queue, (&mut self.timers, &self.tables)),
            () = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
            // After a round started, once the checkpoint's tick, the finished attempts and
            // the queue were looked at: admit, then go round again — unless a checkpoint is
            // due, which admits nothing and waits for what runs (the round among it):
            // looping here then would never let it finish.
            () = std::future::ready(()), if turns.after_round && !turns.checkpoint_due => {}
        }
        Ok(())
    }
}
