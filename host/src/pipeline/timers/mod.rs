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

mod round;

use crate::clock::SharedClock;
use crate::ids::Partition;
use crate::pipeline::policy::{CLOCK_LOOK_MAX, ROUND_BACKOFF_MAX, ROUND_BACKOFF_MIN};
use crate::runtime::{FiredTimer, Header, InputRecord, TimeDomain};
use crate::state::{Shard, StateError, StateWrite};
use crate::time::head::TimerHead;
use crate::time::keys::{self, StoredTimer, TIMER_COUNT_KEY, WATERMARK_KEY};
use crate::time::watermark::{Idleness, Watermarks};
use bytes::Bytes;
pub(in crate::pipeline) use round::{Called, Round, TimerCall, TimersCalled, removals};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A partition's view of its shard's time. See the module docs.
#[derive(Debug)]
pub(crate) struct Timers {
    head: TimerHead,
    watermarks: Watermarks,
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
    /// [`Timers::save`]).
    count_dropped: bool,
    /// No round before this (after an outage), and the next backoff.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// The topic a timer's outputs and dead letters name as their source.
    topic: Arc<str>,
    /// Whether the operator can have timers (a 0.1 component cannot): when not, nothing here
    /// reads or writes the shard.
    enabled: bool,
    /// A round whose next call is to start ([`Timers::go_on`]).
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

    /// The time through which every event-time timer has fired (ms since the epoch): the
    /// applied watermark, or just before the earliest timer still pending at or below it (a
    /// round that goes on). `None` while the timers are not loaded or no watermark applies.
    pub fn fired_through(&self) -> Option<i64> {
        // A head that must be loaded again cannot say which timer is next.
        if !self.enabled || !self.loaded || self.head.needs_load() {
            return None;
        }
        let applied = self.watermarks.applied()?;
        match self.head.next(TimeDomain::EventTime) {
            Some(next) if next <= applied => Some(next - 1),
            _ => Some(applied),
        }
    }

    /// The watermark a marker may carry downstream (docs/topologies.md): every emit at or
    /// before it has been made — [`Self::fired_through`] for an operator with timers (a round
    /// that goes on has not emitted for its later timers yet), the applied watermark for one
    /// without. `None` while neither can say.
    pub fn emitted_through(&self) -> Option<i64> {
        if self.enabled {
            self.fired_through()
        } else {
            self.watermarks.applied()
        }
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

    /// The source record a fired timer's emits and dead letter name: its key, no value, the
    /// time it fired at as timestamp (event time: its own time; processing time: the clock at
    /// the call), no offset, and the timer in `weir.timer.*` headers.
    pub(in crate::pipeline) fn source(
        &self,
        partition: Partition,
        timer: &FiredTimer,
        now_ms: i64,
    ) -> InputRecord {
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
            partition: partition.0,
            offset: -1,
            input: 0,
        }
    }
}

fn header(name: &str, value: Vec<u8>) -> Header {
    Header {
        name: name.to_owned(),
        value,
    }
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

/// What [`Timers::save`] did: whether it wrote to the shard (the next checkpoint has
/// something to keep), the count of pending timers and the watermark it saved (with the clock's
/// time then, ms), for the pipeline's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::pipeline) struct Saved {
    pub wrote: bool,
    pub count: Option<i64>,
    pub watermark: Option<(i64, i64)>,
}

impl Timers {
    /// The watermarks of the shard's inputs.
    pub(in crate::pipeline) fn watermarks(&self) -> &Watermarks {
        &self.watermarks
    }

    /// See [`Self::watermarks`]: records seen and idleness move them.
    pub(in crate::pipeline) fn watermarks_mut(&mut self) -> &mut Watermarks {
        &mut self.watermarks
    }

    /// Whether the shard's timers, count and saved watermark were read.
    pub(in crate::pipeline) fn loaded(&self) -> bool {
        self.loaded
    }

    /// A round prepared or called without a state error: any backoff ends.
    pub(in crate::pipeline) fn round_succeeded(&mut self) {
        self.retry_at = None;
        self.backoff = Duration::ZERO;
    }

    /// A round's preparation met a state outage: no round before a backoff (doubled each
    /// time, within the policy's bounds), which it returns.
    pub(in crate::pipeline) fn round_failed(&mut self) -> Duration {
        self.backoff = (self.backoff * 2).clamp(ROUND_BACKOFF_MIN, ROUND_BACKOFF_MAX);
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff
    }

    /// Takes `timers` out of the head while they fire (they are settled or retried, never
    /// given back).
    pub(in crate::pipeline) fn take(&mut self, timers: &[FiredTimer]) {
        for t in timers {
            let index = keys::time_index(t.domain, t.time_ms, &t.key, &t.name);
            self.head.take(t.domain, &index);
        }
    }

    /// Keeps `round`, whose next call is to start at the top of the worker's loop.
    pub(in crate::pipeline) fn go_on(&mut self, round: Round) {
        self.going_on = Some(round);
    }

    /// The round kept by [`Self::go_on`], if any.
    pub(in crate::pipeline) fn going_on(&mut self) -> Option<Round> {
        self.going_on.take()
    }

    /// With nothing in flight: reads the shard's timers, count and saved watermark once, and
    /// the head of the next timers when it must be read again. Each read is bounded by
    /// `io_max` (`source` names the shard in errors): reads that hang must not hold the
    /// worker, nothing else runs meanwhile.
    ///
    /// # Errors
    /// [`StateError`] from a read, or [`StateError::Unavailable`] when one takes longer than
    /// `io_max`: what was loaded before stays, the rest is read next time.
    pub(in crate::pipeline) async fn load<S: Shard>(
        &mut self,
        shard: &S,
        io_max: Duration,
        source: &str,
    ) -> Result<(), StateError> {
        let hung = |what: &str| StateError::Unavailable {
            shard: source.to_owned(),
            source: format!("{what} still waiting after {io_max:?}").into(),
        };
        if !self.loaded {
            let saved = match tokio::time::timeout(io_max, shard.get(&WATERMARK_KEY)).await {
                Ok(Ok(saved)) => {
                    saved.and_then(|v| Some(i64::from_be_bytes(v.as_ref().try_into().ok()?)))
                }
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(hung("reading the saved watermark")),
            };
            let count = match tokio::time::timeout(io_max, shard.get(&TIMER_COUNT_KEY)).await {
                Ok(Ok(count)) => {
                    count.and_then(|v| Some(i64::from_be_bytes(v.as_ref().try_into().ok()?)))
                }
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(hung("reading the timer count")),
            };
            let mut head = TimerHead::default();
            match tokio::time::timeout(io_max, head.load(shard)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(hung("loading the timers")),
            }
            // The count as of the checkpoint the shard opened from; what records applied
            // since then is in `added`. A shard from before the count was kept is counted
            // once, with nothing in flight: the store holds every applied write.
            let base = match count {
                Some(count) => count,
                None => {
                    let counted = count_timers(shard, source.to_owned(), io_max).await?;
                    i64::try_from(counted).unwrap_or(i64::MAX) - self.added
                }
            };
            // Loaded with nothing in flight: timers that records set or cleared while an
            // outage delayed this are in the store the scan read.
            self.head = head;
            self.watermarks.restore(saved);
            self.saved = saved;
            self.base = Some(base);
            self.saved_count = count;
            self.loaded = true;
        }
        match tokio::time::timeout(io_max, self.head.load(shard)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(hung("loading the next timers")),
        }
    }

    /// The next round's due timers, in firing order, at most one per key and at most
    /// `batch_max`, with the clock's time (ms); `None` when none is due. Call after
    /// [`Self::load`] and [`Self::save`], which applies the watermark the records allow.
    pub(in crate::pipeline) fn next_round(
        &self,
        batch_max: usize,
    ) -> Option<(Vec<FiredTimer>, i64)> {
        let now = self.now_ms();
        let mut due = self.head.due(TimeDomain::ProcessingTime, now, batch_max);
        let event = match self.watermarks.applied() {
            Some(watermark) => self.head.due(TimeDomain::EventTime, watermark, batch_max),
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
            return None;
        }
        Some((due.into_iter().map(fired).collect(), now))
    }

    /// Writes the applied watermark to `shard` when it moved, and the count of pending
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
    pub(in crate::pipeline) async fn save<S: Shard>(
        &mut self,
        shard: &S,
    ) -> Result<Saved, StateError> {
        if !self.enabled {
            return Ok(Saved::default());
        }
        if !self.loaded {
            // Records set or cleared timers before the count was read (an outage delayed the
            // load): a checkpoint must not keep the count it opened with. Without one, the
            // next load counts the timers by a scan.
            if self.added == 0 || self.count_dropped {
                return Ok(Saved::default());
            }
            shard
                .apply(vec![StateWrite {
                    key: TIMER_COUNT_KEY.to_vec(),
                    value: None,
                    expires_at_ms: None,
                }])
                .await?;
            self.count_dropped = true;
            return Ok(Saved {
                wrote: true,
                ..Saved::default()
            });
        }
        let now = self.now_ms();
        let watermark = self.watermarks.candidate(now);
        let count = self.pending().map(|c| i64::try_from(c).unwrap_or(i64::MAX));
        let mut writes = Vec::new();
        if let Some(watermark) = watermark.filter(|&w| self.saved != Some(w)) {
            writes.push(StateWrite {
                key: WATERMARK_KEY.to_vec(),
                value: Some(Bytes::copy_from_slice(&watermark.to_be_bytes())),
                expires_at_ms: None,
            });
        }
        if let Some(count) = count.filter(|&c| self.saved_count != Some(c)) {
            writes.push(StateWrite {
                key: TIMER_COUNT_KEY.to_vec(),
                value: Some(Bytes::copy_from_slice(&count.to_be_bytes())),
                expires_at_ms: None,
            });
        }
        let wrote = !writes.is_empty();
        if wrote {
            shard.apply(writes).await?;
            self.saved = watermark.or(self.saved);
            self.saved_count = count;
        }
        if let Some(watermark) = watermark {
            self.watermarks.restore(Some(watermark));
        }
        Ok(Saved {
            wrote,
            count,
            watermark: watermark.map(|w| (w, now)),
        })
    }
}
