"""The window helpers through `weir.testing.Harness`: the shared test vectors (the Rust SDK runs
the same file and must match byte for byte), and the session helper against a model on
out-of-order input."""

from __future__ import annotations

import json
import pathlib
import random
from typing import Any

import pytest

import weir
from weir.testing import Harness
from weir.windows import Added, HoppingWindows, SessionWindows, TumblingWindows, WindowResult

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "testdata" / "windows.json"


def add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {"count": a["count"] + b["count"], "sum": a["sum"] + b["sum"]}


Helper = TumblingWindows[dict[str, int]] | HoppingWindows[dict[str, int]] | SessionWindows[dict[str, int]]


def helper_from(spec: dict[str, Any]) -> Helper:
    lateness = spec.get("allowed_lateness_ms", 0)
    kind = spec["kind"]
    if kind == "tumbling":
        return TumblingWindows("w", spec["size_ms"], add, allowed_lateness_ms=lateness)
    if kind == "hopping":
        return HoppingWindows(
            "w", spec["size_ms"], spec["slide_ms"], add, allowed_lateness_ms=lateness
        )
    if kind == "session":
        return SessionWindows("w", spec["gap_ms"], add, allowed_lateness_ms=lateness)
    raise ValueError(kind)


def windowed(helper: Helper) -> type[weir.Operator]:
    """The vectors' operator: `{"n": N}` in, window results out."""

    def emit(ctx: weir.Context, key: bytes, result: WindowResult[dict[str, int]]) -> None:
        ctx.emit_json(
            key,
            {
                "start": result.window.start_ms,
                "end": result.window.end_ms,
                "update": result.update,
                "acc": result.acc,
            },
        )

    class Windowed(weir.Operator):
        name = "windowed"
        version = "1.0.0"
        states = [helper.state]

        def process(self, ctx: weir.Context, record: weir.Record) -> None:
            n = json.loads(record.value)["n"]
            added: Added[dict[str, int]] = helper.add(
                ctx, record.timestamp_ms, {"count": 1, "sum": n}
            )
            for update in added.updates:
                emit(ctx, record.key, update)
            if added.dropped:
                ctx.emit_json(record.key, {"dropped": added.dropped})

        def on_timer(self, ctx: weir.Context, timer: weir.Timer) -> None:
            result = helper.on_timer(ctx, timer)
            if result is not None:
                emit(ctx, timer.key, result)

    return Windowed


CASES = json.loads(VECTORS.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"][:40] for c in CASES])
def test_window_helpers_produce_the_shared_vectors_byte_for_byte(case: dict[str, Any]) -> None:
    name = case["name"]
    h = Harness(windowed(helper_from(case["window"])))
    for i, step in enumerate(case["steps"]):
        if "record" in step:
            r = step["record"]
            out = h.send(r["key"], json.dumps({"n": r["n"]}), timestamp_ms=r["ts"])
            assert out.ok, (name, i, out.reason)
        if "watermark" in step:
            for timer, out in h.advance_watermark(step["watermark"]):
                assert out.ok, (name, i, timer, out.reason)
        for key, want in step.get("state", {}).items():
            got = [
                [k.decode(), v.decode()]
                for k, v in sorted(h._host.maps.get((key.encode(), "w"), {}).items())
            ]
            assert got == want, (name, i, key)
        for key, want in step.get("timers", {}).items():
            got = {n: at for n, (at, _) in h.timers(key).items()}
            assert got == want, (name, i, key)
    got_outputs = [[o.key.decode(), o.value.decode()] for o in h.outputs]
    assert got_outputs == case["outputs"], name
    assert h.pending_timers() == case.get("timers_left", 0)


class Model:
    """Sessions recomputed from scratch, per key, over the records still live: no state but
    the records and which of them an emitted result covered (the Rust test's model)."""

    def __init__(self, gap: int, lateness: int) -> None:
        self.gap, self.lateness = gap, lateness
        self.watermark: int | None = None
        self.live: dict[str, list[tuple[int, int, int]]] = {}
        self.emitted_ids: set[int] = set()
        self.next_id = 0
        self.out: list[tuple[str, int, int, int, int, bool]] = []

    def sessions(self, key: str) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
        out: list[tuple[int, int, list[tuple[int, int, int]]]] = []
        for r in sorted(self.live.get(key, []), key=lambda r: (r[1], r[0])):
            if out and r[1] < out[-1][1]:
                start, end, members = out[-1]
                out[-1] = (start, max(end, r[1] + self.gap), members + [r])
            else:
                out.append((r[1], r[1] + self.gap, [r]))
        return out

    def emit(self, key: str, s: tuple[int, int, list[tuple[int, int, int]]]) -> None:
        update = any(r[0] in self.emitted_ids for r in s[2])
        self.out.append((key, s[0], s[1], len(s[2]), sum(r[2] for r in s[2]), update))
        self.emitted_ids.update(r[0] for r in s[2])

    def record(self, key: str, ts: int, n: int) -> None:
        rid = self.next_id
        self.next_id += 1
        self.live.setdefault(key, []).append((rid, ts, n))
        session = next(s for s in self.sessions(key) if any(r[0] == rid for r in s[2]))
        if self.watermark is not None and session[1] - 1 + self.lateness <= self.watermark:
            self.live[key] = [r for r in self.live[key] if r[0] != rid]
            self.out.append((key, -1, 0, 0, 0, False))
            return
        if self.watermark is not None and session[1] - 1 <= self.watermark:
            self.emit(key, session)

    def advance(self, to: int) -> None:
        w = to if self.watermark is None else max(self.watermark, to)
        self.watermark = w
        for key in list(self.live):
            sessions = sorted(self.sessions(key), key=lambda s: s[1])
            for s in sessions:
                if s[1] - 1 <= w and not all(r[0] in self.emitted_ids for r in s[2]):
                    self.emit(key, s)
            for s in sessions:
                if s[1] - 1 + self.lateness <= w:
                    gone = {r[0] for r in s[2]}
                    self.live[key] = [r for r in self.live[key] if r[0] not in gone]


def per_key(emissions: list[tuple[str, int, int, int, int, bool]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for e in emissions:
        out.setdefault(e[0], []).append(e)
    return out


def test_session_windows_match_a_model_on_out_of_order_input() -> None:
    rng = random.Random(20261202)
    for _ in range(300):
        gap, lateness = rng.randrange(1, 40), rng.randrange(0, 30)
        h = Harness(windowed(SessionWindows("w", gap, add, allowed_lateness_ms=lateness)))
        model = Model(gap, lateness)
        wm = 0
        steps: list[tuple[str, int, int] | int] = []
        for _ in range(rng.randrange(1, 60)):
            if rng.random() < 0.8:
                steps.append((rng.choice("ab"), rng.randrange(0, 300), rng.randrange(1, 100)))
            else:
                steps.append(rng.randrange(0, 40))
        steps.append(1000)
        for step in steps:
            if isinstance(step, tuple):
                key, ts, n = step
                out = h.send(key, json.dumps({"n": n}), timestamp_ms=ts)
                assert out.ok, out.reason
                model.record(key, ts, n)
            else:
                wm += step
                for _, out in h.advance_watermark(wm):
                    assert out.ok, out.reason
                model.advance(wm)
        got = []
        for o in h.outputs:
            v = json.loads(o.value)
            if "dropped" in v:
                got.append((o.key.decode(), -1, 0, 0, 0, False))
            else:
                a = v["acc"]
                got.append((o.key.decode(), v["start"], v["end"], a["count"], a["sum"], v["update"]))
        assert per_key(got) == per_key(model.out), (gap, lateness, steps)
        assert h.pending_timers() == 0
        assert not any(h._host.maps.values())


def test_times_that_are_not_ints_of_ms_are_refused() -> None:
    """Floats would store bytes the Rust SDK cannot read (`0.0` as a window start) and timer
    names it could never parse."""
    with pytest.raises(ValueError):
        TumblingWindows("w", 3.6e6, add)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SessionWindows("w", 10, add, allowed_lateness_ms=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        HoppingWindows("w", 10, True, add)

    class FloatTime(weir.Operator):
        name = "float-time"
        version = "1.0.0"
        states = [TumblingWindows("w", 10, add).state]

        def process(self, ctx: weir.Context, record: weir.Record) -> None:
            TumblingWindows("w", 10, add).add(ctx, 3.0, {"count": 1, "sum": 1})  # type: ignore[arg-type]

    h = Harness(FloatTime)
    out = h.send("k", "{}", timestamp_ms=3)
    assert not out.ok and "int of ms" in (out.reason or "")
    assert h.pending_timers() == 0 and not any(h._host.maps.values())


def test_a_window_whose_timer_was_refused_is_removed_once_past_its_lateness() -> None:
    """A rejected `on_timer` leaves its window without a timer (the host discards the call's
    removal of it): the key's next window, or next session record, removes it."""
    hours = TumblingWindows("w", 10, add)
    sessions = SessionWindows("s", 10, add)

    class RefusingTimers(weir.Operator):
        name = "refusing-timers"
        version = "1.0.0"
        states = [hours.state, sessions.state]

        def process(self, ctx: weir.Context, record: weir.Record) -> None:
            hours.add(ctx, record.timestamp_ms, {"count": 1, "sum": 0})
            sessions.add(ctx, record.timestamp_ms, {"count": 1, "sum": 0})

        def on_timer(self, ctx: weir.Context, timer: weir.Timer) -> None:
            hours.on_timer(ctx, timer)
            sessions.on_timer(ctx, timer)
            raise weir.Reject("refused")

    h = Harness(RefusingTimers)
    assert h.send("k", "{}", timestamp_ms=5).ok
    fired = h.advance_watermark(20)
    assert len(fired) == 2 and not any(out.ok for _, out in fired)
    assert h.pending_timers() == 0
    maps = h._host.maps
    assert len(maps[(b"k", "w")]) == 1 and len(maps[(b"k", "s")]) == 1, "left behind"
    assert h.send("k", "{}", timestamp_ms=35).ok
    assert sorted(maps[(b"k", "w")]) == [b"30"]
    assert sorted(maps[(b"k", "s")]) == [b"35"]
