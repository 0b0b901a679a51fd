//! Pipelines of the API: the routes that create, change, start, stop and delete a tenant's
//! pipelines and report their status. The definitions and the hosts' reports, and how they
//! are stored, are the catalog's ([`crate::catalog::pipelines`]).

mod change;
mod checkpoints;
mod runs;
pub mod savepoints;
pub mod state_query;
mod switch;
pub mod verify;

pub use crate::catalog::pipelines::*;
pub(super) use checkpoints::{
    __path_list_checkpoints, __path_trigger_checkpoint, list_checkpoints, trigger_checkpoint,
};
pub(crate) use switch::{__path_switch_operator, switch_operator};

use super::problem::{ApiError, Problem};
use super::{ApiState, AuthProblems, Principal, read_json};
use crate::catalog::valid_operator_name;
use crate::clock::wall_now_ms;
use crate::pipeline::CheckpointRecord;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use std::collections::BTreeMap;

fn check_pipeline_name(name: &str) -> Result<(), ApiError> {
    if valid_operator_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "pipeline name must be 1..=64 bytes of [a-z0-9_-], not starting with `-` or `_`. name=`{name}`"
        )))
    }
}

/// Pipeline `name` of `tenant`; 404 when there is none (another tenant's is none).
pub(super) async fn existing(
    state: &ApiState,
    tenant: &str,
    name: &str,
) -> Result<PipelineRecord, ApiError> {
    let not_found = || ApiError::not_found(format!("no pipeline `{name}`"));
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
        return Err(ApiError::bad_request(format!(
            "you have no version {version} of operator `{operator}`: upload it first (POST /v1/operators/{operator})"
        )));
    }
    Ok(())
}

/// What only the tenant's catalog and the new pipeline's name and uid tell of `spec`: every
/// operator version it runs exists, and its internal topics' names (which hold the tenant, the
/// name and the uid) fit Kafka's.
async fn check_new_spec(
    state: &ApiState,
    tenant: &str,
    (name, uid): (&str, &str),
    spec: &PipelineSpec,
) -> Result<(), ApiError> {
    let mut outputs = BTreeMap::new();
    for (operator, version) in spec.operator_versions() {
        check_operator_version(state, tenant, operator, version).await?;
        if let Some(found) = state.catalog.version(tenant, operator, version).await? {
            outputs.insert((operator.to_owned(), version), found.outputs);
        }
    }
    let mut problems = spec.internal_topic_length_problems(&staged_run_name(tenant, name, uid), 0);
    problems.extend(spec.undeclared_output_problems(|stage| {
        outputs
            .get(&(stage.operator.clone(), stage.operator_version))
            .cloned()
            .flatten()
    }));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ApiError::bad_request(problems.join("; ")))
    }
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
    spec.validate(
        &state.settings.runtime,
        state.settings.pipeline_state_bytes_max,
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut uid = [0u8; 8];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut uid);
    let uid = hex::encode(uid);
    check_new_spec(&state, &tenant, (&name, &uid), &spec).await?;
    // From a savepoint: its state goes under the new uid before the pipeline exists, so no
    // host starts it without (and before the lock below, which every create on this host
    // takes).
    if let Some(from) = &spec.from_savepoint {
        // Fail fast, before copying, on the limit checked again below.
        let count = state.catalog.pipelines(&tenant).await?.len();
        if count >= state.settings.pipelines_per_tenant_max {
            return Err(ApiError::conflict(format!(
                "you have {count} pipelines, the most this service allows per tenant; delete one first"
            )));
        }
        let restored =
            savepoints::restore_into_new(&state, &tenant, (&name, &uid), &spec, from).await;
        match restored {
            Ok(restored) => {
                tracing::info!(%tenant, pipeline = %name, savepoint = %from.savepoint, from = %from.pipeline, bytes = restored.shards.iter().map(|s| s.bytes_copied).sum::<u64>(), "state restored from a savepoint");
            }
            Err(e) => {
                state.catalog.delete_state(&tenant, &uid).await?;
                return Err(e);
            }
        }
    }
    let mut record = PipelineRecord::new(name.clone(), uid.clone(), spec, wall_now_ms());
    let _one_create_at_a_time = state.pipeline_creates.lock().await;
    let count = state.catalog.pipelines(&tenant).await?.len();
    if count >= state.settings.pipelines_per_tenant_max {
        // (A pipeline of stages restored from a savepoint has seeded internal topics too.)
        delete_internal_topics(&state, &tenant, &record).await?;
        state.catalog.delete_state(&tenant, &uid).await?;
        return Err(ApiError::conflict(format!(
            "you have {count} pipelines, the most this service allows per tenant; delete one first"
        )));
    }
    if let Err(e) = state.catalog.create_pipeline(&tenant, &mut record).await {
        delete_internal_topics(&state, &tenant, &record).await?;
        state.catalog.delete_state(&tenant, &uid).await?;
        return Err(e.into());
    }
    // Creates through other API servers racing past the count above: the oldest `max` stay,
    // the others are undone.
    let mut all = state.catalog.pipelines(&tenant).await?;
    if all.len() > state.settings.pipelines_per_tenant_max {
        all.sort_by(|a, b| (a.created_ms, &a.uid).cmp(&(b.created_ms, &b.uid)));
        if all[state.settings.pipelines_per_tenant_max..]
            .iter()
            .any(|p| p.uid == record.uid)
        {
            delete_internal_topics(&state, &tenant, &record).await?;
            state.catalog.delete_pipeline(&tenant, &record).await?;
            return Err(ApiError::conflict(format!(
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
            let resetting = record
                .resetting_since_ms
                .is_some_and(|since| wall_now_ms() < since + RESET_HOLD.as_millis() as u64);
            if desired == DesiredState::Running && resetting {
                let since = record.resetting_since_ms.unwrap_or_default();
                let left_s =
                    (since + RESET_HOLD.as_millis() as u64).saturating_sub(wall_now_ms()) / 1000;
                return Err(ApiError::conflict(format!(
                    "pipeline `{name}` is being reset to a savepoint or saved; start it once that \
                     has answered (if its host died, the mark lapses in {left_s} s: a reset must \
                     then be run again)"
                )));
            }
            if let Some(why) = record
                .reset_failed
                .as_ref()
                .filter(|_| desired == DesiredState::Running)
            {
                return Err(ApiError::conflict(format!(
                    "pipeline `{name}`'s last reset to a savepoint failed part-way ({why}): some partitions may hold the savepoint's state and others their own; reset it again (POST /v1/pipelines/{name}/reset) before starting it"
                )));
            }
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
        (status = 409, description = "Changed concurrently, or being reset", body = Problem, content_type = "application/problem+json"),
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

/// Changes a pipeline's checkpoint interval, in-flight limit, limits or failure policy (or,
/// with `stage`, one stage's own), keeping its state: a new run generation, so every host
/// drains its run, checkpoints and resumes with the new settings.
#[utoipa::path(patch, path = "/v1/pipelines/{name}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = PipelineChange,
    responses(
        (status = 200, description = "Changed; hosts restart it with the settings", body = PipelineView),
        (status = 400, description = "A bad value, a field that cannot change, or no such stage", body = Problem, content_type = "application/problem+json"),
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
    let state_bytes_cap = state.settings.pipeline_state_bytes_max;
    let record = state
        .catalog
        .update_pipeline(tenant, &name, |record| {
            let mut spec = record.spec.clone();
            match change.stage.as_deref() {
                Some(stage) => change::apply_to_stage(&mut spec, stage, &change)?,
                None => change::apply(&mut spec, &change),
            }
            spec.validate(&host, state_bytes_cap)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            if spec != record.spec {
                record.spec = spec;
                record.run_generation += 1;
            }
            Ok::<(), ApiError>(())
        })
        .await?;
    tracing::info!(%tenant, pipeline = %name, generation = record.run_generation, "pipeline settings changed");
    Ok(Json(view(&state, tenant, record).await?))
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
        return Err(ApiError::conflict(format!(
            "pipeline `{name}` is {:?}, not stopped (hosts still running it: {hosts:?}); stop it, then delete it",
            status.state
        )));
    }
    delete_internal_topics(&state, tenant, &record).await?;
    state.catalog.delete_pipeline(tenant, &record).await?;
    tracing::info!(%tenant, pipeline = %name, "pipeline deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes the internal topics of `record`, a pipeline of stages, before the pipeline goes
/// (none for a one-operator one); a host that serves the API without running pipelines has no
/// Kafka to ask and leaves them, saying so in its log.
///
/// # Errors
/// 503 when Kafka does not delete them: the pipeline stays, and a retry deletes both.
async fn delete_internal_topics(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
) -> Result<(), ApiError> {
    // Every generation's: a reset leaves the ones before it, and one that failed, its own.
    let run = staged_run_name(tenant, &record.name, &record.uid);
    let last = record.edge_generation.max(record.edge_generations_made);
    let topics: Vec<String> = (0..=last)
        .flat_map(|generation| record.spec.internal_topics(&run, generation))
        .collect();
    if topics.is_empty() {
        return Ok(());
    }
    let Some(kafka) = state.kafka_settings() else {
        tracing::warn!(%tenant, pipeline = %record.name, ?topics, "no Kafka settings on this host: the deleted pipeline's internal topics stay");
        return Ok(());
    };
    crate::sink::kafka::internal_topics::delete_topics(kafka, &topics)
        .await
        .map_err(|e| {
            ApiError::unavailable("cannot delete the pipeline's internal topics; try again")
                .with_source(e)
        })
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
        .filter(|p| p.spec.operator_versions().contains(&(operator, version)))
        .map(|p| p.name)
        .collect())
}

#[cfg(test)]
mod tests;
