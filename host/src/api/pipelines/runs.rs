//! Which run holds a part of a pipeline's state, as its hosts name it ([`ShardRun`]): the
//! pipeline's own run, or one stage's of a pipeline of stages (`runner::job`, and
//! docs/topologies.md, "Through the API"). Verify and queryable state read a pipeline's shards,
//! and the checkpoints Kafka's committed offsets name, through it.

use super::{PipelineRecord, kafka_topic, staged_run_name};
use crate::api::problem::ApiError;
use crate::config::stages::{internal_topic, run_name};
use crate::topology::DEFAULT_OUTPUT;

/// One run's shards of a pipeline: their name, consumer group, input topics and operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardRun {
    /// The stage, in a pipeline of stages.
    pub stage: Option<String>,
    /// The shards' pipeline name (`ShardId::pipeline`): `{tenant}.{name}`, or
    /// `{tenant}.{name}.{uid}@{stage}`.
    pub shards: String,
    /// The consumer group the run joins: `weir.{tenant}.{name}.{uid}` (`@{stage}` for a
    /// stage's).
    pub group: String,
    /// Its input topics, as Kafka names them (an internal topic for a stage that reads
    /// another).
    pub input_topics: Vec<String>,
    /// The operator it runs, and its version.
    pub operator: (String, u64),
}

impl ShardRun {
    /// The one run of a one-operator pipeline.
    pub(crate) fn pipeline(tenant: &str, record: &PipelineRecord) -> Self {
        let spec = &record.spec;
        Self {
            stage: None,
            shards: kafka_topic(tenant, &record.name),
            group: group(tenant, record),
            input_topics: spec
                .input_topics
                .iter()
                .map(|t| kafka_topic(tenant, t))
                .collect(),
            operator: (spec.operator.clone(), spec.operator_version),
        }
    }

    /// The run `stage` names: the pipeline's (no stage, for a one-operator pipeline), or that
    /// stage's.
    ///
    /// # Errors
    /// 400: a stage asked of a one-operator pipeline, none of a pipeline of stages, or one it
    /// does not have.
    pub(crate) fn of(
        tenant: &str,
        record: &PipelineRecord,
        stage: Option<&str>,
    ) -> Result<Self, ApiError> {
        let spec = &record.spec;
        let names = || -> Vec<&str> { spec.stages.iter().map(|s| s.name.as_str()).collect() };
        match (stage, spec.is_staged()) {
            (None, false) => Ok(Self::pipeline(tenant, record)),
            (Some(_), false) => Err(ApiError::bad_request(
                "this pipeline has one operator and no stages: leave `stage` out",
            )),
            (None, true) => Err(ApiError::bad_request(format!(
                "this pipeline has stages: name the one to read (`stage`, one of {:?})",
                names()
            ))),
            (Some(name), true) => Self::all(tenant, record)
                .into_iter()
                .find(|run| run.stage.as_deref() == Some(name))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "the pipeline has no stage `{name}`; its stages: {:?}",
                        names()
                    ))
                }),
        }
    }

    /// Every run of the pipeline: its one, or each stage's, in the order of `stages`.
    pub(crate) fn all(tenant: &str, record: &PipelineRecord) -> Vec<Self> {
        let spec = &record.spec;
        if !spec.is_staged() {
            return vec![Self::pipeline(tenant, record)];
        }
        let run = staged_run_name(tenant, &record.name, &record.uid);
        // Where a stage's output goes: the tenant's topic it is bound to, or its edge.
        let topic_of = |stage: &str, output: &str| {
            spec.stages
                .iter()
                .find(|s| s.name == stage)
                .and_then(|s| s.outputs.get(output))
                .and_then(|o| o.topic.as_deref())
                .map_or_else(
                    || internal_topic(&run, stage, output, record.edge_generation),
                    |t| kafka_topic(tenant, t),
                )
        };
        spec.stages
            .iter()
            .map(|stage| Self {
                stage: Some(stage.name.clone()),
                shards: run_name(&run, &stage.name),
                group: run_name(&group(tenant, record), &stage.name),
                input_topics: stage
                    .inputs
                    .iter()
                    .map(|input| match (&input.topic, &input.stage) {
                        (Some(topic), _) => kafka_topic(tenant, topic),
                        (None, stage) => topic_of(
                            stage.as_deref().unwrap_or_default(),
                            input.output.as_deref().unwrap_or(DEFAULT_OUTPUT),
                        ),
                    })
                    .collect(),
                operator: (stage.operator.clone(), stage.operator_version),
            })
            .collect()
    }
}

/// The consumer group of `record`'s runs.
fn group(tenant: &str, record: &PipelineRecord) -> String {
    super::consumer_group(tenant, &record.name, &record.uid)
}
