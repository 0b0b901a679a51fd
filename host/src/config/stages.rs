//! A `weir run` pipeline of more than one step (`[[pipeline.stages]]`, docs/topologies.md):
//! each stage an operator over topics or earlier stages' outputs. [`Settings::stage_plan`]
//! turns it into one run's [`Settings`] per stage, in the order the graph gives
//! (`crate::topology`), and the internal topics between them.
//!
//! ```toml
//! [pipeline]
//! name = "rekeyed-counts"
//! dead_letter_topic = "dead-letters"
//! delivery = "exactly_once"
//!
//! [[pipeline.stages]]
//! name = "rekey"
//! operator = "rekey.wasm"
//! inputs = [{ topic = "clicks" }]
//!
//! [[pipeline.stages]]
//! name = "count"
//! operator = "count.wasm"
//! inputs = [{ stage = "rekey" }]
//! outputs = { default = { topic = "counts" } }
//! ```

use super::{FailurePolicy, LateRecords, Settings};
use crate::topology::{self, DEFAULT_OUTPUT, Input, Node};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// One stage of a `weir run` pipeline. Its runs share the pipeline's Kafka, runtime, state,
/// delivery, checkpoint interval and dead-letter topic; the event-time and failure settings
/// left out here are the pipeline's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSettings {
    /// The stage's name, 1..=64 bytes of `[a-z0-9_-]`, unique in the pipeline: its state,
    /// consumer group and internal topics are named after it.
    pub name: String,
    /// Path to its operator component.
    pub operator: PathBuf,
    /// What it reads, at least one besides tables: `{ topic = "…" }`, `{ stage = "…" }` (the
    /// stage's `default` output) or a table, `{ topic = "…", table = "state" }`;
    /// co-partitioned when more than one.
    pub inputs: Vec<StageInput>,
    /// Where its outputs go: `{ default = { topic = "…" }, late = { topic = "…" } }` —
    /// `default` and the named outputs its operator declares. An output no later stage reads
    /// must go to a topic; one that a stage reads and that names no topic is an internal topic.
    #[serde(default)]
    pub outputs: BTreeMap<String, StageOutput>,
    /// As `pipeline.max_out_of_orderness`, for this stage.
    #[serde(default, with = "humantime_serde")]
    pub max_out_of_orderness: Option<Duration>,
    /// As `pipeline.idle_timeout`, for this stage.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// As `pipeline.idle_advance`, for this stage.
    #[serde(default)]
    pub idle_advance: Option<bool>,
    /// As `pipeline.late_records`, for this stage.
    #[serde(default)]
    pub late_records: Option<LateRecords>,
    /// As `pipeline.in_flight_max`, for this stage.
    #[serde(default)]
    pub in_flight_max: Option<usize>,
    /// As `pipeline.failure_policy`, for this stage.
    #[serde(default)]
    pub failure_policy: Option<FailurePolicy>,
    /// Its operator's parameters (`weir:operator/parameters`), as `pipeline.parameters`.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// A stage's input: a topic, or an earlier stage's output (`weir run`'s and the API's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StageInput {
    /// A topic (not one the pipeline writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// A stage of the pipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// That stage's output; default `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Read `topic` as a table into this value state of the operator's (docs/topologies.md,
    /// "Tables"): each record sets the state of its key to its value, an empty or null value
    /// clears it; the shard loads its partition to the end before any other record runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Read `topic` as a global table of this name (docs/topologies.md, "Global tables"): the
    /// whole topic on every host, read by any key with `weir:operator/tables.get`; loaded to
    /// the end before the stage consumes, updated as records arrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_table: Option<String>,
}

/// Where a stage's output goes (`weir run`'s and the API's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StageOutput {
    /// A topic of the user's. Left out: an internal topic, which later stages read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Partitions of the internal topic when Weir creates it (1..=10,000); default: as many as
    /// the stage's inputs have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
}

/// A stage run's edges (docs/topologies.md): what the stage plan and its internal topics tell
/// it, never read from a file. Default: none (a one-operator run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edges {
    /// The stage this run is: its dead letters name it in a `weir.stage` header (its stages
    /// share the pipeline's dead-letter topic).
    pub stage: Option<String>,
    /// The outputs that are internal topics, each with its partitions: at each checkpoint the
    /// shard writes its watermark to every partition of each as a marker record.
    pub output_partitions: BTreeMap<String, i32>,
    /// The inputs that are internal topics, each with how many upstream shards write it: only
    /// their markers move its watermark.
    pub inputs: BTreeMap<String, usize>,
    /// The generation of the pipeline's internal topics ([`internal_topic`]): 0 until a reset
    /// to a savepoint starts new ones (set on the whole pipeline's settings by the API).
    pub generation: u64,
}

/// The Kafka topic of the internal edge from `stage`'s `output` in `pipeline`, generation
/// `generation`: `{pipeline}.{stage}.{output}.internal`, or `{pipeline}.{stage}.{output}.g{n}.internal`
/// from the first reset to a savepoint on (which seeds new topics with what was in flight).
/// Stage and output names hold no `.`, so no two edges of any pipelines share one.
pub fn internal_topic(pipeline: &str, stage: &str, output: &str, generation: u64) -> String {
    if generation == 0 {
        format!("{pipeline}.{stage}.{output}.internal")
    } else {
        format!("{pipeline}.{stage}.{output}.g{generation}.internal")
    }
}

/// The name of `stage`'s run in `pipeline` (or in its consumer group `pipeline`):
/// `{pipeline}@{stage}`. No pipeline name holds an `@` (`[A-Za-z0-9._-]`), so no one-operator
/// pipeline's shards, transactional ids or default consumer group (`weir-{pipeline}`) are a
/// stage's, whatever it is named. (Not a character the object store's paths escape, such as
/// `~`: a shard's objects are addressed under its root's escaped text, escaped once more, where
/// a listing of the pipeline's shards would not find them.)
pub fn run_name(pipeline: &str, stage: &str) -> String {
    format!("{pipeline}@{stage}")
}

/// An internal topic of a pipeline of stages, which Weir creates if it is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalTopic {
    /// The Kafka topic ([`internal_topic`]).
    pub name: String,
    /// Its partitions; `None`: as many as `like` has.
    pub partitions: Option<i32>,
    /// The writing stage's first input, whose partition count it takes by default (an internal
    /// topic itself, created earlier in the plan, for a stage after another).
    pub like: String,
}

/// One stage's run: its name and the settings of a one-operator run of it.
#[derive(Debug, Clone)]
pub struct StageRun {
    /// The stage's name.
    pub stage: String,
    /// Its run's settings: `pipeline.name` is `{pipeline}@{stage}` (its shards' and
    /// transactional ids' name), the consumer group `{group}@{stage}` ([`run_name`]).
    pub settings: Settings,
}

/// What runs a pipeline of stages: its internal topics, to exist first, and its stages'
/// runs, each after the stages it reads.
#[derive(Debug, Clone)]
pub struct StagePlan {
    /// The internal topics, in the order the stages that write them run.
    pub internal: Vec<InternalTopic>,
    /// The runs.
    pub runs: Vec<StageRun>,
}

impl StageSettings {
    /// Its tables (topic → state) and global tables (topic → name).
    fn tables(&self) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let tables = self
            .inputs
            .iter()
            .filter(|i| i.global_table.is_none())
            .filter_map(|i| Some((i.topic.clone()?, i.table.clone()?)))
            .collect();
        let global = self
            .inputs
            .iter()
            .filter_map(|i| {
                let (topic, name) = i.as_global_table()?;
                Some((topic.to_owned(), name.to_owned()))
            })
            .collect();
        (tables, global)
    }
}

impl StageInput {
    /// The topic and name of a global table input; `None` for any other input (and for a
    /// global table that also names a stage, an output or a state, which
    /// [`Settings::validate`] reports).
    pub(crate) fn as_global_table(&self) -> Option<(&str, &str)> {
        match (&self.topic, &self.global_table) {
            (Some(topic), Some(name))
                if self.stage.is_none() && self.output.is_none() && self.table.is_none() =>
            {
                Some((topic, name))
            }
            _ => None,
        }
    }

    /// The graph's view of it; `None` for a global table (outside the graph: no consumer
    /// group reads it), and unless it names a topic or a stage, not both (which
    /// [`Settings::validate`] reports).
    pub(crate) fn as_input(&self) -> Option<Input<'_>> {
        if self.global_table.is_some() {
            return None;
        }
        match (&self.topic, &self.stage, &self.output) {
            (None, Some(stage), output) if self.table.is_none() => Some(Input::Stage {
                stage,
                output: output.as_deref().unwrap_or(DEFAULT_OUTPUT),
            }),
            (Some(topic), None, None) => Some(Input::Topic(topic)),
            _ => None,
        }
    }
}

/// What only the plan shows: an edge's reader whose `idle_timeout` is shorter than two
/// checkpoint intervals (markers come once per interval: every upstream shard would go idle
/// between two).
fn plan_problems(plan: &StagePlan, problems: &mut Vec<String>) {
    let internal: std::collections::BTreeSet<&str> =
        plan.internal.iter().map(|t| t.name.as_str()).collect();
    for run in &plan.runs {
        let p = &run.settings.pipeline;
        let reads_edge = p.input_topics.iter().any(|t| internal.contains(t.as_str()));
        if reads_edge
            && p.idle_timeout
                .is_some_and(|idle| idle < 2 * p.checkpoint_interval)
        {
            problems.push(format!(
                "stage `{}`: idle_timeout must be at least twice pipeline.checkpoint_interval when it reads another stage (upstream shards write their watermarks once per checkpoint). idle_timeout={} checkpoint_interval={}",
                run.stage,
                humantime::format_duration(p.idle_timeout.unwrap_or_default()),
                humantime::format_duration(p.checkpoint_interval)
            ));
        }
    }
}

impl Settings {
    /// The graph of `pipeline.stages`, for `crate::topology`.
    pub(super) fn stage_nodes(&self) -> Vec<Node<'_>> {
        self.pipeline
            .stages
            .iter()
            .map(|s| Node {
                name: &s.name,
                inputs: s.inputs.iter().filter_map(StageInput::as_input).collect(),
                topics: s
                    .outputs
                    .iter()
                    .filter_map(|(name, out)| Some((name.as_str(), out.topic.as_deref()?)))
                    .collect(),
            })
            .collect()
    }

    /// The plan of a pipeline of stages; `None` for a one-operator pipeline (no
    /// `pipeline.stages`), which runs as it is.
    ///
    /// # Errors
    /// The graph's problems (which [`Settings::validate`] reports too).
    pub fn stage_plan(&self) -> Option<Result<StagePlan, Vec<String>>> {
        if self.pipeline.stages.is_empty() {
            return None;
        }
        let nodes = self.stage_nodes();
        Some(topology::check(&nodes).map(|order| self.plan(&order)))
    }

    fn plan(&self, order: &topology::Order) -> StagePlan {
        let p = &self.pipeline;
        let topic_of = |stage: &str, output: &str| {
            p.stages
                .iter()
                .find(|s| s.name == stage)
                .and_then(|s| s.outputs.get(output))
                .and_then(|o| o.topic.clone())
                .unwrap_or_else(|| internal_topic(&p.name, stage, output, p.edges.generation))
        };
        let inputs = |stage: &StageSettings| -> Vec<String> {
            stage
                .inputs
                .iter()
                .filter_map(StageInput::as_input)
                .map(|input| match input {
                    Input::Topic(topic) => topic.to_owned(),
                    Input::Stage { stage, output } => topic_of(stage, output),
                })
                .collect()
        };
        let internal = order
            .internal
            .iter()
            .map(|(i, output)| {
                let stage = &p.stages[*i];
                InternalTopic {
                    name: internal_topic(&p.name, &stage.name, output, p.edges.generation),
                    partitions: stage.outputs.get(output).and_then(|o| o.partitions),
                    // Every stage of a checked graph has an input.
                    like: inputs(stage).into_iter().next().unwrap_or_default(),
                }
            })
            .collect();
        let runs = order
            .stages
            .iter()
            .map(|i| {
                let stage = &p.stages[*i];
                let mut settings = self.clone();
                let run = &mut settings.pipeline;
                run.name = run_name(&p.name, &stage.name);
                run.group_id = Some(run_name(&p.group_id(), &stage.name));
                run.operator = stage.operator.clone();
                run.input_topics = inputs(stage);
                run.output_topic = Some(topic_of(&stage.name, DEFAULT_OUTPUT));
                // Its named outputs: those it binds and those later stages read.
                let read = p.stages.iter().flat_map(|s| &s.inputs).filter_map(|i| {
                    (i.stage.as_deref() == Some(stage.name.as_str()))
                        .then_some(i.output.as_deref()?)
                });
                run.outputs = stage
                    .outputs
                    .keys()
                    .map(String::as_str)
                    .chain(read)
                    .filter(|name| *name != DEFAULT_OUTPUT)
                    .map(|name| (name.to_owned(), topic_of(&stage.name, name)))
                    .collect();
                run.parameters = stage.parameters.clone();
                (run.tables, run.global_tables) = stage.tables();
                run.stages = Vec::new();
                run.max_out_of_orderness =
                    stage.max_out_of_orderness.unwrap_or(p.max_out_of_orderness);
                run.idle_timeout = stage.idle_timeout.or(p.idle_timeout);
                run.idle_advance = stage.idle_advance.unwrap_or(p.idle_advance);
                run.late_records = stage.late_records.unwrap_or(p.late_records);
                run.in_flight_max = stage.in_flight_max.unwrap_or(p.in_flight_max);
                run.failure_policy = stage.failure_policy.unwrap_or(p.failure_policy);
                StageRun {
                    stage: stage.name.clone(),
                    settings,
                }
            })
            .collect();
        StagePlan { internal, runs }
    }

    /// The one-operator fields left beside `stages`, and topics of the user's named as Weir's
    /// internal topics are.
    fn naming_problems(&self, problems: &mut Vec<String>) {
        let p = &self.pipeline;
        let one_operator = [
            ("operator", !p.operator.as_os_str().is_empty()),
            ("input_topics", !p.input_topics.is_empty()),
            ("output_topic", p.output_topic.is_some()),
            ("iceberg", p.iceberg.is_some()),
            ("outputs", !p.outputs.is_empty()),
            ("parameters", !p.parameters.is_empty()),
            ("tables", !p.tables.is_empty()),
            ("global_tables", !p.global_tables.is_empty()),
        ];
        for (field, set) in one_operator {
            if set {
                problems.push(format!(
                    "pipeline.{field} is for a one-operator pipeline: with pipeline.stages, each stage names its own"
                ));
            }
        }
        // Weir's own names: `{pipeline}.….internal` (see `internal_topic`).
        let is_internal = |topic: &str| {
            topic.starts_with(&format!("{}.", p.name)) && topic.ends_with(".internal")
        };
        let users = p.stages.iter().flat_map(|s| {
            let inputs = s.inputs.iter().filter_map(|i| i.topic.as_ref());
            inputs.chain(s.outputs.values().filter_map(|o| o.topic.as_ref()))
        });
        for topic in users.chain([&p.dead_letter_topic]) {
            if is_internal(topic) {
                problems.push(format!(
                    "topic `{topic}` is named as the pipeline's internal topics are: read or write a stage's output by its stage"
                ));
            }
        }
    }

    /// The problems of `pipeline.stages`: the one-operator fields and Weir's own topic names
    /// ([`Self::naming_problems`]), each input's and output's, checkpoints, the graph's, and
    /// each stage's run's as a one-operator pipeline's (named after the stage).
    pub(super) fn stage_problems(&self, problems: &mut Vec<String>) {
        let p = &self.pipeline;
        self.naming_problems(problems);
        for stage in &p.stages {
            for (i, input) in stage.inputs.iter().enumerate() {
                let global = input.global_table.is_some();
                let again = stage.inputs[..i]
                    .iter()
                    .any(|earlier| earlier.global_table.is_some() && earlier.topic == input.topic);
                if global && again {
                    problems.push(format!(
                        "stage `{}`: inputs[{i}] reads topic `{}` as a global table again",
                        stage.name,
                        input.topic.as_deref().unwrap_or_default()
                    ));
                }
                if (global && input.as_global_table().is_none())
                    || (!global && input.as_input().is_none())
                {
                    problems.push(format!(
                        "stage `{}`: inputs[{i}] must be {{ topic = \"…\" }}, {{ stage = \"…\" }}, a table {{ topic = \"…\", table = \"state\" }} or a global table {{ topic = \"…\", global_table = \"name\" }}",
                        stage.name
                    ));
                }
            }
            for (name, output) in &stage.outputs {
                // (`default` unbound is the graph's to name.)
                let read = p.stages.iter().flat_map(|s| &s.inputs).any(|i| {
                    i.stage.as_deref() == Some(stage.name.as_str())
                        && i.output.as_deref().unwrap_or(DEFAULT_OUTPUT) == name
                });
                if name != DEFAULT_OUTPUT && output.topic.is_none() && !read {
                    problems.push(format!(
                        "stage `{}`: output `{name}` goes nowhere: give it a topic or read it in another stage",
                        stage.name
                    ));
                }
                if output.topic.is_some() && output.partitions.is_some() {
                    problems.push(format!(
                        "stage `{}`: outputs.{name}.partitions is for an internal topic: a topic of yours has its own",
                        stage.name
                    ));
                }
                if output
                    .partitions
                    .is_some_and(|n| !(1..=10_000).contains(&n))
                {
                    problems.push(format!(
                        "stage `{}`: outputs.{name}.partitions must be 1..=10000",
                        stage.name
                    ));
                }
            }
        }
        if self.state.backend == super::StateBackendKind::Memory && self.state.memory.url.is_none()
        {
            problems.push(
                "pipeline.stages needs checkpoints (state.backend = \"lsm\", or state.memory.url): an internal topic is purged below what its reader's checkpoints name, and keeps everything without them".to_owned(),
            );
        }
        match self.stage_plan() {
            Some(Ok(plan)) => {
                plan_problems(&plan, problems);
                for run in &plan.runs {
                    let mut found = Vec::new();
                    run.settings.run_problems(&mut found);
                    run.settings.topic_problems(&mut found);
                    problems.extend(
                        found
                            .into_iter()
                            .map(|problem| format!("stage `{}`: {problem}", run.stage)),
                    );
                }
            }
            Some(Err(graph)) => problems.extend(
                graph
                    .into_iter()
                    .map(|problem| format!("pipeline.stages: {problem}")),
            ),
            None => {}
        }
    }
}
