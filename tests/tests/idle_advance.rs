//! `idle_advance` on the real broker: a silent shard's watermark follows the clock only once its
//! consumer has caught up, which librdkafka's partition EOF tells, stepping over the
//! transaction marker a transactional producer (an exactly-once upstream, Weir's own outputs
//! included) leaves after its last record. Were the consumer's position compared with the
//! high watermark instead, the marker would keep such an input one record short of caught up
//! for ever, and its last windows open. For the same reason the partition's lag counts from its
//! last record, not from the marker: 0 once every record is checkpointed (it stayed at 1 before).

use rdkafka::Message;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::collections::BTreeMap;
use std::time::Duration;
use weir_cli::flights::KeyBy;
use weir_host::config::RuntimeSettings;
use weir_tests::*;

const HOUR_MS: i64 = 3_600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_advance_closes_the_last_hours_of_an_input_written_in_a_transaction_and_its_lag_reaches_0()
-> anyhow::Result<()> {
    init_tracing();
    // The first 40 departures of 2013 (a few hours at the three airports), in one transaction.
    let flights: Vec<_> = weir_cli::flights::read_csv_keyed(&flights_csv(), KeyBy::Origin)?
        .into_iter()
        .take(40)
        .collect();
    let mut want: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for f in &flights {
        let hour = f.timestamp_ms - f.timestamp_ms.rem_euclid(HOUR_MS);
        *want.entry((f.key.clone(), hour)).or_default() += 1;
    }
    let (input, output, dlq) = (unique("tx-flights"), unique("hours"), unique("dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("transactional.id", unique("tx-producer"))
        .create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    producer.begin_transaction()?;
    for f in &flights {
        let record = FutureRecord::to(&input)
            .key(f.key.as_bytes())
            .payload(&f.json)
            .timestamp(f.timestamp_ms);
        if let Err((err, _)) = producer.send(record, Duration::from_secs(30)).await {
            anyhow::bail!("cannot send a flight: {err}");
        }
    }
    producer.commit_transaction(Duration::from_secs(30))?;

    let mut settings = settings(
        guest("airport_hours"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    );
    // Checkpointed, so that the lag counts from what they cover.
    settings.state = memory_state_on_s3().await?;
    settings.pipeline.idle_timeout = Some(Duration::from_secs(1));
    settings.pipeline.idle_advance = true;
    let pipeline = RunningPipeline::start(settings);
    pipeline
        .wait_done(flights.len() as u64, Duration::from_secs(60))
        .await?;
    // Every hour closes, the last ones by `idle_advance` once the consumer is past the marker.
    let out = read_exactly(
        &output,
        want.len(),
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
    .await?;
    // The marker after the last record is no record to process: once every record is
    // checkpointed the partition is not behind.
    let records = flights.len() as i64;
    pipeline
        .wait_until(
            "the lag at 0 over the marker",
            Duration::from_secs(60),
            |s| {
                s.partitions.lock().expect("lock").values().any(|p| {
                    p.lag == 0
                        && p.checkpointed_offsets
                            .get(&input)
                            .is_some_and(|o| *o == records)
                })
            },
        )
        .await?;
    pipeline.stop().await?;
    let mut got: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let key = (
            v["origin"].as_str().unwrap_or_default().to_owned(),
            v["hour_start_ms"].as_i64().unwrap_or_default(),
        );
        got.insert(key, v["flights"].as_u64().unwrap_or_default());
    }
    assert_eq!(got, want);
    Ok(())
}
