"""The `Operator` base class, and `export`, which drives one from the exported `process-batch`."""

from __future__ import annotations

from collections.abc import Sequence
import logging
import os
import re
import traceback
from typing import Any, ClassVar

from ._context import (
    DEBUG,
    ERROR,
    INFO,
    TRACE,
    WARN,
    Context,
    Host,
    Level,
    Record,
    Reject,
    Timer,
    _level,
)
from ._state import MapState, ValueState


_NAME = re.compile(r".{1,64}", re.DOTALL)
_REASON_CHARS = 4096


class Operator:
    """A stream operator: subclass it, declare `name`, `version` and `states`, and implement
    `process`, which the host calls once per input record, in offset order per partition.

    An instance lives in the component's linear memory, which is scratch: the host may discard
    it between any two batches (after a trap, on rebalance, on restart, or because it runs
    several instances), so keep nothing in it that must persist; that goes through state.
    """

    name: ClassVar[str]
    """The operator's name, 1..=64 bytes."""
    version: ClassVar[str] = "0.1.0"
    """The operator's version, at most 64 bytes (semver recommended)."""
    states: ClassVar[Sequence[ValueState[Any] | MapState[Any, Any]]] = ()
    """Every named state the operator uses; the host refuses undeclared names."""
    outputs: ClassVar[Sequence[str]] = ()
    """The named outputs it emits to with `ctx.emit_to` besides `"default"` (at most 16, each
    1..=64 bytes of `[a-z0-9_-]`); the pipeline binds each to a topic or a later stage."""

    def process(self, ctx: Context, record: Record) -> None:
        """Processes one record: read and write its key's state and emit through `ctx`.

        Raise `Reject` (or let any `Exception` out) to refuse the record: it is dead-lettered
        with the reason, and its state writes and emits are discarded.
        """
        raise NotImplementedError

    def on_timer(self, ctx: Context, timer: Timer) -> None:
        """Handles a timer of `timer.key` that fired (as Flink's `onTimer`): `ctx` acts for that
        key as for a record. The timer is already removed; set it again to re-arm it. Timers
        fire in time order, never before the key's earlier records. Raising refuses it as
        `process` does (its effects discarded, the timer dead-lettered). Does nothing unless
        overridden.
        """


_OUTPUT_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


def _check(operator: type[Operator]) -> None:
    if not (isinstance(operator, type) and issubclass(operator, Operator)):
        raise TypeError(f"export() takes a subclass of weir.Operator, not {operator!r}")
    name = getattr(operator, "name", None)
    if not isinstance(name, str) or not 0 < len(name.encode()) <= 64:
        raise ValueError(f"{operator.__name__}.name must be a str of 1..=64 bytes")
    if not isinstance(operator.version, str) or len(operator.version.encode()) > 64:
        raise ValueError(f"{operator.__name__}.version must be a str of at most 64 bytes")
    seen: set[str] = set()
    for state in operator.states:
        if not isinstance(state, (ValueState, MapState)):
            raise TypeError(f"{operator.__name__}.states holds {state!r}, not a state")
        if state.name in seen:
            raise ValueError(f"{operator.__name__}.states declares {state.name!r} twice")
        seen.add(state.name)
    if len(operator.outputs) > 16 or len(set(operator.outputs)) != len(operator.outputs):
        raise ValueError(f"{operator.__name__}.outputs must be at most 16 distinct names")
    for output in operator.outputs:
        valid = isinstance(output, str) and 0 < len(output) <= 64 and output != "default"
        if not valid or not all(c in _OUTPUT_NAME_CHARS for c in output):
            raise ValueError(
                f"{operator.__name__}.outputs: {output!r} is not 1..=64 of [a-z0-9_-] or is `default`"
            )
    if operator.process is Operator.process:
        raise TypeError(f"{operator.__name__} does not implement process()")


_LIBRARY_DIRS = (
    os.path.dirname(os.__file__) + os.sep,  # the standard library
    os.path.dirname(__file__) + os.sep,  # this SDK
)


def rejection_reason(error: BaseException) -> str:
    """The dead-letter reason of an exception that left `process`: the `Reject` reason, or the
    exception's type and message with the innermost place in the operator's own code (not the
    standard library's or the SDK's) it went through, at most 4 KiB."""
    if isinstance(error, Reject):
        return error.reason[:_REASON_CHARS]
    where = ""
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if not f.filename.startswith(_LIBRARY_DIRS)]
    if own or frames:
        last = (own or frames)[-1]
        where = f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name})"
    return f"{type(error).__name__}: {error}{where}"[:_REASON_CHARS]


_host: Host | None = None


def log(level: int, message: str) -> None:
    """Writes a line to the host's log at `level` — `weir.TRACE` … `weir.ERROR`, or a `logging`
    level such as `logging.INFO` — rate-limited by the host and truncated at 4 KiB. Never
    fails; outside a running operator the line is dropped."""
    if _host is not None:
        _host.log(_level(level), str(message))


class HostLogHandler(logging.Handler):
    """A `logging` handler that writes records to the host's log, mapping `logging` levels to
    the WIT levels (below DEBUG → trace, WARNING → warn, ERROR and above → error)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            log(record.levelno if record.levelno >= logging.DEBUG else TRACE, self.format(record))
        except Exception:
            self.handleError(record)


logger = logging.getLogger("weir.operator")
"""A `logging.Logger` whose records go to the host's log (level INFO; `logger.setLevel` to
change it). Loggers named `weir.operator.*` propagate to it."""
logger.addHandler(HostLogHandler())
logger.setLevel(logging.INFO)
logger.propagate = False


class Driver:
    """Runs an `Operator` over batches on a `Host`: the body of the exported interface."""

    __slots__ = ("operator", "info", "_ctx")

    def __init__(self, operator: type[Operator], host: Host) -> None:
        _check(operator)
        self.operator = operator()
        self._ctx = Context(host)

    def process_batch(self, records: Sequence[Record], ok: Any, reject: Any) -> list[Any]:
        """One disposition per record, `ok` or `reject(reason)`, in order. An exception out of
        `process` (`SystemExit` included) refuses its record only."""
        global _host
        _host = self._ctx._host  # where `weir.log` and `weir.logger` write
        process = self.operator.process
        ctx = self._ctx
        dispositions = []
        for index, record in enumerate(records):
            ctx._index = index
            try:
                process(ctx, record)
            except (Exception, SystemExit) as error:
                dispositions.append(reject(rejection_reason(error)))
            else:
                dispositions.append(ok)
        return dispositions

    def on_timers(self, timers: Sequence[Timer], ok: Any, reject: Any) -> list[Any]:
        """One disposition per fired timer, as `process_batch` gives per record: index `i` of
        the context stands for `timers[i]` and its key."""
        global _host
        _host = self._ctx._host
        on_timer = self.operator.on_timer
        ctx = self._ctx
        dispositions = []
        for index, timer in enumerate(timers):
            ctx._index = index
            try:
                on_timer(ctx, timer)
            except (Exception, SystemExit) as error:
                dispositions.append(reject(rejection_reason(error)))
            else:
                dispositions.append(ok)
        return dispositions


def export(operator: type[Operator]) -> type:
    """The class componentize-py exports as the world's `operator` interface. Bind it to the
    name `Operator` at the end of the app module (as the Rust SDK's `export_operator!`):

        Operator = weir.export(FlightDelays)

    Checks the declaration at build time: raises `TypeError` or `ValueError` for a class that is
    not a `weir.Operator`, a bad name or version, a state declared twice, or no `process`.
    """
    _check(operator)
    # Everything a component runs must be imported now, while componentize-py snapshots the
    # interpreter: at run time the component has no filesystem to import from. Outside a
    # component (plain CPython, as in tests with `weir.testing`) there are no WIT bindings.
    try:
        from . import _wit
    except ModuleNotFoundError as e:
        if e.name not in ("wit_world", "componentize_py_types"):
            raise
        _wit = None  # type: ignore[assignment]

    driver = Driver(operator, _wit.WitHost()) if _wit is not None else None

    class Exported:
        """`weir:operator/operator`, driving the operator with the WIT imports."""

        def describe(self) -> Any:
            if _wit is None:
                raise RuntimeError("not in a component: build the module with componentize-py")
            return _wit.operator_info(
                operator.name, operator.version, operator.states, operator.outputs
            )

        def process_batch(self, records: list[Any]) -> list[Any]:
            if driver is None:
                raise RuntimeError("not in a component: build the module with componentize-py")
            return driver.process_batch(records, _wit.OK, _wit.reject)

        def on_timers(self, timers: list[Any]) -> list[Any]:
            if driver is None:
                raise RuntimeError("not in a component: build the module with componentize-py")
            return driver.on_timers([_wit.timer(t) for t in timers], _wit.OK, _wit.reject)

    Exported.__name__ = Exported.__qualname__ = "Operator"
    return Exported
