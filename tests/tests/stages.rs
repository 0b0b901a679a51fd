//! A pipeline of two stages on the real broker and S3 server (docs/topologies.md): the first
//! counts the input per key, the second counts the first's emits per key through the internal
//! topic Weir creates, so the second's counts of a key are exactly 1..=n (n its records) when
//! every record crosses the edge once — exactly-once, across a stop and a restart.

use anyhow::Context as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::stages::{StageInput, StageOutput, StageSettings};
use weir_host::config::{Delivery, Settings};
use weir_host::pipeline::PipelineStats;
use weir_host::runner::StagesError;
use weir_host::state::configured::ConfiguredBackend;
use weir_tests::*;

const PARTITIONS: i32 = 2;
const INTERNAL_PARTITIONS: i32 = 3;
const KEYS: u64 = 30;

/// A pipeline of stages running in this process.
struct RunningStages {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), StagesError>>,
}

impl RunningStages {
    fn start(settings: &Settings) -> anyhow::Result<Self> {
        let plan = settings
            .stage_plan()
            .context("stages")?
            .map_err(|problems| anyhow::anyhow!("{problems:?}"))?;
        let clock: SharedClock = Arc::new(SystemClock);
        let backend = Arc::new(ConfiguredBackend::from_settings(
            &settings.state,
            clock.clone(),
        )?);
        let stats = plan
            .runs
            .iter()
            .map(|_| Arc::new(PipelineStats::default()))
            .collect();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let kafka = settings.kafka.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            weir_host::runner::run_stages(&kafka, plan, stats, backend, clock, shutdown).await
        });
        Ok(Self { stop, task })
    }

    /// Stops every stage (each drains and takes its last checkpoint).
    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

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
    let operator = std::mem::take(&mut settings.pipeline.operator);
    settings.pipeline.input_topics.clear();
    settings.pipeline.output_topic = None;
    settings.pipeline.stages = vec![
        StageSettings {
            name: "first".into(),
            operator: operator.clone(),
            inputs: vec![StageInput {
                topic: Some(input.clone()),
                ..StageInput::default()
            }],
            outputs: BTreeMap::from([(
                "default".to_owned(),
                StageOutput {
                    topic: None,
                    partitions: Some(INTERNAL_PARTITIONS),
                },
            )]),
            ..stage()
        },
        StageSettings {
            name: "second".into(),
            operator,
            inputs: vec![StageInput {
                stage: Some("first".into()),
                ..StageInput::default()
            }],
            outputs: BTreeMap::from([(
                "default".to_owned(),
                StageOutput {
                    topic: Some(output.clone()),
                    partitions: None,
                },
            )]),
            ..stage()
        },
    ];
    settings.validate()?;
    let internal =
        weir_host::config::stages::internal_topic(&settings.pipeline.name, "first", "default");

    let mut expected = BTreeMap::new();
    produce_counter(&input, PARTITIONS, (0, 300), KEYS, &mut expected).await?;
    let running = RunningStages::start(&settings)?;
    read_final_counts(&output, &expected).await?;
    running.stop().await?;

    // A second run resumes every stage from its last checkpoint.
    produce_counter(&input, PARTITIONS, (300, 600), KEYS, &mut expected).await?;
    let running = RunningStages::start(&settings)?;
    let counts = read_final_counts(&output, &expected).await?;
    running.stop().await?;

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
    let input = settings.pipeline.input_topics[0].clone();
    let operator = std::mem::take(&mut settings.pipeline.operator);
    settings.pipeline.input_topics.clear();
    settings.pipeline.output_topic = None;
    settings.pipeline.stages = vec![
        StageSettings {
            name: "first".into(),
            operator: operator.clone(),
            inputs: vec![StageInput {
                topic: Some(input),
                ..StageInput::default()
            }],
            ..stage()
        },
        StageSettings {
            name: "second".into(),
            operator,
            inputs: vec![StageInput {
                stage: Some("first".into()),
                ..StageInput::default()
            }],
            outputs: BTreeMap::from([(
                "default".to_owned(),
                StageOutput {
                    topic: Some(output),
                    partitions: None,
                },
            )]),
            ..stage()
        },
    ];
    let internal =
        weir_host::config::stages::internal_topic(&settings.pipeline.name, "first", "default");
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

/// A stage with nothing set but what the tests above set.
fn stage() -> StageSettings {
    StageSettings {
        name: String::new(),
        operator: Default::default(),
        inputs: Vec::new(),
        outputs: BTreeMap::new(),
        max_out_of_orderness: None,
        idle_timeout: None,
        idle_advance: None,
        late_records: None,
        in_flight_max: None,
        failure_policy: None,
    }
}
