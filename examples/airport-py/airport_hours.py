"""airport-hours, in Python: per origin airport and hour of scheduled departure (event time), the
number of flights and the mean and maximum arrival delay (minutes; flights whose delay is missing
count as flights only), emitted once per hour when the watermark closes it.

The same operator as `examples/airport-hours` (Rust): same window state, same output bytes, so
`weir pipeline switch` between the two keeps the open hours.
"""

from __future__ import annotations

from dataclasses import dataclass

import weir
from weir.windows import TumblingWindows, WindowResult


@dataclass
class HourStats:
    """One hour's accumulator (the Rust operator's `HourStats`, fields in the same order)."""

    flights: int = 0
    delay_count: int = 0
    delay_sum: int = 0
    delay_max: int | None = None


def merge(a: HourStats, b: HourStats) -> HourStats:
    a.flights += b.flights
    a.delay_count += b.delay_count
    a.delay_sum += b.delay_sum
    if b.delay_max is not None:
        a.delay_max = b.delay_max if a.delay_max is None else max(a.delay_max, b.delay_max)
    return a


HOUR_MS = 3_600_000
ALLOWED_LATENESS_MS = 30 * 60_000
HOURS = TumblingWindows(
    "hours", HOUR_MS, merge, allowed_lateness_ms=ALLOWED_LATENESS_MS, acc_type=HourStats
)


def emit(ctx: weir.Context, origin: bytes, result: WindowResult[HourStats]) -> None:
    s = result.acc
    ctx.emit_json(
        origin,
        {
            "origin": origin.decode(),
            "hour_start_ms": result.window.start_ms,
            "flights": s.flights,
            "delay_count": s.delay_count,
            "delay_mean": s.delay_sum / s.delay_count if s.delay_count else None,
            "delay_max": s.delay_max,
            "update": result.update,
        },
    )


class AirportHours(weir.Operator):
    name = "airport-hours"
    version = "0.1.0"
    states = [HOURS.state]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        flight = weir.loads(record.value)
        if not isinstance(flight, dict):
            raise weir.Reject("invalid JSON: expected a flight object")
        delay = flight.get("arr_delay")
        if delay is not None and (not isinstance(delay, int) or isinstance(delay, bool)):
            raise weir.Reject("invalid JSON: arr_delay must be an integer or null")
        if record.timestamp_ms < 0:
            raise weir.Reject("a flight needs its scheduled departure as timestamp")
        acc = HourStats(1, int(delay is not None), delay or 0, delay)
        added = HOURS.add(ctx, record.timestamp_ms, acc)
        for update in added.updates:
            emit(ctx, record.key, update)
        if added.dropped:
            ctx.log(weir.WARN, f"flight at {record.timestamp_ms} ms too late for its hour")

    def on_timer(self, ctx: weir.Context, timer: weir.Timer) -> None:
        result = HOURS.on_timer(ctx, timer)
        if result is not None:
            emit(ctx, timer.key, result)


Operator = weir.export(AirportHours)
