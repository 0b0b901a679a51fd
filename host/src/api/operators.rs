//! Operator routes of the API: a tenant's uploads (compiled and described before they are
//! stored as the next immutable version), their listing and their deletion.

use super::*;
use crate::catalog::sha256_hex;
use crate::clock::wall_now_ms;

/// Lists the caller's operators with their versions.
#[utoipa::path(get, path = "/v1/operators", tag = "operators",
    responses(
        (status = 200, description = "The operators", body = [OperatorSummary]),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn list_operators(
    State(state): State<ApiState>,
    principal: Principal,
) -> Result<Json<Vec<OperatorSummary>>, ApiError> {
    let tenant = principal.tenant()?;
    Ok(Json(state.catalog.operators(tenant).await?))
}

fn check_operator_name(name: &str) -> Result<(), ApiError> {
    if valid_operator_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "operator name must be 1..=64 bytes of [a-z0-9_-], not starting with `-` or `_`. name=`{name}`"
        )))
    }
}

/// Uploads a new version of an operator: the body is a `wasm32-wasip2` component
/// implementing the `weir:operator` world (`Content-Type: application/wasm`). It is compiled
/// and its `describe` called before it is stored; versions are immutable.
#[utoipa::path(post, path = "/v1/operators/{name}", tag = "operators",
    params(("name" = String, Path, description = "Operator name, 1..=64 bytes of [a-z0-9_-]", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body(description = "The component's bytes (any content type is read as bytes)",
        content((Vec<u8> = "application/wasm"), (Vec<u8> = "application/octet-stream"))),
    responses(
        (status = 201, description = "Stored as the next version", body = OperatorVersion),
        (status = 400, description = "Bad name or empty body", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Larger than the limit", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a component of the weir:operator world", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "The host failed to compile it (not the upload's fault)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Object storage unavailable; retry", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn upload_operator(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    body: Body,
) -> Result<(StatusCode, Json<OperatorVersion>), ApiError> {
    let tenant = principal.tenant()?.to_owned();
    check_operator_name(&name)?;
    let bytes = read_body(body, state.settings.operator_bytes_max).await?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "the body is empty: send the component's bytes (Content-Type: application/wasm)",
        ));
    }
    let sha256 = sha256_hex(&bytes);
    let operator = match state.compiled.get(&sha256).await {
        Some(operator) => operator,
        None => {
            let operator = state
                .runtime
                .load_operator_bytes(&bytes)
                .await
                .map_err(|err| {
                    ApiError::operator_refused(err.kind(), operator_error(&bytes, &err))
                })?;
            let operator = Arc::new(operator);
            state
                .compiled
                .insert(sha256.clone(), operator.clone())
                .await;
            operator
        }
    };
    let meta = operator.meta();
    let mut states: Vec<StateDescription> = meta
        .states
        .values()
        .map(|s| StateDescription {
            name: s.name.clone(),
            kind: match s.kind {
                crate::runtime::bindings::StateKind::Value => "value".into(),
                crate::runtime::bindings::StateKind::Map => "map".into(),
            },
            ttl_ms: s.ttl_ms,
            version: s.version,
        })
        .collect();
    states.sort_by(|a, b| a.name.cmp(&b.name));
    state
        .catalog
        .put_blob(&tenant, &sha256, bytes.clone())
        .await?;
    let version = state
        .catalog
        .create_version(
            &tenant,
            OperatorVersion {
                name: name.clone(),
                version: 0,
                sha256,
                size_bytes: bytes.len() as u64,
                created_ms: wall_now_ms(),
                declared_name: meta.name.clone(),
                declared_version: meta.version.clone(),
                states,
                outputs: Some(meta.outputs.clone()),
            },
        )
        .await?;
    tracing::info!(%tenant, operator = %name, version = version.version, size_bytes = version.size_bytes, "operator uploaded");
    Ok((StatusCode::CREATED, Json(version)))
}

/// The message of a refused upload of `bytes`: what they are, and what is wrong or missing.
fn operator_error(bytes: &[u8], err: &crate::runtime::RuntimeError) -> String {
    use crate::runtime::RuntimeError as E;
    match err {
        E::InvalidComponent { .. } if !bytes.starts_with(b"\0asm") => {
            "not WebAssembly: the body does not start with the `\\0asm` magic number; upload a component built with `--target wasm32-wasip2`".into()
        }
        E::InvalidComponent { .. } if bytes.get(4..8) == Some(&[1, 0, 0, 0]) => {
            "a core WebAssembly module, not a component: build with `--target wasm32-wasip2` (or wrap the module with `wasm-tools component new`)".into()
        }
        E::InvalidComponent { reason } => {
            format!("not a valid WebAssembly component: {reason}")
        }
        E::WrongWorld { reason } => format!(
            "the component does not implement the `weir:operator` world (missing or mismatched imports/exports): {reason}"
        ),
        other => format!("{other:#}"),
    }
}

/// Lists the versions of one of the caller's operators.
#[utoipa::path(get, path = "/v1/operators/{name}", tag = "operators",
    params(("name" = String, Path, description = "Operator name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    responses(
        (status = 200, description = "Its versions, ascending", body = [OperatorVersion]),
        (status = 404, description = "No such operator", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn get_operator(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Vec<OperatorVersion>>, ApiError> {
    let tenant = principal.tenant()?;
    let not_found = || ApiError::not_found(format!("no operator `{name}`"));
    if !valid_operator_name(&name) {
        return Err(not_found());
    }
    let mut versions = Vec::new();
    for v in state.catalog.version_numbers(tenant, &name).await? {
        if let Some(version) = state.catalog.version(tenant, &name, v).await? {
            versions.push(version);
        }
    }
    if versions.is_empty() {
        return Err(not_found());
    }
    Ok(Json(versions))
}

/// Parses a version path segment; anything else is a 404 (no such version).
fn version_number(name: &str, version: &str) -> Result<u64, ApiError> {
    version
        .parse()
        .ok()
        .filter(|v| *v > 0 && valid_operator_name(name))
        .ok_or_else(|| ApiError::not_found(format!("no version `{version}` of operator `{name}`")))
}

/// One version of one of the caller's operators.
#[utoipa::path(get, path = "/v1/operators/{name}/versions/{version}", tag = "operators",
    params(("name" = String, Path, description = "Operator name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           ("version" = u64, Path, description = "Version number")),
    responses(
        (status = 200, description = "The version", body = OperatorVersion),
        (status = 404, description = "No such version", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn get_operator_version(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath((name, version)): UrlPath<(String, String)>,
) -> Result<Json<OperatorVersion>, ApiError> {
    let tenant = principal.tenant()?;
    let number = version_number(&name, &version)?;
    state
        .catalog
        .version(tenant, &name, number)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no version {number} of operator `{name}`")))
}

/// Deletes one version of one of the caller's operators.
#[utoipa::path(delete, path = "/v1/operators/{name}/versions/{version}", tag = "operators",
    params(("name" = String, Path, description = "Operator name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           ("version" = u64, Path, description = "Version number")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such version", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A pipeline uses it", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn delete_operator_version(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath((name, version)): UrlPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let tenant = principal.tenant()?;
    let number = version_number(&name, &version)?;
    let users = pipelines::pipelines_using(&state, tenant, &name, number).await?;
    if !users.is_empty() {
        return Err(ApiError::conflict(format!(
            "version {number} of operator `{name}` is used by pipelines {users:?}: switch or delete them first"
        )));
    }
    if state.catalog.delete_version(tenant, &name, number).await? {
        tracing::info!(%tenant, operator = %name, version = number, "operator version deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "no version {number} of operator `{name}`"
        )))
    }
}
