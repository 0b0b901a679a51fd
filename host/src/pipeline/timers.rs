//! Firing timers in a partition's worker (docs/time.md).
//!
//! [`Timers`] holds what the worker knows of its shard's time: the head of the next due timers
//! ([`TimerHead`]), the watermark ([`Watermarks`]) and the clock. The worker asks it after every
//! step whether a timer is due — a processing-time timer at or before the clock, an event-time
//! timer at or before the watermark the admitted records allow — and if so stops admitting, lets
//! every admitted record finish (so that the watermark applies only once every record before it
//! has finished, as FLIP-425's epochs), applies the watermark and starts **one round**: at most
//! `timer_batch_max` due timers, in time order and at most one per key, through one `on-timers`
//! call. The round runs as an entry of the execution controller: its keys are held there
//! while it runs ([`super::controller::ExecutionController::hold`]), so a key's later records
//! wait behind its timer — and its earlier ones all finished before — while records of other
//! keys are admitted and run beside it (as Flink 2.0 puts fired timers in its asynchronous
//! execution controller's per-key queues). The next round waits for the next idle moment. A
//! checkpoint due meanwhile goes first, so a backlog of due timers delays a checkpoint by at
//! most one round.
//!
//! A round's effects apply as a batch's do: each fired timer's entries are removed, and its
//! state writes and emits applied, only together. A rejection with effects, or a trap, re-runs
//! the round one timer at a time, each timer's effects applied before the next runs; a timer
//! that is rejected or traps alone is dead-lettered (its entries removed, nothing else of it
//! applied). The re-runs are calls of their own beside the records, never inline. A state
//! outage keeps the round's keys held and its timers taken, and calls again after a backoff, as
//! a batch of records does; records of other keys go on.

use super::PipelineStats;
use super::attempt::{Ended, Running, batch_deadline, prefetch_into};
use super::controller::key_hash;
use super::outcome::WorkerError;
use super::ports::{DeadLetterKind, ShardSink};
use super::worker::PartitionWorker;
use crate::clock::SharedClock;
use crate::runtime::{
    BatchCtx, CallError, Disposition, FiredTimer, Header, HostAbort, InputRecord, Instance,
    Operator, TimeDomain,
};
use crate::state::{Shard, StateError, StateWrite};
use crate::time::head::TimerHead;
use crate::time::keys::{self, StoredTimer, TIMER_COUNT_KEY, WATERMARK_KEY};
use crate::time::watermark::{Idleness, Watermarks};
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// Longest wait between two looks at the clock while a processing-time timer is pending (the
/// clock may jump).
const CLOCK_LOOK_MAX: Duration = Duration::from_secs(1);

/// Longest retry delay of a round after an outage.
const ROUND_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// A partition's view of its shard's time. See the module docs.
#[derive(Debug)]
pub(crate) struct Timers {
    head: TimerHead,
    pub(super) watermarks: Watermarks,
    clock: SharedClock,
    /// Whether the head and the saved watermark were read from the shard.
    loaded: bool,
    /// The watermark last written to the shard.
    saved: Option<i64>,
    /// Timers added to the shard since it opened (applied writes; negative: removed).
    added: i64,
    /// The shard's count of pending timers when loaded, less what had been `added` by then:
    /// `base + added` timers are pending. `None` until loaded.
    base: Option<i64>,
    /// The count last written to the shard ([`TIMER_COUNT_KEY`]).
    saved_count: Option<i64>,
    /// The shard's count was deleted because timers changed before it was read (see
    /// [`PartitionWorker::save_time`]).
    count_dropped: bool,
    /// No round before this (after an outage), and the next backoff.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// The topic a timer's outputs and dead letters name as their source.
    topic: Arc<str>,
    /// Whether the operator can have timers (a 0.1 component cannot): when not, nothing here
    /// reads or writes the shard.
    enabled: bool,
    /// A round whose next call is to start ([`PartitionWorker::continue_round`]).
    going_on: Option<Round>,
}

impl Timers {
    /// Timers of a shard over `topics`, with `max_out_of_orderness` and `idleness`; `enabled`
    /// when the operator can set timers.
    pub fn new(
        topics: &[String],
        max_out_of_orderness: Duration,
        idleness: Idleness,
        clock: SharedClock,
        enabled: bool,
    ) -> Self {
        let now = i64::try_from(clock.now_ms()).unwrap_or(i64::MAX);
        Self {
            head: TimerHead::default(),
            watermarks: Watermarks::new(topics, max_out_of_orderness, idleness, now),
            clock,
            loaded: false,
            saved: None,
            added: 0,
            base: None,
            saved_count: None,
            count_dropped: false,
            retry_at: None,
            backoff: Duration::ZERO,
            topic: topics.first().map_or("", String::as_str).into(),
            enabled,
            going_on: None,
        }
    }

    /// Whether an event-time timer is due by the watermark the records admitted so far allow
    /// (`now_ms` for idleness): admission stops there, so that the round runs before any later
    /// record and lateness is decided at the watermark of every record before it.
    pub fn due_by_watermark(&self, now_ms: i64) -> bool {
        if !self.enabled || !self.loaded {
            return false;
        }
        let Some(next) = self.head.next(TimeDomain::EventTime) else {
            return false;
        };
        self.watermarks.candidate(now_ms).is_some_and(|w| next <= w)
    }

    /// Processing time now, ms since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX)
    }

    /// Whether a round should run now: the shard's timers are not loaded yet, or a timer is due
    /// by the clock or by the watermark the admitted records allow — never during a backoff
    /// after an outage (records go on meanwhile; what they set joins the head, which the next
    /// load completes).
    pub fn due(&self) -> bool {
        if !self.enabled || self.retry_at.is_some_and(|at| Instant::now() < at) {
            return false;
        }
        if !self.loaded {
            return true;
        }
        let by_clock = self
            .head
            .next(TimeDomain::ProcessingTime)
            .is_some_and(|t| t <= self.now_ms());
        let by_watermark = match (
            self.head.next(TimeDomain::EventTime),
            self.watermarks.candidate(self.now_ms()),
        ) {
            (Some(t), Some(w)) => t <= w,
            _ => false,
        };
        by_clock || by_watermark || self.head.needs_load()
    }

    /// When the worker should look again without any record arriving: the next
    /// processing-time timer (at most [`CLOCK_LOOK_MAX`] away), within [`CLOCK_LOOK_MAX`]
    /// while event-time timers wait for an input to go idle, or the end of a backoff.
    pub fn next_wake(&self) -> Option<Instant> {
        if !self.enabled {
            return None;
        }
        let by_clock = self.head.next(TimeDomain::ProcessingTime).map(|t| {
            let wait = u64::try_from(t.saturating_sub(self.now_ms())).unwrap_or(0);
            Instant::now() + Duration::from_millis(wait).min(CLOCK_LOOK_MAX)
        });
        let by_idleness = (self.watermarks.idles()
            && self.head.next(TimeDomain::EventTime).is_some())
        .then(|| Instant::now() + CLOCK_LOOK_MAX);
        let by_clock = match (by_clock, by_idleness) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (by_clock, self.retry_at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Follows applied writes (timers set, moved, cleared or fired) that added `added` timers
    /// to the shard (negative: removed).
    pub fn applied(&mut self, writes: &[StateWrite], added: i64) {
        self.added += added;
        if writes.iter().any(|w| w.key.starts_with(&keys::TIME_INDEX)) {
            self.head.applied(writes);
        }
    }

    /// Timers pending in the shard (set and not fired or cleared), once loaded.
    pub fn pending(&self) -> Option<u64> {
        self.base
            .map(|base| u64::try_from(base + self.added).unwrap_or(0))
    }

    fn backed_off(&mut self) {
        self.backoff = (self.backoff * 2).clamp(Duration::from_millis(50), ROUND_BACKOFF_MAX);
        self.retry_at = Some(Instant::now() + self.backoff);
    }

    /// The source record a fired timer's emits and dead letter name: its key, no value, the
    /// time it fired at as timestamp (event time: its own time; processing time: the clock at
    /// the call), no offset, and the timer in `weir.timer.*` headers.
    fn source(&self, partition: i32, timer: &FiredTimer, now_ms: i64) -> InputRecord {
        let domain = match timer.domain {
            TimeDomain::EventTime => "event-time",
            TimeDomain::ProcessingTime => "processing-time",
        };
        InputRecord {
            key: timer.key.clone(),
            value: Vec::new(),
            timestamp_ms: match timer.domain {
                TimeDomain::EventTime => timer.time_ms,
                TimeDomain::ProcessingTime => now_ms,
            },
            headers: vec![
                header("weir.timer.key", timer.key.clone()),
                header("weir.timer.name", timer.name.clone().into_bytes()),
                header("weir.timer.time-ms", timer.time_ms.to_string().into_bytes()),
                header("weir.timer.domain", domain.as_bytes().to_vec()),
            ],
            topic: self.topic.clone(),
            partition,
            offset: -1,
        }
    }
}

fn header(name: &str, value: Vec<u8>) -> Header {
    Header {
        name: name.to_owned(),
        value,
    }
}

/// A fired timer's two entries, removed when it fires.
fn removals(timer: &FiredTimer) -> [Vec<u8>; 2] {
    [
        keys::per_key(&timer.key, &timer.name),
        keys::time_index(timer.domain, timer.time_ms, &timer.key, &timer.name),
    ]
}

fn fired(t: StoredTimer) -> FiredTimer {
    FiredTimer {
        key: t.key,
        name: t.name,
        time_ms: t.time_ms,
        domain: t.domain,
    }
}

/// The timers pending in `shard` (its time-index entries, both domains), counted by a scan of
/// the whole index in pages, each bounded by `io_max` (`source` names the shard in errors): for
/// a shard that keeps no count yet ([`TIMER_COUNT_KEY`]).
async fn count_timers<S: Shard>(
    shard: &S,
    source: String,
    io_max: Duration,
) -> Result<u64, StateError> {
    const PAGE: usize = 4096;
    let mut count = 0u64;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let scan = shard.scan(&keys::TIME_INDEX, after.as_deref(), PAGE);
        let page = match tokio::time::timeout(io_max, scan).await {
            Ok(page) => page?,
            Err(_) => {
                return Err(StateError::Unavailable {
                    shard: source,
                    source: format!("counting the timers still waiting after {io_max:?}").into(),
                });
            }
        };
        count += page.len() as u64;
        if page.len() < PAGE {
            return Ok(count);
        }
        after = page.into_iter().next_back().map(|(k, _)| k);
    }
}

/// A round of fired timers in progress: held in the execution controller from its start until
/// its last timer is settled, whatever happens in between (a re-run one timer at a time, an
/// outage's backoff), as a batch of records holds its keys.
#[derive(Debug)]
pub(super) struct Round {
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
    /// The timers of the next call: the rest of the round, or its next timer alone.
    fn calling(&self) -> Arc<Vec<FiredTimer>> {
        match (self.one_by_one, self.next) {
            (false, 0) => self.timers.clone(),
            (false, next) => Arc::new(self.timers[next..].to_vec()),
            (true, next) => Arc::new(vec![self.timers[next].clone()]),
        }
    }
}

/// A call of a round that ended beside the record batches, handed back to the worker
/// ([`PartitionWorker::timers_called`]).
pub(super) struct TimersCalled<S: Shard> {
    round: Round,
    /// The timers the call was given.
    calling: Arc<Vec<FiredTimer>>,
    /// The instance, unless the call left it unusable or none could be created.
    instance: Option<Instance<S>>,
    called: Called,
}

/// An `on-timers` call with all it needs owned, so that it runs beside the worker's record
/// batches as their attempts do ([`super::attempt::attempt`]).
struct TimerCall<S: Shard> {
    timers: Arc<Vec<FiredTimer>>,
    shard: Arc<S>,
    operator: Arc<Operator<S>>,
    source: Arc<str>,
    stats: Arc<PipelineStats>,
    /// The call's time: the shard's applied watermark, and the clock.
    watermark: Option<i64>,
    now_ms: i64,
    deadline: Duration,
    emit_record_bytes_max: u64,
    /// Longest wait for the prefetch.
    io_max: Duration,
}

impl<S: Shard> TimerCall<S> {
    /// Prefetches the timers' keys' declared value states (as for a batch of records), stages
    /// every fired timer's entries as removed and calls `on-timers` on `instance` (or a new
    /// one). Returns the instance unless the call left it unusable or none could be created.
    async fn run(self, instance: Option<Instance<S>>) -> (Option<Instance<S>>, Called) {
        let mut batch = BatchCtx::for_timers(self.timers.clone());
        batch.set_emit_record_bytes_max(self.emit_record_bytes_max);
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
                    shard: self.source.to_string(),
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
                        shard: self.source.to_string(),
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
pub(super) enum Called {
    /// Dispositions and staged effects.
    Done(Vec<Disposition>, BatchCtx),
    /// The guest failed (trap, deadline, wrong disposition count).
    Fault(CallError),
    /// The state backend failed.
    Outage(StateError),
}

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// With nothing in flight: loads the shard's timers and saved watermark once, applies the
    /// watermark the finished records allow (saving it when it moved), and fires one round of
    /// due timers. A state outage backs off (records go on meanwhile); a corrupt state ends
    /// the worker.
    /// With nothing in flight: prepares one round of due timers ([`Self::due_round`]) and
    /// starts its call in `running`, beside the record batches to come. The round's keys are
    /// held in the execution controller until it ends, so that a key's later records wait
    /// behind its timer (as FLIP-425's per-key order), while other keys' records run. A state
    /// outage backs off (records go on meanwhile); a corrupt state ends the worker.
    pub(super) async fn timer_round(
        &mut self,
        running: &mut Running<S>,
    ) -> Result<(), WorkerError> {
        match self.due_round().await {
            Ok(None) => self.round_ended(Ok(())),
            Ok(Some((timers, now_ms))) => {
                self.start_round(timers, now_ms, running);
                Ok(())
            }
            Err(err) => self.round_ended(Err(err)),
        }
    }

    /// A round's preparation or call ended: a success ends any backoff; an outage starts or
    /// lengthens one; a corrupt state ends the worker.
    fn round_ended(&mut self, result: Result<(), StateError>) -> Result<(), WorkerError> {
        match result {
            Ok(()) => {
                self.timers.retry_at = None;
                self.timers.backoff = Duration::ZERO;
                Ok(())
            }
            Err(err) if err.kind() == crate::error::ErrorKind::Corrupt => Err(self.corrupt(err)),
            Err(err) => {
                self.timers.backed_off();
                tracing::warn!(partition = self.partition, error = %err, retry_in = ?self.timers.backoff, "state backend unavailable; timers wait");
                // Counted as a record's retry is, once timers run (not for their first load,
                // which records do not wait for while it backs off).
                if self.timers.loaded {
                    self.stats.outage_retries.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
        }
    }

    /// With nothing in flight: loads the shard's timers and saved watermark once, applies
    /// (and saves) the watermark the finished records allow, and picks the next round's due
    /// timers, in firing order, at most one per key. `None` when none is due.
    async fn due_round(&mut self) -> Result<Option<(Vec<FiredTimer>, i64)>, StateError> {
        // Reads that hang must not hold the worker (nothing else runs meanwhile): bounded as
        // a call's state reads are, and an outage when they take longer.
        let io_max = self.settings.call_io_allowance;
        let hung = |what: &str| StateError::Unavailable {
            shard: self.source.to_string(),
            source: format!("{what} still waiting after {io_max:?}").into(),
        };
        if !self.timers.loaded {
            let saved = match tokio::time::timeout(io_max, self.shard.get(&WATERMARK_KEY)).await {
                Ok(Ok(saved)) => {
                    saved.and_then(|v| Some(i64::from_be_bytes(v.as_ref().try_into().ok()?)))
                }
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(hung("reading the saved watermark")),
            };
            let count = match tokio::time::timeout(io_max, self.shard.get(&TIMER_COUNT_KEY)).await {
                Ok(Ok(count)) => {
                    count.and_then(|v| Some(i64::from_be_bytes(v.as_ref().try_into().ok()?)))
                }
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(hung("reading the timer count")),
            };
            let mut head = TimerHead::default();
            match tokio::time::timeout(io_max, head.load(&*self.shard)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(hung("loading the timers")),
            }
            // The count as of the checkpoint the shard opened from; what records applied
            // since then is in `added`. A shard from before the count was kept is counted
            // once, with nothing in flight: the store holds every applied write.
            let base = match count {
                Some(count) => count,
                None => match count_timers(&*self.shard, self.source.to_string(), io_max).await {
                    Ok(count) => i64::try_from(count).unwrap_or(i64::MAX) - self.timers.added,
                    Err(err) => return Err(err),
                },
            };
            // Loaded with nothing in flight: timers that records set or cleared while an
            // outage delayed this are in the store the scan read.
            self.timers.head = head;
            self.timers.watermarks.restore(saved);
            self.timers.saved = saved;
            self.timers.base = Some(base);
            self.timers.saved_count = count;
            self.timers.loaded = true;
        }
        match tokio::time::timeout(io_max, self.timers.head.load(&*self.shard)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(err),
            Err(_) => return Err(hung("loading the next timers")),
        }
        self.save_time().await?;
        let batch_max = self.settings.timer_batch_max;
        let now = self.timers.now_ms();
        let mut due = self
            .timers
            .head
            .due(TimeDomain::ProcessingTime, now, batch_max);
        let event = match self.timers.watermarks.applied() {
            Some(watermark) => self
                .timers
                .head
                .due(TimeDomain::EventTime, watermark, batch_max),
            None => Vec::new(),
        };
        // Both domains share a round half and half when both have a backlog, so that neither
        // starves the other; either takes the room the other leaves.
        let processing = due.len().min(
            batch_max
                .div_ceil(2)
                .max(batch_max.saturating_sub(event.len())),
        );
        due.truncate(processing);
        due.extend(event.into_iter().take(batch_max - processing));
        // At most one timer per key in a round: a timer may clear or move another of its key,
        // so the next of a key fires in the next round, from the head as that left it (never
        // a timer its key's earlier timer cleared or moved).
        let mut keys = std::collections::HashSet::with_capacity(due.len());
        due.retain(|t| keys.insert(t.key.clone()));
        if due.is_empty() {
            return Ok(None);
        }
        Ok(Some((due.into_iter().map(fired).collect(), now)))
    }

    /// Starts a round over `timers` in `running`: they leave the head while they fire (they
    /// are settled or retried, never given back) and their keys are held in the controller
    /// until the round ends ([`Self::timers_called`]).
    fn start_round(&mut self, timers: Vec<FiredTimer>, now_ms: i64, running: &mut Running<S>) {
        for t in &timers {
            let index = keys::time_index(t.domain, t.time_ms, &t.key, &t.name);
            self.timers.head.take(t.domain, &index);
        }
        // Distinct: a round has at most one timer per key.
        let held: Vec<u64> = timers.iter().map(|t| key_hash(&t.key)).collect();
        self.execution.controller.hold(&held);
        let round = Round {
            timers: Arc::new(timers),
            next: 0,
            one_by_one: false,
            held,
            now_ms,
            delay: Duration::ZERO,
            backoff: self.settings.outage_backoff_min,
        };
        self.call_round(round, running);
    }

    /// Starts the next call of a round that goes on ([`Self::timers_called`] left it in
    /// `Timers::going_on`), if there is one: called at the top of the worker's loop, before
    /// anything looks at what runs.
    pub(super) fn continue_round(&mut self, running: &mut Running<S>) {
        if let Some(round) = self.timers.going_on.take() {
            self.call_round(round, running);
        }
    }

    /// Pushes the round's next call (after its delay) into `running`.
    fn call_round(&mut self, round: Round, running: &mut Running<S>) {
        let calling = round.calling();
        let instance = self.take_instance();
        let call = self.timer_call(calling.clone(), round.now_ms);
        running.push(Box::pin(async move {
            if !round.delay.is_zero() {
                tokio::time::sleep(round.delay).await;
            }
            let (instance, called) = call.run(instance).await;
            Ended::Timers(TimersCalled {
                round,
                calling,
                instance,
                called,
            })
        }));
    }

    /// A call of a round ended ([`Self::start_round`]): its effects are applied, or its
    /// timers dead-lettered, and the round ends — its keys' records may run — once every timer
    /// is settled; until then it goes on (`Timers::going_on`, started again at the top of the
    /// worker's loop): one timer at a time after a trap or a rejection with effects, the same
    /// call again after a backoff on an outage. Nothing of it is ever called inline: record
    /// calls beside it are left unpolled meanwhile, and their wall-clock caps would run out.
    pub(super) async fn timers_called(
        &mut self,
        ended: TimersCalled<S>,
    ) -> Result<(), WorkerError> {
        let TimersCalled {
            mut round,
            calling,
            instance,
            called,
        } = ended;
        self.give_back_instance(instance);
        round.delay = Duration::ZERO;
        let now = round.now_ms;
        let settled = match called {
            Called::Outage(err) => Err(err),
            Called::Done(dispositions, batch)
                if !round.one_by_one
                    && !dispositions
                        .iter()
                        .enumerate()
                        .any(|(i, d)| matches!(d, Disposition::Reject(_)) && batch.touched(i)) =>
            {
                // One write: on an outage nothing of the call was applied.
                let settled = self
                    .settle_timers(&calling, &dispositions, batch, now)
                    .await?;
                settled.map(|()| round.next = round.timers.len())
            }
            // A rejection with effects, or a fault: one timer at a time.
            Called::Done(..) | Called::Fault(_) if !round.one_by_one => {
                round.one_by_one = true;
                self.timers.going_on = Some(round);
                return Ok(());
            }
            // One timer alone, rejected with effects: those are discarded, it is
            // dead-lettered.
            Called::Done(dispositions, batch)
                if batch.touched(0)
                    && matches!(dispositions.first(), Some(Disposition::Reject(_))) =>
            {
                let reason = match dispositions.into_iter().next() {
                    Some(Disposition::Reject(reason)) => reason,
                    _ => String::new(),
                };
                let settled = self
                    .timer_failed(&calling[0], DeadLetterKind::Rejected, &reason, now)
                    .await?;
                settled.map(|()| round.next += 1)
            }
            Called::Done(dispositions, batch) => {
                let settled = self
                    .settle_timers(&calling, &dispositions, batch, now)
                    .await?;
                settled.map(|()| round.next += 1)
            }
            Called::Fault(fault) => {
                let kind = match fault {
                    CallError::Trap { deadline: true, .. } => DeadLetterKind::Deadline,
                    _ => DeadLetterKind::Trapped,
                };
                let settled = self
                    .timer_failed(&calling[0], kind, &fault.to_string(), now)
                    .await?;
                settled.map(|()| round.next += 1)
            }
        };
        match settled {
            Ok(()) if round.next < round.timers.len() => {
                round.backoff = self.settings.outage_backoff_min;
                self.timers.going_on = Some(round);
                Ok(())
            }
            Ok(()) => {
                self.execution.controller.finish(&round.held, 0);
                self.round_ended(Ok(()))
            }
            Err(err) if err.kind() == crate::error::ErrorKind::Corrupt => Err(self.corrupt(err)),
            Err(err) => {
                // Its keys stay held and its timers taken: the same call after a backoff.
                tracing::warn!(partition = self.partition, error = %err, retry_in = ?round.backoff, "state backend unavailable; timers wait");
                self.stats.outage_retries.fetch_add(1, Ordering::Relaxed);
                round.delay = round.backoff;
                round.backoff = (round.backoff * 2).min(ROUND_BACKOFF_MAX);
                self.timers.going_on = Some(round);
                Ok(())
            }
        }
    }

    /// Writes the applied watermark to the shard when it moved, and the count of pending
    /// timers when it changed, so that a checkpoint keeps them (called before each checkpoint
    /// and each round, with nothing in flight: the count is then the store's).
    ///
    /// The new watermark is applied only once written: a watermark operators saw (or that
    /// decided lateness) is always one the next checkpoint holds, so none goes back after a
    /// restart.
    ///
    /// # Errors
    /// [`StateError`] from the write: nothing was saved, and a checkpoint must not be taken
    /// (it would keep a count its timers do not match).
    pub(super) async fn save_time(&mut self) -> Result<(), StateError> {
        if !self.timers.enabled {
            return Ok(());
        }
        if !self.timers.loaded {
            // Records set or cleared timers before the count was read (an outage delayed the
            // load): a checkpoint must not keep the count it opened with. Without one, the
            // next load counts the timers by a scan.
            if self.timers.added != 0 && !self.timers.count_dropped {
                self.shard
                    .apply(vec![StateWrite {
                        key: TIMER_COUNT_KEY.to_vec(),
                        value: None,
                        expires_at_ms: None,
                    }])
                    .await?;
                self.timers.count_dropped = true;
                self.dirty = true;
            }
            return Ok(());
        }
        let now = self.timers.now_ms();
        let watermark = self.timers.watermarks.candidate(now);
        let count = self
            .timers
            .pending()
            .map(|c| i64::try_from(c).unwrap_or(i64::MAX));
        let mut writes = Vec::new();
        if let Some(watermark) = watermark.filter(|&w| self.timers.saved != Some(w)) {
            writes.push(StateWrite {
                key: WATERMARK_KEY.to_vec(),
                value: Some(Bytes::copy_from_slice(&watermark.to_be_bytes())),
                expires_at_ms: None,
            });
        }
        if let Some(count) = count.filter(|&c| self.timers.saved_count != Some(c)) {
            writes.push(StateWrite {
                key: TIMER_COUNT_KEY.to_vec(),
                value: Some(Bytes::copy_from_slice(&count.to_be_bytes())),
                expires_at_ms: None,
            });
        }
        if !writes.is_empty() {
            self.shard.apply(writes).await?;
            self.timers.saved = watermark.or(self.timers.saved);
            self.timers.saved_count = count;
            self.dirty = true;
        }
        if let Some(count) = count {
            self.stats
                .record_timers_pending(self.partition, u64::try_from(count).unwrap_or(0));
        }
        if let Some(watermark) = watermark {
            self.timers.watermarks.restore(Some(watermark));
            self.stats.record_watermark(self.partition, watermark, now);
        }
        Ok(())
    }

    /// What a call over `timers` needs, owned (see [`TimerCall::run`]).
    fn timer_call(&self, timers: Arc<Vec<FiredTimer>>, now_ms: i64) -> TimerCall<S> {
        TimerCall {
            deadline: batch_deadline(&self.settings, timers.len()),
            timers,
            shard: self.shard.clone(),
            operator: self.operator.clone(),
            source: self.source.clone(),
            stats: self.stats.clone(),
            watermark: self.timers.watermarks.applied(),
            now_ms,
            emit_record_bytes_max: self.sink.output_bytes_max(),
            io_max: self.settings.call_io_allowance,
        }
    }

    /// An idle instance, or `None` with one more counted live (the call creates it).
    fn take_instance(&mut self) -> Option<Instance<S>> {
        let instance = self.execution.idle.pop();
        if instance.is_none() {
            self.execution.live += 1;
        }
        instance
    }

    /// An instance back from a call: idle again, or gone (`None`: a failed call left it
    /// unusable, or none could be created).
    fn give_back_instance(&mut self, instance: Option<Instance<S>>) {
        match instance {
            Some(instance) => self.execution.idle.push(instance),
            None => self.execution.live -= 1,
        }
    }

    /// Applies a successful call over `timers`: every timer's removal, the effects (writes and
    /// emits), and dead letters for the rejected ones (whose effects, if any, the caller made
    /// sure are not in `batch`).
    async fn settle_timers(
        &mut self,
        timers: &[FiredTimer],
        dispositions: &[Disposition],
        batch: BatchCtx,
        now_ms: i64,
    ) -> Result<Result<(), StateError>, WorkerError> {
        fail::fail_point!("timers-before-apply", |_| crate::fail_points::crash(
            "timers-before-apply"
        ));
        // The fired timers' removals are staged by the host, not counted by the call.
        let added = batch.timers_added() - timers.len() as i64;
        let (writes, emits) = batch.into_effects();
        let follow: Vec<StateWrite> = writes
            .iter()
            .filter(|w| w.key.starts_with(&keys::TIME_INDEX))
            .cloned()
            .collect();
        if let Err(err) = self.shard.apply(writes).await {
            return Ok(Err(err));
        }
        self.timers.applied(&follow, added);
        self.dirty = true;
        for emit in &emits {
            let source = self
                .timers
                .source(self.partition, &timers[emit.record as usize], now_ms);
            if let Err(err) = self.sink.emit(emit, &source).await {
                return Err(self.sink_failed(err));
            }
        }
        self.stats
            .emitted
            .fetch_add(emits.len() as u64, Ordering::Relaxed);
        self.stats.metrics.records_out.increment(emits.len() as u64);
        for (timer, disposition) in timers.iter().zip(dispositions) {
            if let Disposition::Reject(reason) = disposition {
                let source = self.timers.source(self.partition, timer, now_ms);
                self.dead_letter(&source, DeadLetterKind::Rejected, reason)
                    .await?;
            }
        }
        self.stats.timers_fired(timers.len() as u64);
        fail::fail_point!("timers-after-emit", |_| crate::fail_points::crash(
            "timers-after-emit"
        ));
        Ok(Ok(()))
    }

    /// A timer rejected, or whose call failed, alone: its entries removed, nothing else of it
    /// applied, and it is dead-lettered — a rejection always, a failure as `failure_policy`
    /// says (or skipped, or the pipeline stops).
    async fn timer_failed(
        &mut self,
        timer: &FiredTimer,
        kind: DeadLetterKind,
        error: &str,
        now_ms: i64,
    ) -> Result<Result<(), StateError>, WorkerError> {
        let writes: Vec<StateWrite> = removals(timer)
            .into_iter()
            .map(|key| StateWrite {
                key,
                value: None,
                expires_at_ms: None,
            })
            .collect();
        if let Err(err) = self.shard.apply(writes.clone()).await {
            return Ok(Err(err));
        }
        self.timers.applied(&writes, -1);
        self.dirty = true;
        let source = self.timers.source(self.partition, timer, now_ms);
        self.stats.timers_fired(1);
        if kind == DeadLetterKind::Rejected {
            self.dead_letter(&source, kind, error).await?;
        } else {
            self.failed_alone(&source, kind, error).await?;
        }
        Ok(Ok(()))
    }
}
