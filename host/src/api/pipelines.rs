//! Pipelines of the API: their definitions and the hosts' reports on them, in object storage,
//! and the routes that manage them.
//!
//! A pipeline is a definition ([`PipelineRecord`]) every `weir serve` host that runs pipelines
//! reads ([`super::runner`]): each host runs the pipeline's consumer-group member, so Kafka
//! divides the partitions among the hosts, and each writes what it runs into a
//! [`HostStatus`]. `GET /v1/pipelines/{name}` merges the fresh ones.
//!
//! Layout under the catalog prefix (beside [`super::catalog`]'s):
//! - `tenants/{tenant}/pipelines/{name}/revisions/{revision:010}.json` — the definition; every
//!   change writes the next revision, created once (`PutMode::Create`), so two hosts changing
//!   a pipeline at once cannot both win (the loser answers 409) on every store;
//! - `tenants/{tenant}/pipelines/{name}/hosts/{host}.json` — one host's [`HostStatus`];
//! - `tenants/{tenant}/state/{uid}/…` — the pipeline's keyed state (LSM shards).
//!
//! Topic names are the tenant's own: topic `orders` of tenant `acme` is the Kafka topic
//! `acme.orders` ([`kafka_topic`]), so no tenant can name another's topic.

use super::catalog::{Catalog, valid_operator_name};
use super::problem::{ApiError, Problem};
use super::{ApiState, AuthProblems, Principal, now_ms, read_json};
use crate::config::{Delivery, FailurePolicy, RuntimeSettings};
use crate::pipeline::{CheckpointRecord, PartitionProgress};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa::ToSchema;

/// Revisions of a definition kept in the store (older ones are deleted after a change).
const REVISIONS_KEPT: u64 = 4;

/// A host's status older than this (or than its `stale_after_ms`, if longer) is ignored: the
/// host is gone (killed, or cut off).
pub const HOST_STATUS_STALE: Duration = Duration::from_secs(15);

fn default_stale_after_ms() -> u64 {
    HOST_STATUS_STALE.as_millis() as u64
}

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
    /// The first limit above the host's value, naming it.
    pub fn apply(&self, host: &RuntimeSettings) -> Result<RuntimeSettings, String> {
        fn within(name: &str, asked: Option<u64>, cap: u64) -> Result<u64, String> {
            match asked {
                None => Ok(cap),
                Some(0) => Err(format!("limits.{name} must be above 0")),
                Some(v) if v > cap => Err(format!(
                    "limits.{name} = {v} is above this service's maximum of {cap}"
                )),
                Some(v) => Ok(v),
            }
        }
        let mut runtime = host.clone();
        runtime.instance_memory_bytes_max = within(
            "instance_memory_bytes_max",
            self.instance_memory_bytes_max,
            host.instance_memory_bytes_max as u64,
        )? as usize;
        runtime.record_deadline = Duration::from_millis(within(
            "record_deadline_ms",
            self.record_deadline_ms,
            host.record_deadline.as_millis() as u64,
        )?);
        runtime.emit_bytes_per_record_max = within(
            "emit_bytes_per_record_max",
            self.emit_bytes_per_record_max,
            host.emit_bytes_per_record_max,
        )?;
        runtime.state_value_bytes_max = within(
            "state_value_bytes_max",
            self.state_value_bytes_max,
            host.state_value_bytes_max,
        )?;
        Ok(runtime)
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
    /// One of the tenant's operators.
    pub operator: String,
    /// Its version.
    pub operator_version: u64,
    /// Topics to consume (the tenant's names, see [`kafka_topic`]); co-partitioned when more
    /// than one. 1..=8 of them.
    pub input_topics: Vec<String>,
    /// Topic that receives the operator's emits.
    pub output_topic: String,
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
}

/// Whether `topic` is a valid topic name of a tenant: 1..=200 bytes of `[A-Za-z0-9._-]`, not
/// `.` or `..`.
pub fn valid_topic(topic: &str) -> bool {
    (1..=TOPIC_BYTES_MAX).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The Kafka topic behind a tenant's topic: `{tenant}.{topic}`. Tenant ids hold no `.`, so
/// the prefix is unambiguous.
pub fn kafka_topic(tenant: &str, topic: &str) -> String {
    format!("{tenant}.{topic}")
}

impl PipelineSpec {
    /// Checks the spec against the host's limits.
    ///
    /// # Errors
    /// What is wrong, for a 400.
    pub fn validate(&self, host: &RuntimeSettings) -> Result<(), String> {
        if !valid_operator_name(&self.operator) || self.operator_version == 0 {
            return Err(format!(
                "operator must name one of your operators and operator_version one of its versions (from 1). operator=`{}` operator_version={}",
                self.operator, self.operator_version
            ));
        }
        if !(1..=8).contains(&self.input_topics.len()) {
            return Err(format!(
                "input_topics must list 1..=8 topics. count={}",
                self.input_topics.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for topic in self
            .input_topics
            .iter()
            .chain([&self.output_topic, &self.dead_letter_topic])
        {
            if !valid_topic(topic) {
                return Err(format!(
                    "topic names must be 1..={TOPIC_BYTES_MAX} bytes of [A-Za-z0-9._-]. topic=`{topic}`"
                ));
            }
        }
        if self.output_topic == self.dead_letter_topic {
            return Err(format!(
                "output_topic and dead_letter_topic must differ. topic=`{}`",
                self.output_topic
            ));
        }
        for topic in &self.input_topics {
            if !seen.insert(topic) {
                return Err(format!("input topic `{topic}` is listed twice"));
            }
            if *topic == self.output_topic || *topic == self.dead_letter_topic {
                return Err(format!(
                    "topic `{topic}` is both an input and the output or dead-letter topic"
                ));
            }
        }
        if !(100..=3_600_000).contains(&self.checkpoint_interval_ms) {
            return Err(format!(
                "checkpoint_interval_ms must be 100..=3600000. value={}",
                self.checkpoint_interval_ms
            ));
        }
        if !(1..=65_536).contains(&self.in_flight_max) {
            return Err(format!(
                "in_flight_max must be 1..=65536. value={}",
                self.in_flight_max
            ));
        }
        self.limits.apply(host)?;
        Ok(())
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
}

/// What one host does with a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HostPhase {
    /// Fetching the operator, checking topics, joining the consumer group.
    Starting,
    /// Processing its partitions.
    Running,
    /// Its run failed (`reason`); the host starts it again after a backoff.
    Failed,
    /// Draining: finishing admitted records and checkpointing, before a restart or stop.
    Stopping,
    /// Not running it here.
    Stopped,
}

/// What one host reports about one pipeline, every reconcile interval.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostStatus {
    /// The host (`pipelines.host_id`).
    pub host: String,
    /// The pipeline's uid this report is about.
    pub uid: String,
    /// The run generation it runs.
    pub run_generation: u64,
    /// What it does with the pipeline.
    pub phase: HostPhase,
    /// Why it failed, when it did (the last failure while it restarts).
    pub reason: Option<String>,
    /// When this report was written, ms since the Unix epoch.
    pub updated_ms: u64,
    /// Age after which the report no longer counts (the host is gone), ms: a few of the
    /// host's reconcile intervals, at least [`HOST_STATUS_STALE`].
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// Times this host restarted the pipeline after a failure.
    pub restarts: u64,
    /// Records processed (ok or dead-lettered) by this host's current run.
    pub records_done: u64,
    /// Records per second over the last reconcile interval.
    pub records_per_s: f64,
    /// Records sent to the dead-letter topic by this run.
    pub dead_lettered: u64,
    /// Records dropped by `failure_policy = "skip"` in this run.
    pub skipped_failed: u64,
    /// Records emitted to the output topic by this run.
    pub emitted: u64,
    /// Checkpoints committed by this run.
    pub checkpoints: u64,
    /// Block reads served by the state caches (memory or disk).
    pub cache_hits: u64,
    /// Block reads fetched from object storage.
    pub cache_misses: u64,
    /// The partitions this host runs.
    pub partitions: Vec<PartitionProgress>,
    /// Its newest checkpoints, oldest first.
    pub recent_checkpoints: Vec<CheckpointRecord>,
}

/// A pipeline's state over all hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PipelineState {
    /// Should run; no host reports running it yet.
    Starting,
    /// Hosts run it.
    Running,
    /// A host's run failed (see `reason`); hosts retry with backoff.
    Failed,
    /// Stopped, but a host still drains it.
    Stopping,
    /// No host runs it.
    Stopped,
}

/// One host in a pipeline's status.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostSummary {
    /// The host.
    pub host: String,
    /// What it does.
    pub phase: HostPhase,
    /// Why it failed, if it did.
    pub reason: Option<String>,
    /// The partitions it runs.
    pub partitions: Vec<i32>,
    /// Its records per second.
    pub records_per_s: f64,
    /// Age of its report, ms.
    pub report_age_ms: u64,
}

/// A pipeline's status, merged from the fresh reports of the hosts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PipelineStatus {
    /// Over all hosts.
    pub state: PipelineState,
    /// Why, when failed.
    pub reason: Option<String>,
    /// The hosts that report on it.
    pub hosts: Vec<HostSummary>,
    /// Per partition: checkpointed offsets, high watermarks, lag, state bytes.
    pub partitions: Vec<PartitionProgress>,
    /// Records per second, summed over hosts.
    pub records_per_s: f64,
    /// Records processed by the hosts' current runs.
    pub records_done: u64,
    /// Records dead-lettered by the hosts' current runs.
    pub dead_lettered: u64,
    /// Records skipped (`failure_policy = "skip"`) by the hosts' current runs.
    pub skipped_failed: u64,
    /// Records emitted by the hosts' current runs.
    pub emitted: u64,
    /// The newest committed checkpoint of any partition.
    pub last_checkpoint: Option<CheckpointRecord>,
    /// Bytes of state the partitions' last checkpoints reference, summed.
    pub state_bytes: u64,
    /// Share of block reads the state caches served (none before any read).
    pub cache_hit_rate: Option<f64>,
}

/// A pipeline: its definition and status.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PipelineView {
    /// The definition.
    pub definition: PipelineRecord,
    /// What the hosts report.
    pub status: PipelineStatus,
}

/// The body of `PUT /v1/pipelines/{name}/operator`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorSwitch {
    /// The version to run from now on (same operator).
    pub operator_version: u64,
}

/// The body of `PATCH /v1/pipelines/{name}`: the settings that can change while keeping
/// the pipeline's state. Absent fields stay; topics and delivery cannot change (the state and
/// its offsets belong to them).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineChange {
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

/// Merges `reports` (with their ages) into a status for `record`.
pub fn merge_status(record: &PipelineRecord, reports: &[(HostStatus, u64)]) -> PipelineStatus {
    let fresh: Vec<&HostStatus> = reports
        .iter()
        .filter(|(r, age)| {
            r.uid == record.uid
                && *age <= r.stale_after_ms.max(default_stale_after_ms())
                && r.phase != HostPhase::Stopped
        })
        .map(|(r, _)| r)
        .collect();
    let failed = fresh.iter().find(|r| r.phase == HostPhase::Failed);
    let current = |r: &&&HostStatus| r.run_generation == record.run_generation;
    let state = match record.desired {
        DesiredState::Stopped if fresh.is_empty() => PipelineState::Stopped,
        DesiredState::Stopped => PipelineState::Stopping,
        DesiredState::Running if failed.is_some() => PipelineState::Failed,
        DesiredState::Running
            if fresh
                .iter()
                .filter(current)
                .any(|r| r.phase == HostPhase::Running) =>
        {
            PipelineState::Running
        }
        DesiredState::Running => PipelineState::Starting,
    };
    let mut partitions: BTreeMap<i32, PartitionProgress> = BTreeMap::new();
    let mut last_checkpoint: Option<CheckpointRecord> = None;
    let (mut hits, mut misses) = (0u64, 0u64);
    let mut status = PipelineStatus {
        state,
        reason: failed.and_then(|r| r.reason.clone()),
        hosts: Vec::new(),
        partitions: Vec::new(),
        records_per_s: 0.0,
        records_done: 0,
        dead_lettered: 0,
        skipped_failed: 0,
        emitted: 0,
        last_checkpoint: None,
        state_bytes: 0,
        cache_hit_rate: None,
    };
    for (report, age) in reports {
        if !fresh.iter().any(|r| std::ptr::eq(*r, report)) {
            continue;
        }
        status.hosts.push(HostSummary {
            host: report.host.clone(),
            phase: report.phase,
            reason: report.reason.clone(),
            partitions: report.partitions.iter().map(|p| p.partition).collect(),
            records_per_s: report.records_per_s,
            report_age_ms: *age,
        });
        status.records_per_s += report.records_per_s;
        status.records_done += report.records_done;
        status.dead_lettered += report.dead_lettered;
        status.skipped_failed += report.skipped_failed;
        status.emitted += report.emitted;
        hits += report.cache_hits;
        misses += report.cache_misses;
        for p in &report.partitions {
            partitions.insert(p.partition, p.clone());
        }
        if let Some(newest) = report.recent_checkpoints.last()
            && last_checkpoint
                .as_ref()
                .is_none_or(|c| c.committed_ms < newest.committed_ms)
        {
            last_checkpoint = Some(newest.clone());
        }
    }
    status.hosts.sort_by(|a, b| a.host.cmp(&b.host));
    status.state_bytes = partitions.values().map(|p| p.state_bytes).sum();
    status.partitions = partitions.into_values().collect();
    status.last_checkpoint = last_checkpoint;
    if hits + misses > 0 {
        status.cache_hit_rate = Some(hits as f64 / (hits + misses) as f64);
    }
    status
}

impl Catalog {
    fn pipeline_dir(&self, tenant: &str, name: &str) -> Path {
        self.path(&format!("tenants/{tenant}/pipelines/{name}"))
    }

    /// Where the keyed state of the pipeline with uid `uid` lives.
    pub fn pipeline_state_prefix(&self, tenant: &str, uid: &str) -> Path {
        self.path(&format!("tenants/{tenant}/state/{uid}"))
    }

    async fn revision_numbers(&self, tenant: &str, name: &str) -> Result<Vec<u64>, ApiError> {
        let dir = self.pipeline_dir(tenant, name).join("revisions");
        let metas: Vec<_> = self.store().list(Some(&dir)).try_collect().await?;
        let mut revisions: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        revisions.sort_unstable();
        Ok(revisions)
    }

    fn revision_path(&self, tenant: &str, name: &str, revision: u64) -> Path {
        self.pipeline_dir(tenant, name)
            .join("revisions")
            .join(format!("{revision:010}.json"))
    }

    /// The newest definition of pipeline `name`, if it exists (and is not deleted).
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] on a store error.
    pub async fn pipeline(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<PipelineRecord>, ApiError> {
        Ok(self
            .newest_revision(tenant, name)
            .await?
            .filter(|r| !r.deleted))
    }

    /// The newest revision of pipeline `name`, a deletion's tombstone included.
    async fn newest_revision(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<PipelineRecord>, ApiError> {
        // A revision can be deleted (pruned, or the pipeline deleted) between list and get.
        for revision in self.revision_numbers(tenant, name).await?.iter().rev() {
            if let Some(record) = self
                .get_json(&self.revision_path(tenant, name, *revision))
                .await?
            {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    /// Stores `record` as revision `record.revision`; `false` if another writer took it.
    async fn write_revision(
        &self,
        tenant: &str,
        record: &PipelineRecord,
    ) -> Result<bool, ApiError> {
        let path = self.revision_path(tenant, &record.name, record.revision);
        if !self.create_json(&path, record).await? {
            return Ok(false);
        }
        // Older revisions are history nobody reads; a failure to prune costs only space.
        if record.revision > REVISIONS_KEPT {
            for old in self.revision_numbers(tenant, &record.name).await? {
                if old + REVISIONS_KEPT <= record.revision {
                    let _ = self
                        .store()
                        .delete(&self.revision_path(tenant, &record.name, old))
                        .await;
                }
            }
        }
        Ok(true)
    }

    /// Creates pipeline `record.name`: revision 1, or the one after a deleted pipeline's
    /// tombstone (set in `record`).
    ///
    /// # Errors
    /// [`ApiError::Conflict`] if it exists; [`ApiError::Unavailable`] on a store error.
    pub async fn create_pipeline(
        &self,
        tenant: &str,
        record: &mut PipelineRecord,
    ) -> Result<(), ApiError> {
        let newest = self.newest_revision(tenant, &record.name).await?;
        record.revision = newest.as_ref().map_or(1, |r| r.revision + 1);
        if newest.is_some_and(|r| !r.deleted) || !self.write_revision(tenant, record).await? {
            return Err(ApiError::Conflict(format!(
                "pipeline `{}` exists",
                record.name
            )));
        }
        Ok(())
    }

    /// Changes pipeline `name` with `change` and stores the result as the next revision.
    ///
    /// # Errors
    /// [`ApiError::NotFound`] if it does not exist; `change`'s error; [`ApiError::Conflict`]
    /// if another request changed it at the same time; [`ApiError::Unavailable`] on a store
    /// error.
    pub async fn update_pipeline(
        &self,
        tenant: &str,
        name: &str,
        change: impl FnOnce(&mut PipelineRecord) -> Result<(), ApiError>,
    ) -> Result<PipelineRecord, ApiError> {
        let mut record = self
            .pipeline(tenant, name)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("no pipeline `{name}`")))?;
        let before = record.clone();
        change(&mut record)?;
        if record == before {
            return Ok(record); // nothing to change: no revision, no conflict with others
        }
        record.revision += 1;
        record.updated_ms = now_ms();
        if self.write_revision(tenant, &record).await? {
            Ok(record)
        } else {
            Err(ApiError::Conflict(format!(
                "pipeline `{name}` was changed by another request at the same time; read it and try again"
            )))
        }
    }

    /// The tenant's pipelines, by name.
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] on a store error.
    pub async fn pipelines(&self, tenant: &str) -> Result<Vec<PipelineRecord>, ApiError> {
        let dir = self.path(&format!("tenants/{tenant}/pipelines"));
        let listed = self.store().list_with_delimiter(Some(&dir)).await?;
        let mut out = Vec::new();
        for prefix in listed.common_prefixes {
            if let Some(name) = prefix.filename()
                && let Some(record) = self.pipeline(tenant, name).await?
            {
                out.push(record);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Every tenant's pipelines, as `(tenant, definition)`.
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] on a store error.
    pub async fn all_pipelines(&self) -> Result<Vec<(String, PipelineRecord)>, ApiError> {
        let mut out = Vec::new();
        for tenant in self.tenants().await? {
            for record in self.pipelines(&tenant.id).await? {
                out.push((tenant.id.clone(), record));
            }
        }
        Ok(out)
    }

    fn host_status_path(&self, tenant: &str, name: &str, host: &str) -> Path {
        self.pipeline_dir(tenant, name)
            .join("hosts")
            .join(format!("{host}.json"))
    }

    /// Writes `status`, this host's report on pipeline `name`.
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] on a store error.
    pub async fn put_host_status(
        &self,
        tenant: &str,
        name: &str,
        status: &HostStatus,
    ) -> Result<(), ApiError> {
        let body = serde_json::to_vec(status).expect("host status serializes");
        self.store()
            .put(
                &self.host_status_path(tenant, name, &status.host),
                body.into(),
            )
            .await?;
        Ok(())
    }

    /// Deletes `host`'s report on pipeline `name`.
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] on a store error.
    pub async fn delete_host_status(
        &self,
        tenant: &str,
        name: &str,
        host: &str,
    ) -> Result<(), ApiError> {
        match self
            .store()
            .delete(&self.host_status_path(tenant, name, host))
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Every host's report on pipeline `name`, with its age in ms.
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] on a store error.
    pub async fn host_statuses(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Vec<(HostStatus, u64)>, ApiError> {
        let dir = self.pipeline_dir(tenant, name).join("hosts");
        let metas: Vec<_> = self.store().list(Some(&dir)).try_collect().await?;
        let now = now_ms();
        let mut out = Vec::new();
        for meta in metas {
            if let Some(status) = self.get_json::<HostStatus>(&meta.location).await? {
                let age = now.saturating_sub(status.updated_ms);
                out.push((status, age));
            }
        }
        Ok(out)
    }

    /// Deletes pipeline `record.name`: writes a tombstone as its next revision (so a change
    /// racing with the deletion fails instead of bringing it back), then deletes its older
    /// revisions, reports and state. The tombstone stays.
    ///
    /// # Errors
    /// [`ApiError::Conflict`] if it changed meanwhile; [`ApiError::Unavailable`] on a store
    /// error.
    pub async fn delete_pipeline(
        &self,
        tenant: &str,
        record: &PipelineRecord,
    ) -> Result<(), ApiError> {
        let tombstone = PipelineRecord {
            deleted: true,
            desired: DesiredState::Stopped,
            revision: record.revision + 1,
            updated_ms: now_ms(),
            ..record.clone()
        };
        if !self.write_revision(tenant, &tombstone).await? {
            return Err(ApiError::Conflict(format!(
                "pipeline `{}` was changed by another request at the same time; read it and try again",
                record.name
            )));
        }
        let keep = self.revision_path(tenant, &record.name, tombstone.revision);
        for dir in [
            self.pipeline_dir(tenant, &record.name),
            self.pipeline_state_prefix(tenant, &record.uid),
        ] {
            let metas: Vec<_> = self.store().list(Some(&dir)).try_collect().await?;
            for meta in metas.into_iter().filter(|m| m.location != keep) {
                match self.store().delete(&meta.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(err) => return Err(err.into()),
                }
            }
        }
        Ok(())
    }
}

fn check_pipeline_name(name: &str) -> Result<(), ApiError> {
    if valid_operator_name(name) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "pipeline name must be 1..=64 bytes of [a-z0-9_-], not starting with `-` or `_`. name=`{name}`"
        )))
    }
}

/// The pipeline `name` of `tenant`, or a 404.
async fn existing(state: &ApiState, tenant: &str, name: &str) -> Result<PipelineRecord, ApiError> {
    let not_found = || ApiError::NotFound(format!("no pipeline `{name}`"));
    if !valid_operator_name(name) {
        return Err(not_found());
    }
    state
        .catalog
        .pipeline(tenant, name)
        .await?
        .ok_or_else(not_found)
}

async fn view(
    state: &ApiState,
    tenant: &str,
    record: PipelineRecord,
) -> Result<PipelineView, ApiError> {
    let reports = state.catalog.host_statuses(tenant, &record.name).await?;
    let status = merge_status(&record, &reports);
    Ok(PipelineView {
        definition: record,
        status,
    })
}

/// Checks that the tenant's operator version exists.
async fn check_operator_version(
    state: &ApiState,
    tenant: &str,
    operator: &str,
    version: u64,
) -> Result<(), ApiError> {
    if state
        .catalog
        .version(tenant, operator, version)
        .await?
        .is_none()
    {
        return Err(ApiError::BadRequest(format!(
            "you have no version {version} of operator `{operator}`: upload it first (POST /v1/operators/{operator})"
        )));
    }
    Ok(())
}

/// Creates and starts a pipeline.
#[utoipa::path(post, path = "/v1/pipelines/{name}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name, 1..=64 bytes of [a-z0-9_-]", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = PipelineSpec,
    responses(
        (status = 201, description = "Created; hosts start it", body = PipelineView),
        (status = 400, description = "Bad name, spec or operator version", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Exists, or too many pipelines", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn create_pipeline(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    body: Body,
) -> Result<(StatusCode, Json<PipelineView>), ApiError> {
    let tenant = principal.tenant()?.to_owned();
    tracing::Span::current().record("pipeline", name.as_str());
    check_pipeline_name(&name)?;
    let spec: PipelineSpec = read_json(body).await?;
    spec.validate(&state.settings.runtime)
        .map_err(ApiError::BadRequest)?;
    check_operator_version(&state, &tenant, &spec.operator, spec.operator_version).await?;
    let _one_create_at_a_time = state.pipeline_creates.lock().await;
    let count = state.catalog.pipelines(&tenant).await?.len();
    if count >= state.settings.pipelines_per_tenant_max {
        return Err(ApiError::Conflict(format!(
            "you have {count} pipelines, the most this service allows per tenant; delete one first"
        )));
    }
    let mut uid = [0u8; 8];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut uid);
    let now = now_ms();
    let mut record = PipelineRecord {
        name: name.clone(),
        uid: hex::encode(uid),
        spec,
        desired: DesiredState::Running,
        run_generation: 1,
        checkpoint_requests: 0,
        revision: 1,
        created_ms: now,
        updated_ms: now,
        deleted: false,
    };
    state.catalog.create_pipeline(&tenant, &mut record).await?;
    // Creates through other API servers racing past the count above: the oldest `max` stay,
    // the others are undone.
    let mut all = state.catalog.pipelines(&tenant).await?;
    if all.len() > state.settings.pipelines_per_tenant_max {
        all.sort_by(|a, b| (a.created_ms, &a.uid).cmp(&(b.created_ms, &b.uid)));
        if all[state.settings.pipelines_per_tenant_max..]
            .iter()
            .any(|p| p.uid == record.uid)
        {
            state.catalog.delete_pipeline(&tenant, &record).await?;
            return Err(ApiError::Conflict(format!(
                "you have {} pipelines, the most this service allows per tenant; delete one first",
                state.settings.pipelines_per_tenant_max
            )));
        }
    }
    tracing::info!(%tenant, pipeline = %name, uid = %record.uid, "pipeline created");
    Ok((
        StatusCode::CREATED,
        Json(view(&state, &tenant, record).await?),
    ))
}

/// Lists the caller's pipelines with their status.
#[utoipa::path(get, path = "/v1/pipelines", tag = "pipelines",
    responses(
        (status = 200, description = "The pipelines", body = [PipelineView]),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn list_pipelines(
    State(state): State<ApiState>,
    principal: Principal,
) -> Result<Json<Vec<PipelineView>>, ApiError> {
    let tenant = principal.tenant()?;
    let mut out = Vec::new();
    for record in state.catalog.pipelines(tenant).await? {
        out.push(view(&state, tenant, record).await?);
    }
    Ok(Json(out))
}

/// One of the caller's pipelines: definition and status (state, per-partition offsets and
/// lag, records/s, last checkpoint, state bytes, cache hit rate, dead-lettered count).
#[utoipa::path(get, path = "/v1/pipelines/{name}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "The pipeline", body = PipelineView),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn get_pipeline(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<PipelineView>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, tenant, &name).await?;
    Ok(Json(view(&state, tenant, record).await?))
}

/// Changes the desired state of pipeline `name`; a start of a stopped pipeline is a new run
/// generation.
async fn set_desired(
    state: &ApiState,
    tenant: &str,
    name: &str,
    desired: DesiredState,
) -> Result<PipelineView, ApiError> {
    existing(state, tenant, name).await?;
    let record = state
        .catalog
        .update_pipeline(tenant, name, |record| {
            if record.desired != desired {
                record.desired = desired;
                if desired == DesiredState::Running {
                    record.run_generation += 1;
                }
            }
            Ok(())
        })
        .await?;
    tracing::info!(%tenant, pipeline = %name, ?desired, "pipeline desired state set");
    view(state, tenant, record).await
}

/// Starts a stopped pipeline from its last checkpoint (no-op when it should run already).
#[utoipa::path(post, path = "/v1/pipelines/{name}/start", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "It should run; hosts start it", body = PipelineView),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Changed concurrently", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn start_pipeline(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<PipelineView>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    Ok(Json(
        set_desired(&state, tenant, &name, DesiredState::Running).await?,
    ))
}

/// Stops a pipeline: every host drains it (finishes admitted records) and checkpoints; state
/// and offsets stay for the next start.
#[utoipa::path(post, path = "/v1/pipelines/{name}/stop", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "It should stop; hosts drain it", body = PipelineView),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Changed concurrently", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn stop_pipeline(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<PipelineView>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    Ok(Json(
        set_desired(&state, tenant, &name, DesiredState::Stopped).await?,
    ))
}

/// Switches a pipeline to another version of its operator, keeping its state: every host
/// drains its run and checkpoints, then resumes from that checkpoint with the new version.
#[utoipa::path(put, path = "/v1/pipelines/{name}/operator", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = OperatorSwitch,
    responses(
        (status = 200, description = "Switched; hosts restart it with the version", body = PipelineView),
        (status = 400, description = "No such operator version", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Changed concurrently", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn switch_operator(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    body: Body,
) -> Result<Json<PipelineView>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let current = existing(&state, tenant, &name).await?;
    let switch: OperatorSwitch = read_json(body).await?;
    check_operator_version(
        &state,
        tenant,
        &current.spec.operator,
        switch.operator_version,
    )
    .await?;
    let record = state
        .catalog
        .update_pipeline(tenant, &name, |record| {
            if record.spec.operator_version != switch.operator_version {
                record.spec.operator_version = switch.operator_version;
                record.run_generation += 1;
            }
            Ok(())
        })
        .await?;
    tracing::info!(%tenant, pipeline = %name, version = switch.operator_version, "pipeline operator switched");
    Ok(Json(view(&state, tenant, record).await?))
}

/// Changes a pipeline's checkpoint interval, in-flight limit, limits or failure policy,
/// keeping its state: a new run generation, so every host drains its run, checkpoints and
/// resumes with the new settings.
#[utoipa::path(patch, path = "/v1/pipelines/{name}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = PipelineChange,
    responses(
        (status = 200, description = "Changed; hosts restart it with the settings", body = PipelineView),
        (status = 400, description = "A bad value, or a field that cannot change", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Changed concurrently", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn change_pipeline(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    body: Body,
) -> Result<Json<PipelineView>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    existing(&state, tenant, &name).await?;
    let change: PipelineChange = read_json(body).await?;
    let host = state.settings.runtime.clone();
    let record = state
        .catalog
        .update_pipeline(tenant, &name, |record| {
            let mut spec = record.spec.clone();
            if let Some(v) = change.checkpoint_interval_ms {
                spec.checkpoint_interval_ms = v;
            }
            if let Some(v) = change.in_flight_max {
                spec.in_flight_max = v;
            }
            if let Some(v) = change.limits {
                spec.limits = v;
            }
            if let Some(v) = change.failure_policy {
                spec.failure_policy = v;
            }
            spec.validate(&host).map_err(ApiError::BadRequest)?;
            if spec != record.spec {
                record.spec = spec;
                record.run_generation += 1;
            }
            Ok(())
        })
        .await?;
    tracing::info!(%tenant, pipeline = %name, generation = record.run_generation, "pipeline settings changed");
    Ok(Json(view(&state, tenant, record).await?))
}

/// Asks every host running the pipeline to checkpoint every partition now.
#[utoipa::path(post, path = "/v1/pipelines/{name}/checkpoints", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 202, description = "Asked; hosts checkpoint at their next reconcile", body = CheckpointRequested),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not running, or changed concurrently", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn trigger_checkpoint(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
) -> Result<(StatusCode, Json<CheckpointRequested>), ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    existing(&state, tenant, &name).await?;
    let record = state
        .catalog
        .update_pipeline(tenant, &name, |record| {
            if record.desired != DesiredState::Running {
                return Err(ApiError::Conflict(format!(
                    "pipeline `{name}` is stopped: start it to checkpoint"
                )));
            }
            record.checkpoint_requests += 1;
            Ok(())
        })
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CheckpointRequested {
            request: record.checkpoint_requests,
            requested_ms: record.updated_ms,
        }),
    ))
}

/// The newest committed checkpoints of the pipeline's partitions, from the hosts that run
/// them, newest first.
#[utoipa::path(get, path = "/v1/pipelines/{name}/checkpoints", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "The checkpoints", body = [CheckpointRecord]),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn list_checkpoints(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Vec<CheckpointRecord>>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, tenant, &name).await?;
    let mut checkpoints: Vec<CheckpointRecord> = state
        .catalog
        .host_statuses(tenant, &name)
        .await?
        .into_iter()
        .filter(|(s, _)| s.uid == record.uid)
        .flat_map(|(s, _)| s.recent_checkpoints)
        .collect();
    checkpoints.sort_by(|a, b| {
        (b.committed_ms, b.partition, b.version).cmp(&(a.committed_ms, a.partition, a.version))
    });
    Ok(Json(checkpoints))
}

/// Deletes a stopped pipeline with its state. A running one answers 409: stop it, and delete
/// it once no host runs it.
#[utoipa::path(delete, path = "/v1/pipelines/{name}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 204, description = "Deleted, with its state"),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not stopped yet", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn delete_pipeline(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, tenant, &name).await?;
    let status = view(&state, tenant, record.clone()).await?.status;
    if status.state != PipelineState::Stopped {
        let hosts: Vec<&str> = status.hosts.iter().map(|h| h.host.as_str()).collect();
        return Err(ApiError::Conflict(format!(
            "pipeline `{name}` is {:?}, not stopped (hosts still running it: {hosts:?}); stop it, then delete it",
            status.state
        )));
    }
    state.catalog.delete_pipeline(tenant, &record).await?;
    tracing::info!(%tenant, pipeline = %name, "pipeline deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// The caller's pipelines that use version `version` of operator `operator`.
pub(super) async fn pipelines_using(
    state: &ApiState,
    tenant: &str,
    operator: &str,
    version: u64,
) -> Result<Vec<String>, ApiError> {
    Ok(state
        .catalog
        .pipelines(tenant)
        .await?
        .into_iter()
        .filter(|p| p.spec.operator == operator && p.spec.operator_version == version)
        .map(|p| p.name)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(desired: DesiredState) -> PipelineRecord {
        PipelineRecord {
            name: "p".into(),
            uid: "u1".into(),
            spec: PipelineSpec {
                operator: "op".into(),
                operator_version: 1,
                input_topics: vec!["in".into()],
                output_topic: "out".into(),
                dead_letter_topic: "dlq".into(),
                checkpoint_interval_ms: 1000,
                in_flight_max: 16,
                limits: PipelineLimits::default(),
                failure_policy: FailurePolicy::DeadLetter,
                delivery: Delivery::AtLeastOnce,
            },
            desired,
            run_generation: 2,
            checkpoint_requests: 0,
            revision: 3,
            created_ms: 0,
            updated_ms: 0,
            deleted: false,
        }
    }

    fn report(host: &str, phase: HostPhase, partitions: &[i32]) -> HostStatus {
        HostStatus {
            host: host.into(),
            uid: "u1".into(),
            run_generation: 2,
            phase,
            reason: (phase == HostPhase::Failed).then(|| "topic `in` does not exist".into()),
            updated_ms: 0,
            stale_after_ms: 15_000,
            restarts: 0,
            records_done: 10,
            records_per_s: 5.0,
            dead_lettered: 1,
            skipped_failed: 0,
            emitted: 9,
            checkpoints: 1,
            cache_hits: 3,
            cache_misses: 1,
            partitions: partitions
                .iter()
                .map(|&p| PartitionProgress {
                    partition: p,
                    state_bytes: 100,
                    ..PartitionProgress::default()
                })
                .collect(),
            recent_checkpoints: Vec::new(),
        }
    }

    #[test]
    fn status_merges_fresh_reports_and_ignores_stale_ones_and_other_uids() {
        let mut other_uid = report("c", HostPhase::Running, &[5]);
        other_uid.uid = "u0".into();
        let reports = vec![
            (report("a", HostPhase::Running, &[0, 1]), 1_000),
            (report("b", HostPhase::Running, &[2, 3]), 2_000),
            (report("gone", HostPhase::Failed, &[4]), 16_000),
            (other_uid, 0),
        ];
        let status = merge_status(&record(DesiredState::Running), &reports);
        assert_eq!(status.state, PipelineState::Running);
        assert_eq!(status.reason, None);
        let hosts: Vec<&str> = status.hosts.iter().map(|h| h.host.as_str()).collect();
        assert_eq!(hosts, ["a", "b"]);
        let partitions: Vec<i32> = status.partitions.iter().map(|p| p.partition).collect();
        assert_eq!(partitions, [0, 1, 2, 3]);
        assert_eq!(status.records_done, 20);
        assert_eq!(status.dead_lettered, 2);
        assert_eq!(status.state_bytes, 400);
        assert_eq!(status.records_per_s, 10.0);
        assert_eq!(status.cache_hit_rate, Some(0.75));
    }

    #[test]
    fn a_failed_host_makes_the_pipeline_failed_with_its_reason() {
        let reports = vec![
            (report("a", HostPhase::Running, &[0]), 0),
            (report("b", HostPhase::Failed, &[]), 0),
        ];
        let status = merge_status(&record(DesiredState::Running), &reports);
        assert_eq!(status.state, PipelineState::Failed);
        assert_eq!(status.reason.as_deref(), Some("topic `in` does not exist"));
    }

    #[test]
    fn a_stopped_pipeline_is_stopping_while_a_host_still_runs_it() {
        let record = record(DesiredState::Stopped);
        let draining = vec![(report("a", HostPhase::Stopping, &[0]), 0)];
        assert_eq!(
            merge_status(&record, &draining).state,
            PipelineState::Stopping
        );
        let done = vec![(report("a", HostPhase::Stopped, &[]), 0)];
        assert_eq!(merge_status(&record, &done).state, PipelineState::Stopped);
        // A killed host's report goes stale: it does not hold the pipeline in `stopping`.
        let killed = vec![(report("a", HostPhase::Running, &[0]), 60_000)];
        assert_eq!(merge_status(&record, &killed).state, PipelineState::Stopped);
    }

    #[test]
    fn a_running_pipeline_is_starting_until_a_host_runs_its_current_generation() {
        let mut old = report("a", HostPhase::Running, &[0]);
        old.run_generation = 1;
        let status = merge_status(&record(DesiredState::Running), &[(old, 0)]);
        assert_eq!(status.state, PipelineState::Starting);
        assert_eq!(
            merge_status(&record(DesiredState::Running), &[]).state,
            PipelineState::Starting
        );
    }

    #[test]
    fn limits_above_the_hosts_are_refused_naming_the_limit() {
        let host = RuntimeSettings::default();
        let limits = PipelineLimits {
            record_deadline_ms: Some(host.record_deadline.as_millis() as u64 + 1),
            ..PipelineLimits::default()
        };
        let err = limits.apply(&host).expect_err("above the host's deadline");
        assert!(err.contains("limits.record_deadline_ms"), "{err}");
        let limits = PipelineLimits {
            instance_memory_bytes_max: Some(1 << 20),
            ..PipelineLimits::default()
        };
        assert_eq!(
            limits
                .apply(&host)
                .expect("within")
                .instance_memory_bytes_max,
            1 << 20
        );
    }

    #[test]
    fn tenant_topics_cannot_name_another_tenants_topic() {
        assert_eq!(kafka_topic("acme", "orders"), "acme.orders");
        assert!(!valid_topic("../globex.orders"));
        assert!(!valid_topic("a/b"));
        assert!(!valid_topic(".."));
        assert!(valid_topic("globex.orders"), "stays under acme's prefix");
        assert_eq!(kafka_topic("acme", "globex.orders"), "acme.globex.orders");
    }
}
