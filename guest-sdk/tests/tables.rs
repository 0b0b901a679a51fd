//! Global tables through the SDK (docs/topologies.md, "Global tables"): `Context::lookup` by
//! any key, the harness's tables and their updates between records.

use serde::Deserialize;
use weir_sdk::testing::Harness;
use weir_sdk::{Context, Operator, Record, Reject, StateSpec};

/// Enriches each flight (key: its id, value: its tail number) with its plane's manufacturer.
struct Enrich;

#[derive(Deserialize)]
struct Plane {
    manufacturer: String,
}

impl Operator for Enrich {
    const NAME: &'static str = "enrich";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        let plane: Option<Plane> = ctx.lookup("planes", record.value())?;
        let maker = plane.map_or_else(|| "unknown".to_owned(), |p| p.manufacturer);
        ctx.emit(record.key(), maker.as_bytes())
    }
}

#[test]
fn a_lookup_reads_any_key_and_sees_the_updates_made_before_the_record() {
    let mut h = Harness::<Enrich>::new().with_global_table(
        "planes",
        &[
            (b"N10575", br#"{"manufacturer":"EMBRAER"}"#),
            (b"N14228", br#"{"manufacturer":"BOEING"}"#),
        ],
    );
    assert_eq!(h.send(b"f1", b"N14228").emitted[0].value, b"BOEING");
    assert_eq!(
        h.send(b"f2", b"N0EGMQ").emitted[0].value,
        b"unknown",
        "a plane the table has no row for"
    );
    h.set_global_row("planes", b"N0EGMQ", Some(br#"{"manufacturer":"AIRBUS"}"#));
    h.set_global_row("planes", b"N14228", None);
    assert_eq!(h.send(b"f3", b"N0EGMQ").emitted[0].value, b"AIRBUS");
    assert_eq!(
        h.send(b"f4", b"N14228").emitted[0].value,
        b"unknown",
        "deleted by a tombstone"
    );
}

#[test]
fn a_table_the_stage_does_not_read_or_a_row_that_does_not_decode_rejects_the_record() {
    let mut h = Harness::<Enrich>::new();
    let out = h.send(b"f1", b"N14228");
    assert!(
        out.reason
            .as_deref()
            .is_some_and(|r| r.contains("no global table `planes`")),
        "{:?}",
        out.reason
    );
    let mut h = Harness::<Enrich>::new().with_global_table("planes", &[(b"N1", b"not json")]);
    let out = h.send(b"f1", b"N1");
    assert!(
        out.reason
            .as_deref()
            .is_some_and(|r| r.contains("cannot decode the row of global table `planes`")),
        "{:?}",
        out.reason
    );
}
