"""Unit-test an operator in plain CPython (pytest, no component, no host), as Flink's operator
test harnesses do: state in memory, batches processed with the host's rules.

    from weir.testing import Harness

    def test_counts_per_key():
        h = Harness(Counter)
        h.send(b"a", b"{}")
        out = h.send(b"a", b"{}")
        assert out.ok and out.emitted[0].value == b'{"count":2}'
        assert h.value(b"a", COUNT) == 2

What it keeps of the host: state scoped to each record's key; a record's state writes and emits
applied only if it is processed (a `Reject` or any exception discards them); undeclared states,
the wrong kind, values over 1 MiB, map keys over 4 KiB and output over 1 MiB per record refused
with the host's reasons; map iteration in ascending byte order of encoded keys; timers (one per
key and name, at most 1,024 per key) fired in time order, each removed before its `on_timer`
runs. Time moves only when the test says: `advance_watermark` and `advance_processing_time`
fire what becomes due, as the host does between records. What it does not: TTL expiry,
durability, watermarks from record timestamps, and the Wasm sandbox itself (memory and CPU
caps) — build the component and run it in Weir for those.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
import bisect
from typing import Any, TypeVar

from ._context import EVENT_TIME, PROCESSING_TIME, Reject, TimeDomain, Timer
from ._operator import Driver, Operator
from ._state import MapState, ValueState

T = TypeVar("T")

VALUE_BYTES_MAX = 1 << 20
"""The host's default limit on a state value, bytes."""
MAP_KEY_BYTES_MAX = 4 << 10
"""The host's default limit on a map key, bytes."""
EMIT_BYTES_MAX = 1_000_000
"""The host's default limit on the output of one input record, bytes (keys, values and headers,
plus 64 per emit and 64 per header)."""
OUTPUT_RECORD_BYTES_MAX = 1_000_000
"""The largest output record, as Kafka counts it (key, value and headers, plus 97 bytes of
framing and 10 per header): the producer's default `message.max.bytes`. A pipeline's output
topic may take less (its `max.message.bytes`)."""
MAP_PAGE_MAX = 1024
"""The host's cap on a map page."""
TIMERS_PER_KEY_MAX = 1024
"""The host's default limit on the timers of one key."""
TIMER_NAME_BYTES_MAX = 128
"""The longest timer name, bytes."""
LEVELS = ("trace", "debug", "info", "warn", "error")


@dataclass
class Header:
    """A Kafka header of a test record."""

    name: str
    value: bytes


@dataclass
class TestRecord:
    """An input record as the host passes it (see `weir.Record`)."""

    key: bytes
    value: bytes
    timestamp_ms: int = -1
    headers: list[Header] = field(default_factory=list)
    topic: str = "input"
    partition: int = 0
    offset: int = 0
    input: int = 0


@dataclass
class Output:
    """A record the operator emitted: to `output` (`"default"` or a named one), with
    `timestamp_ms` when the operator gave one (None: its input record's)."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    output: str = "default"
    timestamp_ms: int | None = None


@dataclass
class Outcome:
    """What became of one input record: `reason` is None when it was processed, else the
    dead-letter reason; `emitted` holds its outputs (empty when rejected)."""

    reason: str | None
    emitted: list[Output]

    @property
    def ok(self) -> bool:
        """Whether the record was processed (not dead-lettered)."""
        return self.reason is None


_ABSENT = object()


class _MemoryHost:
    """The host imports over dictionaries, with an undo log per record."""

    def __init__(
        self,
        states: Sequence[ValueState[Any] | MapState[Any, Any]],
        outputs: Sequence[str] = (),
        parameters: dict[str, str] | None = None,
    ) -> None:
        self.kinds = {s.name: s.kind for s in states}
        self.outputs = set(outputs)
        self.params = dict(parameters or {})
        self.global_tables: dict[str, dict[bytes, bytes]] = {}
        self.values: dict[tuple[bytes, str], bytes] = {}
        self.maps: dict[tuple[bytes, str], dict[bytes, bytes]] = {}
        self.keys: list[bytes] = []
        self.undo: list[tuple[dict[Any, Any], Any, Any]] = []
        self.emitted: list[Output] = []
        self.emitted_bytes = 0
        self.logs: list[tuple[str, str]] = []
        self.timers: dict[tuple[bytes, str], tuple[int, TimeDomain]] = {}
        self.watermark_ms: int | None = None
        self.now_ms = 0

    def _slot(self, record: int, name: str, kind: str) -> tuple[bytes, str]:
        if not 0 <= record < len(self.keys):
            raise Reject(f"state error: invalid record index {record}")
        declared = self.kinds.get(name)
        if declared is None:
            raise Reject(f"state error: undeclared state `{name}`")
        if declared != kind:
            raise Reject(f"state error: state `{name}` is of the other kind")
        return (self.keys[record], name)

    def _write(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        self.undo.append((table, key, table.get(key, _ABSENT)))
        if value is _ABSENT:
            table.pop(key, None)
        else:
            table[key] = value

    def _map(self, record: int, name: str, key: bytes) -> dict[bytes, bytes]:
        slot = self._slot(record, name, "map")
        if len(key) > MAP_KEY_BYTES_MAX:
            raise Reject(f"state error: larger than the limit of {MAP_KEY_BYTES_MAX} bytes")
        entries = self.maps.get(slot)
        if entries is None:
            entries = {}
            self._write(self.maps, slot, entries)
        return entries

    def value_get(self, record: int, name: str) -> bytes | None:
        return self.values.get(self._slot(record, name, "value"))

    def get_many(self, record: int, names: list[str]) -> list[bytes | None]:
        return [self.value_get(record, n) for n in names]

    def value_set(self, record: int, name: str, value: bytes) -> None:
        slot = self._slot(record, name, "value")
        if len(value) > VALUE_BYTES_MAX:
            raise Reject(f"state error: larger than the limit of {VALUE_BYTES_MAX} bytes")
        self._write(self.values, slot, bytes(value))

    def value_clear(self, record: int, name: str) -> None:
        self._write(self.values, self._slot(record, name, "value"), _ABSENT)

    def map_get(self, record: int, name: str, key: bytes) -> bytes | None:
        return self._map(record, name, key).get(key)

    def map_put(self, record: int, name: str, key: bytes, value: bytes) -> None:
        entries = self._map(record, name, key)
        if len(value) > VALUE_BYTES_MAX:
            raise Reject(f"state error: larger than the limit of {VALUE_BYTES_MAX} bytes")
        self._write(entries, bytes(key), bytes(value))

    def map_remove(self, record: int, name: str, key: bytes) -> None:
        self._write(self._map(record, name, key), key, _ABSENT)

    def map_iterate(
        self, record: int, name: str, start_after: bytes | None, page_size: int
    ) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
        entries = self.maps.get(self._slot(record, name, "map"), {})
        keys = sorted(entries)
        start = 0 if start_after is None else bisect.bisect_right(keys, start_after)
        page = keys[start : start + min(max(page_size, 1), MAP_PAGE_MAX)]
        more = start + len(page) < len(keys)
        return [(k, entries[k]) for k in page], (page[-1] if more and page else None)

    def emit(
        self, record: int, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]
    ) -> None:
        self.emit_to(record, "default", key, value, headers, None)

    def emit_to(
        self,
        record: int,
        output: str,
        key: bytes,
        value: bytes,
        headers: Sequence[tuple[str, bytes]],
        timestamp_ms: int | None,
    ) -> None:
        if output != "default" and output not in self.outputs:
            raise Reject(f"emit error: the operator declares no output `{output}`")
        if not 0 <= record < len(self.keys):
            raise Reject(f"emit error: invalid record index {record}")
        wire = 97 + len(key) + len(value) + sum(10 + len(n.encode()) + len(v) for n, v in headers)
        if wire > OUTPUT_RECORD_BYTES_MAX:
            raise Reject(
                "emit error: output for this record exceeds the limit of "
                f"{OUTPUT_RECORD_BYTES_MAX} bytes"
            )
        size = len(key) + len(value) + 64 + sum(64 + len(n.encode()) + len(v) for n, v in headers)
        if self.emitted_bytes + size > EMIT_BYTES_MAX:
            raise Reject(
                f"emit error: output for this record exceeds the limit of {EMIT_BYTES_MAX} bytes"
            )
        self.emitted_bytes += size
        self.emitted.append(
            Output(
                bytes(key), bytes(value), [(n, bytes(v)) for n, v in headers], output, timestamp_ms
            )
        )

    def parameter(self, name: str) -> str | None:
        return self.params.get(name)

    def parameters(self) -> list[tuple[str, str]]:
        return sorted(self.params.items())

    def table_get(self, name: str, key: bytes) -> bytes | None:
        if len(key) > MAP_KEY_BYTES_MAX:
            raise Reject(f"state error: larger than the limit of {MAP_KEY_BYTES_MAX} bytes")
        rows = self.global_tables.get(name)
        if rows is None:
            raise Reject(f"table error: the stage reads no global table `{name}`")
        return rows.get(bytes(key))

    def log(self, level: int, message: str) -> None:
        self.logs.append((LEVELS[level], message.encode()[:4096].decode(errors="ignore")))

    def _timer(self, record: int, name: str) -> tuple[bytes, str]:
        if not 0 <= record < len(self.keys):
            raise Reject(f"timer error: invalid record index {record}")
        if not 0 < len(name.encode()) <= TIMER_NAME_BYTES_MAX:
            raise Reject(f"timer error: names are 1..=128 bytes, not `{name}`")
        return (self.keys[record], name)

    def timer_set(self, record: int, name: str, at_ms: int, domain: TimeDomain) -> None:
        slot = self._timer(record, name)
        if slot not in self.timers:
            if sum(1 for key, _ in self.timers if key == slot[0]) >= TIMERS_PER_KEY_MAX:
                raise Reject(f"timer error: a key may have at most {TIMERS_PER_KEY_MAX} timers")
        self._write(self.timers, slot, (int(at_ms), domain))

    def timer_clear(self, record: int, name: str) -> None:
        self._write(self.timers, self._timer(record, name), _ABSENT)

    def timer_get(self, record: int, name: str) -> tuple[int, TimeDomain] | None:
        return self.timers.get(self._timer(record, name))

    def watermark(self) -> int | None:
        return self.watermark_ms

    def processing_time(self) -> int:
        return self.now_ms


class Harness:
    """Runs `operator` over records you give it, one record per batch (a batch of several
    behaves the same, since each record's writes are visible to the next at once)."""

    def __init__(
        self,
        operator: type[Operator],
        *,
        processing_time_ms: int = 0,
        parameters: dict[str, str] | None = None,
        global_tables: dict[str, dict[bytes, bytes]] | None = None,
    ) -> None:
        self._host = _MemoryHost(operator.states, operator.outputs, parameters)
        for name, rows in (global_tables or {}).items():
            self._host.global_tables[name] = {bytes(k): bytes(v) for k, v in rows.items()}
        self._host.now_ms = processing_time_ms
        self._driver = Driver(operator, self._host)
        self.outputs: list[Output] = []
        """Every record emitted by processed records and fired timers, in order."""
        self.dead_letters: list[tuple[TestRecord, str]] = []
        """Every rejected record with its reason, in order."""
        self.dead_timers: list[tuple[Timer, str]] = []
        """Every fired timer that was refused, with its reason, in order."""
        self._offset = 0

    def set_global_row(self, name: str, key: bytes, value: bytes | None) -> None:
        """Sets (or, with None, deletes: a tombstone) the row of `key` in global table `name`,
        as an update of its topic that the host applied before the next record."""
        rows = self._host.global_tables.setdefault(name, {})
        if value is None:
            rows.pop(bytes(key), None)
        else:
            rows[bytes(key)] = bytes(value)

    @property
    def logs(self) -> list[tuple[str, str]]:
        """Every (level, line) the operator logged."""
        return self._host.logs

    def process(self, record: TestRecord) -> Outcome:
        """Processes one record and says what became of it."""
        outcome = self._call(
            record.key, lambda: self._driver.process_batch([record], None, lambda r: r)
        )
        if not outcome.ok:
            self.dead_letters.append((record, outcome.reason or ""))
        return outcome

    def _call(self, key: bytes, call: Any) -> Outcome:
        """One call for `key`: its effects kept if it returns ok, else undone."""
        host = self._host
        host.keys = [key]
        host.undo.clear()
        host.emitted = []
        host.emitted_bytes = 0
        [disposition] = call()
        if disposition is None:
            self.outputs.extend(host.emitted)
            return Outcome(None, host.emitted)
        for table, k, previous in reversed(host.undo):
            if previous is _ABSENT:
                table.pop(k, None)
            else:
                table[k] = previous
        return Outcome(disposition, [])

    # time

    @property
    def watermark(self) -> int | None:
        """The event-time watermark operators see, ms (None until advanced)."""
        return self._host.watermark_ms

    @property
    def processing_time(self) -> int:
        """The processing time operators see, ms."""
        return self._host.now_ms

    def advance_watermark(self, to_ms: int) -> list[tuple[Timer, Outcome]]:
        """Moves the watermark to `to_ms` (never back) and fires every event-time timer at or
        before it, in time order; returns each fired timer with what became of it."""
        if self._host.watermark_ms is None or to_ms > self._host.watermark_ms:
            self._host.watermark_ms = to_ms
        return self._fire(EVENT_TIME, self._host.watermark_ms)

    def advance_processing_time(self, by_ms: int) -> list[tuple[Timer, Outcome]]:
        """Moves processing time forward *by* `by_ms` and fires every processing-time timer due
        by then, in time order; returns each fired timer with what became of it."""
        self._host.now_ms += by_ms
        return self._fire(PROCESSING_TIME, self._host.now_ms)

    def timers(self, key: bytes | str) -> dict[str, tuple[int, TimeDomain]]:
        """The pending timers of `key`: name → (time, domain)."""
        k = key.encode() if isinstance(key, str) else key
        return {name: at for (tk, name), at in sorted(self._host.timers.items()) if tk == k}

    def pending_timers(self) -> int:
        """How many timers are pending, all keys."""
        return len(self._host.timers)

    def _fire(self, domain: TimeDomain, up_to: int) -> list[tuple[Timer, Outcome]]:
        """Rounds of due timers, as the host fires them: each round those due when it starts,
        at most one per key, in the host's order (time, then key length, key and name); a timer
        re-armed at or before `up_to`, or the next of a key, fires in the next round."""
        fired: list[tuple[Timer, Outcome]] = []
        while True:
            due = sorted(
                (at, len(key), key, name)
                for (key, name), (at, d) in self._host.timers.items()
                if d == domain and at <= up_to
            )
            if not due:
                return fired
            keys: set[bytes] = set()
            for at, _, key, name in due:
                if key in keys:
                    continue  # the next of a key fires in the next round
                keys.add(key)
                del self._host.timers[(key, name)]
                timer = Timer(key, name, at, domain)
                outcome = self._call(
                    key, lambda t=timer: self._driver.on_timers([t], None, lambda r: r)
                )
                if not outcome.ok:
                    self.dead_timers.append((timer, outcome.reason or ""))
                fired.append((timer, outcome))

    def send(
        self,
        key: bytes | str,
        value: bytes | str,
        *,
        timestamp_ms: int = -1,
        headers: Iterable[tuple[str, bytes]] = (),
        partition: int = 0,
        input: int = 0,
    ) -> Outcome:
        """Processes a record made of these parts (`str` encoded as UTF-8), at the next offset,
        as read from the stage's input `input`."""
        record = TestRecord(
            key.encode() if isinstance(key, str) else key,
            value.encode() if isinstance(value, str) else value,
            timestamp_ms,
            [Header(n, v) for n, v in headers],
            partition=partition,
            offset=self._offset,
            input=input,
        )
        self._offset += 1
        return self.process(record)

    def value(self, key: bytes | str, state: ValueState[T]) -> T | None:
        """The stored value of `state` for `key`, decoded; None when absent."""
        k = key.encode() if isinstance(key, str) else key
        data = self._host.values.get((k, state.name))
        return None if data is None else state.codec.decode(data)

    def map(self, key: bytes | str, state: MapState[Any, Any]) -> dict[Any, Any]:
        """The stored entries of `state` for `key`, decoded, in iteration order."""
        k = key.encode() if isinstance(key, str) else key
        entries = self._host.maps.get((k, state.name), {})
        return {
            state.key_codec.decode(mk): state.value_codec.decode(entries[mk])
            for mk in sorted(entries)
        }
