//! Tenants and their API keys (admin key): `POST/GET /v1/tenants`, `POST
//! /v1/tenants/{tenant}/api-keys`.

use super::problem::{ApiError, Problem};
use super::{ApiState, AuthProblems, Principal, read_json};
use crate::catalog::sha256_hex;
use crate::catalog::{ApiKeyRecord, Tenant, valid_tenant_id};
use crate::clock::wall_now_ms;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A tenant to create.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NewTenant {
    /// 1..=32 bytes of `[a-z0-9-]`, not starting with `-`.
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,31}$")]
    pub id: String,
    /// A display name; the id when absent.
    #[serde(default)]
    pub name: Option<String>,
}

/// A new API key: `key` is shown this once and never stored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NewApiKey {
    /// The key, to send as `Authorization: Bearer <key>`.
    pub key: String,
    /// What is stored of it.
    #[serde(flatten)]
    pub record: ApiKeyRecord,
}

/// Creates a tenant (admin).
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants",
    request_body = NewTenant,
    responses(
        (status = 201, description = "Created", body = Tenant),
        (status = 400, description = "Bad id or body", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Exists", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn create_tenant(
    State(state): State<ApiState>,
    principal: Principal,
    body: Body,
) -> Result<(StatusCode, Json<Tenant>), ApiError> {
    principal.admin()?;
    let new: NewTenant = read_json(body).await?;
    if !valid_tenant_id(&new.id) {
        return Err(ApiError::bad_request(format!(
            "tenant id must be 1..=32 bytes of [a-z0-9-], not starting with `-`. id=`{}`",
            new.id
        )));
    }
    let tenant = Tenant {
        name: new.name.unwrap_or_else(|| new.id.clone()),
        id: new.id,
        created_ms: wall_now_ms(),
    };
    state.catalog.create_tenant(&tenant).await?;
    tracing::info!(tenant = %tenant.id, "tenant created");
    Ok((StatusCode::CREATED, Json(tenant)))
}

/// Lists the tenants (admin).
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants",
    responses(
        (status = 200, description = "The tenants", body = [Tenant]),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn list_tenants(
    State(state): State<ApiState>,
    principal: Principal,
) -> Result<Json<Vec<Tenant>>, ApiError> {
    principal.admin()?;
    Ok(Json(state.catalog.tenants().await?))
}

/// Creates an API key for a tenant (admin). The key is in this answer only.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/api-keys", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant id", pattern = "^[a-z0-9][a-z0-9-]{0,31}$")),
    responses(
        (status = 201, description = "Created; the key is shown once", body = NewApiKey),
        (status = 404, description = "No such tenant", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn create_api_key(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(tenant): UrlPath<String>,
) -> Result<(StatusCode, Json<NewApiKey>), ApiError> {
    principal.admin()?;
    if !valid_tenant_id(&tenant) || state.catalog.tenant(&tenant).await?.is_none() {
        return Err(ApiError::not_found(format!("no tenant `{tenant}`")));
    }
    let mut secret = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut secret);
    let key = format!("weir_{}", hex::encode(secret));
    let hash = sha256_hex(key.as_bytes());
    let record = ApiKeyRecord {
        key_id: hash[..12].to_owned(),
        tenant: tenant.clone(),
        created_ms: wall_now_ms(),
    };
    state.catalog.create_key(&hash, &record).await?;
    tracing::info!(%tenant, key_id = %record.key_id, "API key created");
    Ok((StatusCode::CREATED, Json(NewApiKey { key, record })))
}
