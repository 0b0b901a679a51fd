//! A round of fired timers (see the parent module): its calls, which run as tasks beside the
//! record batches, and how each call's outcome is applied — all of it, one timer at a time
//! after a trap or a rejection with effects, or again after a backoff on an outage.

use crate::pipeline::PipelineStats;
use crate::pipeline::attempt::prefetch_into;
use crate::pipeline::controller::key_hash;
use crate::pipeline::policy::ROUND_BACKOFF_MAX;
use crate::runtime::guest_log::LogSource;
use crate::runtime::{
    BatchCtx, CallError, CallSettings, Disposition, FiredTimer, HostAbort, Instance, Operator,
};
use crate::state::{Shard, StateError};
use crate::time::keys;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A fired timer's two entries, removed when it fires.
pub(in crate::pipeline) fn removals(timer: &FiredTimer) -> [Vec<u8>; 2] {
    [
        keys::per_key(&timer.key, &timer.name),
        keys::time_index(timer.domain, timer.time_ms, &timer.key, &timer.name),
    ]
}

/// A round of fired timers in progress: held in the execution controller from its start until
/// its last timer is settled, whatever happens in between (a re-run one timer at a time, an
/// outage's backoff), as a batch of records holds its keys.
#[derive(Debug)]
pub(in crate::pipeline) struct Round {
    /// Its timers, in firing order, at most one per key.
    timers: Arc<Vec<FiredTimer>>,
    /// Timers before this one are settled (fired, or dead-lettered).
    next: usize,
    /// After a trap or a rejection with effects: one timer per call.
    one_by_one: bool,
    /// Hashes of its keys, held in the execution controller.
    held: Vec<u64>,
    /// Processing time of its calls, ms.
    now_ms: i64,
    /// Wait before the next call (after an outage), and the wait after the next outage.
    delay: Duration,
    backoff: Duration,
}

impl Round {
    /// A round over `timers` (distinct keys, firing order) whose calls run at `now_ms`, held
    /// in the execution controller by the returned hashes of its keys; `backoff` is its first
    /// wait after an outage.
    pub(in crate::pipeline) fn new(
        timers: Vec<FiredTimer>,
        now_ms: i64,
        backoff: Duration,
    ) -> Self {
        // Distinct: a round has at most one timer per key.
        let held: Vec<u64> = timers.iter().map(|t| key_hash(&t.key)).collect();
        Self {
            timers: Arc::new(timers),
            next: 0,
            one_by_one: false,
            held,
            now_ms,
            delay: Duration::ZERO,
            backoff,
        }
    }

    /// The hashes of its keys, held in the execution controller while it runs.
    pub(in crate::pipeline) fn held(&self) -> &[u64] {
        &self.held
    }

    /// Processing time of its calls, ms.
    pub(in crate::pipeline) fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// Wait before its next call starts (after an outage).
    pub(in crate::pipeline) fn delay(&self) -> Duration {
        self.delay
    }

    /// Whether a call gets one timer alone (after a trap or a rejection with effects).
    pub(in crate::pipeline) fn one_by_one(&self) -> bool {
        self.one_by_one
    }

    /// From now on, one timer per call.
    pub(in crate::pipeline) fn go_one_by_one(&mut self) {
        self.one_by_one = true;
        self.delay = Duration::ZERO;
    }

    /// The call over `calling` settled its timers (applied, or dead-lettered): the next call
    /// starts at once, with the first backoff `backoff_min` again.
    pub(in crate::pipeline) fn settled(&mut self, calling: usize, backoff_min: Duration) {
        self.next += calling;
        self.delay = Duration::ZERO;
        self.backoff = backoff_min;
    }

    /// Whether every timer of it is settled.
    pub(in crate::pipeline) fn done(&self) -> bool {
        self.next >= self.timers.len()
    }

    /// An outage: the same call again after the backoff, which doubles (at most
    /// [`ROUND_BACKOFF_MAX`]); returns the wait.
    pub(in crate::pipeline) fn backed_off(&mut self) -> Duration {
        self.delay = self.backoff;
        self.backoff = (self.backoff * 2).min(ROUND_BACKOFF_MAX);
        self.delay
    }

    /// The timers of the next call: the rest of the round, or its next timer alone.
    pub(in crate::pipeline) fn calling(&self) -> Arc<Vec<FiredTimer>> {
        match (self.one_by_one, self.next) {
            (false, 0) => self.timers.clone(),
            (false, next) => Arc::new(self.timers[next..].to_vec()),
            (true, next) => Arc::new(vec![self.timers[next].clone()]),
        }
    }
}

/// A call of a round that ended beside the record batches, handed back to the worker
/// (`PartitionWorker::timers_called`).
pub(in crate::pipeline) struct TimersCalled<S: Shard> {
    pub round: Round,
    /// The timers the call was given.
    pub calling: Arc<Vec<FiredTimer>>,
    /// The instance, unless the call left it unusable or none could be created.
    pub instance: Option<Instance<S>>,
    pub called: Called,
}

/// An `on-timers` call with all it needs owned, so that it runs beside the worker's record
/// batches as their attempts do (`pipeline::attempt::attempt`).
pub(in crate::pipeline) struct TimerCall<S: Shard> {
    pub timers: Arc<Vec<FiredTimer>>,
    pub shard: Arc<S>,
    pub operator: Arc<Operator<S>>,
    pub source: LogSource,
    pub stats: Arc<PipelineStats>,
    /// The call's time: the shard's applied watermark, and the clock.
    pub watermark: Option<i64>,
    pub now_ms: i64,
    pub deadline: Duration,
    pub emits: Arc<CallSettings>,
    /// Longest wait for the prefetch.
    pub io_max: Duration,
}

impl<S: Shard> TimerCall<S> {
    /// Prefetches the timers' keys' declared value states (as for a batch of records), stages
    /// every fired timer's entries as removed and calls `on-timers` on `instance` (or a new
    /// one). Returns the instance unless the call left it unusable or none could be created.
    pub(in crate::pipeline) async fn run(
        self,
        instance: Option<Instance<S>>,
    ) -> (Option<Instance<S>>, Called) {
        let mut batch = BatchCtx::for_timers(self.timers.clone());
        batch.set_call_settings(&self.emits);
        batch.set_time(self.watermark, self.now_ms);
        let keys = self.timers.iter().map(|t| t.key.as_slice());
        let value_states = &self.operator.meta().value_states;
        let io_max = self.io_max;
        match tokio::time::timeout(
            io_max,
            prefetch_into(&*self.shard, value_states, keys, &mut batch),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return (instance, Called::Outage(err)),
            Err(_) => {
                let err = StateError::Unavailable {
                    shard: self.source.label.to_string(),
                    source: format!("prefetch still waiting after {io_max:?}").into(),
                };
                return (instance, Called::Outage(err));
            }
        }
        for timer in self.timers.iter() {
            for key in removals(timer) {
                batch.stage_removal(key);
            }
        }
        let mut instance = match instance {
            Some(instance) => instance,
            None => match self
                .operator
                .instantiate(Some(self.shard.clone()), self.source.clone())
                .await
            {
                Ok(instance) => instance,
                Err(err) => {
                    let err = StateError::Unavailable {
                        shard: self.source.label.to_string(),
                        source: Box::new(err),
                    };
                    return (None, Called::Outage(err));
                }
            },
        };
        let result = instance.call_timers(batch, self.deadline).await;
        self.stats.guest_calls.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok((dispositions, batch)) => (Some(instance), Called::Done(dispositions, batch)),
            // The store is unusable after any error.
            Err(CallError::Aborted(HostAbort::State(err))) => (None, Called::Outage(err)),
            Err(fault) => {
                self.stats.traps.fetch_add(1, Ordering::Relaxed);
                (None, Called::Fault(fault))
            }
        }
    }
}

/// How a round's call ended.
pub(in crate::pipeline) enum Called {
    /// Dispositions and staged effects.
    Done(Vec<Disposition>, BatchCtx),
    /// The guest failed (trap, deadline, wrong disposition count).
    Fault(CallError),
    /// The state backend failed.
    Outage(StateError),
}
