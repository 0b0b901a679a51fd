//! A pipeline's checkpoints: ask its hosts for one now (`POST
//! /v1/pipelines/{name}/checkpoints`), and list the recent ones they report (`GET`).

use super::*;

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
pub(in crate::api) async fn trigger_checkpoint(
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
                return Err(ApiError::conflict(format!(
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
pub(in crate::api) async fn list_checkpoints(
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
