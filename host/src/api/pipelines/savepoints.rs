//! Savepoints of a pipeline ([`crate::checkpoints::savepoint`]): take one with the pipeline running
//! (`POST /v1/pipelines/{name}/savepoints`), list and delete them, reset a stopped pipeline to
//! one (`POST /v1/pipelines/{name}/reset`), and copy one into a new pipeline
//! ([`restore_into_new`], for `POST /v1/pipelines/{name}` with `from_savepoint`).
//!
//! A savepoint lives under its pipeline's state prefix (`{state}/savepoints/{name}/`) and is
//! deleted with the pipeline; a pipeline created from it holds its own copy.

use super::{DesiredState, PipelineRecord, PipelineSpec, PipelineState, SavepointRef, existing};
use crate::api::problem::{ApiError, Problem, ProblemKind};
use crate::api::{ApiState, AuthProblems, Principal, read_json};
use crate::checkpoints::savepoint::{
    self, SavepointDescriptor, SavepointDir, SavepointError, savepoint_root,
};
use crate::checkpoints::verify::shard_roots;
use crate::clock::wall_now_ms;
use crate::ids::{ManifestVersion, Offset, Partition};
use crate::state::stored::CheckpointFormat;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use utoipa::ToSchema;

mod exports;
mod graph;
mod take;
pub use exports::*;
pub(super) use take::committed_versions_of;
pub(crate) use take::{__path_create_savepoint, create_savepoint};

/// How long a reset of a stopping pipeline waits for its hosts to finish stopping.
const STOP_WAIT: Duration = Duration::from_secs(60);

/// Body of `POST /v1/pipelines/{name}/savepoints` (none at all takes the defaults).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSavepoint {
    /// The savepoint's name, 1..=64 bytes of `[a-z0-9_-]`, unique per pipeline; default
    /// `sp-{ms since the Unix epoch}`.
    pub name: Option<String>,
}

/// Body of `POST /v1/pipelines/{name}/reset`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetRequest {
    /// The savepoint's name.
    pub savepoint: String,
    /// The pipeline it was taken of; default this one.
    pub pipeline: Option<String>,
}

/// What a reset or a create from a savepoint restored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Restored {
    /// The savepoint.
    pub savepoint: String,
    /// The pipeline it was taken of.
    pub from_pipeline: String,
    /// Per partition, the checkpoint written: the pipeline resumes from it.
    pub shards: Vec<RestoredShard>,
    /// The operator version the pipeline runs from now on: a reset puts back the version that
    /// took the savepoint (same operator, still uploaded), since a later one may not read its
    /// state; a create keeps the version its spec names.
    #[serde(default)]
    pub operator_version: u64,
    /// A pipeline of stages: each stage's operator version from now on (as `operator_version`;
    /// that one is then 0).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub operator_versions: BTreeMap<String, u64>,
}

/// One partition's restored checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RestoredShard {
    /// Its stage, in a pipeline of stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The input partition.
    pub partition: Partition,
    /// The checkpoint's manifest version in the pipeline's shard (above every earlier one).
    pub version: ManifestVersion,
    /// Its input offsets (topic → next offset).
    pub offsets: BTreeMap<String, Offset>,
    /// Bytes copied from the savepoint (server-side on S3); into another backend, the bytes of
    /// the export read.
    pub bytes_copied: u64,
}

fn unavailable(e: SavepointError) -> ApiError {
    match e {
        SavepointError::Unavailable(_) => {
            ApiError::unavailable("the savepoint could not be read or written").with_source(e)
        }
        SavepointError::Unusable(reason) => ApiError::conflict(reason),
    }
}

/// The savepoint root of the pipeline `record` of `tenant`.
fn savepoints_of(state: &ApiState, tenant: &str, record: &PipelineRecord) -> Path {
    let prefix = state.catalog.pipeline_state_prefix(tenant, &record.uid);
    Path::from(format!("{prefix}/savepoints"))
}

/// The shards the pipeline's runs write: named `{tenant}.{name}` under its state prefix.
pub(super) async fn shards_of(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
) -> Result<Vec<(Partition, Path)>, ApiError> {
    let run = super::runs::ShardRun::pipeline(tenant, record);
    shards_of_run(state, tenant, record, &run).await
}

/// The shards one run of `record` writes (a stage's, in a pipeline of stages).
pub(super) async fn shards_of_run(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    run: &super::runs::ShardRun,
) -> Result<Vec<(Partition, Path)>, ApiError> {
    let prefix = state.catalog.pipeline_state_prefix(tenant, &record.uid);
    shard_roots(state.catalog.store(), &prefix, &run.shards)
        .await
        .map_err(ApiError::from)
}

/// The root of partition `partition`'s shard of pipeline `name` (uid `uid`) of `tenant`.
fn shard_root(state: &ApiState, tenant: &str, name: &str, uid: &str, partition: Partition) -> Path {
    let id = crate::state::ShardId {
        pipeline: format!("{tenant}.{name}"),
        partition,
    };
    id.root_under(&state.catalog.pipeline_state_prefix(tenant, uid))
}

fn check_savepoint_name(name: &str) -> Result<(), ApiError> {
    if crate::catalog::valid_operator_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "savepoint name must be 1..=64 bytes of [a-z0-9_-], not starting with `-` or `_`. name=`{name}`"
        )))
    }
}

fn backend_name(spec: &PipelineSpec) -> &'static str {
    match spec.state_backend {
        super::PipelineStateBackend::Lsm => "lsm",
        super::PipelineStateBackend::Memory => "memory",
    }
}

/// The pipeline's savepoints, oldest first.
#[utoipa::path(get, path = "/v1/pipelines/{name}/savepoints", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "The savepoints", body = [SavepointDescriptor]),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store failed", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn list_savepoints(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Vec<SavepointDescriptor>>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, tenant, &name).await?;
    let found = savepoint::list(
        state.catalog.store(),
        &savepoints_of(&state, tenant, &record),
    )
    .await
    .map_err(unavailable)?;
    Ok(Json(found))
}

/// Deletes a savepoint with its objects. Pipelines created from it or reset to it keep
/// their own copies.
#[utoipa::path(delete, path = "/v1/pipelines/{name}/savepoints/{savepoint}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           ("savepoint" = String, Path, description = "Savepoint name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such pipeline or savepoint", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store failed", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn delete_savepoint(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath((name, savepoint)): UrlPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, tenant, &name).await?;
    let dir = found_savepoint(&state, tenant, &record, &savepoint)
        .await?
        .0;
    savepoint::delete(state.catalog.store(), &dir.root)
        .await
        .map_err(unavailable)?;
    tracing::info!(%tenant, pipeline = %name, %savepoint, "savepoint deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// The savepoint `savepoint` of `record`: where it is and its descriptor, or a 404.
pub(super) async fn found_savepoint(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    savepoint: &str,
) -> Result<(SavepointDir, SavepointDescriptor), ApiError> {
    let not_found = || {
        ApiError::not_found(format!(
            "pipeline `{}` has no savepoint `{savepoint}`",
            record.name
        ))
    };
    if !crate::catalog::valid_operator_name(savepoint) {
        return Err(not_found());
    }
    let root = savepoint_root(&savepoints_of(state, tenant, record), savepoint);
    let found = savepoint::descriptor(state.catalog.store(), &root)
        .await
        .map_err(unavailable)?
        .ok_or_else(not_found)?;
    Ok((SavepointDir::new(&root, &found.data), found))
}

/// Why a pipeline of `spec` reading `partitions` partitions (when known) cannot take the
/// state of `saved`, if it cannot. The backend may differ: the restore converts through the
/// portable format.
fn incompatible(
    saved: &SavepointDescriptor,
    spec: &PipelineSpec,
    partitions: Option<usize>,
) -> Option<String> {
    if !saved.stages.is_empty() {
        return Some(format!(
            "savepoint `{}` is of pipeline of stages `{}`; this pipeline has one operator",
            saved.name, saved.pipeline
        ));
    }
    let mut theirs = saved.input_topics.clone();
    let mut ours = spec.input_topics.clone();
    theirs.sort();
    ours.sort();
    if theirs != ours {
        return Some(format!(
            "savepoint `{}` of pipeline `{}` holds offsets of topics {:?}; this pipeline reads {:?}",
            saved.name, saved.pipeline, saved.input_topics, spec.input_topics
        ));
    }
    if let Some(partitions) = partitions.filter(|p| *p != saved.shards.len()) {
        return Some(format!(
            "savepoint `{}` holds {} partitions; the input topics have {partitions} now (state is partitioned by the input's partitions)",
            saved.name,
            saved.shards.len()
        ));
    }
    None
}

/// The number of partitions of `topics` (the tenant's names), from the brokers, when this
/// host has their settings; an error when they differ or a topic is missing.
async fn input_partitions(
    state: &ApiState,
    tenant: &str,
    topics: &[String],
) -> Result<Option<usize>, ApiError> {
    let Some(kafka) = state.kafka_settings().cloned() else {
        return Ok(None);
    };
    let topics: Vec<String> = topics
        .iter()
        .map(|t| super::kafka_topic(tenant, t))
        .collect();
    let prefix = format!("{tenant}.");
    tokio::task::spawn_blocking(move || {
        use crate::source::kafka::broker::{TopicLookupError, topic_partitions};
        let name = |topic: &str| topic.strip_prefix(&prefix).unwrap_or(topic).to_owned();
        let counts =
            topic_partitions(&kafka, &topics, Duration::from_secs(10)).map_err(|e| match e {
                TopicLookupError::Client(e) => {
                    ApiError::unavailable("cannot create a Kafka client").with_source(e)
                }
                TopicLookupError::Unavailable { topic, reason } => ApiError::unavailable(format!(
                    "cannot read the metadata of topic `{}`: {reason}",
                    name(&topic)
                )),
                TopicLookupError::Missing { topic } => ApiError::bad_request(format!(
                    "topic `{}` does not exist; create it first",
                    name(&topic)
                )),
            })?;
        Ok(counts.iter().max().copied())
    })
    .await
    .map_err(|e| ApiError::internal("the metadata task failed").with_source(e))?
}

/// Copies every shard of savepoint `root` (`saved`) into the pipeline `name` with uid `uid`
/// and spec `spec`: as it is on the savepoint's backend, through the portable format on the
/// other.
async fn restore(
    state: &ApiState,
    tenant: &str,
    (name, uid, spec): (&str, &str, &PipelineSpec),
    (dir, saved): (&SavepointDir, &SavepointDescriptor),
) -> Result<Restored, ApiError> {
    let mut shards = Vec::with_capacity(saved.shards.len());
    for shard in &saved.shards {
        let target = shard_root(state, tenant, name, uid, shard.partition);
        let (version, bytes_copied) =
            restore_one(state, spec, (dir, saved), shard.partition, &target).await?;
        shards.push(RestoredShard {
            stage: None,
            partition: shard.partition,
            version,
            offsets: shard.offsets.clone(),
            bytes_copied,
        });
    }
    Ok(Restored {
        savepoint: saved.name.clone(),
        from_pipeline: saved.pipeline.clone(),
        shards,
        operator_version: spec.operator_version,
        operator_versions: BTreeMap::new(),
    })
}

/// Restores partition `partition` of the savepoint in `dir` (`saved`) into the shard under
/// `target` of a pipeline of `spec`: as it is on the savepoint's backend, through the portable
/// format on the other. The version written, and the bytes copied.
async fn restore_one(
    state: &ApiState,
    spec: &PipelineSpec,
    (dir, saved): (&SavepointDir, &SavepointDescriptor),
    partition: Partition,
    target: &Path,
) -> Result<(ManifestVersion, u64), ApiError> {
    let store = state.catalog.store();
    let token = format!("restore-{}-{}", saved.pipeline, saved.name);
    let restored = if saved.state_backend == backend_name(spec) {
        savepoint::restore_shard(store, &dir.shard(partition), target, &token).await
    } else {
        let into = match spec.state_backend {
            super::PipelineStateBackend::Lsm => {
                CheckpointFormat::Lsm(crate::state::lsm::tree::LsmSettings::default())
            }
            super::PipelineStateBackend::Memory => CheckpointFormat::Memory,
        };
        let clock: crate::clock::SharedClock = Arc::new(crate::clock::SystemClock);
        savepoint::restore_shard_converted(
            store,
            dir,
            (&saved.state_backend, partition),
            (target, into, &token),
            &clock,
        )
        .await
    };
    let (version, bytes) = restored.map_err(unavailable)?;
    Ok((ManifestVersion(version.0), bytes))
}

/// For a create with `from_savepoint`: checks the savepoint fits `spec`, and copies it into the
/// new pipeline `name`'s state (uid `uid`), before the pipeline is stored.
///
/// # Errors
/// 400 naming what does not fit (no such pipeline or savepoint, other topics, another
/// backend, another partition count); 503 when the store or brokers fail.
pub(super) async fn restore_into_new(
    state: &ApiState,
    tenant: &str,
    (name, uid): (&str, &str),
    spec: &PipelineSpec,
    from: &SavepointRef,
) -> Result<Restored, ApiError> {
    let bad = |e: ApiError| {
        if e.is(ProblemKind::NotFound) {
            e.as_kind(ProblemKind::BadRequest)
        } else {
            e
        }
    };
    let source = existing(state, tenant, &from.pipeline).await.map_err(bad)?;
    let (dir, saved) = found_savepoint(state, tenant, &source, &from.savepoint)
        .await
        .map_err(bad)?;
    if spec.is_staged() {
        return graph::restore_into_new(state, tenant, (name, uid, spec), (&dir, &saved)).await;
    }
    let partitions = input_partitions(state, tenant, &spec.input_topics).await?;
    if let Some(reason) = incompatible(&saved, spec, partitions) {
        return Err(ApiError::bad_request(reason));
    }
    restore(state, tenant, (name, uid, spec), (&dir, &saved)).await
}

/// Resets a stopped pipeline to a savepoint (of itself, or of another of your pipelines that
/// reads the same topics): every partition's state and input offsets become the savepoint's,
/// as a new checkpoint above every earlier one (checkpoint ids stay monotonic). Start it
/// afterwards; it processes again what came after the savepoint. The operator version stays
/// the pipeline's (switch it first to run the savepoint's).
#[utoipa::path(post, path = "/v1/pipelines/{name}/reset", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = ResetRequest,
    responses(
        (status = 200, description = "Reset; start it to resume from the savepoint", body = Restored),
        (status = 400, description = "The savepoint does not fit the pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline or savepoint", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not stopped", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store failed", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn reset_pipeline(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    body: Body,
) -> Result<Json<Restored>, ApiError> {
    let tenant = principal.tenant()?.to_owned();
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, &tenant, &name).await?;
    let request: ResetRequest = read_json(body).await?;
    if record.desired != DesiredState::Stopped {
        return Err(ApiError::conflict(format!(
            "pipeline `{name}` is running: stop it (POST /v1/pipelines/{name}/stop), then reset it"
        )));
    }
    wait_stopped(&state, &tenant, &record).await?;
    let source = match request.pipeline.as_deref() {
        None => record.clone(),
        Some(other) if other == name => record.clone(),
        Some(other) => existing(&state, &tenant, other).await?,
    };
    let (dir, saved) = found_savepoint(&state, &tenant, &source, &request.savepoint).await?;
    if record.spec.is_staged() {
        return graph::reset_pipeline(&state, &tenant, &record, (&dir, &saved)).await;
    }
    check_reset(&state, &tenant, &record, &saved).await?;
    // Marked, so that no start runs a host's claim into the middle of the copies; the mark is
    // written only if the pipeline is still stopped (the update is create-only by revision).
    state
        .catalog
        .update_pipeline(&tenant, &name, |r| mark_resetting(r, &record))
        .await?;
    let restored = restore(
        &state,
        &tenant,
        (&name, &record.uid, &record.spec),
        (&dir, &saved),
    )
    .await;
    // The operator version that took the savepoint runs it again (as a Flink job restarted
    // from a savepoint with the jar that took it): a later version may not read its state.
    let back_to = match &restored {
        Ok(_) if saved.operator == record.spec.operator => state
            .catalog
            .version(&tenant, &saved.operator, saved.operator_version)
            .await?
            .map(|_| saved.operator_version),
        _ => None,
    };
    let failed = restored.as_ref().err().map(ToString::to_string);
    let record = state
        .catalog
        .update_pipeline(&tenant, &name, |r| {
            r.resetting_since_ms = None;
            r.reset_failed = failed.clone();
            if let Some(version) = back_to {
                r.spec.operator_version = version;
            }
            Ok::<(), ApiError>(())
        })
        .await?;
    let mut restored = restored?;
    restored.operator_version = record.spec.operator_version;
    tracing::info!(audit = true, %tenant, pipeline = %name, savepoint = %saved.name, from = %saved.pipeline, versions = ?restored.shards.iter().map(|s| s.version).collect::<Vec<_>>(), "pipeline reset to a savepoint");
    Ok(Json(restored))
}

/// Marks `r`, the stored revision of `record`, as being reset, so that no start runs a host's
/// claim into the middle of the copies ([`hold`]), and as not reset yet: until the reset's
/// last update says it succeeded, starts are refused even once the mark lapses (a reset whose
/// host died part-way leaves some shards restored and others not).
fn mark_resetting(r: &mut PipelineRecord, record: &PipelineRecord) -> Result<(), ApiError> {
    hold(r, record, "reset")?;
    let began = std::time::UNIX_EPOCH + Duration::from_millis(wall_now_ms());
    r.reset_failed = Some(format!(
        "a reset began at {} and did not finish: its host may have stopped",
        humantime::format_rfc3339_seconds(began)
    ));
    Ok(())
}

/// Holds `r`, the stored revision of the stopped `record`, for a reset or a savepoint
/// (`what`): starts and other holds are refused until it is released or lapses
/// (`RESET_HOLD`); a conflict when it was started or replaced since, or another hold is on.
pub(super) fn hold(
    r: &mut PipelineRecord,
    record: &PipelineRecord,
    what: &str,
) -> Result<(), ApiError> {
    let name = &record.name;
    if r.desired != DesiredState::Stopped || r.uid != record.uid {
        return Err(ApiError::conflict(format!(
            "pipeline `{name}` was started or replaced while the {what} began; stop it and ask again"
        )));
    }
    let under_way = r
        .resetting_since_ms
        .is_some_and(|since| wall_now_ms() < since + super::RESET_HOLD.as_millis() as u64);
    if under_way {
        return Err(ApiError::conflict(format!(
            "pipeline `{name}` is being reset or saved already; wait for that answer"
        )));
    }
    r.resetting_since_ms = Some(wall_now_ms());
    Ok(())
}

/// Waits for a stopped pipeline's hosts to drain and checkpoint (up to [`STOP_WAIT`]); a
/// conflict when they do not.
async fn wait_stopped(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
) -> Result<(), ApiError> {
    let name = &record.name;
    // Stopping: the hosts drain and checkpoint first; the reset waits for them.
    let deadline = crate::clock::monotonic_now() + STOP_WAIT;
    loop {
        let status = super::view(state, tenant, record.clone()).await?.status;
        if status.state == PipelineState::Stopped {
            return Ok(());
        }
        if crate::clock::monotonic_now() >= deadline {
            let hosts: Vec<&str> = status.hosts.iter().map(|h| h.host.as_str()).collect();
            return Err(ApiError::conflict(format!(
                "pipeline `{name}` is still stopping after {STOP_WAIT:?} (hosts still running it: {hosts:?}); reset it once it has stopped"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the pipeline can be reset to `saved` ([`incompatible`]), with no partition whose
/// state the savepoint lacks (that one would keep its own); a bad request says why not.
async fn check_reset(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    saved: &SavepointDescriptor,
) -> Result<(), ApiError> {
    let name = &record.name;
    let partitions = input_partitions(state, tenant, &record.spec.input_topics).await?;
    if let Some(reason) = incompatible(saved, &record.spec, partitions) {
        return Err(ApiError::bad_request(reason));
    }
    let saved_partitions: Vec<Partition> = saved.shards.iter().map(|s| s.partition).collect();
    if let Some((extra, _)) = shards_of(state, tenant, record)
        .await?
        .into_iter()
        .find(|(p, _)| !saved_partitions.contains(p))
    {
        return Err(ApiError::bad_request(format!(
            "pipeline `{name}` has state for partition {extra}, which savepoint `{}` does not hold",
            saved.name
        )));
    }
    Ok(())
}
