//! A pipeline of stages in the API (`stages` of a [`PipelineSpec`], docs/topologies.md): each
//! stage's definition ([`StageSpec`]), their validation (every problem at once, with the
//! graph's from `crate::topology`), the internal topics Weir keeps for their edges, and the
//! `weir run` stages a host runs them as.

use super::spec::{PipelineLimits, PipelineSpec, SpecError, kafka_topic, valid_topic};
use crate::catalog::valid_operator_name;
use crate::config::stages::{StageSettings, internal_topic};
use crate::config::{FailurePolicy, LateRecords, RuntimeSettings};
use crate::topology::{self, DEFAULT_OUTPUT, Node};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use utoipa::ToSchema;

pub use crate::config::stages::{StageInput, StageOutput};

/// Most parameters one operator (or stage) is given.
const PARAMETERS_MAX: usize = 64;

/// Longest parameter value, bytes.
const PARAMETER_VALUE_BYTES_MAX: usize = 4096;

/// Kafka's longest topic name, bytes.
const KAFKA_TOPIC_BYTES_MAX: usize = 249;

/// One stage of a pipeline: an operator over topics or earlier stages' outputs, with its own
/// parameters and, if it sets them, its own event-time and failure settings (the pipeline's
/// otherwise). Its state, consumer group and internal topics are named after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// The stage's name, 1..=64 bytes of `[a-z0-9_-]`, unique in the pipeline.
    pub name: String,
    /// One of the tenant's operators.
    pub operator: String,
    /// Its version (from 1).
    pub operator_version: u64,
    /// What it reads, 1..=8: `{"topic": "…"}` (one of the tenant's topics) or
    /// `{"stage": "…"}` (that stage's `default` output; `"output": "…"` for a named one).
    /// Co-partitioned when more than one.
    pub inputs: Vec<StageInput>,
    /// Where its outputs go, by name: `{"default": {"topic": "…"}}` for a topic of the
    /// tenant's; an output that a later stage reads and that names no topic goes through an
    /// internal topic Weir creates (`{"partitions": n}`: with `n` partitions rather than as
    /// many as the stage's inputs have). Every output the operator declares must go somewhere.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, StageOutput>,
    /// Its operator's parameters, as the pipeline's `parameters`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// As the pipeline's `max_out_of_orderness_ms`, for this stage. A stage that reads another
    /// also takes the watermark its upstream stage sends (docs/topologies.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_out_of_orderness_ms: Option<u64>,
    /// As the pipeline's `idle_timeout_ms`, for this stage; at least two checkpoint intervals
    /// when it reads another stage (whose shards send their watermarks once per checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// As the pipeline's `idle_advance`, for this stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_advance: Option<bool>,
    /// As the pipeline's `late_records`, for this stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_records: Option<LateRecords>,
    /// As the pipeline's `in_flight_max`, for this stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight_max: Option<u64>,
    /// As the pipeline's `failure_policy`, for this stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    /// The limits of this stage's operator calls, replacing the pipeline's `limits` (each
    /// absent field takes the host's value, as there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<PipelineLimits>,
}

impl StageSpec {
    /// The graph's view of it.
    fn node(&self) -> Node<'_> {
        Node {
            name: &self.name,
            inputs: self
                .inputs
                .iter()
                .filter_map(StageInput::as_input)
                .collect(),
            topics: self
                .outputs
                .iter()
                .filter_map(|(name, out)| Some((name.as_str(), out.topic.as_deref()?)))
                .collect(),
        }
    }

    /// Whether it reads another stage (through an internal topic).
    fn reads_a_stage(&self) -> bool {
        self.inputs.iter().any(|i| i.stage.is_some())
    }
}

/// `stages` as a spec gives it: an empty list is refused (no stage is no pipeline of stages;
/// leave `stages` out for a one-operator one).
pub(super) fn listed_stages<'de, D: serde::Deserializer<'de>>(
    stages: D,
) -> Result<Vec<StageSpec>, D::Error> {
    let stages = Vec::<StageSpec>::deserialize(stages)?;
    if stages.is_empty() {
        return Err(serde::de::Error::custom(
            "stages must list 1..=32 stages (leave it out for a one-operator pipeline)",
        ));
    }
    Ok(stages)
}

/// The problems of `parameters` (of `field`): too many, a name or value too long.
pub(super) fn parameter_problems(
    field: &str,
    parameters: &BTreeMap<String, String>,
    problems: &mut Vec<String>,
) {
    if parameters.len() > PARAMETERS_MAX {
        problems.push(format!(
            "{field} holds at most {PARAMETERS_MAX} parameters. count={}",
            parameters.len()
        ));
    }
    for (name, value) in parameters {
        if !(1..=64).contains(&name.len()) {
            problems.push(format!(
                "{field}: parameter names are 1..=64 bytes. name=`{name}`"
            ));
        }
        if value.len() > PARAMETER_VALUE_BYTES_MAX {
            problems.push(format!(
                "{field}.{name} is {} bytes, more than {PARAMETER_VALUE_BYTES_MAX}",
                value.len()
            ));
        }
    }
}

/// The name pipeline `pipeline` (of uid `uid`) of `tenant`, a pipeline of stages, runs
/// under: `{tenant}.{pipeline}.{uid}`. Its stages' runs
/// are `{…}@{stage}` and its internal topics `{…}.{stage}.{output}.internal`: under the
/// tenant's prefix, and a pipeline created again under a deleted one's name never meets the
/// deleted one's topics (whose deletion Kafka finishes in its own time).
/// The problems of `stage`'s table names (`table` and `global_table`): each 1..=64 bytes, not
/// a reserved name (`!…`), and no name twice in the stage — the operator reads each by its
/// name, and so does the API's state query.
fn table_name_problems(stage: &StageSpec, problems: &mut Vec<String>) {
    let mut seen = std::collections::BTreeSet::new();
    let names = stage
        .inputs
        .iter()
        .filter_map(|i| i.table.as_deref().or(i.global_table.as_deref()));
    for table in names {
        let name = &stage.name;
        if table.is_empty() || table.len() > 64 || table.starts_with('!') {
            problems.push(format!(
                "stage `{name}`: table `{table}`: a table's name is 1..=64 bytes and does not start with `!`"
            ));
        }
        if !seen.insert(table) {
            problems.push(format!(
                "stage `{name}`: two inputs are read as table `{table}`"
            ));
        }
    }
}

pub fn staged_run_name(tenant: &str, pipeline: &str, uid: &str) -> String {
    format!("{}.{uid}", kafka_topic(tenant, pipeline))
}

impl PipelineSpec {
    /// Whether it is a pipeline of stages.
    pub fn is_staged(&self) -> bool {
        !self.stages.is_empty()
    }

    /// Every operator version it runs, `(operator, version)`: its operator's, or each stage's.
    pub fn operator_versions(&self) -> Vec<(&str, u64)> {
        if self.is_staged() {
            self.stages
                .iter()
                .map(|s| (s.operator.as_str(), s.operator_version))
                .collect()
        } else {
            vec![(self.operator.as_str(), self.operator_version)]
        }
    }

    /// The graph of its stages.
    fn nodes(&self) -> Vec<Node<'_>> {
        self.stages.iter().map(StageSpec::node).collect()
    }

    /// Its edges through internal topics, as `(writing stage, output)`, in the order its
    /// stages write them; none for a one-operator pipeline or a graph with problems.
    pub fn edges(&self) -> Vec<(String, String)> {
        let nodes = self.nodes();
        match topology::check(&nodes) {
            Ok(order) if self.is_staged() => order
                .internal
                .iter()
                .map(|(i, output)| (self.stages[*i].name.clone(), (*output).to_owned()))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The named outputs of stage `stage` that the pipeline uses (bound in its `outputs`, or
    /// read by another stage), besides `default`, which every operator has.
    pub fn used_outputs(&self, stage: &str) -> Vec<String> {
        let bound = self
            .stages
            .iter()
            .filter(|s| s.name == stage)
            .flat_map(|s| s.outputs.keys().cloned());
        let read = self
            .stages
            .iter()
            .flat_map(|s| &s.inputs)
            .filter(|i| i.stage.as_deref() == Some(stage))
            .map(|i| {
                i.output
                    .clone()
                    .unwrap_or_else(|| DEFAULT_OUTPUT.to_owned())
            });
        let mut used: Vec<String> = bound.chain(read).filter(|o| o != DEFAULT_OUTPUT).collect();
        used.sort();
        used.dedup();
        used
    }

    /// Each output a stage uses that its operator version does not declare, as a problem;
    /// `declared` gives a stage's operator version's named outputs, `None` when unknown (a
    /// version uploaded before they were kept: checked when the pipeline runs).
    pub fn undeclared_output_problems(
        &self,
        declared: impl Fn(&StageSpec) -> Option<Vec<String>>,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        for stage in &self.stages {
            let Some(declared) = declared(stage) else {
                continue;
            };
            for output in self.used_outputs(&stage.name) {
                if !declared.contains(&output) {
                    problems.push(format!(
                        "stage `{}` uses output `{output}`, which version {} of operator `{}` does not declare (it declares {declared:?} besides `default`)",
                        stage.name, stage.operator_version, stage.operator
                    ));
                }
            }
        }
        problems
    }

    /// The Kafka topics of its edges when it runs as `run_name` ([`staged_run_name`]) with
    /// internal topics of generation `generation`, in the order its stages write them ([`Self::edges`]).
    pub fn internal_topics(&self, run_name: &str, generation: u64) -> Vec<String> {
        self.edges()
            .iter()
            .map(|(stage, output)| internal_topic(run_name, stage, output, generation))
            .collect()
    }

    /// The problems of a pipeline of stages: a one-operator field beside `stages`, each stage's
    /// operator, topics, outputs, parameters and settings, the graph's (cycles, unknown
    /// stages, unbound outputs…), and an edge's reader idle sooner than its upstream's
    /// watermarks come.
    pub(super) fn stage_problems(&self, problems: &mut Vec<String>) {
        let one_operator = [
            ("operator", !self.operator.is_empty()),
            ("operator_version", self.operator_version != 0),
            ("input_topics", !self.input_topics.is_empty()),
            ("output_topic", self.output_topic.is_some()),
            ("parameters", !self.parameters.is_empty()),
            ("iceberg", self.iceberg.is_some()),
        ];
        for (field, set) in one_operator {
            if set {
                problems.push(if field == "iceberg" {
                    format!(
                        "{field} is for a one-operator pipeline: a pipeline of stages writes no table yet"
                    )
                } else {
                    format!(
                        "{field} is for a one-operator pipeline: with stages, each stage names its own"
                    )
                });
            }
        }
        for stage in &self.stages {
            self.one_stage_problems(stage, problems);
        }
        if let Err(graph) = topology::check(&self.nodes()) {
            problems.extend(graph.into_iter().map(|p| format!("stages: {p}")));
        }
    }

    /// The problems of `stage` on its own.
    fn one_stage_problems(&self, stage: &StageSpec, problems: &mut Vec<String>) {
        let name = &stage.name;
        if !valid_operator_name(&stage.operator) || stage.operator_version == 0 {
            problems.push(format!(
                "stage `{name}`: operator must name one of your operators and operator_version one of its versions (from 1). operator=`{}` operator_version={}",
                stage.operator, stage.operator_version
            ));
        }
        if stage.inputs.len() > 8 {
            problems.push(format!(
                "stage `{name}`: inputs must list 1..=8 inputs. count={}",
                stage.inputs.len()
            ));
        }
        for (i, input) in stage.inputs.iter().enumerate() {
            match (&input.topic, &input.stage, &input.output) {
                (Some(topic), None, None) => {
                    if input.table.is_some() && input.global_table.is_some() {
                        problems.push(format!(
                            "stage `{name}`: inputs[{i}] is a table or a global table, not both"
                        ));
                    }
                    if *topic == self.dead_letter_topic {
                        problems.push(format!(
                            "stage `{name}` reads the dead-letter topic `{topic}`"
                        ));
                    }
                }
                (None, Some(_), _) if input.table.is_none() && input.global_table.is_none() => {}
                _ => problems.push(format!(
                    "stage `{name}`: inputs[{i}] must be {{\"topic\": \"…\"}} (with \"table\" or \"global_table\" to read it as a table) or {{\"stage\": \"…\"}} (with \"output\" for a named one)"
                )),
            }
        }
        table_name_problems(stage, problems);
        for (output, to) in &stage.outputs {
            if to.topic.as_ref() == Some(&self.dead_letter_topic) {
                problems.push(format!(
                    "stage `{name}`: output `{output}` goes to the dead-letter topic `{}`: results and dead letters would mix",
                    self.dead_letter_topic
                ));
            }
            if to.topic.is_some() && to.partitions.is_some() {
                problems.push(format!(
                    "stage `{name}`: outputs.{output}.partitions is for an internal topic: a topic of yours has its own"
                ));
            }
            if to.partitions.is_some_and(|n| !(1..=10_000).contains(&n)) {
                problems.push(format!(
                    "stage `{name}`: outputs.{output}.partitions must be 1..=10000"
                ));
            }
            let read = self.stages.iter().flat_map(|s| &s.inputs).any(|i| {
                i.stage.as_ref() == Some(name)
                    && i.output.as_deref().unwrap_or(DEFAULT_OUTPUT) == output
            });
            if output != DEFAULT_OUTPUT && to.topic.is_none() && !read {
                problems.push(format!(
                    "stage `{name}`: output `{output}` goes nowhere: give it a topic or read it in another stage"
                ));
            }
        }
        let topics = stage
            .inputs
            .iter()
            .filter_map(|i| i.topic.as_ref())
            .chain(stage.outputs.values().filter_map(|o| o.topic.as_ref()));
        for topic in topics {
            if !valid_topic(topic) {
                problems.push(format!(
                    "stage `{name}`: topic names must be 1..=200 bytes of [A-Za-z0-9._-], not ending in `.internal`. topic=`{topic}`"
                ));
            }
        }
        parameter_problems(
            &format!("stage `{name}`: parameters"),
            &stage.parameters,
            problems,
        );
        self.stage_time_problems(stage, problems);
    }

    /// `stage`'s own event-time and in-flight settings within their ranges, and its idleness
    /// no shorter than two checkpoint intervals when it reads another stage.
    fn stage_time_problems(&self, stage: &StageSpec, problems: &mut Vec<String>) {
        let name = &stage.name;
        if stage
            .max_out_of_orderness_ms
            .is_some_and(|v| v > 31_536_000_000)
        {
            problems.push(format!(
                "stage `{name}`: max_out_of_orderness_ms must be 0..=31536000000 (a year)"
            ));
        }
        if stage
            .idle_timeout_ms
            .is_some_and(|t| !(10..=86_400_000).contains(&t))
        {
            problems.push(format!(
                "stage `{name}`: idle_timeout_ms must be 10..=86400000"
            ));
        }
        if stage
            .in_flight_max
            .is_some_and(|n| !(1..=65_536).contains(&n))
        {
            problems.push(format!("stage `{name}`: in_flight_max must be 1..=65536"));
        }
        let idle = stage.idle_timeout_ms.or(self.idle_timeout_ms);
        if stage.idle_advance.unwrap_or(self.idle_advance) && idle.is_none() {
            problems.push(format!(
                "stage `{name}`: idle_advance needs idle_timeout_ms"
            ));
        }
        if stage.reads_a_stage() && idle.is_some_and(|idle| idle < 2 * self.checkpoint_interval_ms)
        {
            problems.push(format!(
                "stage `{name}`: idle_timeout_ms must be at least twice checkpoint_interval_ms when it reads another stage (upstream shards send their watermarks once per checkpoint). idle_timeout_ms={} checkpoint_interval_ms={}",
                idle.unwrap_or_default(),
                self.checkpoint_interval_ms
            ));
        }
    }

    /// The problems of each stage's own `limits` against the host's, each naming its stage.
    pub(super) fn stage_limit_problems(&self, host: &RuntimeSettings, problems: &mut Vec<String>) {
        for stage in &self.stages {
            if let Some(Err(e)) = stage.limits.as_ref().map(|l| l.apply(host)) {
                let name = &stage.name;
                problems.extend(e.problems.iter().map(|p| format!("stage `{name}`: {p}")));
            }
        }
    }

    /// The runtime stage `stage` runs with on a host of `host`'s limits: its own `limits`, or
    /// else the pipeline's, applied.
    ///
    /// # Errors
    /// A limit above the host's (one lowered since the pipeline was defined), as
    /// [`PipelineLimits::apply`].
    pub fn stage_runtime(
        &self,
        stage: &str,
        host: &RuntimeSettings,
    ) -> Result<RuntimeSettings, SpecError> {
        let own = self
            .stages
            .iter()
            .find(|s| s.name == stage)
            .and_then(|s| s.limits.as_ref());
        own.unwrap_or(&self.limits).apply(host)
    }

    /// Its internal topics' Kafka names too long for Kafka (249 bytes) when it runs as
    /// `run_name` with internal topics of generation `generation`, each a problem.
    pub fn internal_topic_length_problems(&self, run_name: &str, generation: u64) -> Vec<String> {
        self.internal_topics(run_name, generation)
            .into_iter()
            .filter(|t| t.len() > KAFKA_TOPIC_BYTES_MAX)
            .map(|t| {
                format!(
                    "the internal topic `{t}` would be {} bytes, more than Kafka's {KAFKA_TOPIC_BYTES_MAX}: shorten the pipeline's, the stage's or the output's name",
                    t.len()
                )
            })
            .collect()
    }

    /// Its stages as `weir run` has them, for a host of `tenant`: topics under the tenant's
    /// prefix, each stage's operator at `operators[i]` (in the order of `stages`), its own
    /// settings where it sets them.
    pub fn stage_settings(&self, tenant: &str, operators: &[PathBuf]) -> Vec<StageSettings> {
        self.stages
            .iter()
            .zip(operators)
            .map(|(stage, operator)| StageSettings {
                name: stage.name.clone(),
                operator: operator.clone(),
                inputs: stage
                    .inputs
                    .iter()
                    .map(|i| StageInput {
                        topic: i.topic.as_ref().map(|t| kafka_topic(tenant, t)),
                        ..i.clone()
                    })
                    .collect(),
                outputs: stage
                    .outputs
                    .iter()
                    .map(|(name, o)| {
                        let topic = o.topic.as_ref().map(|t| kafka_topic(tenant, t));
                        (name.clone(), StageOutput { topic, ..o.clone() })
                    })
                    .collect(),
                max_out_of_orderness: stage.max_out_of_orderness_ms.map(Duration::from_millis),
                idle_timeout: stage.idle_timeout_ms.map(Duration::from_millis),
                idle_advance: stage.idle_advance,
                late_records: stage.late_records,
                in_flight_max: stage.in_flight_max.map(|n| n as usize),
                failure_policy: stage.failure_policy,
                parameters: stage.parameters.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
