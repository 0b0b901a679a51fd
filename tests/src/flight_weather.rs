//! The oracle of `examples/flight-weather` (docs/topologies.md) and its stages, for the tests
//! that run it: per plane manufacturer and per visibility at the origin in the flight's
//! scheduled hour, the flights, those with an arrival delay, and the delays' sum — computed
//! from the CSVs with nothing of Weir's code.

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Per group (`manufacturer=…`, `visibility=…`): flights, delays known, delays' sum.
pub type GroupStats = BTreeMap<String, (u64, u64, i64)>;

/// A flight as the oracle needs it.
#[derive(Debug, Clone)]
pub struct WeatherFlight {
    /// `{origin}|{time_hour}`: the key of its origin's weather in its scheduled hour.
    pub hour_key: String,
    /// Its tail number, if any.
    pub tailnum: Option<String>,
    /// Its arrival delay, minutes, if known.
    pub arr_delay: Option<i64>,
}

/// The flights of `flights_csv` scheduled before the hour `before` (a `time_hour`, compared
/// as text: ISO-8601 UTC), in file order.
///
/// # Errors
/// An unreadable CSV.
pub fn weather_flights(flights_csv: &Path, before: &str) -> anyhow::Result<Vec<WeatherFlight>> {
    let mut reader = csv::Reader::from_path(flights_csv)?;
    let headers = reader.headers()?.clone();
    let col = |name: &str| headers.iter().position(|h| h == name).expect("a column");
    let [origin, time_hour, tailnum, arr_delay] =
        ["origin", "time_hour", "tailnum", "arr_delay"].map(col);
    let mut flights = Vec::new();
    for row in reader.records() {
        let row = row?;
        if row[time_hour] >= *before {
            continue;
        }
        flights.push(WeatherFlight {
            hour_key: format!("{}|{}", &row[origin], &row[time_hour]),
            tailnum: Some(row[tailnum].to_owned()).filter(|t| !t.is_empty()),
            arr_delay: row[arr_delay].parse().ok(),
        });
    }
    Ok(flights)
}

/// Tail number → manufacturer, from `planes.csv`.
///
/// # Errors
/// An unreadable CSV.
pub fn manufacturers(planes_csv: &Path) -> anyhow::Result<HashMap<String, String>> {
    let mut reader = csv::Reader::from_path(planes_csv)?;
    let headers = reader.headers()?.clone();
    let col = |name: &str| headers.iter().position(|h| h == name).expect("a column");
    let (tailnum, manufacturer) = (col("tailnum"), col("manufacturer"));
    let mut out = HashMap::new();
    for row in reader.records() {
        let row = row?;
        out.insert(row[tailnum].to_owned(), row[manufacturer].to_owned());
    }
    Ok(out)
}

/// `{origin}|{time_hour}` → visibility as the CSV writes it (the last row of a key wins, as a
/// table's), from `weather.csv`.
///
/// # Errors
/// An unreadable CSV.
pub fn visibilities(weather_csv: &Path) -> anyhow::Result<HashMap<String, String>> {
    let mut reader = csv::Reader::from_path(weather_csv)?;
    let headers = reader.headers()?.clone();
    let col = |name: &str| headers.iter().position(|h| h == name).expect("a column");
    let [origin, time_hour, visib] = ["origin", "time_hour", "visib"].map(col);
    let mut out = HashMap::new();
    for row in reader.records() {
        let row = row?;
        let visibility = Some(row[visib].to_owned())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "unknown".to_owned());
        out.insert(format!("{}|{}", &row[origin], &row[time_hour]), visibility);
    }
    Ok(out)
}

/// The groups' statistics over `flights`, each flight counted once under its plane's
/// manufacturer (`unknown` without one) and once under its hour's visibility (`unknown`
/// without a weather row).
pub fn flight_weather_oracle(
    flights: &[WeatherFlight],
    makers: &HashMap<String, String>,
    visibility: &HashMap<String, String>,
) -> GroupStats {
    let mut out = GroupStats::new();
    for flight in flights {
        let maker = flight
            .tailnum
            .as_ref()
            .and_then(|t| makers.get(t))
            .map_or("unknown", String::as_str);
        let visib = visibility
            .get(&flight.hour_key)
            .map_or("unknown", String::as_str);
        for group in [
            format!("manufacturer={maker}"),
            format!("visibility={visib}"),
        ] {
            let entry = out.entry(group).or_default();
            entry.0 += 1;
            if let Some(d) = flight.arr_delay {
                entry.1 += 1;
                entry.2 += d;
            }
        }
    }
    out
}

/// Checks the stats stage's outputs against `want`: each group's last output (its most
/// flights) exact, its mean within 1e-9 of the sum over the count; as many outputs as two per
/// flight.
///
/// # Errors
/// An output that is not the stage's JSON.
pub fn check_flight_weather(out: &[OwnedMessage], want: &GroupStats) -> anyhow::Result<()> {
    let mut last: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for m in out {
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())?;
        let newer = last
            .get(&key)
            .is_none_or(|old| old["flights"].as_u64() < v["flights"].as_u64());
        if newer {
            last.insert(key, v);
        }
    }
    let got: GroupStats = last
        .iter()
        .map(|(k, v)| {
            let n = |f: &str| v[f].as_i64().unwrap_or(-1);
            (
                k.clone(),
                (n("flights") as u64, n("delay_count") as u64, n("delay_sum")),
            )
        })
        .collect();
    assert_eq!(&got, want, "each group's last statistics");
    for (group, v) in &last {
        let (_, count, sum) = want[group];
        if count > 0 {
            let mean = v["delay_mean"].as_f64().expect("a mean");
            let exact = sum as f64 / count as f64;
            assert!(
                (mean - exact).abs() <= 1e-9,
                "{group}: mean {mean} against {exact}"
            );
        }
    }
    let flights: u64 = want
        .iter()
        .filter(|(k, _)| k.starts_with("manufacturer="))
        .map(|(_, s)| s.0)
        .sum();
    assert_eq!(
        out.len() as u64,
        2 * flights,
        "two outputs per flight, none twice"
    );
    Ok(())
}

/// The stages of `examples/flight-weather` for `weir run`, the component at `component`:
/// `by-hour` over `flights`, `enrich` with the `weather` table and the `planes` global table,
/// `stats` to `out`.
pub fn flight_weather_stages_toml(
    component: &Path,
    flights: &str,
    (weather, planes): (&str, &str),
    out: &str,
) -> String {
    format!(
        r#"[[pipeline.stages]]
name = "by-hour"
operator = "{component}"
inputs = [{{ topic = "{flights}" }}]
parameters = {{ role = "by-hour" }}

[[pipeline.stages]]
name = "enrich"
operator = "{component}"
inputs = [{{ stage = "by-hour" }}, {{ topic = "{weather}", table = "weather" }}, {{ topic = "{planes}", global_table = "planes" }}]
parameters = {{ role = "enrich" }}

[[pipeline.stages]]
name = "stats"
operator = "{component}"
inputs = [{{ stage = "enrich" }}]
outputs = {{ default = {{ topic = "{out}" }} }}
parameters = {{ role = "stats" }}
"#,
        component = component.display(),
    )
}
