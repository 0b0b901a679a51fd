//! A pipeline's definition ([`PipelineSpec`], [`PipelineRecord`]) and its validation against
//! the host's limits and the tenant's topic names, every problem at once ([`SpecError`]). What
//! the hosts report of it is in `status`.

use super::stages::StageSpec;
use crate::catalog::valid_operator_name;
use crate::config::{Delivery, FailurePolicy, LateRecords, RuntimeSettings, StateBackendKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa::ToSchema;

/// Longest topic name a tenant may use, bytes (Kafka's limit is 249 with the tenant prefix).
const TOPIC_BYTES_MAX: usize = 200;

/// Limits of one pipeline's operator calls. An absent field takes the host's value
/// (`[runtime]` of serve.toml), which is also the most a pipeline may ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineLimits {
    /// Linear memory cap per operator instance, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_memory_bytes_max: Option<u64>,
    /// CPU deadline per record, ms (epoch interruption); a record past it is a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_deadline_ms: Option<u64>,
    /// Bytes (keys, values, headers) one input record may emit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emit_bytes_per_record_max: Option<u64>,
    /// Largest state value, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_value_bytes_max: Option<u64>,
}

impl PipelineLimits {
    /// The host's `runtime` with these limits applied.
    ///
    /// # Errors
    /// Every limit at 0 or above the host's value, naming it.
    pub fn apply(&self, host: &RuntimeSettings) -> Result<RuntimeSettings, SpecError> {
        let mut problems = Vec::new();
        let mut within = |name: &str, asked: Option<u64>, cap: u64| match asked {
            None => cap,
            Some(0) => {
                problems.push(format!("limits.{name} must be above 0"));
                cap
            }
            Some(v) if v > cap => {
                problems.push(format!(
                    "limits.{name} = {v} is above this service's maximum of {cap}"
                ));
                cap
            }
            Some(v) => v,
        };
        let mut runtime = host.clone();
        runtime.instance_memory_bytes_max = within(
            "instance_memory_bytes_max",
            self.instance_memory_bytes_max,
            host.instance_memory_bytes_max as u64,
        ) as usize;
        runtime.record_deadline = Duration::from_millis(within(
            "record_deadline_ms",
            self.record_deadline_ms,
            host.record_deadline.as_millis() as u64,
        ));
        runtime.emit_bytes_per_record_max = within(
            "emit_bytes_per_record_max",
            self.emit_bytes_per_record_max,
            host.emit_bytes_per_record_max,
        );
        runtime.state_value_bytes_max = within(
            "state_value_bytes_max",
            self.state_value_bytes_max,
            host.state_value_bytes_max,
        );
        SpecError::or(problems, runtime)
    }
}

/// What is wrong with a pipeline's spec: every problem found, each naming its field, for a
/// 400. Displayed as the problems joined by `; `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", problems.join("; "))]
pub struct SpecError {
    /// The problems, in the order of the spec's fields; never empty.
    pub problems: Vec<String>,
}

impl SpecError {
    /// `value` if no problem was found, else the problems.
    fn or<T>(problems: Vec<String>, value: T) -> Result<T, SpecError> {
        if problems.is_empty() {
            Ok(value)
        } else {
            Err(SpecError { problems })
        }
    }
}

fn default_checkpoint_interval_ms() -> u64 {
    10_000
}

fn default_in_flight_max() -> u64 {
    crate::config::DEFAULT_IN_FLIGHT_MAX as u64
}

/// What a pipeline runs: the body of `POST /v1/pipelines/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// One of the tenant's operators. Required unless `stages` is set (then each stage names
    /// its own).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operator: String,
    /// Its version (from 1); required with `operator`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub operator_version: u64,
    /// Topics to consume (the tenant's names, see [`kafka_topic`]); co-partitioned when more
    /// than one. 1..=8 of them; none with `stages`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_topics: Vec<String>,
    /// The operator's parameters (`weir:operator/parameters`): name → value, at most 64, names
    /// 1..=64 bytes, values up to 4,096 bytes. With `stages`, each stage has its own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// A pipeline of more than one step (docs/topologies.md): its stages, each an operator
    /// over topics or earlier stages' outputs, 1..=32 of them. Left out: a one-operator
    /// pipeline of `operator` over `input_topics`. With stages, `operator`,
    /// `operator_version`, `input_topics`, `output_topic`, `parameters`, `iceberg` and
    /// `from_savepoint` are left out; the other fields are the whole pipeline's (the
    /// event-time and failure ones each stage may set for itself).
    #[serde(
        default,
        deserialize_with = "super::stages::listed_stages",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub stages: Vec<StageSpec>,
    /// Topic that receives the operator's emits. May be left out when `iceberg` is set: the
    /// emits then go only to the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_topic: Option<String>,
    /// Topic that receives rejected and failed records, with the reason in `weir.error`.
    pub dead_letter_topic: String,
    /// How often each partition checkpoints, ms (100..=3 600 000); default 10 000.
    #[serde(default = "default_checkpoint_interval_ms")]
    pub checkpoint_interval_ms: u64,
    /// Records of one partition in flight at once (1..=65 536); default 4096.
    #[serde(default = "default_in_flight_max")]
    pub in_flight_max: u64,
    /// Limits of the operator's calls.
    #[serde(default)]
    pub limits: PipelineLimits,
    /// What a record whose call fails for good does; default `dead_letter`.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// The output's guarantee; default `at_least_once`.
    #[serde(default)]
    pub delivery: Delivery,
    /// How far the event-time watermark stays behind the highest record timestamp, ms
    /// (0..=31 536 000 000, a year); default 0 (docs/time.md).
    #[serde(default)]
    pub max_out_of_orderness_ms: u64,
    /// An input topic with no record for this long stops holding the watermark back, ms
    /// (10..=86 400 000); default none: never idle.
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Once every input is idle, the watermark follows processing time (needs
    /// `idle_timeout_ms`); default false.
    #[serde(default)]
    pub idle_advance: bool,
    /// What a record behind the watermark does; default `process`.
    #[serde(default)]
    pub late_records: LateRecords,
    /// Where the pipeline's keyed state lives; default `lsm` (docs/api.md "State backends").
    #[serde(default = "default_state_backend")]
    pub state_backend: PipelineStateBackend,
    /// The most keyed state a `memory` pipeline may hold, bytes (keys, values and 64 bytes
    /// per entry), divided evenly over its partitions; a write that would take a partition
    /// past its share fails its record with `too-large`. Default and maximum: the service's
    /// `pipeline_state_bytes_max`. Only for `state_backend = "memory"` (the `lsm` backend's
    /// state lives in object storage; its RAM and disk are bounded caches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_bytes_max: Option<u64>,
    /// Create the pipeline from a savepoint of one of the tenant's pipelines (itself, if it
    /// was deleted and created again, cannot be: a savepoint goes with its pipeline): its
    /// state and input offsets are copied into the new pipeline's before it starts. The
    /// savepoint's pipeline must read the same input topics, with as many partitions, on the
    /// same `state_backend`. Kept in the definition as where its state came from; set only at
    /// creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_savepoint: Option<SavepointRef>,
    /// An Apache Iceberg table that receives the operator's emits too, exactly once
    /// (docs/iceberg.md): each emit is a JSON object of the table's columns. The table is the
    /// tenant's, in the host's catalog and warehouse; created if missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iceberg: Option<TableSpec>,
}

/// A pipeline's Iceberg table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// The table's name: 1..=128 bytes of `[a-z0-9_]`.
    pub table: String,
    /// Its columns, in order (1..=256).
    pub columns: Vec<crate::sink::iceberg::ColumnSpec>,
}

impl TableSpec {
    /// The table's schema.
    ///
    /// # Errors
    /// What is wrong, for a 400.
    pub fn schema(&self) -> Result<crate::sink::iceberg::TableSchema, SpecError> {
        let problem = |problem: String| SpecError {
            problems: vec![problem],
        };
        crate::sink::iceberg::check_table_name("iceberg.table", &self.table)
            .map_err(|e| problem(e.to_string()))?;
        crate::sink::iceberg::TableSchema::new(&self.columns)
            .map_err(|e| problem(format!("iceberg: {e}")))
    }
}

/// A savepoint of one of the tenant's pipelines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SavepointRef {
    /// The pipeline it was taken of.
    pub pipeline: String,
    /// The savepoint's name.
    pub savepoint: String,
}

/// Where a pipeline's keyed state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PipelineStateBackend {
    /// A map per partition in the RAM of the host that runs it, as Flink's
    /// HashMapStateBackend: fastest, bounded by `state_bytes_max`; each checkpoint writes a
    /// full snapshot under the pipeline's prefix.
    Memory,
    /// The disaggregated LSM tree: SSTs in object storage, RAM and disk as caches (as Flink
    /// 2.0's ForSt backend): state of any size, checkpoints that cost the last memtable.
    Lsm,
}

impl PipelineStateBackend {
    /// The host's backend kind.
    pub fn kind(self) -> StateBackendKind {
        match self {
            Self::Memory => StateBackendKind::Memory,
            Self::Lsm => StateBackendKind::Lsm,
        }
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn default_state_backend() -> PipelineStateBackend {
    PipelineStateBackend::Lsm
}

/// Whether `topic` is a valid topic name of a tenant: 1..=200 bytes of `[A-Za-z0-9._-]`, not
/// `.` or `..`, not ending in `.internal` (Weir's internal topics between stages, which a
/// pipeline reads or writes by their stage: docs/topologies.md).
pub fn valid_topic(topic: &str) -> bool {
    (1..=TOPIC_BYTES_MAX).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && !topic.ends_with(".internal")
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The Kafka topic behind a tenant's topic: `{tenant}.{topic}`. Tenant ids hold no `.`, so
/// the prefix is unambiguous.
pub fn kafka_topic(tenant: &str, topic: &str) -> String {
    format!("{tenant}.{topic}")
}

/// The consumer group a pipeline's runs join: `weir.{tenant}.{pipeline}.{uid}` (a stage's:
/// `…@{stage}`, `config::stages::run_name`). The uid makes a re-created pipeline start afresh.
pub fn consumer_group(tenant: &str, pipeline: &str, uid: &str) -> String {
    format!("weir.{tenant}.{pipeline}.{uid}")
}

impl PipelineSpec {
    /// Checks the spec against the host's limits and `state_bytes_cap` (the service's
    /// `pipeline_state_bytes_max`).
    ///
    /// # Errors
    /// Every problem found ([`SpecError`]), for a 400.
    pub fn validate(&self, host: &RuntimeSettings, state_bytes_cap: u64) -> Result<(), SpecError> {
        let mut problems = Vec::new();
        if self.is_staged() {
            self.stage_problems(&mut problems);
            self.stage_limit_problems(host, &mut problems);
            if !valid_topic(&self.dead_letter_topic) {
                problems.push(format!(
                    "topic names must be 1..={TOPIC_BYTES_MAX} bytes of [A-Za-z0-9._-], not ending in `.internal`. topic=`{}`",
                    self.dead_letter_topic
                ));
            }
        } else {
            if !valid_operator_name(&self.operator) || self.operator_version == 0 {
                problems.push(format!(
                    "operator must name one of your operators and operator_version one of its versions (from 1). operator=`{}` operator_version={}",
                    self.operator, self.operator_version
                ));
            }
            self.check_topics(&mut problems);
            super::stages::parameter_problems("parameters", &self.parameters, &mut problems);
            if let Some(Err(e)) = self.iceberg.as_ref().map(TableSpec::schema) {
                problems.extend(e.problems);
            }
        }
        self.check_time(&mut problems);
        self.check_state(state_bytes_cap, &mut problems);
        if let Err(e) = self.limits.apply(host) {
            problems.extend(e.problems);
        }
        SpecError::or(problems, ())
    }

    /// The input, output and dead-letter topics: valid names, 1..=8 inputs, each once, none
    /// also the output or the dead-letter topic; an output unless a table takes the rows.
    fn check_topics(&self, problems: &mut Vec<String>) {
        if !(1..=8).contains(&self.input_topics.len()) {
            problems.push(format!(
                "input_topics must list 1..=8 topics. count={}",
                self.input_topics.len()
            ));
        }
        if self.output_topic.is_none() && self.iceberg.is_none() {
            problems.push("output_topic is required unless iceberg names a table".to_owned());
        }
        for topic in self
            .input_topics
            .iter()
            .chain(&self.output_topic)
            .chain([&self.dead_letter_topic])
        {
            if !valid_topic(topic) {
                problems.push(format!(
                    "topic names must be 1..={TOPIC_BYTES_MAX} bytes of [A-Za-z0-9._-], not ending in `.internal`. topic=`{topic}`"
                ));
            }
        }
        if self.output_topic.as_ref() == Some(&self.dead_letter_topic) {
            problems.push(format!(
                "output_topic and dead_letter_topic must differ. topic=`{}`",
                self.dead_letter_topic
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for topic in &self.input_topics {
            if !seen.insert(topic) {
                problems.push(format!("input topic `{topic}` is listed twice"));
            }
            if self.output_topic.as_ref() == Some(topic) || *topic == self.dead_letter_topic {
                problems.push(format!(
                    "topic `{topic}` is both an input and the output or dead-letter topic"
                ));
            }
        }
    }

    /// Checkpoints, in-flight records, idleness and event time within their ranges.
    fn check_time(&self, problems: &mut Vec<String>) {
        if !(100..=3_600_000).contains(&self.checkpoint_interval_ms) {
            problems.push(format!(
                "checkpoint_interval_ms must be 100..=3600000. value={}",
                self.checkpoint_interval_ms
            ));
        }
        if !(1..=65_536).contains(&self.in_flight_max) {
            problems.push(format!(
                "in_flight_max must be 1..=65536. value={}",
                self.in_flight_max
            ));
        }
        if self
            .idle_timeout_ms
            .is_some_and(|t| !(10..=86_400_000).contains(&t))
        {
            problems.push(format!(
                "idle_timeout_ms must be 10..=86400000. value={:?}",
                self.idle_timeout_ms
            ));
        }
        if self.idle_advance && self.idle_timeout_ms.is_none() {
            problems.push("idle_advance needs idle_timeout_ms".to_owned());
        }
        if self.max_out_of_orderness_ms > 31_536_000_000 {
            problems.push(format!(
                "max_out_of_orderness_ms must be 0..=31536000000 (a year). value={}",
                self.max_out_of_orderness_ms
            ));
        }
    }

    /// A state quota only for `memory`, above 0 and within `state_bytes_cap`.
    fn check_state(&self, state_bytes_cap: u64, problems: &mut Vec<String>) {
        match (self.state_backend, self.state_bytes_max) {
            (PipelineStateBackend::Lsm, Some(_)) => problems.push(
                "state_bytes_max applies to state_backend = \"memory\" only (the lsm backend's state lives in object storage)"
                    .to_owned(),
            ),
            (_, Some(0)) => problems.push("state_bytes_max must be above 0".to_owned()),
            (_, Some(v)) if v > state_bytes_cap => problems.push(format!(
                "state_bytes_max = {v} is above this service's maximum of {state_bytes_cap}"
            )),
            _ => {}
        }
    }

    /// The most bytes of `memory` state each of `partitions` partitions may hold: the
    /// pipeline's quota (`state_bytes_max`, else `state_bytes_cap`; never above the cap, which
    /// may have been lowered since the pipeline was defined) divided evenly, rounded up;
    /// `None` for the `lsm` backend. Fixed for a run: partitions added to the topics count
    /// from the next run (a restart, a switch).
    pub fn shard_state_bytes_max(&self, state_bytes_cap: u64, partitions: usize) -> Option<u64> {
        (self.state_backend == PipelineStateBackend::Memory).then(|| {
            self.state_bytes_max
                .unwrap_or(state_bytes_cap)
                .min(state_bytes_cap)
                .div_ceil(partitions.max(1) as u64)
        })
    }
}

/// Whether a pipeline should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DesiredState {
    /// Every host that runs pipelines runs it.
    Running,
    /// No host runs it; its state and offsets stay for the next start.
    Stopped,
}

/// A pipeline's definition, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PipelineRecord {
    /// The pipeline's name, 1..=64 bytes of `[a-z0-9_-]`.
    pub name: String,
    /// Random id given at creation: the pipeline's state and consumer group belong to it, so
    /// a new pipeline of a deleted one's name starts afresh.
    pub uid: String,
    /// What it runs.
    pub spec: PipelineSpec,
    /// Whether it should run.
    pub desired: DesiredState,
    /// Changes whenever the hosts must restart it (start, operator switch): each host stops
    /// its run (draining it, with a last checkpoint) and starts the new one from that
    /// checkpoint.
    pub run_generation: u64,
    /// Checkpoints asked for through the API; hosts checkpoint every partition when it grows.
    pub checkpoint_requests: u64,
    /// This definition's revision, from 1.
    pub revision: u64,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
    /// Time of this revision, ms since the Unix epoch.
    pub updated_ms: u64,
    /// This revision is the tombstone of a deleted pipeline (never shown by the API).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(ignore)]
    pub deleted: bool,
    /// A reset to a savepoint runs since this time, ms since the Unix epoch: starts are refused
    /// meanwhile (for at most `RESET_HOLD`, should the reset's host die).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resetting_since_ms: Option<u64>,
    /// A reset to a savepoint failed part-way, and why: some shards may hold the savepoint's
    /// state and others their own, so starts are refused until a reset succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_failed: Option<String>,
    /// A pipeline of stages: the generation of the internal topics it runs over (0 until a
    /// reset to a savepoint seeds new ones: `config::stages::internal_topic`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub edge_generation: u64,
    /// The highest generation of internal topics a reset made (some perhaps for a reset that
    /// failed): a reset makes the next, a delete deletes every one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub edge_generations_made: u64,
}

impl PipelineRecord {
    /// A new pipeline's first revision: running, created at `now_ms` (ms since the Unix
    /// epoch).
    pub fn new(name: String, uid: String, spec: PipelineSpec, now_ms: u64) -> Self {
        Self {
            name,
            uid,
            spec,
            desired: DesiredState::Running,
            run_generation: 1,
            checkpoint_requests: 0,
            revision: 1,
            created_ms: now_ms,
            updated_ms: now_ms,
            deleted: false,
            resetting_since_ms: None,
            reset_failed: None,
            edge_generation: 0,
            edge_generations_made: 0,
        }
    }
}

/// How long a reset in progress holds off starts at most (a reset whose host died releases
/// its pipeline after this).
pub const RESET_HOLD: std::time::Duration = std::time::Duration::from_secs(600);

/// The body of `PUT /v1/pipelines/{name}/operator`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorSwitch {
    /// The version to run from now on (same operator).
    pub operator_version: u64,
    /// The stage whose operator switches: required for a pipeline of stages, left out for a
    /// one-operator one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
}

/// The body of `PATCH /v1/pipelines/{name}`: the settings that can change while keeping
/// the pipeline's state, its backend included. Absent fields stay; topics and delivery cannot
/// change (the state and its offsets belong to them). With `stage`, the fields a stage can
/// have of its own (all but the checkpoint interval, the backend and the state quota) become
/// that stage's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineChange {
    /// The stage whose own settings change, in a pipeline of stages; left out, the pipeline's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// How often each partition checkpoints, ms.
    #[serde(default)]
    pub checkpoint_interval_ms: Option<u64>,
    /// Records of one partition in flight at once.
    #[serde(default)]
    pub in_flight_max: Option<u64>,
    /// The limits, replacing the current ones.
    #[serde(default)]
    pub limits: Option<PipelineLimits>,
    /// What a record whose call fails for good does.
    #[serde(default)]
    pub failure_policy: Option<FailurePolicy>,
    /// How far the event-time watermark stays behind the highest record timestamp, ms. The
    /// watermark never goes back: a larger value holds it where it is until records catch up.
    #[serde(default)]
    pub max_out_of_orderness_ms: Option<u64>,
    /// An input topic with no record for this long stops holding the watermark back, ms; 0
    /// turns idleness off.
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Once every input is idle, the watermark follows processing time.
    #[serde(default)]
    pub idle_advance: Option<bool>,
    /// What a record behind the watermark does.
    #[serde(default)]
    pub late_records: Option<LateRecords>,
    /// The quota of a `memory` pipeline's state, bytes (see [`PipelineSpec::state_bytes_max`]).
    #[serde(default)]
    pub state_bytes_max: Option<u64>,
    /// Move the state to the other backend, with the pipeline running: each host drains and
    /// checkpoints its partitions on the old one, and each partition's next open converts that
    /// checkpoint through the portable format (docs/api.md "Switching backends"). To `lsm`,
    /// the quota goes.
    #[serde(default)]
    pub state_backend: Option<PipelineStateBackend>,
}

/// A checkpoint asked for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointRequested {
    /// The request's number: hosts checkpoint every partition they run when they see it.
    pub request: u64,
    /// When it was asked for, ms since the Unix epoch: checkpoints committed after it answer
    /// it (`GET …/checkpoints`).
    pub requested_ms: u64,
}
