"""The Python SDK in plain CPython, through `weir.testing.Harness`."""

from __future__ import annotations

from dataclasses import dataclass, field
import json
import logging
import sys

import pytest

import weir
from weir.testing import Harness


@dataclass
class Totals:
    count: int = 0
    last: str | None = None


TOTALS = weir.ValueState("totals", Totals)
SEEN = weir.MapState("seen", str, int)
RAW = weir.ValueState("raw", codec=weir.RAW)


class Tally(weir.Operator):
    """Counts records per key, remembers per word how often it came, and refuses `"bad"`."""

    name = "tally"
    version = "1.2.3"
    states = [TOTALS, SEEN, RAW]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        word = record.value.decode()
        totals = ctx.get(TOTALS) or Totals()
        totals.count += 1
        totals.last = word
        ctx.set(TOTALS, totals)
        seen = ctx.map(SEEN)
        seen[word] = seen.get(word, 0) + 1
        ctx.set(RAW, record.value)
        ctx.emit_json(record.key, {"count": totals.count, "word": word})
        if word == "bad":
            raise weir.Reject("bad word")
        if word == "boom":
            {}["missing"]


def test_state_is_per_key_and_stored_as_the_rust_sdk_stores_it() -> None:
    h = Harness(Tally)
    assert h.send("a", "x").ok
    assert h.send("a", "y").ok
    assert h.send("b", "x").ok
    assert h.value("a", TOTALS) == Totals(2, "y")
    assert h.value("b", TOTALS) == Totals(1, "x")
    assert h._host.values[(b"a", "totals")] == b'{"count":2,"last":"y"}'
    assert h._host.values[(b"a", "raw")] == b"y"
    assert h.map("a", SEEN) == {"x": 1, "y": 1}
    assert [o.value for o in h.outputs] == [
        b'{"count":1,"word":"x"}',
        b'{"count":2,"word":"y"}',
        b'{"count":1,"word":"x"}',
    ]
    assert [o.key for o in h.outputs] == [b"a", b"a", b"b"]


def test_a_rejected_record_keeps_no_state_writes_and_no_emits() -> None:
    h = Harness(Tally)
    h.send("a", "x")
    out = h.send("a", "bad")
    assert out.reason == "bad word"
    assert out.emitted == []
    assert h.value("a", TOTALS) == Totals(1, "x")
    assert h.map("a", SEEN) == {"x": 1}
    assert len(h.outputs) == 1
    assert h.dead_letters[0][1] == "bad word"


def test_an_exception_dead_letters_the_record_with_its_type_and_place() -> None:
    h = Harness(Tally)
    out = h.send("a", "boom")
    assert out.reason is not None
    assert out.reason.startswith("KeyError: 'missing' (at test_sdk.py:")
    assert out.reason.endswith(" in process)")
    assert h.value("a", TOTALS) is None


def test_state_that_does_not_decode_rejects_naming_the_state() -> None:
    h = Harness(Tally)
    h._host.values[(b"a", "totals")] = b"not json"
    out = h.send("a", "x")
    assert out.reason is not None
    assert out.reason.startswith("cannot decode state `totals`: ")


def test_unknown_fields_in_stored_objects_are_ignored() -> None:
    h = Harness(Tally)
    h._host.values[(b"a", "totals")] = b'{"count":5,"last":"q","added_later":true}'
    assert h.send("a", "x").ok
    assert h.value("a", TOTALS) == Totals(6, "x")


class Misuse(weir.Operator):
    name = "misuse"
    states = [TOTALS, SEEN]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        what = record.value
        if what == b"undeclared":
            ctx.get(weir.ValueState("other"))
        elif what == b"wrong-kind":
            ctx.get(weir.ValueState("seen"))
        elif what == b"too-large":
            ctx.set(TOTALS, Totals(1, "x" * (1 << 20)))
        elif what == b"big-key":
            ctx.map(SEEN)["k" * 5000] = 1
        elif what == b"big-output":
            for _ in range(20):
                ctx.emit(b"", b"v" * 60_000)
        elif what == b"log":
            ctx.log(weir.WARN, "careful")
            weir.logger.info("via logging %d", 7)


@pytest.mark.parametrize(
    ("what", "reason"),
    [
        ("undeclared", "state error: undeclared state `other`"),
        ("wrong-kind", "state error: state `seen` is of the other kind"),
        ("too-large", "state error: larger than the limit of 1048576 bytes"),
        ("big-key", "state error: larger than the limit of 4096 bytes"),
        ("big-output", "emit error: output for this record exceeds the limit of 1000000 bytes"),
    ],
)
def test_host_refusals_reject_with_the_hosts_reason(what: str, reason: str) -> None:
    assert Harness(Misuse).send("k", what).reason == reason


def test_logs_reach_the_host_from_the_context_and_from_logging() -> None:
    h = Harness(Misuse)
    assert h.send("k", "log").ok
    assert h.logs == [("warn", "careful"), ("info", "via logging 7")]


class Pages(weir.Operator):
    name = "pages"
    states = [SEEN]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        m = ctx.map(SEEN)
        if record.value == b"fill":
            for i in range(600):
                m[f"w{i:04}"] = i
        elif record.value == b"drop":
            del m["w0001"]
            m.discard("absent")
            with pytest.raises(KeyError):
                del m["absent"]
        else:
            items = list(m.items())
            ctx.emit_json(b"", {"len": len(m), "first": items[0], "last": items[-1],
                                "has": "w0001" in m})


def test_map_iteration_pages_through_every_entry_in_key_order() -> None:
    h = Harness(Pages)
    h.send("k", "fill")
    out = h.send("k", "read")
    assert json.loads(out.emitted[0].value) == {
        "len": 600, "first": ["w0000", 0], "last": ["w0599", 599], "has": True,
    }
    h.send("k", "drop")
    out = h.send("k", "read")
    assert json.loads(out.emitted[0].value)["len"] == 599
    assert json.loads(out.emitted[0].value)["has"] is False


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"name": ""}, "name must be a str of 1..=64 bytes"),
        ({"name": "x" * 65}, "name must be a str of 1..=64 bytes"),
        ({"version": "v" * 65}, "version must be a str of at most 64 bytes"),
        ({"states": [TOTALS, TOTALS]}, "declares 'totals' twice"),
        ({"states": ["totals"]}, "not a state"),
        ({"outputs": ["default"]}, "is not 1..=64 of"),
        ({"outputs": ["Late"]}, "is not 1..=64 of"),
        ({"outputs": ["late", "late"]}, "at most 16 distinct names"),
    ],
)
def test_export_checks_the_declaration(change: dict[str, object], error: str) -> None:
    bad = type("Bad", (Tally,), change)
    with pytest.raises((TypeError, ValueError), match=error):
        weir.export(bad)


def test_state_names_and_ttls_are_checked_where_declared() -> None:
    with pytest.raises(ValueError, match="1..=64 characters"):
        weir.ValueState("Not Valid")
    with pytest.raises(ValueError, match="positive"):
        weir.MapState("m", ttl_ms=0)
    assert weir.ValueState("ok-name_1", ttl_ms=60_000).ttl_ms == 60_000


def test_json_is_byte_compatible_with_serde_json() -> None:
    assert weir.dumps({"route": "JFK-LAX", "mean": -0.4806, "max": None, "é": [1, 2]}) == (
        '{"route":"JFK-LAX","mean":-0.4806,"max":null,"é":[1,2]}'.encode()
    )
    assert weir.dumps(Totals(3, "z")) == b'{"count":3,"last":"z"}'
    assert weir.loads(b'{"a":1}') == {"a": 1}


def test_an_exported_module_refuses_to_run_outside_a_component() -> None:
    exported = weir.export(Tally)
    assert exported.__name__ == "Operator"
    with pytest.raises(RuntimeError, match="componentize-py"):
        exported().process_batch([])


@pytest.mark.parametrize(
    ("value", "serde_json"),
    [
        (1e16, "1e16"),
        (1.5e16, "1.5e16"),
        (1e15, "1000000000000000.0"),
        (1e-5, "0.00001"),
        (9.9e-5, "0.000099"),
        (1e-7, "1e-7"),
        (-2.5e-9, "-2.5e-9"),
        (1.7976931348623157e308, "1.7976931348623157e308"),
        (5e-324, "5e-324"),
        (3.0, "3.0"),
        (-0.0, "-0.0"),
        (float("nan"), "null"),
        (float("inf"), "null"),
        (float("-inf"), "null"),
    ],
)
def test_floats_are_written_as_serde_json_writes_them(value: float, serde_json: str) -> None:
    # serde_json writes finite floats with ryu (plain for 1e-5 <= |x| < 1e16, else d.ddde[-]x)
    # and non-finite ones as null.
    assert weir.dumps([value]) == f"[{serde_json}]".encode()
    assert weir.dumps({"t": "1e+16 NaN e-5", "v": value}) == (
        f'{{"t":"1e+16 NaN e-5","v":{serde_json}}}'.encode()
    )


@dataclass
class Leg:
    origin: str
    minutes: int


@dataclass
class Trip:
    legs: list[Leg]
    first: Leg | None = None
    by_name: dict[str, Leg] = field(default_factory=dict)
    span: tuple[int, int] = (0, 0)
    derived: int = field(init=False, default=0)


TRIPS = weir.ValueState("trips", Trip)
PAIRS = weir.MapState("pairs", tuple, int)


class Nested(weir.Operator):
    name = "nested"
    states = [TRIPS, PAIRS]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        trip = ctx.get(TRIPS) or Trip([])
        leg = Leg(record.value.decode(), len(trip.legs))
        trip.legs.append(leg)
        trip.first = trip.first or leg
        trip.by_name[leg.origin] = leg
        trip.span = (trip.span[0], leg.minutes)
        trip.derived += 1
        ctx.set(TRIPS, trip)
        pairs = ctx.map(PAIRS)
        pairs[(leg.origin, leg.minutes)] = leg.minutes
        ctx.emit_json(record.key, {"keys": sorted(pairs)})


def test_nested_dataclasses_tuples_and_init_false_fields_survive_a_round_trip() -> None:
    h = Harness(Nested)
    for origin in ["JFK", "LAX", "SFO"]:
        assert h.send("k", origin).ok, h.dead_letters
    trip = h.value("k", TRIPS)
    assert trip is not None
    assert trip.legs == [Leg("JFK", 0), Leg("LAX", 1), Leg("SFO", 2)]
    assert trip.first == Leg("JFK", 0)
    assert trip.by_name["SFO"] == Leg("SFO", 2)
    assert trip.span == (0, 2)
    assert trip.derived == 3
    assert h.map("k", PAIRS) == {("JFK", 0): 0, ("LAX", 1): 1, ("SFO", 2): 2}
    assert json.loads(h.outputs[-1].value) == {"keys": [["JFK", 0], ["LAX", 1], ["SFO", 2]]}


@pytest.mark.parametrize("ttl", [1.5, True, -1, 0])
def test_a_ttl_that_is_not_a_positive_int_is_refused_where_declared(ttl: object) -> None:
    with pytest.raises(ValueError, match="ttl_ms"):
        weir.ValueState("v", ttl_ms=ttl)  # type: ignore[arg-type]


class Emitter(weir.Operator):
    name = "emitter"

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        what = record.value
        if what == b"forward":
            ctx.emit(None, bytearray(b"v"), headers=record.headers)
        elif what == b"mapping":
            ctx.emit(memoryview(b"k"), "v", headers={"a": "1", "b": None})
        elif what == b"bad-value":
            ctx.emit(b"k", 123)  # type: ignore[arg-type]
        elif what == b"levels":
            ctx.log(logging.WARNING, "from logging")
            ctx.log(99, "too high")
            ctx.log(-1, "too low")
            weir.log(weir.Level.INFO, "module level")
        elif what == b"exit":
            sys.exit(3)
        elif what == b"bare-reject":
            raise weir.Reject()
        elif what == b"json":
            weir.loads(b"{not json")


def test_emit_takes_bytes_like_values_none_and_forwards_headers() -> None:
    h = Harness(Emitter)
    out = h.send("in", "forward", headers=[("trace", b"abc"), ("trace", b"def")])
    assert out.emitted[0].key == b""
    assert out.emitted[0].value == b"v"
    assert out.emitted[0].headers == [("trace", b"abc"), ("trace", b"def")]
    out = h.send("in", "mapping")
    assert (out.emitted[0].key, out.emitted[0].headers) == (b"k", [("a", b"1"), ("b", b"")])
    out = h.send("in", "bad-value")
    assert out.reason is not None
    assert out.reason.startswith("TypeError: emit takes bytes, str or None, not int (at test_sdk.py:")


def test_log_levels_never_fail_and_lines_go_to_the_harness_that_ran_the_record() -> None:
    first, second = Harness(Emitter), Harness(Emitter)
    assert first.send("k", "levels").ok
    assert first.logs == [
        ("warn", "from logging"),
        ("error", "too high"),
        ("trace", "too low"),
        ("info", "module level"),
    ]
    assert second.logs == []


def test_exit_and_a_bare_reject_dead_letter_only_the_record() -> None:
    h = Harness(Emitter)
    reason = h.send("k", "exit").reason
    assert reason is not None and reason.startswith("SystemExit: 3 (at test_sdk.py:")
    assert h.send("k", "bare-reject").reason == "rejected by the operator"


def test_a_reason_names_the_operators_own_line_not_the_library_it_called() -> None:
    reason = Harness(Emitter).send("k", "json").reason
    assert reason is not None
    assert reason.startswith("JSONDecodeError: Expecting property name")
    assert "(at test_sdk.py:" in reason and "in process)" in reason


def test_clearing_a_map_removes_every_entry_across_pages() -> None:
    class Clear(weir.Operator):
        name = "clear"
        states = [SEEN]

        def process(self, ctx: weir.Context, record: weir.Record) -> None:
            m = ctx.map(SEEN)
            if record.value == b"fill":
                for i in range(600):
                    m[f"w{i:04}"] = i
            else:
                m.clear()
                ctx.emit_json(b"", {"len": len(m)})

    h = Harness(Clear)
    h.send("k", "fill")
    assert json.loads(h.send("k", "clear").emitted[0].value) == {"len": 0}
    assert h.map("k", SEEN) == {}


COUNT = weir.ValueState("count", int)


class Reminder(weir.Operator):
    """Counts records per key and, after each, sets an event-time timer `close` at the record's
    timestamp + 100 and a processing-time timer `idle` 1 s after the call; a fired timer emits
    its name, time and the key's count. A record `again` re-arms `close` from `on_timer`; a
    record `boom` makes `close` raise after writing state."""

    name = "reminder"
    states = [COUNT]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        ctx.set(COUNT, ctx.get(COUNT, 0) + 1)
        ctx.set_timer("close", record.timestamp_ms + 100)
        ctx.set_timer("idle", ctx.processing_time() + 1000, weir.PROCESSING_TIME)
        if record.value == b"clear":
            ctx.clear_timer("idle")
        if record.value in (b"again", b"boom"):
            ctx.set(weir.ValueState("count", int), 1000 if record.value == b"boom" else 0)

    def on_timer(self, ctx: weir.Context, timer: weir.Timer) -> None:
        assert ctx.timer(timer.name) is None, "a fired timer is already removed"
        count = ctx.get(COUNT, 0)
        if timer.name == "close" and count == 1000:
            ctx.set(COUNT, -1)
            raise weir.Reject("boom")
        if timer.name == "close" and count == 0:
            ctx.set(COUNT, 1)
            ctx.set_timer("close", timer.time_ms + 50)
        ctx.emit_json(timer.key, {"fired": timer.name, "at": timer.time_ms, "count": count,
                                  "watermark": ctx.watermark(), "now": ctx.processing_time()})


def test_event_time_timers_fire_in_time_order_when_the_watermark_passes_them() -> None:
    h = Harness(Reminder)
    h.send("b", "x", timestamp_ms=300)
    h.send("a", "x", timestamp_ms=100)
    h.send("a", "x", timestamp_ms=150)  # moves a's `close` to 250
    assert h.timers("a")["close"] == (250, weir.EVENT_TIME)
    assert h.advance_watermark(249) == []
    fired = h.advance_watermark(400)
    assert [(t.key, t.time_ms) for t, _ in fired] == [(b"a", 250), (b"b", 400)]
    assert [json.loads(o.emitted[0].value)["count"] for _, o in fired] == [2, 1]
    assert json.loads(fired[0][1].emitted[0].value)["watermark"] == 400
    assert h.advance_watermark(300) == [], "the watermark never goes back"
    assert h.watermark == 400


def test_processing_time_timers_fire_as_time_is_advanced_and_clear_removes_them() -> None:
    h = Harness(Reminder, processing_time_ms=10_000)
    h.send("k", "x", timestamp_ms=1)
    h.send("q", "clear", timestamp_ms=1)
    assert "idle" not in h.timers("q")
    assert h.advance_processing_time(999) == []
    [(timer, outcome)] = h.advance_processing_time(1)
    assert (timer.key, timer.name, timer.time_ms, timer.domain) == (
        b"k", "idle", 11_000, weir.PROCESSING_TIME)
    assert json.loads(outcome.emitted[0].value)["now"] == 11_000
    assert h.pending_timers() == 2  # both `close` timers


def test_a_timer_re_armed_at_or_before_the_watermark_fires_in_the_next_round() -> None:
    h = Harness(Reminder)
    h.send("k", "again", timestamp_ms=0)
    fired = h.advance_watermark(1_000)
    assert [t.time_ms for t, _ in fired] == [100, 150]
    assert h.timers("k") == {"idle": (1_000, weir.PROCESSING_TIME)}


def test_a_refused_timer_is_dead_lettered_and_its_writes_discarded() -> None:
    h = Harness(Reminder)
    h.send("k", "boom", timestamp_ms=0)
    [(timer, outcome)] = h.advance_watermark(100)
    assert not outcome.ok and outcome.reason == "boom"
    assert h.dead_timers == [(timer, "boom")]
    assert h.value("k", COUNT) == 1000, "its write was undone"
    assert "close" not in h.timers("k"), "and it is gone"


def test_timer_names_and_the_per_key_limit_are_the_hosts() -> None:
    class Many(weir.Operator):
        name = "many"

        def process(self, ctx: weir.Context, record: weir.Record) -> None:
            for i in range(int(record.value)):
                ctx.set_timer(f"t{i}", i)

    h = Harness(Many)
    assert h.send("k", "1024").ok
    out = h.send("j", "1025")
    assert out.reason == "timer error: a key may have at most 1024 timers"
    assert h.timers("j") == {}, "nothing of the refused record stays"


@dataclass
class Count:
    count: int = 0
    last_seen_ms: int = -1


def _from_plain(version: int, value: object) -> object:
    if version == 0:
        return {"count": value, "last_seen_ms": -1}
    raise ValueError(f"no upgrade from schema version {version}")


COUNT_V1 = weir.ValueState("count", Count, version=1, upgrade=_from_plain)


class CounterV2(weir.Operator):
    """S12's counter v2: `count` was a plain number (schema version 0)."""

    name = "counter"
    version = "0.2.0"
    states = [COUNT_V1]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        state = ctx.get(COUNT_V1) or Count()
        state.count += 1
        state.last_seen_ms = record.timestamp_ms
        ctx.set(COUNT_V1, state)


def test_a_versioned_state_upgrades_older_values_as_read_and_refuses_newer_ones() -> None:
    h = Harness(CounterV2)
    # What `counter` (the Rust fixture, schema version 0) stored: the count alone.
    h._host.values[(b"a", "count")] = b"41"
    assert h.send("a", "x").ok
    stored = h._host.values[(b"a", "count")]
    assert stored[:5] == b"\x00\x00\x00\x00\x01"
    assert json.loads(stored[5:])["count"] == 42
    assert h.value("a", COUNT_V1) == Count(42, -1)
    assert COUNT_V1.version == 1
    # A value of a newer schema version: the record fails naming the state.
    h._host.values[(b"b", "count")] = b"\x00\x00\x00\x00\x02{}"
    out = h.send("b", "x")
    assert out.reason is not None
    assert out.reason.startswith("cannot decode state `count`: ")
    assert "schema version 2" in out.reason
    with pytest.raises(ValueError, match="needs an upgrade"):
        weir.ValueState("count", Count, version=1)


class Router(weir.Operator):
    """Sends records over the stage's `threshold` parameter to `late`, timestamped with their
    value; the others to `default`, tagged with the input they came from."""

    name = "router"
    outputs = ["late"]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        threshold = int(ctx.parameter("threshold") or "0")
        delay = int(record.value)
        if record.key == b"nowhere":
            ctx.emit_to("early", record.key, record.value)
        elif delay > threshold:
            ctx.emit_to("late", record.key, record.value, timestamp_ms=delay)
        else:
            ctx.emit_json(record.key, {"input": record.input, "params": ctx.parameters()})


def test_named_outputs_timestamps_parameters_and_inputs_reach_the_operator() -> None:
    h = Harness(Router, parameters={"threshold": "60"})
    out = h.send("a", "90")
    assert [(o.output, o.value, o.timestamp_ms) for o in out.emitted] == [("late", b"90", 90)]
    out = h.send("a", "5", input=1)
    assert [(o.output, o.timestamp_ms) for o in out.emitted] == [("default", None)]
    assert json.loads(out.emitted[0].value) == {"input": 1, "params": {"threshold": "60"}}
    out = h.send("nowhere", "1")
    assert out.reason == "emit error: the operator declares no output `early`"
