//! Tenant isolation of running pipelines, through the API on the real broker and S3 server:
//! hostile guests (traps, runaway loops, memory bombs) are dead-lettered while another
//! tenant's pipeline on the same host keeps its latency.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weir_tests::api::*;
use weir_tests::*;

/// Produces `n` records to `input` (one partition per key modulo `partitions`), one every
/// `every`, for the counter: record `i` has key `k{i % keys}`. Returns when each `(key,
/// count)` output is expected and when its input was sent.
async fn produce_paced(
    input: &str,
    partitions: i32,
    (from, n): (u64, u64),
    keys: u64,
    every: Duration,
    counts: &mut BTreeMap<String, u64>,
) -> anyhow::Result<BTreeMap<(String, u64), Instant>> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("linger.ms", "0")
        .create()?;
    let mut sent = BTreeMap::new();
    let mut ticks = tokio::time::interval(every);
    for i in from..from + n {
        ticks.tick().await;
        let key = format!("k{}", i % keys);
        let count = counts.entry(key.clone()).or_default();
        *count += 1;
        sent.insert((key.clone(), *count), Instant::now());
        let partition = i32::try_from(i % keys)? % partitions;
        let value = format!("record {i}");
        let record = FutureRecord::to(input)
            .partition(partition)
            .key(key.as_bytes())
            .payload(value.as_bytes());
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(sent)
}

/// When each `(key, count)` output of the counter on `output` was first seen, recorded from
/// now on by a reader of every partition (`partitions`) from the beginning.
type Seen = std::sync::Arc<std::sync::Mutex<BTreeMap<(String, u64), Instant>>>;

fn spawn_output_reader(output: &str, partitions: i32) -> anyhow::Result<Seen> {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("latency"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()?;
    // Assigned, not subscribed: no group rebalance delays the first fetch.
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(output, p, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let seen: Seen = Default::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok(msg) = consumer.recv().await else {
                continue;
            };
            let now = Instant::now();
            let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
            let Ok(value) = serde_json::from_slice::<Value>(msg.payload().unwrap_or_default())
            else {
                continue;
            };
            let count = value["count"].as_u64().unwrap_or_default();
            record
                .lock()
                .expect("seen lock")
                .entry((key, count))
                .or_insert(now);
        }
    });
    Ok(seen)
}

/// Waits until every `(key, count)` of `sent` was seen, and returns each one's latency
/// (first seen − sent), sorted.
async fn latencies(
    seen: &Seen,
    sent: &BTreeMap<(String, u64), Instant>,
    timeout: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let deadline = Instant::now() + timeout;
    loop {
        {
            let seen = seen.lock().expect("seen lock");
            let found: Vec<Duration> = sent
                .iter()
                .filter_map(|(k, at)| seen.get(k).map(|s| s.saturating_duration_since(*at)))
                .collect();
            if found.len() == sent.len() {
                let mut found = found;
                found.sort();
                return Ok(found);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} of {} outputs seen in {timeout:?}",
                found.len(),
                sent.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Hostile guests of one tenant (an endless loop, a 1 GiB allocation, endless recursion, a
/// 100 MB emit flood) run beside a well-behaved pipeline of another tenant on the same host:
/// every hostile record is dead-lettered, the host and both pipelines keep running, and the
/// well-behaved pipeline's end-to-end latency (produce → output seen) is printed alone and
/// beside the hostile one (measured, not asserted: tests assert no wall-clock times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_are_dead_lettered_and_another_tenants_pipeline_keeps_running()
-> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let (good_id, evil_id) = (tenant_id("good"), tenant_id("evil"));
    let good = tenant_with_key(addr, &good_id).await?;
    let evil = tenant_with_key(addr, &evil_id).await?;
    for (id, key) in [(&good_id, &good), (&evil_id, &evil)] {
        upload_counter(addr, key, 1).await?;
        create_topics(&[
            (&kafka_topic_of(id, "in"), 2),
            (&kafka_topic_of(id, "out"), 2),
            (&kafka_topic_of(id, "dlq"), 1),
        ])
        .await?;
        let spec = json!({
            "operator": "counter", "operator_version": 1,
            "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
            "checkpoint_interval_ms": 1000,
        });
        create_pipeline(addr, key, "counts", &spec).await?;
    }
    for key in [&good, &evil] {
        wait_for_pipeline(addr, key, "counts", Duration::from_secs(60), |v| {
            state_of(v) == "running"
                && v["status"]["partitions"].as_array().map(Vec::len) == Some(2)
        })
        .await?;
    }
    let (good_in, good_out) = (
        kafka_topic_of(&good_id, "in"),
        kafka_topic_of(&good_id, "out"),
    );
    let seen = spawn_output_reader(&good_out, 2)?;
    let mut counts = BTreeMap::new();
    let every = Duration::from_millis(10);
    // Warm-up, not measured: the first outputs of a new pipeline take ~500 ms more.
    let warm_up = produce_paced(&good_in, 2, (0, 20), 20, every, &mut counts).await?;
    latencies(&seen, &warm_up, Duration::from_secs(60)).await?;
    let sent = produce_paced(&good_in, 2, (20, 500), 20, every, &mut counts).await?;
    let alone = latencies(&seen, &sent, Duration::from_secs(60)).await?;

    // The hostile tenant sends its poisons all along the second measurement.
    let poisons: [&[u8]; 4] = [
        b"poison:loop",
        b"poison:alloc",
        b"poison:recurse",
        b"poison:emit-flood",
    ];
    let evil_in = kafka_topic_of(&evil_id, "in");
    let hostile = tokio::spawn(async move {
        let mut sent = 0u64;
        for round in 0..6 {
            let records: Vec<(Vec<u8>, Vec<u8>)> = poisons
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("e{round}-{i}").into_bytes(), p.to_vec()))
                .collect();
            produce(&evil_in, round % 2, &records).await?;
            sent += records.len() as u64;
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        anyhow::Ok(sent)
    });
    let sent = produce_paced(&good_in, 2, (520, 500), 20, every, &mut counts).await?;
    let beside = latencies(&seen, &sent, Duration::from_secs(60)).await?;
    let hostile_sent = hostile.await??;

    let view = wait_for_pipeline(addr, &evil, "counts", Duration::from_secs(120), |v| {
        v["status"]["dead_lettered"].as_u64() == Some(hostile_sent)
    })
    .await?;
    assert_eq!(
        state_of(&view),
        "running",
        "the hostile pipeline goes on: {view:#}"
    );
    let good_view = wait_for_pipeline(addr, &good, "counts", Duration::from_secs(30), |v| {
        v["status"]["records_done"] == 1020
    })
    .await?;
    assert_eq!(state_of(&good_view), "running");
    assert_eq!(good_view["status"]["dead_lettered"], 0);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "well-behaved pipeline, end-to-end latency over {} records at 100/s: alone p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; beside {hostile_sent} hostile records (loop, 1 GiB alloc, recursion, 100 MB emit flood): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        alone.len(),
        ms(percentile(&alone, 0.5)),
        ms(percentile(&alone, 0.99)),
        ms(percentile(&alone, 1.0)),
        ms(percentile(&beside, 0.5)),
        ms(percentile(&beside, 0.99)),
        ms(percentile(&beside, 1.0)),
    );
    Ok(())
}
