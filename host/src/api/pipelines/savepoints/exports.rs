//! A savepoint's export in the portable format: made once (`POST …/savepoints/{sp}/exports`)
//! and kept with the savepoint, downloaded per partition (`GET …/exports/{partition}`).

use super::{found_savepoint, unavailable};
use crate::api::pipelines::existing;
use crate::api::problem::{ApiError, Problem};
use crate::api::{ApiState, AuthProblems, Principal};
use crate::checkpoints::savepoint;
use crate::ids::Partition;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use object_store::ObjectStoreExt as _;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// One partition's export of a savepoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExportedPartition {
    /// The input partition.
    pub partition: Partition,
    /// Bytes of its JSON lines.
    pub bytes: u64,
    /// Where to download it (`GET`, `application/x-ndjson`).
    pub download: String,
}

/// Exports a savepoint in the portable format (docs/api.md "The portable format"): per
/// partition, the keys and values of every state, the timers, the watermark and the offsets
/// as JSON lines, in key order. Made once per savepoint and kept with it.
#[utoipa::path(post, path = "/v1/pipelines/{name}/savepoints/{savepoint}/exports", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           ("savepoint" = String, Path, description = "Savepoint name")),
    responses(
        (status = 200, description = "Exported", body = [ExportedPartition]),
        (status = 404, description = "No such pipeline or savepoint", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store failed", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn export_savepoint(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath((name, savepoint)): UrlPath<(String, String)>,
) -> Result<Json<Vec<ExportedPartition>>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, tenant, &name).await?;
    let (dir, saved) = found_savepoint(&state, tenant, &record, &savepoint).await?;
    if !saved.stages.is_empty() {
        return Err(ApiError::conflict(format!(
            "savepoint `{savepoint}` is of a pipeline of stages, which has no export in the portable format yet (docs/topologies.md)"
        )));
    }
    let store = state.catalog.store();
    let clock: crate::clock::SharedClock = Arc::new(crate::clock::SystemClock);
    let mut out = Vec::with_capacity(saved.shards.len());
    for shard in &saved.shards {
        savepoint::export_shard(store, &dir, (&saved.state_backend, shard.partition), &clock)
            .await
            .map_err(unavailable)?;
        let meta = store.head(&dir.export(shard.partition)).await?;
        out.push(ExportedPartition {
            partition: shard.partition,
            bytes: meta.size,
            download: format!(
                "/v1/pipelines/{name}/savepoints/{savepoint}/exports/{}",
                shard.partition
            ),
        });
    }
    Ok(Json(out))
}

/// Downloads one partition's export of a savepoint (made by `POST …/exports`).
#[utoipa::path(get, path = "/v1/pipelines/{name}/savepoints/{savepoint}/exports/{partition}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           ("savepoint" = String, Path, description = "Savepoint name"),
           ("partition" = i32, Path, description = "Input partition")),
    responses(
        (status = 200, description = "The partition's JSON lines", content_type = "application/x-ndjson"),
        (status = 404, description = "No such pipeline, savepoint or export", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store failed", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn download_export(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath((name, savepoint, partition)): UrlPath<(String, String, String)>,
) -> Result<axum::response::Response, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, tenant, &name).await?;
    let (dir, saved) = found_savepoint(&state, tenant, &record, &savepoint).await?;
    // Any other text names no partition of the savepoint: 404, as a partition it lacks.
    let Some(partition) = partition
        .parse::<i32>()
        .ok()
        .filter(|p| saved.shards.iter().any(|s| s.partition == Partition(*p)))
    else {
        return Err(ApiError::not_found(format!(
            "savepoint `{savepoint}` holds no partition `{partition}`"
        )));
    };
    let path = dir.export(Partition(partition));
    let got = match state.catalog.store().get(&path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(ApiError::not_found(format!(
                "savepoint `{savepoint}` has no export of partition {partition}: POST /v1/pipelines/{name}/savepoints/{savepoint}/exports first"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let body = Body::from_stream(got.into_stream());
    axum::response::Response::builder()
        .header("content-type", "application/x-ndjson")
        .body(body)
        .map_err(|e| ApiError::internal("cannot build the export's response").with_source(e))
}
