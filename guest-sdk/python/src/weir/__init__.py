"""Write Weir stream operators in Python.

An operator is a subclass of `weir.Operator` whose `process(ctx, record)` the host calls once per
input record; `ctx` reads and writes the record key's state and emits records. Build the module
into a WebAssembly component of the `weir:operator` world with componentize-py and upload it as
you would a Rust one:

    import json
    import weir

    COUNT = weir.ValueState("count", int)

    class Counter(weir.Operator):
        name = "counter"
        version = "1.0.0"
        states = [COUNT]

        def process(self, ctx, record):
            count = ctx.get(COUNT, 0) + 1
            ctx.set(COUNT, count)
            ctx.emit_json(record.key, {"count": count})

    Operator = weir.export(Counter)

State values, map keys and map values are stored as compact JSON, as the Rust SDK stores them,
so either language reads the other's state. A record's writes and emits take effect only if
`process` returns; raising `weir.Reject` (or any exception) dead-letters the record instead.
Linear memory is scratch: keep nothing between records that must persist.
"""

from ._context import (
    DEBUG,
    ERROR,
    EVENT_TIME,
    INFO,
    MAP_PAGE_SIZE,
    PROCESSING_TIME,
    TRACE,
    WARN,
    Context,
    Header,
    Host,
    Level,
    MapView,
    Record,
    Reject,
    TimeDomain,
    Timer,
)
from ._operator import (
    Driver,
    HostLogHandler,
    Operator,
    export,
    log,
    logger,
    rejection_reason,
)
from ._state import (
    RAW,
    Codec,
    JsonCodec,
    MapState,
    RawCodec,
    Upgrade,
    ValueState,
    VersionedCodec,
    dumps,
    loads,
)

__all__ = [
    "DEBUG",
    "ERROR",
    "EVENT_TIME",
    "INFO",
    "MAP_PAGE_SIZE",
    "PROCESSING_TIME",
    "RAW",
    "TRACE",
    "WARN",
    "Codec",
    "Context",
    "Driver",
    "Header",
    "Host",
    "HostLogHandler",
    "JsonCodec",
    "Level",
    "MapState",
    "MapView",
    "Operator",
    "RawCodec",
    "Record",
    "Reject",
    "TimeDomain",
    "Timer",
    "Upgrade",
    "ValueState",
    "VersionedCodec",
    "dumps",
    "export",
    "loads",
    "log",
    "logger",
    "rejection_reason",
]
