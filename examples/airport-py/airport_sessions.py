"""airport-sessions, in Python: per origin airport, its operating sessions (runs of scheduled
departures less than two hours apart); when the watermark closes one it emits the first and last
scheduled departure, the number of flights and their total air time (minutes; a missing air time
counts 0).

The same operator as `examples/airport-sessions` (Rust): same window state, same output bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import weir
from weir.windows import SessionWindows, WindowResult


@dataclass
class SessionStats:
    """One session's accumulator (the Rust operator's `SessionStats`)."""

    flights: int = 0
    air_time: int = 0


def merge(a: SessionStats, b: SessionStats) -> SessionStats:
    a.flights += b.flights
    a.air_time += b.air_time
    return a


GAP_MS = 2 * 3_600_000
SESSIONS = SessionWindows("sessions", GAP_MS, merge, acc_type=SessionStats)


def emit(ctx: weir.Context, origin: bytes, result: WindowResult[SessionStats]) -> None:
    ctx.emit_json(
        origin,
        {
            "origin": origin.decode(),
            "first_departure_ms": result.window.start_ms,
            "last_departure_ms": result.window.end_ms - GAP_MS,
            "flights": result.acc.flights,
            "air_time": result.acc.air_time,
            "update": result.update,
        },
    )


class AirportSessions(weir.Operator):
    name = "airport-sessions"
    version = "0.1.0"
    states = [SESSIONS.state]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        flight = weir.loads(record.value)
        if not isinstance(flight, dict):
            raise weir.Reject("invalid JSON: expected a flight object")
        air_time = flight.get("air_time")
        if air_time is not None and (not isinstance(air_time, int) or isinstance(air_time, bool)):
            raise weir.Reject("invalid JSON: air_time must be an integer or null")
        if record.timestamp_ms < 0:
            raise weir.Reject("a flight needs its scheduled departure as timestamp")
        added = SESSIONS.add(ctx, record.timestamp_ms, SessionStats(1, air_time or 0))
        for update in added.updates:
            emit(ctx, record.key, update)
        if added.dropped:
            ctx.log(weir.WARN, f"flight at {record.timestamp_ms} ms too late for its session")

    def on_timer(self, ctx: weir.Context, timer: weir.Timer) -> None:
        result = SESSIONS.on_timer(ctx, timer)
        if result is not None:
            emit(ctx, timer.key, result)


Operator = weir.export(AirportSessions)
