"""airport-hours and airport-sessions in plain CPython, through `weir.testing.Harness`."""

import json

from airport_hours import HOURS, AirportHours
from airport_sessions import SESSIONS, AirportSessions
from weir.testing import Harness

H = 3_600_000
T0 = 1_357_041_600_000  # 2013-01-01T12:00:00Z


def flight(arr_delay: int | None = None, air_time: int | None = None) -> str:
    return json.dumps({"origin": "JFK", "arr_delay": arr_delay, "air_time": air_time})


def test_an_hour_is_emitted_once_when_the_watermark_closes_it() -> None:
    h = Harness(AirportHours)
    assert h.send("JFK", flight(10), timestamp_ms=T0 + 5 * 60_000).ok
    assert h.send("JFK", flight(None), timestamp_ms=T0 + 50 * 60_000).ok
    assert h.send("JFK", flight(-4), timestamp_ms=T0 + H).ok  # the next hour
    assert h.map("JFK", HOURS.state)[T0]  # open
    assert h.advance_watermark(T0 + H - 2) == []
    [(_, out)] = h.advance_watermark(T0 + H - 1)
    assert out.emitted[0].value == (
        b'{"origin":"JFK","hour_start_ms":1357041600000,"flights":2,"delay_count":1,'
        b'"delay_mean":10.0,"delay_max":10,"update":false}'
    )
    # within the allowed lateness a late flight updates the hour at once
    out = h.send("JFK", flight(30), timestamp_ms=T0 + 1)
    assert json.loads(out.emitted[0].value)["update"] is True
    assert json.loads(out.emitted[0].value)["delay_mean"] == 20.0
    h.advance_watermark(T0 + 3 * H)
    assert len(h.outputs) == 3
    assert h.pending_timers() == 0 and not any(h._host.maps.values())
    # past it, dropped and logged
    assert h.send("JFK", flight(1), timestamp_ms=T0).emitted == []
    assert "too late" in h.logs[-1][1]


def test_departures_less_than_two_hours_apart_are_one_session() -> None:
    h = Harness(AirportSessions)
    for minutes, air in [(0, 100), (119, None), (230, 50), (351, 7)]:
        assert h.send("JFK", flight(air_time=air), timestamp_ms=T0 + minutes * 60_000).ok
    h.advance_watermark(T0 + 10 * H)
    got = [json.loads(o.value) for o in h.outputs]
    assert [(s["flights"], s["air_time"]) for s in got] == [(3, 150), (1, 7)]
    assert got[0]["first_departure_ms"] == T0
    assert got[0]["last_departure_ms"] == T0 + 230 * 60_000
    assert h.pending_timers() == 0 and not any(h._host.maps.values())
    assert SESSIONS.name == "sessions"
