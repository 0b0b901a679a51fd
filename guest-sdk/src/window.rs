//! Event-time windows built on map state and timers: [`TumblingWindows`], [`HoppingWindows`]
//! and [`SessionWindows`], each with an allowed lateness (as Flink's window operator with
//! `allowedLateness` and its default event-time trigger).
//!
//! A window helper is a named map state of the current key, from window start to the window's
//! accumulator, plus one event-time timer per open window. The operator turns each record into
//! an accumulator of one record (an [`Aggregate`]) and calls `add` with the record's timestamp;
//! from [`Operator::on_timer`](crate::Operator::on_timer) it calls `on_timer`, which returns the
//! window that closed. Emitting is up to the operator:
//!
//! - **Final result.** A window `[start, end)` closes when the watermark reaches `end - 1`: its
//!   timer fires and `on_timer` returns its accumulator once.
//! - **Late updates.** With an allowed lateness `L`, a closed window is kept until the watermark
//!   reaches `end - 1 + L`; a record for it until then (one the host delivers although it is late:
//!   `late_records = "process"`) is merged in and `add` returns the window's new result at once,
//!   flagged [`WindowResult::update`].
//! - **Dropped.** Once the watermark reaches `end - 1 + L` the window's state is gone, and a
//!   record for it is not added: `add` counts it in [`Added::dropped`].
//! - **Refused timers.** When the operator's `on_timer` rejects (or traps) on a window's timer,
//!   the host dead-letters the timer and discards the call's effects, the window's removal
//!   included. The window, left without a timer, is removed by the key's next record that opens
//!   a window (or, for sessions, any next record) once it is past its allowed lateness.
//! - **Timers.** Each open window, and each closed one kept for its lateness, holds one timer of
//!   its key: a key can have at most the host's `runtime.timers_per_key_max` (1,024 by default)
//!   of them, and a record that would open one more is rejected. Mind it with hopping windows
//!   (`size / slide` windows per record) and long lateness.
//!
//! Sessions: a record at `t` opens the window `[t, t + gap)`; windows that overlap merge, so a
//! session is a run of records whose consecutive timestamps are *less than* `gap` apart (Flink
//! also merges windows that only touch, i.e. records exactly `gap` apart).
//!
//! **Stored bytes** are shared with the Python SDK's `weir.windows` (frozen by the vectors in
//! `guest-sdk/testdata/windows.json`), so `weir pipeline switch` between a Rust and a Python
//! version of an operator keeps its open windows: the map key is the window start as a JSON
//! integer, the value `{"end":E,"fired":B,"acc":A}` with `A` the accumulator's JSON (give its
//! Rust fields the order of the Python dict's keys), and the timer of the window starting at `S`
//! is named `NAME:S` after the state. `fired` says a result of the window was emitted before.

use crate::context::{Context, TimeDomain, Timer};
use crate::operator::Reject;
use crate::state::{MapState, StateSpec};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A window's accumulator: what a window keeps of its records (as Flink's `AggregateFunction`
/// accumulators, with the add step done by the operator: an accumulator of one record).
pub trait Aggregate: Serialize + DeserializeOwned + Clone {
    /// Folds `other` into `self`. The helpers call it as `earlier.merge(later)` in start order
    /// when sessions merge, and with the record's accumulator last; make it associative (and
    /// commutative, for results that do not depend on arrival order).
    fn merge(&mut self, other: Self);
}

/// A window of event time: `[start_ms, end_ms)`, ms since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    /// First ms in the window.
    pub start_ms: i64,
    /// First ms after the window.
    pub end_ms: i64,
}

impl Window {
    /// The last ms in the window, `end_ms - 1`: the window closes when the watermark reaches it.
    pub fn max_timestamp(&self) -> i64 {
        self.end_ms - 1
    }
}

/// A window's result: its accumulator when it closed, or after a late record.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowResult<A> {
    /// The window.
    pub window: Window,
    /// Its accumulator.
    pub acc: A,
    /// Whether a result of this window (or, for sessions, of a session merged into it) was
    /// emitted before: this one supersedes it.
    pub update: bool,
}

/// What `add` did with a record.
#[derive(Debug, Clone, PartialEq)]
pub struct Added<A> {
    /// Results of closed windows the record was merged into (late updates), to emit now.
    pub updates: Vec<WindowResult<A>>,
    /// How many of the record's windows were past their allowed lateness: the record was not
    /// added to them.
    pub dropped: u32,
}

impl<A> Default for Added<A> {
    fn default() -> Self {
        Self {
            updates: Vec::new(),
            dropped: 0,
        }
    }
}

/// One window's stored state; its JSON is shared with the Python SDK.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "A: Aggregate")]
struct Entry<A> {
    end: i64,
    fired: bool,
    acc: A,
}

/// What the three helpers share: the map state, the lateness and the timers.
#[derive(Debug)]
struct Windows<A> {
    state: MapState<i64, Entry<A>>,
    allowed_lateness_ms: i64,
}

impl<A: Aggregate> Windows<A> {
    const fn new(name: &'static str) -> Self {
        Self {
            state: MapState::new(name),
            allowed_lateness_ms: 0,
        }
    }

    fn timer_name(&self, start: i64) -> String {
        format!("{}:{start}", self.state.name())
    }

    /// Whether `window` is past its allowed lateness (as Flink's `isWindowLate`).
    fn is_late(&self, window: Window, watermark: Option<i64>) -> bool {
        watermark.is_some_and(|w| self.cleanup(window) <= w)
    }

    /// When `window`'s allowed lateness ends: `end - 1 + L` (saturating, so that a lateness of
    /// `i64::MAX` keeps windows for ever rather than wrapping).
    fn cleanup(&self, window: Window) -> i64 {
        window
            .max_timestamp()
            .saturating_add(self.allowed_lateness_ms)
    }

    /// Stores `entry` as the window starting at `start` and points its timer where it must be:
    /// at the window's end if it is still open, else (it is already due: a late record) at the
    /// end of its lateness, after pushing its result to `added`. `timer_at` is where the
    /// window's timer is now, when known.
    fn settle(
        &self,
        ctx: &mut Context,
        start: i64,
        mut entry: Entry<A>,
        timer_at: Option<i64>,
        watermark: Option<i64>,
        added: &mut Added<A>,
    ) -> Result<(), Reject> {
        let window = Window {
            start_ms: start,
            end_ms: entry.end,
        };
        let at = if watermark.is_some_and(|w| window.max_timestamp() <= w) {
            added.updates.push(WindowResult {
                window,
                acc: entry.acc.clone(),
                update: entry.fired,
            });
            entry.fired = true;
            self.cleanup(window)
        } else {
            window.max_timestamp()
        };
        if timer_at != Some(at) {
            ctx.set_timer(&self.timer_name(start), at, TimeDomain::EventTime)?;
        }
        ctx.map_put(&self.state, &start, &entry)
    }

    /// Whether the key's window starting at `start` (of `entry`) was left behind: past its
    /// allowed lateness with no timer. That happens only when an `on_timer` call that closed or
    /// ended it was rejected (the host dead-lettered the timer and discarded the call's
    /// removal of the window); a window past its lateness whose timer is still pending (due,
    /// not fired yet) is not.
    fn is_orphan(
        &self,
        ctx: &mut Context,
        start: i64,
        end: i64,
        watermark: Option<i64>,
    ) -> Result<bool, Reject> {
        let window = Window {
            start_ms: start,
            end_ms: end,
        };
        Ok(self.is_late(window, watermark) && ctx.timer(&self.timer_name(start))?.is_none())
    }

    /// Removes the key's windows that were left behind ([`Self::is_orphan`]), so that a
    /// rejected `on_timer` leaks no state: called when a record opens a new window.
    fn remove_orphans(&self, ctx: &mut Context, watermark: Option<i64>) -> Result<(), Reject> {
        if watermark.is_none() {
            return Ok(());
        }
        let entries: Vec<(i64, Entry<A>)> = ctx.map_entries(&self.state)?;
        for (start, entry) in entries {
            if self.is_orphan(ctx, start, entry.end, watermark)? {
                ctx.map_remove(&self.state, &start)?;
            }
        }
        Ok(())
    }

    /// Adds `acc` to each of `windows` (fixed windows: they never merge).
    fn add_fixed(
        &self,
        ctx: &mut Context,
        windows: impl Iterator<Item = Window>,
        acc: A,
    ) -> Result<Added<A>, Reject> {
        let watermark = ctx.watermark();
        let mut added = Added::default();
        let mut swept = false;
        for window in windows {
            if self.is_late(window, watermark) {
                added.dropped += 1;
                continue;
            }
            let (entry, timer_at) = match ctx.map_get(&self.state, &window.start_ms)? {
                Some(mut entry) => {
                    entry.acc.merge(acc.clone());
                    let at = if entry.fired {
                        self.cleanup(window)
                    } else {
                        window.max_timestamp()
                    };
                    (entry, Some(at))
                }
                None => {
                    if !swept {
                        self.remove_orphans(ctx, watermark)?;
                        swept = true;
                    }
                    (
                        Entry {
                            end: window.end_ms,
                            fired: false,
                            acc: acc.clone(),
                        },
                        None,
                    )
                }
            };
            self.settle(ctx, window.start_ms, entry, timer_at, watermark, &mut added)?;
        }
        Ok(added)
    }

    /// Adds `acc` at `timestamp` to the key's sessions, merging those it bridges.
    fn add_session(
        &self,
        ctx: &mut Context,
        timestamp: i64,
        gap: i64,
        acc: A,
    ) -> Result<Added<A>, Reject> {
        let watermark = ctx.watermark();
        let mut added = Added::default();
        let own = Window {
            start_ms: timestamp,
            end_ms: timestamp.saturating_add(gap),
        };
        let mut sessions = ctx.map_entries(&self.state)?;
        sessions.sort_by_key(|(start, _)| *start);
        let mut start = own.start_ms;
        let mut merged: Option<Entry<A>> = None;
        let mut absorbed = Vec::new();
        for (s, entry) in sessions {
            if !(s < own.end_ms && own.start_ms < entry.end) {
                // A session left behind by a rejected `on_timer` goes now (one it would merge
                // with has its timer set again below).
                if self.is_orphan(ctx, s, entry.end, watermark)? {
                    ctx.map_remove(&self.state, &s)?;
                }
                continue;
            }
            start = start.min(s);
            merged = Some(match merged {
                None => entry,
                Some(mut m) => {
                    m.end = m.end.max(entry.end);
                    m.fired |= entry.fired;
                    m.acc.merge(entry.acc);
                    m
                }
            });
            absorbed.push(s);
        }
        let entry = match merged {
            None => Entry {
                end: own.end_ms,
                fired: false,
                acc,
            },
            Some(mut m) => {
                m.end = m.end.max(own.end_ms);
                m.acc.merge(acc);
                m
            }
        };
        let merged = Window {
            start_ms: start,
            end_ms: entry.end,
        };
        if self.is_late(merged, watermark) {
            // it joins no kept session (they all end after the watermark), and its own is late
            added.dropped = 1;
            return Ok(added);
        }
        for s in absorbed.into_iter().filter(|s| *s != start) {
            ctx.clear_timer(&self.timer_name(s))?;
            ctx.map_remove(&self.state, &s)?;
        }
        self.settle(ctx, start, entry, None, watermark, &mut added)?;
        Ok(added)
    }

    fn on_timer(
        &self,
        ctx: &mut Context,
        timer: &Timer,
    ) -> Result<Option<WindowResult<A>>, Reject> {
        if timer.domain != TimeDomain::EventTime {
            return Ok(None);
        }
        let Some(start) = timer
            .name
            .strip_prefix(self.state.name())
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|start| start.parse::<i64>().ok())
        else {
            return Ok(None);
        };
        let Some(mut entry) = ctx.map_get(&self.state, &start)? else {
            return Ok(None);
        };
        let window = Window {
            start_ms: start,
            end_ms: entry.end,
        };
        if entry.fired && timer.time_ms != window.max_timestamp() {
            // the end of its allowed lateness
            ctx.map_remove(&self.state, &start)?;
            return Ok(None);
        }
        let result = WindowResult {
            window,
            acc: entry.acc.clone(),
            update: entry.fired,
        };
        let cleanup = self.cleanup(window);
        if ctx.watermark().is_none_or(|w| cleanup <= w) {
            ctx.map_remove(&self.state, &start)?;
        } else {
            entry.fired = true;
            ctx.set_timer(&self.timer_name(start), cleanup, TimeDomain::EventTime)?;
            ctx.map_put(&self.state, &start, &entry)?;
        }
        Ok(Some(result))
    }
}

macro_rules! common_methods {
    () => {
        /// The same windows keeping closed ones for `ms` of event time, for late updates.
        ///
        /// # Panics
        /// When `ms` is negative.
        pub const fn with_allowed_lateness_ms(mut self, ms: i64) -> Self {
            assert!(ms >= 0, "allowed lateness is at least 0 ms");
            self.windows.allowed_lateness_ms = ms;
            self
        }

        /// The map state's declaration, to list in
        /// [`Operator::STATES`](crate::Operator::STATES).
        pub const fn spec(&self) -> StateSpec {
            self.windows.state.spec()
        }

        /// The map state's name.
        pub const fn name(&self) -> &'static str {
            self.windows.state.name()
        }

        /// Call from [`Operator::on_timer`](crate::Operator::on_timer): when `timer` is one of
        /// these windows' and closes a window, returns its result (emit it); `None` for a timer
        /// that is not theirs, or that only ends a window's allowed lateness.
        ///
        /// # Errors
        /// [`Reject`] when state or timers fail, or the stored window does not decode as `A`.
        pub fn on_timer(
            &self,
            ctx: &mut Context,
            timer: &Timer,
        ) -> Result<Option<WindowResult<A>>, Reject> {
            self.windows.on_timer(ctx, timer)
        }
    };
}

/// Fixed, non-overlapping windows of `size_ms`, aligned to the Unix epoch (as Flink's
/// `TumblingEventTimeWindows`): a record at `t` falls in `[t - t mod size, … + size)`.
#[derive(Debug)]
pub struct TumblingWindows<A> {
    windows: Windows<A>,
    size_ms: i64,
}

impl<A: Aggregate> TumblingWindows<A> {
    /// Windows of `size_ms` kept in the map state `name`, with no allowed lateness.
    ///
    /// # Panics
    /// When `size_ms` is not positive.
    pub const fn new(name: &'static str, size_ms: i64) -> Self {
        assert!(size_ms > 0, "a window lasts at least 1 ms");
        Self {
            windows: Windows::new(name),
            size_ms,
        }
    }

    common_methods!();

    /// The window a record at `timestamp_ms` falls in.
    pub fn window_of(&self, timestamp_ms: i64) -> Window {
        let start = timestamp_ms - timestamp_ms.rem_euclid(self.size_ms);
        Window {
            start_ms: start,
            end_ms: start + self.size_ms,
        }
    }

    /// Adds a record's accumulator `acc` to the window of `timestamp_ms` (the record's event
    /// time), or counts it dropped when that window is past its allowed lateness.
    ///
    /// # Errors
    /// [`Reject`] when state or timers fail (for example too many open windows for the host's
    /// timer limit), or the stored window does not decode as `A`.
    pub fn add(&self, ctx: &mut Context, timestamp_ms: i64, acc: A) -> Result<Added<A>, Reject> {
        self.windows
            .add_fixed(ctx, std::iter::once(self.window_of(timestamp_ms)), acc)
    }
}

/// Windows of `size_ms` starting every `slide_ms`, aligned to the Unix epoch (as Flink's
/// `SlidingEventTimeWindows`): a record falls in `size / slide` windows (rounded up).
#[derive(Debug)]
pub struct HoppingWindows<A> {
    windows: Windows<A>,
    size_ms: i64,
    slide_ms: i64,
}

impl<A: Aggregate> HoppingWindows<A> {
    /// Windows of `size_ms` every `slide_ms` kept in the map state `name`, with no allowed
    /// lateness.
    ///
    /// # Panics
    /// When `size_ms` or `slide_ms` is not positive.
    pub const fn new(name: &'static str, size_ms: i64, slide_ms: i64) -> Self {
        assert!(
            size_ms > 0 && slide_ms > 0,
            "windows and slides last at least 1 ms"
        );
        Self {
            windows: Windows::new(name),
            size_ms,
            slide_ms,
        }
    }

    common_methods!();

    /// The windows a record at `timestamp_ms` falls in, in start order.
    pub fn windows_of(&self, timestamp_ms: i64) -> impl Iterator<Item = Window> + use<A> {
        let last = timestamp_ms - timestamp_ms.rem_euclid(self.slide_ms);
        let (size, slide) = (self.size_ms, self.slide_ms);
        let count = (size + slide - 1) / slide;
        (0..count)
            .rev()
            .map(move |i| last - i * slide)
            .filter(move |start| timestamp_ms < start + size)
            .map(move |start| Window {
                start_ms: start,
                end_ms: start + size,
            })
    }

    /// Adds a record's accumulator `acc` to each window of `timestamp_ms`; windows past their
    /// allowed lateness are counted dropped.
    ///
    /// # Errors
    /// As [`TumblingWindows::add`].
    pub fn add(&self, ctx: &mut Context, timestamp_ms: i64, acc: A) -> Result<Added<A>, Reject> {
        self.windows
            .add_fixed(ctx, self.windows_of(timestamp_ms), acc)
    }
}

/// Sessions of each key: runs of records whose consecutive timestamps are less than `gap_ms`
/// apart (as Flink's `EventTimeSessionWindows`, but windows that only touch do not merge). A
/// session `[first, last + gap)` closes when the watermark reaches `last + gap - 1`.
#[derive(Debug)]
pub struct SessionWindows<A> {
    windows: Windows<A>,
    gap_ms: i64,
}

impl<A: Aggregate> SessionWindows<A> {
    /// Sessions with a gap of `gap_ms` kept in the map state `name`, with no allowed lateness.
    ///
    /// # Panics
    /// When `gap_ms` is not positive.
    pub const fn new(name: &'static str, gap_ms: i64) -> Self {
        assert!(gap_ms > 0, "a session gap lasts at least 1 ms");
        Self {
            windows: Windows::new(name),
            gap_ms,
        }
    }

    common_methods!();

    /// Adds a record's accumulator `acc` at `timestamp_ms` to the key's sessions: it opens
    /// `[t, t + gap)` and merges with every session that overlaps it (as Flink, lateness is
    /// judged on the merged session: a late record inside a session still kept joins it).
    /// Counted dropped when the merged session is past its allowed lateness.
    ///
    /// # Errors
    /// As [`TumblingWindows::add`].
    pub fn add(&self, ctx: &mut Context, timestamp_ms: i64, acc: A) -> Result<Added<A>, Reject> {
        self.windows
            .add_session(ctx, timestamp_ms, self.gap_ms, acc)
    }
}
