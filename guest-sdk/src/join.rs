//! Stream–stream joins of two inputs of a stage, built on map state and event-time timers:
//! [`WindowJoin`] (records of both sides in the same tumbling window, as Flink's window join
//! and Nexmark q8's persons and auctions) and [`IntervalJoin`] (a left record at `t` with the
//! right records in `[t + lower, t + upper]`, as Flink's interval join and Nexmark q4's bids
//! within an auction's lifetime).
//!
//! Both emit every join result as soon as the second of its two records arrives (as Kafka
//! Streams' `KStream#join`): the operator calls `left` or `right` with a record of that side
//! (tell them apart with [`Record::input`](crate::Record::input)), gets back the stored records
//! of the other side it joins, and emits what it makes of each pair. A record behind the
//! watermark — it could miss results already emitted — is not joined nor kept: the call says
//! it was dropped. From [`Operator::on_timer`](crate::Operator::on_timer) the operator calls
//! `on_timer`, which removes what can no longer join.
//!
//! **State size per key** (JSON of the records' values, as the operator's types serialize):
//! - window join: the records of both sides in the key's open windows — a window is removed
//!   once the watermark reaches its end − 1 — and one timer per open window;
//! - interval join: the left records of the last `upper` ms of event time behind the
//!   watermark and the right records of the last `−lower` ms (each kept until no record of the
//!   other side can still join it), and one timer per distinct timestamp of each side: a key
//!   can have at most the host's `runtime.timers_per_key_max` (1,024 by default) of them.
//!
//! **Stored bytes** are shared with the Python SDK's `weir.joins` (frozen by the vectors in
//! `guest-sdk/testdata/joins.json`): one map state; a window join keeps each side's records of
//! the window starting at `S` under the map key `[S,"l"]` or `[S,"r"]` as a JSON array of the
//! values in arrival order, with the timer `NAME:S`; an interval join keeps each side's records
//! at timestamp `T` under `[T,"l"]` or `[T,"r"]`, with the timers `NAME:l:T` and `NAME:r:T`.

use crate::context::{Context, TimeDomain, Timer};
use crate::operator::Reject;
use crate::state::{MapState, StateSpec};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A side of a join; stored as `"l"` or `"r"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Side {
    /// The left input.
    #[serde(rename = "l")]
    Left,
    /// The right input.
    #[serde(rename = "r")]
    Right,
}

impl Side {
    fn as_str(self) -> &'static str {
        match self {
            Side::Left => "l",
            Side::Right => "r",
        }
    }
}

/// What a join did with a record: the stored records of the other side it joins (emit a result
/// for each), or that it was dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined<T> {
    /// The other side's records it joins, in the order they were stored.
    pub matches: Vec<T>,
    /// The record was behind the watermark: neither joined nor kept.
    pub dropped: bool,
}

impl<T> Joined<T> {
    fn dropped() -> Self {
        Self {
            matches: Vec::new(),
            dropped: true,
        }
    }
}

/// The record's event time, or a rejection for a record without one (a join is in event time).
fn event_time(timestamp_ms: i64) -> Result<i64, Reject> {
    if timestamp_ms < 0 {
        return Err(Reject::new(
            "a join needs the record's event time; it has no timestamp",
        ));
    }
    Ok(timestamp_ms)
}

/// The one map state of a join, typed for each side's values (same name, same declaration).
#[derive(Debug)]
struct Sides<L, R> {
    left: MapState<(i64, Side), Vec<L>>,
    right: MapState<(i64, Side), Vec<R>>,
}

impl<L: Serialize + DeserializeOwned, R: Serialize + DeserializeOwned> Sides<L, R> {
    const fn new(name: &'static str) -> Self {
        Self {
            left: MapState::new(name),
            right: MapState::new(name),
        }
    }

    /// Appends `value` to `side`'s records under `at`; returns whether the entry was new.
    fn append<T: Serialize + DeserializeOwned + Clone>(
        ctx: &mut Context,
        state: &MapState<(i64, Side), Vec<T>>,
        key: (i64, Side),
        value: &T,
    ) -> Result<bool, Reject> {
        let stored = ctx.map_get(state, &key)?;
        let new = stored.is_none();
        let mut rows = stored.unwrap_or_default();
        rows.push(value.clone());
        ctx.map_put(state, &key, &rows)?;
        Ok(new)
    }
}

/// Records of both sides with the same key in the same tumbling window of `size_ms` (aligned
/// to the Unix epoch, as [`crate::window::TumblingWindows`]) join (module docs).
#[derive(Debug)]
pub struct WindowJoin<L, R> {
    sides: Sides<L, R>,
    size_ms: i64,
}

impl<L, R> WindowJoin<L, R>
where
    L: Serialize + DeserializeOwned + Clone,
    R: Serialize + DeserializeOwned + Clone,
{
    /// A join in windows of `size_ms`, kept in the map state `name`.
    ///
    /// # Panics
    /// When `size_ms` is not positive.
    pub const fn new(name: &'static str, size_ms: i64) -> Self {
        assert!(size_ms > 0, "a window lasts at least 1 ms");
        Self {
            sides: Sides::new(name),
            size_ms,
        }
    }

    /// The map state's declaration, to list in [`Operator::STATES`](crate::Operator::STATES).
    pub const fn spec(&self) -> StateSpec {
        self.sides.left.spec()
    }

    /// The start of the window a record at `timestamp_ms` falls in.
    pub fn window_start(&self, timestamp_ms: i64) -> i64 {
        timestamp_ms - timestamp_ms.rem_euclid(self.size_ms)
    }

    /// A left record with `value` at `timestamp_ms`: the right records of its window it joins.
    ///
    /// # Errors
    /// [`Reject`] for a record without a timestamp, or when state or timers fail.
    pub fn left(
        &self,
        ctx: &mut Context,
        value: &L,
        timestamp_ms: i64,
    ) -> Result<Joined<R>, Reject> {
        let mine = (&self.sides.left, Side::Left);
        self.add(
            ctx,
            value,
            timestamp_ms,
            mine,
            (&self.sides.right, Side::Right),
        )
    }

    /// A right record with `value` at `timestamp_ms`: the left records of its window it joins.
    ///
    /// # Errors
    /// As [`WindowJoin::left`].
    pub fn right(
        &self,
        ctx: &mut Context,
        value: &R,
        timestamp_ms: i64,
    ) -> Result<Joined<L>, Reject> {
        let mine = (&self.sides.right, Side::Right);
        self.add(
            ctx,
            value,
            timestamp_ms,
            mine,
            (&self.sides.left, Side::Left),
        )
    }

    /// A record of side `mine` with `value`: stored, and the records of side `theirs` in its
    /// window returned; its window's timer set with the window's first record.
    fn add<T, O>(
        &self,
        ctx: &mut Context,
        value: &T,
        timestamp_ms: i64,
        (mine, side): (&MapState<(i64, Side), Vec<T>>, Side),
        (theirs, other): (&MapState<(i64, Side), Vec<O>>, Side),
    ) -> Result<Joined<O>, Reject>
    where
        T: Serialize + DeserializeOwned + Clone,
        O: DeserializeOwned,
    {
        let Some(start) = self.open_window(ctx, timestamp_ms)? else {
            return Ok(Joined::dropped());
        };
        let matches = ctx.map_get(theirs, &(start, other))?.unwrap_or_default();
        let new = Sides::<L, R>::append(ctx, mine, (start, side), value)?;
        if new && matches.is_empty() {
            self.set_timer(ctx, start)?;
        }
        Ok(Joined {
            matches,
            dropped: false,
        })
    }

    /// Call from [`Operator::on_timer`](crate::Operator::on_timer): when `timer` is this
    /// join's, removes its window's records and returns `true`.
    ///
    /// # Errors
    /// [`Reject`] when state fails.
    pub fn on_timer(&self, ctx: &mut Context, timer: &Timer) -> Result<bool, Reject> {
        let Some(start) = timer
            .name
            .strip_prefix(self.sides.left.name())
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|start| start.parse::<i64>().ok())
        else {
            return Ok(false);
        };
        ctx.map_remove(&self.sides.left, &(start, Side::Left))?;
        ctx.map_remove(&self.sides.right, &(start, Side::Right))?;
        Ok(true)
    }

    /// The start of the record's window, or `None` when the window has closed (the watermark
    /// reached its end − 1).
    fn open_window(&self, ctx: &Context, timestamp_ms: i64) -> Result<Option<i64>, Reject> {
        let start = self.window_start(event_time(timestamp_ms)?);
        let closed = ctx
            .watermark()
            .is_some_and(|w| start + self.size_ms - 1 <= w);
        Ok((!closed).then_some(start))
    }

    fn set_timer(&self, ctx: &mut Context, start: i64) -> Result<(), Reject> {
        let name = format!("{}:{start}", self.sides.left.name());
        ctx.set_timer(&name, start + self.size_ms - 1, TimeDomain::EventTime)
    }
}

/// A left record at `t` joins the right records of the same key at `t + lower_ms ..= t +
/// upper_ms` (as Flink's `between(lower, upper)`; module docs).
#[derive(Debug)]
pub struct IntervalJoin<L, R> {
    sides: Sides<L, R>,
    lower_ms: i64,
    upper_ms: i64,
}

impl<L, R> IntervalJoin<L, R>
where
    L: Serialize + DeserializeOwned + Clone,
    R: Serialize + DeserializeOwned + Clone,
{
    /// A join of left records at `t` with right records in `[t + lower_ms, t + upper_ms]`,
    /// kept in the map state `name`.
    ///
    /// # Panics
    /// When `lower_ms > upper_ms`.
    pub const fn new(name: &'static str, lower_ms: i64, upper_ms: i64) -> Self {
        assert!(
            lower_ms <= upper_ms,
            "the interval's lower bound is at most its upper"
        );
        Self {
            sides: Sides::new(name),
            lower_ms,
            upper_ms,
        }
    }

    /// The map state's declaration, to list in [`Operator::STATES`](crate::Operator::STATES).
    pub const fn spec(&self) -> StateSpec {
        self.sides.left.spec()
    }

    /// A left record with `value` at `timestamp_ms`: the right records it joins, in timestamp
    /// order.
    ///
    /// # Errors
    /// [`Reject`] for a record without a timestamp, or when state or timers fail.
    pub fn left(
        &self,
        ctx: &mut Context,
        value: &L,
        timestamp_ms: i64,
    ) -> Result<Joined<R>, Reject> {
        let t = event_time(timestamp_ms)?;
        // No right record at or before t + upper can come once the watermark is there.
        let (from, to) = (t + self.lower_ms, t + self.upper_ms);
        let mine = (&self.sides.left, Side::Left);
        self.add(
            ctx,
            value,
            t,
            mine,
            (&self.sides.right, Side::Right),
            (from, to, to),
        )
    }

    /// A right record with `value` at `timestamp_ms`: the left records it joins (those at
    /// `timestamp_ms - upper_ms ..= timestamp_ms - lower_ms`), in timestamp order.
    ///
    /// # Errors
    /// As [`IntervalJoin::left`].
    pub fn right(
        &self,
        ctx: &mut Context,
        value: &R,
        timestamp_ms: i64,
    ) -> Result<Joined<L>, Reject> {
        let t = event_time(timestamp_ms)?;
        // No left record at or before t - lower can come once the watermark is there.
        let (from, to) = (t - self.upper_ms, t - self.lower_ms);
        let mine = (&self.sides.right, Side::Right);
        self.add(
            ctx,
            value,
            t,
            mine,
            (&self.sides.left, Side::Left),
            (from, to, to),
        )
    }

    /// A record of side `mine` at `t`: unless behind the watermark, stored until `until` and the
    /// records of side `theirs` at `from ..= to` returned.
    fn add<T, O>(
        &self,
        ctx: &mut Context,
        value: &T,
        t: i64,
        (mine, side): (&MapState<(i64, Side), Vec<T>>, Side),
        (theirs, other): (&MapState<(i64, Side), Vec<O>>, Side),
        (from, to, until): (i64, i64, i64),
    ) -> Result<Joined<O>, Reject>
    where
        T: Serialize + DeserializeOwned + Clone,
        O: DeserializeOwned,
    {
        if ctx.watermark().is_some_and(|w| t <= w) {
            return Ok(Joined::dropped());
        }
        let matches = self.stored(ctx, other, from, to, theirs)?;
        if Sides::<L, R>::append(ctx, mine, (t, side), value)? {
            self.set_timer(ctx, side, t, until)?;
        }
        Ok(Joined {
            matches,
            dropped: false,
        })
    }

    /// Call from [`Operator::on_timer`](crate::Operator::on_timer): when `timer` is this
    /// join's, removes the records it was set for and returns `true`.
    ///
    /// # Errors
    /// [`Reject`] when state fails.
    pub fn on_timer(&self, ctx: &mut Context, timer: &Timer) -> Result<bool, Reject> {
        let Some((side, t)) = timer
            .name
            .strip_prefix(self.sides.left.name())
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| rest.split_once(':'))
            .and_then(|(side, t)| Some((side, t.parse::<i64>().ok()?)))
        else {
            return Ok(false);
        };
        match side {
            "l" => ctx.map_remove(&self.sides.left, &(t, Side::Left))?,
            "r" => ctx.map_remove(&self.sides.right, &(t, Side::Right))?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `side`'s records at `from ..= to`, in timestamp order (the map's order would put
    /// `[10,…]` before `[9,…]`).
    fn stored<T: DeserializeOwned>(
        &self,
        ctx: &mut Context,
        side: Side,
        from: i64,
        to: i64,
        state: &MapState<(i64, Side), Vec<T>>,
    ) -> Result<Vec<T>, Reject> {
        // Both sides share the map: list its keys, then read the wanted side's entries.
        let keys: MapState<(i64, Side), serde::de::IgnoredAny> = MapState::new(state.name());
        let mut at: Vec<i64> = ctx
            .map_entries(&keys)?
            .into_iter()
            .filter(|((t, s), _)| *s == side && (from..=to).contains(t))
            .map(|((t, _), _)| t)
            .collect();
        at.sort_unstable();
        let mut rows = Vec::new();
        for t in at {
            rows.extend(ctx.map_get(state, &(t, side))?.unwrap_or_default());
        }
        Ok(rows)
    }

    fn set_timer(&self, ctx: &mut Context, side: Side, t: i64, at: i64) -> Result<(), Reject> {
        let name = format!("{}:{}:{t}", self.sides.left.name(), side.as_str());
        ctx.set_timer(&name, at, TimeDomain::EventTime)
    }
}
