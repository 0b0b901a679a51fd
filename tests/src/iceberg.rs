//! Iceberg tables as a user's tool sees them: `tests/iceberg/table.py` run with pyiceberg
//! (`WEIR_PYICEBERG`, installed by the test command) on the SQLite catalog the host writes and
//! the S3 server.

use crate::{py_tool, s3_endpoint};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use weir_cli::flights::FlightRecord;
use weir_host::sink::iceberg::{ColumnSpec, ColumnType, TableSchema};

/// Runs `tests/iceberg/table.py` with pyiceberg and returns what it printed.
///
/// # Errors
/// When it cannot run or fails (its stderr in the error).
pub fn pyiceberg(args: &[&str]) -> anyhow::Result<String> {
    let python = py_tool("WEIR_PYICEBERG", "pyiceberg", "python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("iceberg/table.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "pyiceberg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Every row and snapshot of `table` (`namespace.name`) as pyiceberg reads it through the
/// catalog database `db` (catalog `weir`): `{"rows": [...], "snapshots": [{"id", "summary"}]}`.
///
/// # Errors
/// When pyiceberg fails or prints something else.
pub fn read_with_pyiceberg(db: &Path, table: &str) -> anyhow::Result<Value> {
    let uri = format!("sqlite:///{}", db.display());
    Ok(serde_json::from_str(&pyiceberg(&[
        "read",
        &uri,
        "weir",
        table,
        &s3_endpoint(),
    ])?)?)
}

/// The rows `table`'s current snapshot holds (its summary's `total-records`; 0 with none).
pub fn current_rows(table: &iceberg::table::Table) -> u64 {
    table
        .metadata()
        .current_snapshot()
        .and_then(|s| s.summary().additional_properties.get("total-records"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The columns of `flight-delays`' emits: a route's running statistics.
pub fn flight_delays_columns() -> Vec<ColumnSpec> {
    let column = |name: &str, kind, required| ColumnSpec {
        name: name.into(),
        kind,
        required,
    };
    vec![
        column("route", ColumnType::String, true),
        column("flights", ColumnType::Long, true),
        column("delay_count", ColumnType::Long, true),
        column("delay_sum", ColumnType::Long, true),
        column("delay_max", ColumnType::Long, false),
        column("delay_mean", ColumnType::Double, false),
    ]
}

/// [`flight_delays_columns`] as a schema.
pub fn flight_delays_table() -> TableSchema {
    TableSchema::new(&flight_delays_columns()).expect("a valid schema")
}

/// Per route: flights, delays known, their sum and maximum — from the records produced.
fn oracle(flights: &[FlightRecord]) -> BTreeMap<String, (u64, u64, i64, Option<i64>)> {
    let mut out: BTreeMap<String, (u64, u64, i64, Option<i64>)> = BTreeMap::new();
    for f in flights {
        let row: Value = serde_json::from_slice(&f.json).expect("a flight is JSON");
        let route = format!(
            "{}-{}",
            row["origin"].as_str().unwrap_or_default(),
            row["dest"].as_str().unwrap_or_default()
        );
        let e = out.entry(route).or_default();
        e.0 += 1;
        if let Some(d) = row["arr_delay"].as_i64() {
            e.1 += 1;
            e.2 += d;
            e.3 = Some(e.3.map_or(d, |m: i64| m.max(d)));
        }
    }
    out
}

/// Asserts that the rows pyiceberg read (`read`, as [`read_with_pyiceberg`] returns them) of
/// a `flight-delays` table over `flights` hold every route's running `flights` counts 1..n
/// once each, with no gap and no repeat, and that each route's last row equals the oracle
/// computed from `flights`.
pub fn assert_route_stats_exactly_once(read: &Value, flights: &[FlightRecord]) {
    let mut by_route: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for row in read["rows"].as_array().expect("rows") {
        by_route
            .entry(row["route"].as_str().expect("route").to_owned())
            .or_default()
            .push(row);
    }
    let want = oracle(flights);
    assert_eq!(by_route.len(), want.len(), "routes");
    for (route, rows) in &mut by_route {
        rows.sort_by_key(|r| r["flights"].as_u64());
        let counts: Vec<u64> = rows.iter().filter_map(|r| r["flights"].as_u64()).collect();
        let n = want[route].0;
        assert_eq!(
            counts,
            (1..=n).collect::<Vec<_>>(),
            "{route}: 1..n once each"
        );
        let last = rows.last().expect("a row");
        let (_, delay_count, delay_sum, delay_max) = want[route];
        assert_eq!(last["delay_count"].as_u64(), Some(delay_count), "{route}");
        assert_eq!(last["delay_sum"].as_i64(), Some(delay_sum), "{route}");
        assert_eq!(last["delay_max"].as_i64(), delay_max, "{route}");
    }
}
