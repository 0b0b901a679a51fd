"""Stream-stream joins of two inputs of a stage, built on map state and event-time timers:
`WindowJoin` (records of both sides in the same tumbling window, as Flink's window join and
Nexmark q8) and `IntervalJoin` (a left record at `t` with the right records in
`[t + lower, t + upper]`, as Flink's interval join and Nexmark q4). The Python twin of the
Rust SDK's `weir_sdk::join`, storing the very same bytes.

Both emit every join result as soon as the second of its two records arrives: the operator
calls `left` or `right` with a record of that side (tell them apart with `record.input`), gets
back the stored records of the other side it joins, and emits what it makes of each pair. A
record behind the watermark is neither joined nor kept: `Joined.dropped` says so. From
`on_timer` the operator calls the helper's `on_timer`, which removes what can no longer join.

State size per key (JSON of the records' values): a window join keeps the records of both sides
in the key's open windows (a window goes once the watermark reaches its end - 1) and one timer
per open window; an interval join keeps the left records of the last `upper` ms of event time
behind the watermark and the right records of the last `-lower` ms, with one timer per distinct
timestamp of each side (at most the host's `runtime.timers_per_key_max` per key).

Stored bytes (shared with Rust, frozen by `guest-sdk/testdata/joins.json`): one map state; a
window join keeps each side's records of the window starting at `S` under the map key `[S,"l"]`
or `[S,"r"]` as a JSON array of the values in arrival order, with the timer `NAME:S`; an
interval join keeps each side's records at timestamp `T` under `[T,"l"]` or `[T,"r"]`, with the
timers `NAME:l:T` and `NAME:r:T`. Values are stored as `json` writes them: give a dict the key
order of the Rust struct's fields.

    BIDS = IntervalJoin("bids", 0, 3_600_000)

    class Bids(weir.Operator):
        states = [BIDS.state]

        def process(self, ctx, record):
            value = json.loads(record.value)
            if record.input == 0:
                joined = BIDS.left(ctx, value, record.timestamp_ms)
                pairs = [(value, other) for other in joined.matches]
            else:
                joined = BIDS.right(ctx, value, record.timestamp_ms)
                pairs = [(other, value) for other in joined.matches]
            for auction, bid in pairs:
                ctx.emit_json(record.key, {"auction": auction, "bid": bid})

        def on_timer(self, ctx, timer):
            BIDS.on_timer(ctx, timer)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._context import EVENT_TIME, Context, Reject, Timer
from ._state import RAW, MapState, dumps, loads

__all__ = ["IntervalJoin", "Joined", "WindowJoin"]

LEFT = "l"
RIGHT = "r"


@dataclass
class Joined:
    """What a join did with a record."""

    matches: list[Any] = field(default_factory=list)
    """The other side's records it joins, in the order they were stored."""
    dropped: bool = False
    """The record was behind the watermark: neither joined nor kept."""


def _ms(name: str, value: object) -> int:
    """`value` if it is an int of ms (not a bool), else `ValueError` naming `name`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int of ms, not {value!r}")
    return value


def _event_time(timestamp_ms: object) -> int:
    """The record's event time; `Reject` for one without (a join is in event time)."""
    if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
        raise Reject(f"a join timestamp must be an int of ms, not {timestamp_ms!r}")
    if timestamp_ms < 0:
        raise Reject("a join needs the record's event time; it has no timestamp")
    return timestamp_ms


class _Sides:
    """The one map state of a join: `[T, side]` to the JSON array of that side's values."""

    def __init__(self, name: str) -> None:
        self.state: MapState[list[Any], bytes] = MapState(name, value_codec=RAW)
        """The map state to list in the operator's `states`."""

    @property
    def name(self) -> str:
        """The map state's name."""
        return self.state.name

    def rows(self, ctx: Context, at: int, side: str) -> list[Any]:
        data = ctx.map(self.state).get([at, side])
        return [] if data is None else list(loads(data))

    def append(self, ctx: Context, at: int, side: str, value: Any) -> bool:
        """Appends `value` to `side`'s records under `at`; whether the entry was new."""
        view = ctx.map(self.state)
        data = view.get([at, side])
        rows = [] if data is None else list(loads(data))
        rows.append(value)
        view[[at, side]] = dumps(rows)
        return data is None

    def remove(self, ctx: Context, at: int, side: str) -> None:
        view = ctx.map(self.state)
        if [at, side] in view:
            del view[[at, side]]


class WindowJoin:
    """Records of both sides with the same key in the same tumbling window of `size_ms`
    (aligned to the Unix epoch) join. Raises `ValueError` for a size that is not a positive int
    of ms."""

    def __init__(self, name: str, size_ms: int) -> None:
        if _ms("size_ms", size_ms) <= 0:
            raise ValueError("a window lasts at least 1 ms")
        self._sides = _Sides(name)
        self.state = self._sides.state
        """The map state to list in the operator's `states`."""
        self.size_ms = size_ms

    def window_start(self, timestamp_ms: int) -> int:
        """The start of the window a record at `timestamp_ms` falls in."""
        return timestamp_ms - timestamp_ms % self.size_ms

    def left(self, ctx: Context, value: Any, timestamp_ms: int) -> Joined:
        """A left record: the right records of its window it joins."""
        return self._add(ctx, value, timestamp_ms, LEFT, RIGHT)

    def right(self, ctx: Context, value: Any, timestamp_ms: int) -> Joined:
        """A right record: the left records of its window it joins."""
        return self._add(ctx, value, timestamp_ms, RIGHT, LEFT)

    def _add(self, ctx: Context, value: Any, timestamp_ms: int, side: str, other: str) -> Joined:
        start = self.window_start(_event_time(timestamp_ms))
        watermark = ctx.watermark()
        if watermark is not None and start + self.size_ms - 1 <= watermark:
            return Joined(dropped=True)
        matches = self._sides.rows(ctx, start, other)
        if self._sides.append(ctx, start, side, value) and not matches:
            ctx.set_timer(f"{self._sides.name}:{start}", start + self.size_ms - 1, EVENT_TIME)
        return Joined(matches=matches)

    def on_timer(self, ctx: Context, timer: Timer) -> bool:
        """When `timer` is this join's, removes its window's records and returns True."""
        prefix = f"{self._sides.name}:"
        if not timer.name.startswith(prefix):
            return False
        try:
            start = int(timer.name[len(prefix):])
        except ValueError:
            return False
        self._sides.remove(ctx, start, LEFT)
        self._sides.remove(ctx, start, RIGHT)
        return True


class IntervalJoin:
    """A left record at `t` joins the right records of the same key at `t + lower_ms` ..=
    `t + upper_ms` (as Flink's `between(lower, upper)`). Raises `ValueError` when the bounds are
    not ints of ms or `lower_ms > upper_ms`."""

    def __init__(self, name: str, lower_ms: int, upper_ms: int) -> None:
        if _ms("lower_ms", lower_ms) > _ms("upper_ms", upper_ms):
            raise ValueError("the interval's lower bound is at most its upper")
        self._sides = _Sides(name)
        self.state = self._sides.state
        """The map state to list in the operator's `states`."""
        self.lower_ms = lower_ms
        self.upper_ms = upper_ms

    def left(self, ctx: Context, value: Any, timestamp_ms: int) -> Joined:
        """A left record: the right records it joins, in timestamp order."""
        t = _event_time(timestamp_ms)
        return self._add(ctx, value, t, LEFT, (t + self.lower_ms, t + self.upper_ms))

    def right(self, ctx: Context, value: Any, timestamp_ms: int) -> Joined:
        """A right record: the left records it joins (at t - upper ..= t - lower), in timestamp
        order."""
        t = _event_time(timestamp_ms)
        return self._add(ctx, value, t, RIGHT, (t - self.upper_ms, t - self.lower_ms))

    def _add(
        self, ctx: Context, value: Any, t: int, side: str, bounds: tuple[int, int]
    ) -> Joined:
        watermark = ctx.watermark()
        if watermark is not None and t <= watermark:
            return Joined(dropped=True)
        other = RIGHT if side == LEFT else LEFT
        low, high = bounds
        at = sorted(
            key[0]
            for key in ctx.map(self._sides.state)
            if key[1] == other and low <= key[0] <= high
        )
        matches = [row for k in at for row in self._sides.rows(ctx, k, other)]
        if self._sides.append(ctx, t, side, value):
            # Once the watermark reaches the last time the other side could match, it goes.
            until = t + self.upper_ms if side == LEFT else t - self.lower_ms
            ctx.set_timer(f"{self._sides.name}:{side}:{t}", until, EVENT_TIME)
        return Joined(matches=matches)

    def on_timer(self, ctx: Context, timer: Timer) -> bool:
        """When `timer` is this join's, removes the records it was set for and returns True."""
        prefix = f"{self._sides.name}:"
        if not timer.name.startswith(prefix):
            return False
        side, _, t = timer.name[len(prefix):].partition(":")
        if side not in (LEFT, RIGHT):
            return False
        try:
            at = int(t)
        except ValueError:
            return False
        self._sides.remove(ctx, at, side)
        return True
