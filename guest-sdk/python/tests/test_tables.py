"""Global tables through the SDK (docs/topologies.md, "Global tables"): `Context.lookup` by any
key, the harness's tables and their updates between records — as guest-sdk/tests/tables.rs."""

from __future__ import annotations

import weir
from weir.testing import Harness


class Enrich(weir.Operator):
    """Each flight (key: its id, value: its tail number) with its plane's manufacturer."""

    name = "enrich"
    version = "0.1.0"
    states: list[weir.ValueState[object]] = []

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        plane = ctx.lookup("planes", record.value)
        ctx.emit(record.key, "unknown" if plane is None else plane["manufacturer"])


def test_a_lookup_reads_any_key_and_sees_the_updates_made_before_the_record() -> None:
    h = Harness(
        Enrich,
        global_tables={
            "planes": {
                b"N10575": b'{"manufacturer":"EMBRAER"}',
                b"N14228": b'{"manufacturer":"BOEING"}',
            }
        },
    )
    assert h.send(b"f1", b"N14228").emitted[0].value == b"BOEING"
    assert h.send(b"f2", b"N0EGMQ").emitted[0].value == b"unknown"
    h.set_global_row("planes", b"N0EGMQ", b'{"manufacturer":"AIRBUS"}')
    h.set_global_row("planes", b"N14228", None)
    assert h.send(b"f3", b"N0EGMQ").emitted[0].value == b"AIRBUS"
    assert h.send(b"f4", b"N14228").emitted[0].value == b"unknown", "deleted by a tombstone"


def test_a_table_the_stage_does_not_read_or_a_row_that_does_not_decode_rejects_the_record() -> None:
    out = Harness(Enrich).send(b"f1", b"N14228")
    assert out.reason is not None and "no global table `planes`" in out.reason
    h = Harness(Enrich, global_tables={"planes": {b"N1": b"not json"}})
    out = h.send(b"f1", b"N1")
    assert out.reason is not None and "cannot decode the row of global table `planes`" in out.reason
