//! `weir dev --operator X --input FILE.jsonl`: any operator over a file of records, on
//! librdkafka's embedded mock cluster (or `--bootstrap-servers`), with heap state; prints every
//! output and dead letter, one JSON object a line, then a count.
//!
//! The input file has one JSON object a line (blank lines and lines starting with `#` are
//! skipped): `{"key": …, "value": …, "timestamp_ms": 1700000000000, "headers": {"name": "v"}}`.
//! Every field is optional. A string `key` or `value` is its UTF-8 bytes; any other JSON value
//! (an object, a number) is its JSON text, so `"value": {"name": "x"}` sends `{"name":"x"}`.
//!
//! Printed: `{"output": {"key", "value", "partition", "offset"}}` for each emit and
//! `{"dead_letter": {"key", "value", "kind", "error"}}` for each dead letter, in partition
//! and offset order; a value that is JSON text is printed as JSON, else as a string.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::pipeline::PipelineStats;
use weir_host::sink::kafka::{HEADER_ERROR, HEADER_ERROR_KIND};
use weir_host::state::memory::MemoryBackend;

use crate::dev::{DevError, DevOptions, cluster, pipeline_settings};

/// One line of the input file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    #[serde(default)]
    key: Value,
    #[serde(default)]
    value: Value,
    timestamp_ms: Option<i64>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// The bytes a JSON field stands for: a string's UTF-8, `null`'s nothing, else the JSON text.
fn bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::Null => Vec::new(),
        Value::String(text) => text.as_bytes().to_vec(),
        other => other.to_string().into_bytes(),
    }
}

/// A printed payload: JSON if it is JSON text, else a (lossy) string.
fn shown(payload: Option<&[u8]>) -> Value {
    let payload = payload.unwrap_or_default();
    serde_json::from_slice(payload)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(payload).into_owned()))
}

/// Reads the input file.
fn read_input(path: &Path) -> Result<Vec<InputLine>, DevError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| DevError::Input(format!("cannot read {}: {e}", path.display())))?;
    let mut records = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let record = serde_json::from_str(line)
            .map_err(|e| DevError::Input(format!("{} line {}: {e}", path.display(), number + 1)))?;
        records.push(record);
    }
    Ok(records)
}

/// Runs `opts.operator` over the records of `input` and prints its outputs and dead letters.
///
/// # Errors
/// An unreadable or malformed input file, Kafka, the pipeline, or outputs that do not arrive.
pub async fn run(opts: &DevOptions, input: &Path) -> Result<(), DevError> {
    let records = read_input(input)?;
    let run_id = std::process::id();
    let (input_topic, output, dlq) = (
        format!("dev-in-{run_id}"),
        format!("dev-out-{run_id}"),
        format!("dev-dlq-{run_id}"),
    );
    let topics = [
        (input_topic.as_str(), opts.partitions),
        (output.as_str(), opts.partitions),
        (dlq.as_str(), 1),
    ];
    let (_mock, bootstrap) = cluster(opts.bootstrap_servers.as_deref(), &topics).await?;

    let producer: FutureProducer = crate::kafka::client(&bootstrap)
        .set("linger.ms", "5")
        .create()?;
    for record in &records {
        let key = bytes(&record.key);
        let value = bytes(&record.value);
        let mut headers = rdkafka::message::OwnedHeaders::new();
        for (name, value) in &record.headers {
            headers = headers.insert(rdkafka::message::Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        let mut message = FutureRecord::to(&input_topic)
            .key(&key)
            .payload(&value)
            .headers(headers);
        if let Some(ms) = record.timestamp_ms {
            message = message.timestamp(ms);
        }
        producer
            .send(message, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| DevError::Kafka(e))?;
    }

    let settings = pipeline_settings(
        "dev",
        &opts.operator,
        (&input_topic, &output, &dlq),
        &bootstrap,
    );
    let clock: SharedClock = Arc::new(SystemClock);
    let stats = Arc::new(PipelineStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let pipeline = tokio::spawn(weir_host::runner::run(
        settings,
        Arc::new(MemoryBackend::new(clock.clone())),
        clock,
        stats.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let expected = records.len() as u64;
    let limit = Duration::from_secs(120);
    let started = Instant::now();
    while stats.records_done() < expected && !pipeline.is_finished() {
        if started.elapsed() > limit {
            return Err(DevError::Timeout(
                limit,
                format!("{} of {expected} records processed", stats.records_done()),
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Drained: every emit and dead letter is acknowledged before the pipeline returns.
    let _ = stop_tx.send(());
    match pipeline.await {
        Ok(result) => result?,
        Err(join) => return Err(DevError::Timeout(limit, format!("pipeline task: {join}"))),
    }
    let emitted = stats.emitted.load(Ordering::Relaxed);
    let dead = stats.dead_lettered.load(Ordering::Relaxed);
    let outputs = read_all(&bootstrap, &output, opts.partitions, emitted).await?;
    let dead_letters = read_all(&bootstrap, &dlq, 1, dead).await?;
    for (partition, offset, msg) in &outputs {
        println!(
            "{}",
            json!({"output": {
                "key": shown(msg.key()),
                "value": shown(msg.payload()),
                "partition": partition,
                "offset": offset,
            }})
        );
    }
    for (_, _, msg) in &dead_letters {
        let header = |name: &str| {
            msg.headers().and_then(|hs| {
                hs.iter()
                    .find(|h| h.key == name)
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            })
        };
        println!(
            "{}",
            json!({"dead_letter": {
                "key": shown(msg.key()),
                "value": shown(msg.payload()),
                "kind": header(HEADER_ERROR_KIND),
                "error": header(HEADER_ERROR),
            }})
        );
    }
    eprintln!(
        "{expected} records in, {} outputs, {} dead letters",
        outputs.len(),
        dead_letters.len()
    );
    Ok(())
}

/// Reads `count` records of `topic` (its `partitions`) from the beginning, in partition and
/// offset order.
async fn read_all(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    count: u64,
) -> Result<Vec<(i32, i64, rdkafka::message::OwnedMessage)>, DevError> {
    let consumer: BaseConsumer = crate::kafka::client(bootstrap)
        .set(
            "group.id",
            format!("weir-dev-reader-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut read = Vec::new();
        while (read.len() as u64) < count {
            if Instant::now() > deadline {
                return Err(DevError::Timeout(
                    Duration::from_secs(60),
                    format!("read {} of {count} records of {topic}", read.len()),
                ));
            }
            if let Some(msg) = consumer.poll(Duration::from_millis(100)) {
                let msg = msg?;
                read.push((msg.partition(), msg.offset(), msg.detach()));
            }
        }
        read.sort_by_key(|(p, o, _)| (*p, *o));
        Ok(read)
    })
    .await
    .map_err(|e| DevError::Timeout(Duration::ZERO, format!("reader task: {e}")))?
}
