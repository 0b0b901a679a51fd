"""Event-time windows built on map state and timers: `TumblingWindows`, `HoppingWindows` and
`SessionWindows`, each with an allowed lateness (as Flink's window operator with
`allowedLateness` and its default event-time trigger). The Python twin of the Rust SDK's
`weir_sdk::window`, storing the very same bytes.

A window helper is a named map state of the current key, from window start to the window's
accumulator, plus one event-time timer per open window. The operator turns each record into an
accumulator of one record (any JSON value, or a dataclass with `acc_type`) and calls `add` with
the record's timestamp; from `on_timer` it calls the helper's `on_timer`, which returns the
window that closed. Emitting is up to the operator:

- Final result: a window `[start, end)` closes when the watermark reaches `end - 1`; its timer
  fires and `on_timer` returns its accumulator once.
- Late updates: with an allowed lateness `L`, a closed window is kept until the watermark
  reaches `end - 1 + L`; a record for it until then (one the host delivers although it is late:
  `late_records = "process"`) is merged in and `add` returns the window's new result at once,
  with `update` set.
- Dropped: once the watermark reaches `end - 1 + L` the window's state is gone, and a record
  for it is not added: `add` counts it in `Added.dropped`.
- Refused timers: when the operator's `on_timer` rejects (or raises) on a window's timer, the
  host dead-letters the timer and discards the call's effects, the window's removal included.
  The window, left without a timer, is removed by the key's next record that opens a window
  (or, for sessions, any next record) once it is past its allowed lateness.
- Timers: each open window, and each closed one kept for its lateness, holds one timer of its
  key; a key can have at most the host's `runtime.timers_per_key_max` (1,024 by default), and a
  record that would open one more is rejected. Mind it with hopping windows and long lateness.

Times are integer ms (`int`); a float or `bool` is refused (`ValueError` at construction,
`weir.Reject` from `add`), since the stored bytes must be the Rust SDK's.

Sessions: a record at `t` opens `[t, t + gap)`; windows that overlap merge, so a session is a
run of records whose consecutive timestamps are less than `gap` apart.

Stored bytes (shared with Rust, frozen by `guest-sdk/testdata/windows.json`): the map key is
the window start as a JSON integer, the value `{"end":E,"fired":B,"acc":A}`, and the timer of
the window starting at `S` is named `NAME:S`. Keep the accumulator's keys (or dataclass fields)
in the order of the Rust struct's fields so `weir pipeline switch` keeps open windows.

    HOURS = TumblingWindows("hours", 3_600_000, merge=lambda a, b: {"n": a["n"] + b["n"]})

    class Hourly(weir.Operator):
        states = [HOURS.state]

        def process(self, ctx, record):
            for result in HOURS.add(ctx, record.timestamp_ms, {"n": 1}).updates:
                ctx.emit_json(record.key, {"start": result.window.start_ms, **result.acc})

        def on_timer(self, ctx, timer):
            result = HOURS.on_timer(ctx, timer)
            if result is not None:
                ctx.emit_json(timer.key, {"start": result.window.start_ms, **result.acc})
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ._context import EVENT_TIME, Context, Reject, Timer
from ._state import RAW, MapState, _converter, dumps, loads

A = TypeVar("A")

I64_MAX = (1 << 63) - 1
"""The largest time a timer takes (WIT `s64`)."""


def _ms(name: str, value: object) -> int:
    """`value` if it is an int of ms (not a bool), else `ValueError` naming `name`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int of ms, not {value!r}")
    return value

__all__ = [
    "Added",
    "HoppingWindows",
    "SessionWindows",
    "TumblingWindows",
    "Window",
    "WindowResult",
]


@dataclass(frozen=True, order=True)
class Window:
    """A window of event time: `[start_ms, end_ms)`, ms since the Unix epoch."""

    start_ms: int
    end_ms: int

    @property
    def max_timestamp(self) -> int:
        """The last ms in the window: it closes when the watermark reaches it."""
        return self.end_ms - 1


@dataclass
class WindowResult(Generic[A]):
    """A window's result: its accumulator when it closed, or after a late record."""

    window: Window
    acc: A
    update: bool
    """A result of this window (or, for sessions, of one merged into it) was emitted before:
    this one supersedes it."""


@dataclass
class Added(Generic[A]):
    """What `add` did with a record."""

    updates: list[WindowResult[A]] = field(default_factory=list)
    """Results of closed windows the record was merged into (late updates): emit them now."""
    dropped: int = 0
    """How many of the record's windows were past their allowed lateness."""


class _Windows(Generic[A]):
    """What the three helpers share: the map state, the lateness and the timers."""

    def __init__(
        self,
        name: str,
        merge: Callable[[A, A], A],
        allowed_lateness_ms: int,
        acc_type: type[A] | None,
    ) -> None:
        if _ms("allowed_lateness_ms", allowed_lateness_ms) < 0:
            raise ValueError("allowed lateness is at least 0 ms")
        self.state: MapState[int, bytes] = MapState(name, int, value_codec=RAW)
        """The map state to list in the operator's `states`."""
        self.allowed_lateness_ms = allowed_lateness_ms
        self._merge = merge
        self._convert = _converter(acc_type) if acc_type is not None else None

    @property
    def name(self) -> str:
        """The map state's name."""
        return self.state.name

    def _timer_name(self, start: int) -> str:
        return f"{self.state.name}:{start}"

    def _cleanup(self, window: Window) -> int:
        """When `window`'s allowed lateness ends: `end - 1 + L`, at most `I64_MAX` (as the Rust
        SDK saturates)."""
        return min(window.max_timestamp + self.allowed_lateness_ms, I64_MAX)

    def _is_late(self, window: Window, watermark: int | None) -> bool:
        return watermark is not None and self._cleanup(window) <= watermark

    @staticmethod
    def _timestamp(timestamp_ms: object) -> int:
        if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
            raise Reject(f"a window timestamp must be an int of ms, not {timestamp_ms!r}")
        return timestamp_ms

    def _decode(self, data: bytes) -> dict[str, Any]:
        entry: dict[str, Any] = loads(data)
        if self._convert is not None:
            entry["acc"] = self._convert(entry["acc"])
        return entry

    def _entries(self, ctx: Context) -> Iterator[tuple[int, dict[str, Any]]]:
        for start, data in ctx.map(self.state).entries():
            yield start, self._decode(data)

    def _get(self, ctx: Context, start: int) -> dict[str, Any] | None:
        data = ctx.map(self.state).get(start)
        return None if data is None else self._decode(data)

    def _put(self, ctx: Context, start: int, entry: dict[str, Any]) -> None:
        ctx.map(self.state)[start] = dumps(
            {"end": entry["end"], "fired": entry["fired"], "acc": entry["acc"]}
        )

    def _settle(
        self,
        ctx: Context,
        start: int,
        entry: dict[str, Any],
        timer_at: int | None,
        watermark: int | None,
        added: Added[A],
    ) -> None:
        """Stores `entry` and points its timer where it must be: at the window's end if it is
        still open, else (already due: a late record) at the end of its lateness, after adding
        its result to `added`."""
        window = Window(start, entry["end"])
        if watermark is not None and window.max_timestamp <= watermark:
            added.updates.append(WindowResult(window, entry["acc"], entry["fired"]))
            entry["fired"] = True
            at = self._cleanup(window)
        else:
            at = window.max_timestamp
        if timer_at != at:
            ctx.set_timer(self._timer_name(start), at, EVENT_TIME)
        self._put(ctx, start, entry)

    def _is_orphan(self, ctx: Context, start: int, end: int, watermark: int | None) -> bool:
        """Whether the key's window at `start` was left behind: past its allowed lateness with
        no timer (an `on_timer` call that closed or ended it was rejected, and the host discarded
        its removal with the rest of the call). A window past its lateness whose timer is still
        pending is not."""
        if not self._is_late(Window(start, end), watermark):
            return False
        return ctx.timer(self._timer_name(start)) is None

    def _remove_orphans(self, ctx: Context, watermark: int | None) -> None:
        """Removes the key's windows that were left behind: called when a record opens a new
        window, so that a rejected `on_timer` leaks no state."""
        if watermark is None:
            return
        for start, entry in list(self._entries(ctx)):
            if self._is_orphan(ctx, start, entry["end"], watermark):
                ctx.map(self.state).discard(start)

    def _add_fixed(self, ctx: Context, windows: list[Window], acc: A) -> Added[A]:
        watermark = ctx.watermark()
        added: Added[A] = Added()
        swept = False
        for window in windows:
            if self._is_late(window, watermark):
                added.dropped += 1
                continue
            entry = self._get(ctx, window.start_ms)
            timer_at: int | None
            if entry is None:
                if not swept:
                    self._remove_orphans(ctx, watermark)
                    swept = True
                entry = {"end": window.end_ms, "fired": False, "acc": acc}
                timer_at = None
            else:
                entry["acc"] = self._merge(entry["acc"], acc)
                timer_at = self._cleanup(window) if entry["fired"] else window.max_timestamp
            self._settle(ctx, window.start_ms, entry, timer_at, watermark, added)
        return added

    def on_timer(self, ctx: Context, timer: Timer) -> WindowResult[A] | None:
        """Call from the operator's `on_timer`: when `timer` is one of these windows' and
        closes a window, returns its result (emit it); None for a timer that is not theirs, or
        that only ends a window's allowed lateness."""
        if timer.domain != EVENT_TIME:
            return None
        prefix = self.state.name + ":"
        if not timer.name.startswith(prefix):
            return None
        try:
            start = int(timer.name[len(prefix) :])
        except ValueError:
            return None
        entry = self._get(ctx, start)
        if entry is None:
            return None
        window = Window(start, entry["end"])
        if entry["fired"] and timer.time_ms != window.max_timestamp:
            del ctx.map(self.state)[start]  # the end of its allowed lateness
            return None
        result = WindowResult(window, entry["acc"], entry["fired"])
        cleanup = self._cleanup(window)
        watermark = ctx.watermark()
        if watermark is None or cleanup <= watermark:
            ctx.map(self.state).discard(start)
        else:
            entry["fired"] = True
            ctx.set_timer(self._timer_name(start), cleanup, EVENT_TIME)
            self._put(ctx, start, entry)
        return result


class TumblingWindows(_Windows[A]):
    """Fixed, non-overlapping windows of `size_ms` aligned to the Unix epoch (as Flink's
    `TumblingEventTimeWindows`): a record at `t` falls in `[t - t % size, … + size)`.

    `merge(a, b)` folds accumulator `b` into `a` and returns the result (it may change and
    return `a`, never `b`). `acc_type` (a dataclass) decodes stored accumulators into it."""

    def __init__(
        self,
        name: str,
        size_ms: int,
        merge: Callable[[A, A], A],
        *,
        allowed_lateness_ms: int = 0,
        acc_type: type[A] | None = None,
    ) -> None:
        if _ms("size_ms", size_ms) <= 0:
            raise ValueError("a window lasts at least 1 ms")
        super().__init__(name, merge, allowed_lateness_ms, acc_type)
        self.size_ms = size_ms

    def window_of(self, timestamp_ms: int) -> Window:
        """The window a record at `timestamp_ms` falls in."""
        start = timestamp_ms - timestamp_ms % self.size_ms
        return Window(start, start + self.size_ms)

    def add(self, ctx: Context, timestamp_ms: int, acc: A) -> Added[A]:
        """Adds a record's accumulator to the window of `timestamp_ms` (its event time), or
        counts it dropped when that window is past its allowed lateness. Raises `Reject` when
        state or timers fail (for example more open windows than the host's timer limit)."""
        return self._add_fixed(ctx, [self.window_of(self._timestamp(timestamp_ms))], acc)


class HoppingWindows(_Windows[A]):
    """Windows of `size_ms` starting every `slide_ms`, aligned to the Unix epoch (as Flink's
    `SlidingEventTimeWindows`): a record falls in `size / slide` windows (rounded up).
    `merge` and `acc_type` as for `TumblingWindows`."""

    def __init__(
        self,
        name: str,
        size_ms: int,
        slide_ms: int,
        merge: Callable[[A, A], A],
        *,
        allowed_lateness_ms: int = 0,
        acc_type: type[A] | None = None,
    ) -> None:
        if _ms("size_ms", size_ms) <= 0 or _ms("slide_ms", slide_ms) <= 0:
            raise ValueError("windows and slides last at least 1 ms")
        super().__init__(name, merge, allowed_lateness_ms, acc_type)
        self.size_ms = size_ms
        self.slide_ms = slide_ms

    def windows_of(self, timestamp_ms: int) -> list[Window]:
        """The windows a record at `timestamp_ms` falls in, in start order."""
        last = timestamp_ms - timestamp_ms % self.slide_ms
        count = -(-self.size_ms // self.slide_ms)
        starts = (last - i * self.slide_ms for i in reversed(range(count)))
        return [Window(s, s + self.size_ms) for s in starts if timestamp_ms < s + self.size_ms]

    def add(self, ctx: Context, timestamp_ms: int, acc: A) -> Added[A]:
        """Adds a record's accumulator to each window of `timestamp_ms`; windows past their
        allowed lateness are counted dropped."""
        return self._add_fixed(ctx, self.windows_of(self._timestamp(timestamp_ms)), acc)


class SessionWindows(_Windows[A]):
    """Sessions of each key: runs of records whose consecutive timestamps are less than
    `gap_ms` apart (as Flink's `EventTimeSessionWindows`, but windows that only touch do not
    merge). A session `[first, last + gap)` closes when the watermark reaches
    `last + gap - 1`. `merge` and `acc_type` as for `TumblingWindows`; merging sessions calls
    `merge(earlier, later)` in start order, and with the record's accumulator last."""

    def __init__(
        self,
        name: str,
        gap_ms: int,
        merge: Callable[[A, A], A],
        *,
        allowed_lateness_ms: int = 0,
        acc_type: type[A] | None = None,
    ) -> None:
        if _ms("gap_ms", gap_ms) <= 0:
            raise ValueError("a session gap lasts at least 1 ms")
        super().__init__(name, merge, allowed_lateness_ms, acc_type)
        self.gap_ms = gap_ms

    def add(self, ctx: Context, timestamp_ms: int, acc: A) -> Added[A]:
        """Adds a record's accumulator at `timestamp_ms` to the key's sessions: it opens
        `[t, t + gap)` and merges with every session that overlaps it (as Flink, lateness is
        judged on the merged session). Counted dropped when that session is past its allowed
        lateness."""
        timestamp_ms = self._timestamp(timestamp_ms)
        watermark = ctx.watermark()
        added: Added[A] = Added()
        own = Window(timestamp_ms, min(timestamp_ms + self.gap_ms, I64_MAX))
        start = own.start_ms
        merged: dict[str, Any] | None = None
        absorbed: list[int] = []
        for s, entry in sorted(self._entries(ctx), key=lambda e: e[0]):
            if not (s < own.end_ms and own.start_ms < entry["end"]):
                # A session left behind by a rejected `on_timer` goes now (one it would merge
                # with has its timer set again below).
                if self._is_orphan(ctx, s, entry["end"], watermark):
                    ctx.map(self.state).discard(s)
                continue
            start = min(start, s)
            if merged is None:
                merged = entry
            else:
                merged["end"] = max(merged["end"], entry["end"])
                merged["fired"] = merged["fired"] or entry["fired"]
                merged["acc"] = self._merge(merged["acc"], entry["acc"])
            absorbed.append(s)
        if merged is None:
            merged = {"end": own.end_ms, "fired": False, "acc": acc}
        else:
            merged["end"] = max(merged["end"], own.end_ms)
            merged["acc"] = self._merge(merged["acc"], acc)
        if self._is_late(Window(start, merged["end"]), watermark):
            added.dropped = 1
            return added
        for s in absorbed:
            if s != start:
                ctx.clear_timer(self._timer_name(s))
                ctx.map(self.state).discard(s)
        self._settle(ctx, start, merged, None, watermark, added)
        return added
