"""`Context`: the operator's handle to keyed state, timers, emit and log for the current record
(or fired timer)."""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Iterator, ItemsView, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, overload

from ._state import MapState, ValueState, dumps

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

MAP_PAGE_SIZE = 256
"""Entries asked of the host per page when iterating a map state."""


class TimeDomain(enum.Enum):
    """The two kinds of time a timer can be set in (as Flink's `TimeDomain`)."""

    EVENT_TIME = "event-time"
    """Record timestamps, as the shard's watermark tracks them: an event-time timer fires once
    the watermark reaches its time."""
    PROCESSING_TIME = "processing-time"
    """The host's clock: a processing-time timer fires once the clock reaches its time, even
    when no record arrives."""


EVENT_TIME = TimeDomain.EVENT_TIME
PROCESSING_TIME = TimeDomain.PROCESSING_TIME


@dataclass(frozen=True)
class Timer:
    """A timer that fired, as `Operator.on_timer` receives it."""

    key: bytes
    """The key it was set for (the context acts for it)."""
    name: str
    """Its name."""
    time_ms: int
    """The time it was set for, ms of its domain."""
    domain: TimeDomain
    """Its domain."""


class Level(enum.IntEnum):
    """Levels of `Context.log` and `weir.log`, as the WIT `log.level` enum."""

    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


TRACE, DEBUG, INFO, WARN, ERROR = Level


def _level(level: int) -> int:
    if level >= logging.DEBUG:  # a `logging` level
        return (
            DEBUG if level < logging.INFO else INFO if level < logging.WARNING else
            WARN if level < logging.ERROR else ERROR
        )
    return min(max(int(level), TRACE), ERROR)



class Reject(Exception):
    """Refuses the current record: raise it from `Operator.process`.

    The record goes to the pipeline's dead-letter topic with `reason` (the host keeps at most
    4 KiB of it); the state writes and emits the record made are discarded. Any other
    `Exception` raised by `process` is treated the same way, with the exception's type, message
    and place as the reason.
    """

    def __init__(self, reason: str = "rejected by the operator") -> None:
        super().__init__(reason)
        self.reason = reason


class Header(Protocol):
    """One Kafka record header: `name` (str) and `value` (raw bytes)."""

    name: str
    value: bytes


class Record(Protocol):
    """One input record, as the host passes it (a `weir:operator/types.input-record`).

    - `key`, `value`: bytes; empty for a null key or value. State is scoped to `key`.
    - `timestamp_ms`: milliseconds since the Unix epoch, -1 when the broker gave none.
    - `headers`: list of `Header`, in order.
    - `topic`, `partition`, `offset`: where the record was read.
    - `input`: which of the stage's inputs it came from (its index in the stage's `inputs`).
    """

    key: bytes
    value: bytes
    timestamp_ms: int
    topic: str
    partition: int
    offset: int
    input: int

    @property
    def headers(self) -> Sequence[Header]:
        """The record's Kafka headers, in order."""
        ...


class Host(Protocol):
    """What the SDK needs of the host: the `weir:operator` imports, with each failure raised as
    `Reject` carrying the same reason the Rust SDK gives. The component binds it to the WIT
    imports; `weir.testing` binds it to memory."""

    def value_get(self, record: int, name: str) -> bytes | None: ...
    def get_many(self, record: int, names: list[str]) -> list[bytes | None]: ...
    def value_set(self, record: int, name: str, value: bytes) -> None: ...
    def value_clear(self, record: int, name: str) -> None: ...
    def map_get(self, record: int, name: str, key: bytes) -> bytes | None: ...
    def map_put(self, record: int, name: str, key: bytes, value: bytes) -> None: ...
    def map_remove(self, record: int, name: str, key: bytes) -> None: ...
    def map_iterate(
        self, record: int, name: str, start_after: bytes | None, page_size: int
    ) -> tuple[list[tuple[bytes, bytes]], bytes | None]: ...
    def emit(
        self, record: int, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]
    ) -> None: ...
    def emit_to(
        self,
        record: int,
        output: str,
        key: bytes,
        value: bytes,
        headers: Sequence[tuple[str, bytes]],
        timestamp_ms: int | None,
    ) -> None: ...
    def parameter(self, name: str) -> str | None: ...
    def parameters(self) -> list[tuple[str, str]]: ...
    def table_get(self, name: str, key: bytes) -> bytes | None: ...
    def log(self, level: int, message: str) -> None: ...
    def timer_set(self, record: int, name: str, at_ms: int, domain: TimeDomain) -> None: ...
    def timer_clear(self, record: int, name: str) -> None: ...
    def timer_get(self, record: int, name: str) -> tuple[int, TimeDomain] | None: ...
    def watermark(self) -> int | None: ...
    def processing_time(self) -> int: ...


Data = bytes | bytearray | memoryview | str | None
"""What `Context.emit` takes as a key, value or header value: bytes-like, `str` (UTF-8) or
`None` (empty)."""

HeadersArg = Sequence[tuple[str, Data]] | Sequence[Header] | Mapping[str, Data]
"""Headers to emit: (name, value) pairs, `Header`s (as in `record.headers`) or a mapping."""


def _bytes(data: Data) -> bytes:
    if type(data) is bytes:
        return data
    if isinstance(data, str):
        return data.encode()
    if data is None:
        return b""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"emit takes bytes, str or None, not {type(data).__name__}")


def _headers(headers: HeadersArg) -> list[tuple[str, bytes]]:
    items: Any = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for h in items:
        name, value = h if isinstance(h, tuple) else (h.name, h.value)
        if not isinstance(name, str):
            raise TypeError(f"a header name is a str, not {type(name).__name__}")
        out.append((name, _bytes(value)))
    return out


def _decode(state: str, codec: Any, data: bytes) -> Any:
    try:
        return codec.decode(data)
    except Exception as e:
        raise Reject(f"cannot decode state `{state}`: {e}") from e


def _encode(state: str, codec: Any, value: Any) -> bytes:
    try:
        return codec.encode(value)  # type: ignore[no-any-return]
    except Exception as e:
        raise Reject(f"cannot encode state `{state}`: {e}") from e


class Context:
    """Access to the current record's keyed state, to emit and to log.

    Every state call reads or writes the state of the current record's key; writes are visible
    to later records at once and become durable when the record is processed. A context is valid
    only during the `process` call it is passed to.
    """

    __slots__ = ("_host", "_index")

    def __init__(self, host: Host) -> None:
        self._host = host
        self._index = 0

    # value state

    @overload
    def get(self, state: ValueState[T]) -> T | None: ...
    @overload
    def get(self, state: ValueState[T], default: D) -> T | D: ...
    def get(self, state: ValueState[T], default: Any = None) -> Any:
        """The key's value of `state`, or `default` when it has none (never set, cleared or
        expired). Raises `Reject` when the state is undeclared or a map, or its bytes do not
        decode."""
        data = self._host.value_get(self._index, state.name)
        return default if data is None else _decode(state.name, state.codec, data)

    def get_bytes(self, state: ValueState[Any]) -> bytes | None:
        """The key's value of `state` as stored, not decoded: a table input's row is its topic's
        record value, in whatever format the topic has (docs/topologies.md, "Tables"); None when
        it has none. Raises `Reject` when the state is undeclared or a map."""
        return self._host.value_get(self._index, state.name)

    def get_many(self, *states: ValueState[Any]) -> tuple[Any, ...]:
        """The key's values of several states in one host call, `None` for each absent one."""
        names = [s.name for s in states]
        values = self._host.get_many(self._index, names)
        return tuple(
            None if data is None else _decode(s.name, s.codec, data)
            for s, data in zip(states, values)
        )

    def set(self, state: ValueState[T], value: T) -> None:
        """Sets the key's value of `state`, restarting its TTL. Raises `Reject` when the state
        is undeclared or a map, or the encoded value exceeds the host's limit (1 MiB)."""
        self._host.value_set(self._index, state.name, _encode(state.name, state.codec, value))

    def clear(self, state: ValueState[Any]) -> None:
        """Clears the key's value of `state` (a tombstone); clearing an absent value is fine."""
        self._host.value_clear(self._index, state.name)

    # map state

    def map(self, state: MapState[K, V]) -> MapView[K, V]:
        """The key's map of `state`, as a `MutableMapping` that reads and writes through the
        host: `m[k]`, `m.get(k)`, `m[k] = v`, `del m[k]`, `k in m`, iteration in ascending
        order of encoded keys (paged, `MAP_PAGE_SIZE` entries per host call)."""
        return MapView(self, state)

    # output

    def emit(self, key: Data, value: Data, headers: HeadersArg = ()) -> None:
        """Emits a record to the output topic. Keys, values and header values are bytes-like,
        `str` (UTF-8) or `None` (empty; an empty key is produced as a null key); headers are
        (name, value) pairs, `Header`s (`record.headers` forwards the input's) or a mapping.
        Raises `TypeError` for anything else, and `Reject` when this record's output exceeds
        the host's limit (1 MiB by default, counting keys, values and headers)."""
        self._host.emit(
            self._index, _bytes(key), _bytes(value), _headers(headers) if headers else ()
        )

    def emit_json(self, key: Data, value: Any) -> None:
        """Emits `value` as compact JSON (the bytes `serde_json` would write)."""
        try:
            data = dumps(value)
        except Exception as e:
            raise Reject(f"cannot encode output: {e}") from e
        self.emit(key, data)

    def emit_to(
        self,
        output: str,
        key: Data,
        value: Data,
        headers: HeadersArg = (),
        *,
        timestamp_ms: int | None = None,
    ) -> None:
        """Emits a record to output `output`: `"default"` or one the operator declares in
        `outputs` (as Flink's side outputs). `timestamp_ms` (ms since the Unix epoch) replaces
        the input record's timestamp: the record's event time in a later stage. Raises `Reject`
        as `emit` does, and for an output the operator does not declare."""
        self._host.emit_to(
            self._index,
            output,
            _bytes(key),
            _bytes(value),
            _headers(headers) if headers else (),
            timestamp_ms,
        )

    def emit_json_to(
        self, output: str, key: Data, value: Any, *, timestamp_ms: int | None = None
    ) -> None:
        """Emits `value` as compact JSON to output `output` (see `emit_to`)."""
        try:
            data = dumps(value)
        except Exception as e:
            raise Reject(f"cannot encode output: {e}") from e
        self.emit_to(output, key, data, timestamp_ms=timestamp_ms)

    def lookup_bytes(self, name: str, key: Data) -> bytes | None:
        """The row of `key` in the stage's global table `name` (an input's `global_table`:
        docs/topologies.md, "Global tables"), as its topic's record holds it; None when the
        table has no row for the key. Any key, not only the record's: the table is whole on
        every host. It holds every update the host applied before this call, which may not yet
        include one produced just before this record. Raises `Reject` when the stage reads no
        global table of that name or the key is longer than the host allows (4 KiB)."""
        return self._host.table_get(name, _bytes(key))

    def lookup(self, name: str, key: Data) -> Any:
        """`lookup_bytes`, the row decoded from JSON (None when there is none)."""
        row = self.lookup_bytes(name, key)
        if row is None:
            return None
        try:
            return json.loads(row)
        except ValueError as e:
            raise Reject(f"cannot decode the row of global table `{name}`: {e}") from e

    def parameter(self, name: str) -> str | None:
        """The value of the stage's parameter `name` (the pipeline's `parameters`), or None."""
        return self._host.parameter(name)

    def parameters(self) -> dict[str, str]:
        """Every parameter of the stage, name → value."""
        return dict(self._host.parameters())

    def log(self, level: int, message: str) -> None:
        """Writes a line to the host's log at `level`: `weir.TRACE` … `weir.ERROR`, or a
        `logging` level (`logging.INFO`); never fails (see `weir.log`)."""
        self._host.log(_level(level), str(message))

    # time

    def set_timer(self, name: str, at_ms: int, domain: TimeDomain = EVENT_TIME) -> None:
        """Sets timer `name` of the current key to fire at `at_ms` in `domain`, replacing any
        timer of that name (at most one per key and name, as Flink's named timers). Staged like
        a state write: it takes effect only if the record is processed. An event-time timer at
        or before the watermark fires in the next round. Raises `Reject` for a name that is
        empty or longer than 128 bytes, or a new name beyond the host's limit of timers per key
        (1,024 by default)."""
        self._host.timer_set(self._index, name, int(at_ms), domain)

    def clear_timer(self, name: str) -> None:
        """Removes timer `name` of the current key; removing one that is not set is fine."""
        self._host.timer_clear(self._index, name)

    def timer(self, name: str) -> tuple[int, TimeDomain] | None:
        """When timer `name` of the current key fires, and in which domain; None when unset."""
        return self._host.timer_get(self._index, name)

    def watermark(self) -> int | None:
        """The shard's event-time watermark, ms: records at or before it are late. None before
        the first record with a timestamp. Constant within a call."""
        return self._host.watermark()

    def processing_time(self) -> int:
        """The host's clock at the start of the call, ms since the Unix epoch (as Flink's
        `currentProcessingTime()`); the component's own clocks read zero."""
        return self._host.processing_time()


class MapView(MutableMapping[K, V], Generic[K, V]):
    """The current key's entries of a `MapState`, read and written through the host."""

    __slots__ = ("_ctx", "_state")

    def __init__(self, ctx: Context, state: MapState[K, V]) -> None:
        self._ctx = ctx
        self._state = state

    def _key(self, key: K) -> bytes:
        return _encode(self._state.name, self._state.key_codec, key)

    def _read(self, key: K) -> bytes | None:
        return self._ctx._host.map_get(self._ctx._index, self._state.name, self._key(key))

    def __getitem__(self, key: K) -> V:
        data = self._read(key)
        if data is None:
            raise KeyError(key)
        return _decode(self._state.name, self._state.value_codec, data)  # type: ignore[no-any-return]

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: Any = None) -> Any:
        """The value of `key`, or `default` when absent (one host call)."""
        data = self._read(key)
        return default if data is None else _decode(self._state.name, self._state.value_codec, data)

    def __contains__(self, key: object) -> bool:
        return self._read(key) is not None  # type: ignore[arg-type]

    def __setitem__(self, key: K, value: V) -> None:
        state = self._state
        self._ctx._host.map_put(
            self._ctx._index,
            state.name,
            self._key(key),
            _encode(state.name, state.value_codec, value),
        )

    def __delitem__(self, key: K) -> None:
        if self._read(key) is None:
            raise KeyError(key)
        self.discard(key)

    def discard(self, key: K) -> None:
        """Removes `key` if present, in one host call (no `KeyError`)."""
        self._ctx._host.map_remove(self._ctx._index, self._state.name, self._key(key))

    def _raw(self) -> Iterator[tuple[bytes, bytes]]:
        start_after: bytes | None = None
        while True:
            entries, start_after = self._ctx._host.map_iterate(
                self._ctx._index, self._state.name, start_after, MAP_PAGE_SIZE
            )
            yield from entries
            if start_after is None:
                return

    def entries(self) -> Iterator[tuple[K, V]]:
        """Every (key, value), in ascending order of encoded keys, a page at a time."""
        name, keys, values = self._state.name, self._state.key_codec, self._state.value_codec
        for k, v in self._raw():
            yield (_decode(name, keys, k), _decode(name, values, v))

    def __iter__(self) -> Iterator[K]:
        name, keys = self._state.name, self._state.key_codec
        return (_decode(name, keys, k) for k, _ in self._raw())

    def __len__(self) -> int:
        return sum(1 for _ in self._raw())

    def clear(self) -> None:
        """Removes every entry: one host call per page to list them, one per entry to remove."""
        host, index, name = self._ctx._host, self._ctx._index, self._state.name
        for k in [k for k, _ in self._raw()]:
            host.map_remove(index, name, k)

    def items(self) -> ItemsView[K, V]:
        return _Items(self)


class _Items(ItemsView[K, V]):
    """`items()` of a `MapView`: one host call per page rather than one per key."""

    _mapping: MapView[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return self._mapping.entries()
