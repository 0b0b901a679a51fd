"""The join helpers through `weir.testing.Harness`, driving a stage's two inputs: the shared test
vectors (the Rust SDK runs the same file and must match byte for byte)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

import weir
from weir.joins import IntervalJoin, Joined, WindowJoin
from weir.testing import Harness

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "testdata" / "joins.json"


def helper_from(spec: dict[str, Any]) -> WindowJoin | IntervalJoin:
    if spec["kind"] == "window":
        return WindowJoin("j", spec["size_ms"])
    if spec["kind"] == "interval":
        return IntervalJoin("j", spec["lower_ms"], spec["upper_ms"])
    raise ValueError(spec["kind"])


def joining(helper: WindowJoin | IntervalJoin) -> type[weir.Operator]:
    """The vectors' operator: input 0 left, input 1 right; each pair out as {"l":…,"r":…}."""

    class Joining(weir.Operator):
        name = "joining"
        version = "1.0.0"
        states = [helper.state]

        def process(self, ctx: weir.Context, record: weir.Record) -> None:
            value = json.loads(record.value)
            left = record.input == 0
            joined: Joined = (
                helper.left(ctx, value, record.timestamp_ms)
                if left
                else helper.right(ctx, value, record.timestamp_ms)
            )
            for other in joined.matches:
                pair = {"l": value, "r": other} if left else {"l": other, "r": value}
                ctx.emit_json(record.key, pair)
            if joined.dropped:
                ctx.emit_json(record.key, {"dropped": True})

        def on_timer(self, ctx: weir.Context, timer: weir.Timer) -> None:
            helper.on_timer(ctx, timer)

    return Joining


CASES = json.loads(VECTORS.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"][:40] for c in CASES])
def test_join_helpers_produce_the_shared_vectors_byte_for_byte(case: dict[str, Any]) -> None:
    name = case["name"]
    h = Harness(joining(helper_from(case["join"])))
    for i, step in enumerate(case["steps"]):
        if "record" in step:
            r = step["record"]
            out = h.send(
                r["key"],
                json.dumps({"v": r["v"]}),
                timestamp_ms=r["ts"],
                input=1 if r["side"] == "r" else 0,
            )
            assert out.ok, (name, i, out.reason)
        if "watermark" in step:
            for timer, out in h.advance_watermark(step["watermark"]):
                assert out.ok, (name, i, timer, out.reason)
        for key, want in step.get("state", {}).items():
            got = [
                [k.decode(), v.decode()]
                for k, v in sorted(h._host.maps.get((key.encode(), "j"), {}).items())
            ]
            assert got == want, (name, i, key)
        for key, want in step.get("timers", {}).items():
            got = {n: at for n, (at, _) in h.timers(key).items()}
            assert got == want, (name, i, key)
    got_outputs = [[o.key.decode(), o.value.decode()] for o in h.outputs]
    assert got_outputs == case["outputs"], name
    assert h.pending_timers() == case.get("timers_left", 0)


def test_a_record_without_event_time_is_rejected() -> None:
    h = Harness(joining(WindowJoin("j", 10)))
    out = h.send("a", json.dumps({"v": 1}))
    assert not out.ok and "event time" in (out.reason or "")


def test_bounds_are_checked_at_construction() -> None:
    with pytest.raises(ValueError):
        IntervalJoin("j", 5, 1)
    with pytest.raises(ValueError):
        WindowJoin("j", 0)
