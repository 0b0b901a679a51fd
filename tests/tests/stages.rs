//! A pipeline of two stages on the real broker and S3 server (docs/topologies.md): the first
//! counts the input per key, the second counts the first's emits per key through the internal
//! topic Weir creates, so the second's counts of a key are exactly 1..=n (n its records) when
//! every record crosses the edge once — exactly-once, across a stop and a restart, and after
//! Weir purged what the second stage's checkpoints had passed.

use anyhow::Context as _;
use rdkafka::Message;
use std::collections::BTreeMap;
use std::time::Duration;
use weir_host::config::stages::{StageInput, StageOutput, StageSettings};
use weir_host::config::{Delivery, Settings};
use weir_tests::*;

const PARTITIONS: i32 = 2;
const INTERNAL_PARTITIONS: i32 = 3;
const KEYS: u64 = 30;

/// Reads the second stage's outputs until every key's last count is its number of records.
async fn read_final_counts(
    output: &str,
    expected: &BTreeMap<String, u64>,
) -> anyhow::Result<BTreeMap<String, Vec<u64>>> {
    read_counts_until(output, Duration::from_secs(90), |counts| {
        expected
            .iter()
            .all(|(key, n)| counts.get(key).and_then(|c| c.last()) == Some(n))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stages_count_every_record_once_across_their_internal_topic() -> anyhow::Result<()> {
    let (mut settings, output) = counter_pipeline_on_s3("stages", PARTITIONS).await?;
    let input = settings.pipeline.input_topics[0].clone();
    settings.pipeline.delivery = Delivery::ExactlyOnce;
    settings.pipeline.checkpoint_interval = Duration::from_millis(200);
    let internal = two_counters(&mut settings, &output, Some(INTERNAL_PARTITIONS));
    settings.validate()?;

    let mut expected = BTreeMap::new();
    produce_counter(&input, PARTITIONS, (0, 300), KEYS, &mut expected).await?;
    let running = RunningStages::start(&settings)?;
    read_final_counts(&output, &expected).await?;
    // Every ten checkpoint intervals, what every stored checkpoint of the second stage's shards
    // has passed goes (once newer checkpoints retire the first, which names no offset): more
    // input, more checkpoints, until each partition of the internal topic starts above 0.
    let mut next = 300;
    while !watermarks(&internal, INTERNAL_PARTITIONS)?
        .iter()
        .all(|(start, _)| *start > 0)
    {
        anyhow::ensure!(
            next < 3_000,
            "the internal topic was not purged: {:?}",
            watermarks(&internal, INTERNAL_PARTITIONS)?
        );
        produce_counter(&input, PARTITIONS, (next, next + KEYS), KEYS, &mut expected).await?;
        next += KEYS;
        read_final_counts(&output, &expected).await?;
    }
    running.stop().await?;

    // A second run resumes every stage from its last checkpoint, past the purge. A record
    // the first stage rejects goes to the pipeline's dead-letter topic, naming that stage.
    produce_counter(&input, PARTITIONS, (next, next + 300), KEYS, &mut expected).await?;
    produce(&input, 0, &[(b"key0".to_vec(), b"poison:reject".to_vec())]).await?;
    let running = RunningStages::start(&settings)?;
    let counts = read_final_counts(&output, &expected).await?;
    let dead = read_exactly(
        &settings.pipeline.dead_letter_topic,
        1,
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await?;
    running.stop().await?;
    assert_eq!(header(&dead[0], "weir.stage").as_deref(), Some("first"));
    assert_eq!(
        header(&dead[0], "weir.source.topic").as_deref(),
        Some(&*input)
    );

    for (key, n) in &expected {
        assert_eq!(
            counts[key],
            (1..=*n).collect::<Vec<_>>(),
            "key {key}: every record crossed the edge once, in order"
        );
    }
    assert_eq!(
        topic_config(&internal, "retention.ms").await?.as_deref(),
        Some("-1"),
        "the internal topic keeps its records until Weir is done with them"
    );
    let sizes = high_watermarks(&internal, INTERNAL_PARTITIONS)?;
    assert_eq!(sizes.len(), INTERNAL_PARTITIONS as usize);
    assert!(
        sizes.iter().all(|end| *end > 0),
        "the first stage's emits went to all {INTERNAL_PARTITIONS} partitions: {sizes:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_topic_with_other_partitions_is_refused_by_name() -> anyhow::Result<()> {
    let (mut settings, output) = counter_pipeline_on_s3("stages-bad", PARTITIONS).await?;
    let internal = two_counters(&mut settings, &output, None);
    create_topics(&[(&internal, PARTITIONS + 1)]).await?;
    let err = RunningStages::start(&settings)?
        .stop()
        .await
        .expect_err("an internal topic of the wrong size");
    assert_eq!(
        format!("{err:#}"),
        format!(
            "cannot set up the internal topics: internal topic `{internal}` has 3 partitions, not the 2 its stage writes: delete it (the pipeline's downstream state goes with it) or set the output's partitions to 3"
        )
    );
    Ok(())
}

/// Outputs that do not fit the stages' operators refuse the whole pipeline before anything
/// starts, every one named with its stage: here the counter (which declares no named output)
/// is bound an output `late` in the first stage and read as `first`'s output `nope` by the
/// second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_that_do_not_fit_the_operators_are_all_named_before_anything_starts()
-> anyhow::Result<()> {
    let (mut settings, output) = counter_pipeline_on_s3("stages-outputs", PARTITIONS).await?;
    two_counters(&mut settings, &output, None);
    let stages = &mut settings.pipeline.stages;
    stages[0].outputs.insert(
        "late".to_owned(),
        StageOutput {
            topic: Some(unique("late")),
            partitions: None,
        },
    );
    // `first`'s default output to a topic of its own: the second stage reads `nope` instead.
    stages[0].outputs.insert(
        "default".to_owned(),
        StageOutput {
            topic: Some(unique("first-out")),
            partitions: None,
        },
    );
    stages[1].inputs[0].output = Some("nope".to_owned());
    let err = RunningStages::start(&settings)?
        .stop()
        .await
        .expect_err("outputs the operators do not declare");
    let message = format!("{err:#}");
    assert!(
        message.starts_with("the stages' outputs do not fit their operators: "),
        "{message}"
    );
    for problem in [
        "stage `first`: the operator has no output `late`",
        "stage `first`: the operator has no output `nope`",
    ] {
        assert!(message.contains(problem), "{problem:?} in {message}");
    }
    Ok(())
}

/// A stage that opens for the first time after its upstream wrote reads the internal topic
/// from its beginning, even with `auto.offset.reset = latest` (which is for the pipeline's own
/// input topics): nothing the upstream wrote before is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_downstream_stage_reads_its_internal_topic_from_the_beginning() -> anyhow::Result<()>
{
    let (mut settings, output) = counter_pipeline_on_s3("stages-reset", PARTITIONS).await?;
    let input = settings.pipeline.input_topics[0].clone();
    settings.pipeline.checkpoint_interval = Duration::from_millis(200);
    let internal = two_counters(&mut settings, &output, None);
    let mut expected = BTreeMap::new();
    produce_counter(&input, PARTITIONS, (0, 200), KEYS, &mut expected).await?;
    // The first stage alone: its outputs wait on the internal topic.
    create_topics(&[(&internal, PARTITIONS)]).await?;
    let plan = settings
        .stage_plan()
        .context("stages")?
        .map_err(|problems| anyhow::anyhow!("{problems:?}"))?;
    let first = RunningPipeline::start(plan.runs[0].settings.clone());
    first.wait_done(200, Duration::from_secs(60)).await?;
    first.stop().await?;
    // Then the whole pipeline, its own inputs read from their end when they have no offset.
    settings
        .kafka
        .consumer
        .insert("auto.offset.reset".into(), "latest".into());
    let running = RunningStages::start(&settings)?;
    let counts = read_final_counts(&output, &expected).await?;
    running.stop().await?;
    assert_counts_exact(&expected, &counts);
    Ok(())
}

/// Produces `(key, value, timestamp)` records to `partition` of `topic`.
async fn produce_at(
    topic: &str,
    partition: i32,
    records: &[(&str, &str, i64)],
) -> anyhow::Result<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()?;
    for (key, value, timestamp_ms) in records {
        let record = FutureRecord::to(topic)
            .partition(partition)
            .key(key.as_bytes())
            .payload(value.as_bytes())
            .timestamp(*timestamp_ms);
        if let Err((err, _)) = producer.send(record, Duration::from_secs(30)).await {
            anyhow::bail!("cannot produce: {err}");
        }
    }
    Ok(())
}

/// Event time across the edge: the first stage forwards an event-time timer command and its
/// two shards run far apart in event time (partition 0 to 100 s, partition 1 to 1 s); the
/// second stage, with no disorder of its own, fires the timer (at 50 s) only once the slow
/// upstream shard has passed it, at the lowest of the upstream shards' watermarks — not at
/// what the fast shard's record timestamps on the internal topic would say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watermark_crosses_the_edge_as_its_slowest_upstream_shards() -> anyhow::Result<()> {
    let (mut settings, output) = counter_pipeline_on_s3("stages-time", PARTITIONS).await?;
    let input = settings.pipeline.input_topics[0].clone();
    settings.pipeline.delivery = Delivery::ExactlyOnce;
    settings.pipeline.checkpoint_interval = Duration::from_millis(200);
    let internal = two_counters(&mut settings, &output, None);
    produce_at(
        &input,
        0,
        &[
            ("a", "forward:timer:event:t:50000", 10_000),
            ("b", "v", 20_000),
            ("b", "v", 100_000),
        ],
    )
    .await?;
    produce_at(&input, 1, &[("c", "v", 1_000)]).await?;
    let running = RunningStages::start(&settings)?;
    // The stages start once Weir has made the internal topic: its metadata is how a client
    // learns that it exists.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while high_watermarks(&internal, PARTITIONS).is_err() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no internal topic `{internal}`"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both upstream shards' markers are on the internal topic: 99999 and 999.
    let mut seen = std::collections::BTreeSet::new();
    read_until(&internal, Duration::from_secs(60), Duration::ZERO, |msg| {
        if let Some(marker) = header(msg, "weir.watermark") {
            seen.insert(marker);
        }
        seen.contains("0:99999") && seen.contains("1:999")
    })
    .await?;
    produce_at(&input, 1, &[("c", "v", 60_000)]).await?;
    let mut fired = None;
    read_until(&output, Duration::from_secs(60), Duration::ZERO, |msg| {
        let value: serde_json::Value =
            serde_json::from_slice(msg.payload().unwrap_or_default()).unwrap_or_default();
        if value.get("fired").is_some() {
            fired = Some(value);
        }
        fired.is_some()
    })
    .await?;
    running.stop().await?;
    let fired = fired.context("the timer fired")?;
    assert_eq!(fired["fired"], "t");
    assert_eq!(
        fired["watermark"], 59_999,
        "the slow upstream shard's watermark (60000 - 1), not the fast one's: {fired}"
    );
    Ok(())
}

/// Makes `settings` (a counter pipeline from its input to `output`) two stages of the counter:
/// `first` reads the input and writes an internal topic (of `internal_partitions`, default as
/// many as the input's), which `second` reads and counts into `output`. Returns the internal
/// topic.
fn two_counters(settings: &mut Settings, output: &str, internal_partitions: Option<i32>) -> String {
    let operator = std::mem::take(&mut settings.pipeline.operator);
    let input = std::mem::take(&mut settings.pipeline.input_topics).remove(0);
    settings.pipeline.output_topic = None;
    let internal = StageOutput {
        topic: None,
        partitions: internal_partitions,
    };
    let to_output = StageOutput {
        topic: Some(output.to_owned()),
        partitions: None,
    };
    settings.pipeline.stages = vec![
        StageSettings {
            name: "first".into(),
            operator: operator.clone(),
            inputs: vec![StageInput {
                topic: Some(input),
                ..StageInput::default()
            }],
            outputs: BTreeMap::from([("default".to_owned(), internal)]),
            ..stage()
        },
        StageSettings {
            name: "second".into(),
            operator,
            inputs: vec![StageInput {
                stage: Some("first".into()),
                ..StageInput::default()
            }],
            outputs: BTreeMap::from([("default".to_owned(), to_output)]),
            ..stage()
        },
    ];
    weir_host::config::stages::internal_topic(&settings.pipeline.name, "first", "default", 0)
}

/// A stage with nothing set but what the tests above set.
fn stage() -> StageSettings {
    StageSettings::default()
}
