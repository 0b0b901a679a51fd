"""flight-delays in plain CPython, through `weir.testing.Harness`."""

import json

from flight_delays import STATS, FlightDelays, RouteStats
from weir.testing import Harness


def flight(origin: str, dest: str, arr_delay: int | None) -> str:
    return json.dumps({"year": 2013, "origin": origin, "dest": dest, "arr_delay": arr_delay})


def test_statistics_per_route_ignore_missing_delays() -> None:
    h = Harness(FlightDelays)
    assert h.send("JFK-LAX", flight("JFK", "LAX", 10)).ok
    assert h.send("JFK-LAX", flight("JFK", "LAX", None)).ok
    out = h.send("JFK-LAX", flight("JFK", "LAX", -4))
    assert out.emitted[0].key == b"JFK-LAX"
    assert out.emitted[0].value == (
        b'{"route":"JFK-LAX","flights":3,"delay_count":2,"delay_sum":6,"delay_max":10,'
        b'"delay_mean":3.0}'
    )
    assert h.value("JFK-LAX", STATS) == RouteStats(3, 2, 6, 10)


def test_a_route_without_known_delays_has_no_mean_or_max() -> None:
    out = Harness(FlightDelays).send("EWR-BOS", flight("EWR", "BOS", None))
    assert json.loads(out.emitted[0].value) == {
        "route": "EWR-BOS", "flights": 1, "delay_count": 0, "delay_sum": 0,
        "delay_max": None, "delay_mean": None,
    }


def test_what_is_not_a_flight_is_dead_lettered_and_changes_nothing() -> None:
    h = Harness(FlightDelays)
    h.send("JFK-LAX", flight("JFK", "LAX", 1))
    not_flights = [
        "not json",
        "[1,2]",
        '{"origin":"JFK"}',
        flight("JFK", "LAX", "late"),
        flight("JFK", "LAX", True),
    ]
    for bad in not_flights:
        assert not h.send("JFK-LAX", bad).ok, bad
    assert h.value("JFK-LAX", STATS) == RouteStats(1, 1, 1, 1)
    assert len(h.dead_letters) == 5
    assert len(h.outputs) == 1
