//! `weir serve`: the multi-tenant HTTP API (axum). Tenants upload operators; every resource is
//! scoped to the tenant whose API key the request carries, and another tenant's resource
//! answers 404. An admin key (from the environment, never stored) creates tenants and their
//! keys. Records live in object storage ([`catalog`]), so every host sharing the store serves
//! the same catalog. Errors are RFC 9457 problem details ([`problem`]); the OpenAPI document,
//! generated from this code (utoipa), is served at `/openapi.json`.
//!
//! Besides, `GET /metrics` (Prometheus), the status page at `/` ([`status`]), and the probes
//! `GET /healthz` and `GET /readyz` ([`crate::health`]).
//!
//! Routes (`/v1`): `POST/GET /tenants`, `POST /tenants/{tenant}/api-keys` (admin);
//! `GET /operators`, `POST/GET /operators/{name}`, `GET/DELETE
//! /operators/{name}/versions/{version}`, `GET /pipelines`, `POST/GET/PATCH/DELETE
//! /pipelines/{name}`, `POST /pipelines/{name}/start|stop`, `PUT /pipelines/{name}/operator`,
//! `POST/GET /pipelines/{name}/checkpoints` (tenant). Pipelines are run by the hosts whose
//! config has a `[pipelines]` section ([`crate::runner`]).

pub mod logs;
mod operators;
pub mod pipelines;
pub mod problem;
mod settings;
pub mod status;
mod tenants;

pub use settings::{DEFAULT_PIPELINE_STATE_BYTES_MAX, ServeSettings};
pub use tenants::{NewApiKey, NewTenant};

use crate::catalog::{
    ApiKeyRecord, Catalog, OperatorSummary, OperatorVersion, StateDescription, Tenant,
    valid_operator_name,
};
use crate::clock::SystemClock;
use crate::config::RuntimeSettings;
use crate::runtime::{Operator, Runtime};
use crate::state::configured::ConfiguredShard;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path as UrlPath, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use problem::{ApiError, Problem};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// Largest JSON request body, bytes.
const JSON_BODY_BYTES_MAX: usize = 64 << 10;

/// How long a verified API key is trusted without reading the store again.
const KEY_CACHE_TTL: Duration = Duration::from_secs(60);

/// Shortest admin key accepted, bytes.
pub const ADMIN_KEY_BYTES_MIN: usize = 32;

/// Settings of the API handlers.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// Largest operator component accepted, bytes.
    pub operator_bytes_max: usize,
    /// SHA-256 of the admin key.
    pub admin_key_sha256: [u8; 32],
    /// Limits the operators are checked and run with (each pipeline's defaults and caps).
    pub runtime: RuntimeSettings,
    /// Most pipelines one tenant may have.
    pub pipelines_per_tenant_max: usize,
    /// Most state one `memory` pipeline may hold, bytes (its default `state_bytes_max`).
    pub pipeline_state_bytes_max: u64,
    /// How often the status page's charts sample every pipeline's status.
    pub status_sample_interval: Duration,
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct ApiState {
    catalog: Catalog,
    runtime: Arc<Runtime<ConfiguredShard>>,
    /// Compiled operators by component SHA-256: a component is compiled once per host.
    compiled: moka::future::Cache<String, Arc<Operator<ConfiguredShard>>>,
    /// Verified keys by SHA-256: the tenant they act for.
    keys: moka::future::Cache<String, String>,
    settings: Arc<ApiSettings>,
    /// The status page's recent history.
    board: Arc<status::StatusBoard>,
    /// Held across a pipeline create's count and write, so that this server's concurrent
    /// creates cannot pass the per-tenant limit together. (Creates through other API servers
    /// sharing the catalog are undone after the fact: see `create_pipeline`.)
    pipeline_creates: Arc<tokio::sync::Mutex<()>>,
    /// The brokers' state for `/readyz`, on a host that runs pipelines.
    kafka: Option<Arc<crate::health::KafkaProbe>>,
    /// Turns `true` when [`serve`]'s shutdown starts: open `?follow` streams end then.
    shutting_down: Arc<tokio::sync::watch::Sender<bool>>,
    /// Open `?follow` streams by tenant ([`logs::FOLLOWS_PER_TENANT_MAX`] each).
    follows: logs::Follows,
    /// The block cache of state queries (`GET /v1/pipelines/{name}/state/…`), shared by every
    /// tenant's reads (blocks are keyed by their object's path, which names the tenant).
    query_caches: Arc<crate::state::lsm::cache::BlockCaches>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("catalog", &self.catalog)
            .finish_non_exhaustive()
    }
}

/// Memory for the blocks state queries read: 64 MiB, no disk tier.
const QUERY_CACHE_BYTES: u64 = 64 << 20;

fn query_caches() -> crate::state::lsm::cache::BlockCaches {
    use crate::state::lsm::cache::{BlockCaches, CacheSettings};
    // Without a disk tier nothing can fail; were it to, queries go uncached.
    BlockCaches::new(&CacheSettings {
        block_cache_bytes: QUERY_CACHE_BYTES,
        disk_cache_bytes: 0,
        disk_cache_dir: None,
    })
    .unwrap_or_else(|_| BlockCaches::none())
}

impl ApiState {
    /// State over `catalog`, with an operator runtime configured by `settings.runtime`.
    ///
    /// # Errors
    /// [`crate::runtime::RuntimeError`] when the engine cannot be configured.
    pub fn new(
        catalog: Catalog,
        settings: ApiSettings,
    ) -> Result<Self, crate::runtime::RuntimeError> {
        // Before any run registers its series: handles taken earlier would record nowhere.
        crate::telemetry::prometheus();
        let runtime = Runtime::new(&settings.runtime, Arc::new(SystemClock))?;
        Ok(Self {
            catalog,
            runtime: Arc::new(runtime),
            compiled: moka::future::Cache::builder().max_capacity(256).build(),
            keys: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(KEY_CACHE_TTL)
                .build(),
            settings: Arc::new(settings),
            board: Arc::default(),
            pipeline_creates: Arc::default(),
            kafka: None,
            shutting_down: Arc::new(tokio::sync::watch::Sender::new(false)),
            follows: logs::Follows::default(),
            query_caches: Arc::new(query_caches()),
        })
    }

    /// The brokers' settings, on a host that runs pipelines.
    pub(crate) fn kafka_settings(&self) -> Option<&crate::config::KafkaSettings> {
        self.kafka.as_deref().map(crate::health::KafkaProbe::kafka)
    }

    /// Reports `probe`'s view of the brokers in `/readyz` (a host that runs pipelines).
    #[must_use]
    pub fn with_kafka_probe(mut self, probe: Arc<crate::health::KafkaProbe>) -> Self {
        self.kafka = Some(probe);
        self
    }

    /// Who `key` acts as: the admin, or the tenant whose key it is.
    ///
    /// # Errors
    /// [`ProblemKind::Unauthorized`](crate::api::problem::ProblemKind::Unauthorized) for an unknown key; [`ProblemKind::Unavailable`](crate::api::problem::ProblemKind::Unavailable) when the store
    /// cannot be read.
    pub async fn principal_of(&self, key: &str) -> Result<Principal, ApiError> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        if digest == self.settings.admin_key_sha256 {
            return Ok(Principal::Admin);
        }
        let hash = hex::encode(digest);
        if let Some(tenant) = self.keys.get(&hash).await {
            return Ok(Principal::Tenant(tenant));
        }
        let record = self
            .catalog
            .key(&hash)
            .await?
            .ok_or_else(|| ApiError::unauthorized("unknown API key"))?;
        self.keys.insert(hash, record.tenant.clone()).await;
        Ok(Principal::Tenant(record.tenant))
    }
}

/// The token of an `Authorization` header's `Bearer` credentials (the scheme name is
/// case-insensitive, RFC 9110 §11.1); `None` for another scheme or an empty token.
pub(crate) fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Who a request acts as, from its `Authorization: Bearer …` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The admin key.
    Admin,
    /// A tenant's key.
    Tenant(String),
}

impl FromRequestParts<ApiState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ApiError::unauthorized("send `Authorization: Bearer <API key>`"))?;
        let key = bearer_token(header).ok_or_else(|| {
            ApiError::unauthorized("the Authorization header must be `Bearer <API key>`")
        })?;
        let principal = state.principal_of(key).await?;
        let name = match &principal {
            Principal::Admin => "(admin)",
            Principal::Tenant(tenant) => tenant.as_str(),
        };
        tracing::Span::current().record("tenant", name);
        Ok(principal)
    }
}

impl Principal {
    fn admin(&self) -> Result<(), ApiError> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Tenant(_) => Err(ApiError::forbidden("this route needs the admin key")),
        }
    }

    fn tenant(&self) -> Result<&str, ApiError> {
        match self {
            Principal::Tenant(t) => Ok(t),
            Principal::Admin => Err(ApiError::forbidden(
                "this route acts for a tenant: use one of the tenant's API keys",
            )),
        }
    }
}

/// Reads a whole body of at most `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        // `to_bytes` reports an over-long body as a length-limit error in its source chain.
        let text = format!("{err:#}");
        let mut source: Option<&dyn std::error::Error> = Some(&err);
        while let Some(e) = source {
            if e.is::<http_body_util::LengthLimitError>() {
                return ApiError::payload_too_large(limit as u64);
            }
            source = e.source();
        }
        ApiError::bad_request(format!("cannot read the request body: {text}"))
    })
}

/// Reads a JSON body of at most [`JSON_BODY_BYTES_MAX`].
async fn read_json<T: for<'de> Deserialize<'de>>(body: Body) -> Result<T, ApiError> {
    parse_json(&read_body(body, JSON_BODY_BYTES_MAX).await?)
}

/// As [`read_json`], but an empty body (or only whitespace) is `T::default()`: for a body
/// whose every field is optional.
async fn read_json_or_default<T: Default + for<'de> Deserialize<'de>>(
    body: Body,
) -> Result<T, ApiError> {
    let bytes = read_body(body, JSON_BODY_BYTES_MAX).await?;
    if bytes.trim_ascii().is_empty() {
        return Ok(T::default());
    }
    parse_json(&bytes)
}

fn parse_json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde would take an array for a struct, field by field in order: not what anyone means.
    if !bytes.trim_ascii_start().starts_with(b"{") {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    // The error names the field: `failure_policy: unknown variant …`.
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes))
        .map_err(|e| ApiError::bad_request("invalid JSON body").with_source(e))
}

/// The problems of every authenticated route, documented once.
#[derive(Debug, utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "a documentation type: its variants are never built"
)]
enum AuthProblems {
    /// No key, or an unknown one.
    #[response(
        status = 401,
        description = "No or unknown API key",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    /// A tenant key on an admin route, or the admin key on a tenant route.
    #[response(
        status = 403,
        description = "This key may not use this route",
        content_type = "application/problem+json"
    )]
    Forbidden(Problem),
}

/// Adds the bearer security scheme.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key: the admin key, or a tenant's key"))
                    .build(),
            ),
        );
    }
}

/// The OpenAPI document of the API.
#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "Weir API", description = "Upload WebAssembly operators and run them over Kafka, per tenant."),
    paths(tenants::create_tenant, tenants::list_tenants, tenants::create_api_key,
          operators::list_operators,
          operators::upload_operator, operators::get_operator,
          operators::get_operator_version, operators::delete_operator_version,
          pipelines::create_pipeline, pipelines::list_pipelines, pipelines::get_pipeline,
          pipelines::start_pipeline, pipelines::stop_pipeline, pipelines::switch_operator,
          pipelines::change_pipeline,
          pipelines::trigger_checkpoint, pipelines::list_checkpoints,
          pipelines::delete_pipeline, logs::pipeline_logs,
          pipelines::verify::verify_pipeline_state, pipelines::state_query::read_state,
          pipelines::savepoints::create_savepoint, pipelines::savepoints::list_savepoints,
          pipelines::savepoints::delete_savepoint, pipelines::savepoints::reset_pipeline,
          pipelines::savepoints::export_savepoint, pipelines::savepoints::download_export,
          status::metrics_page),
    components(schemas(Problem, Tenant, NewTenant, NewApiKey, ApiKeyRecord, OperatorVersion,
                       OperatorSummary, StateDescription, pipelines::PipelineSpec,
                       pipelines::PipelineLimits, pipelines::PipelineRecord,
                       pipelines::PipelineView, pipelines::PipelineStatus,
                       pipelines::HostSummary, pipelines::OperatorSwitch,
                       pipelines::PipelineChange, pipelines::PipelineStateBackend,
                       pipelines::CheckpointRequested, crate::catalog::logs::LogEntry,
                       pipelines::verify::PipelineVerify, pipelines::verify::SavepointCheck,
                       crate::checkpoints::verify::ShardCheck,
                       crate::checkpoints::verify::VersionCheck, pipelines::SavepointRef,
                       pipelines::TableSpec, pipelines::StageSpec, pipelines::StageInput,
                       pipelines::StageOutput, crate::sink::iceberg::ColumnSpec,
                       crate::sink::iceberg::ColumnType,
                       pipelines::savepoints::NewSavepoint, pipelines::savepoints::ResetRequest,
                       pipelines::savepoints::Restored, pipelines::savepoints::RestoredShard,
                       pipelines::savepoints::ExportedPartition,
                       crate::checkpoints::savepoint::SavepointDescriptor,
                       crate::checkpoints::savepoint::SavepointShard,
                       crate::checkpoints::savepoint::SavepointStage,
                       crate::checkpoints::savepoint::SavepointEdge,
                       crate::checkpoints::savepoint::SavepointEdgePartition,
                       pipelines::state_query::StatePage, pipelines::state_query::StateEntry, pipelines::state_query::TableOffset,
                       pipelines::state_query::ReadCheckpoint)),
    modifiers(&BearerAuth),
    tags((name = "tenants", description = "Tenants and their API keys (admin key)"),
         (name = "operators", description = "A tenant's operator components (tenant key)"),
         (name = "pipelines", description = "A tenant's pipelines (tenant key)"),
         (name = "metrics", description = "Prometheus metrics (admin key: the host; tenant key: its own series)")),
)]
pub struct ApiDoc;

async fn openapi_json() -> Response {
    Json(ApiDoc::openapi()).into_response()
}

/// How long `/readyz` waits for the catalog store.
const READY_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// `/readyz`: ready while the catalog store answers; the brokers' state (a host that runs
/// pipelines) is reported, not a condition, so that the API and the status page stay up
/// through a Kafka outage.
async fn readyz(State(state): State<ApiState>) -> crate::health::Readiness {
    let store =
        match tokio::time::timeout(READY_STORE_TIMEOUT, state.catalog.check_readable()).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("cannot read the catalog store: {e}")),
            Err(_) => Some(format!(
                "the catalog store did not answer within {READY_STORE_TIMEOUT:?}"
            )),
        };
    crate::health::Readiness {
        ready: store.is_none(),
        store: Some(store.unwrap_or_else(|| "ok".to_owned())),
        kafka: state.kafka.as_ref().and_then(|probe| probe.state()),
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// The API's router over `state`.
pub fn router(state: ApiState) -> Router {
    let trace = TraceLayer::new_for_http().make_span_with(|request: &axum::http::Request<Body>| {
        tracing::info_span!(
            "request",
            method = %request.method(),
            path = %request.uri().path(),
            tenant = tracing::field::Empty,
            pipeline = tracing::field::Empty,
        )
    });
    Router::new()
        .route("/openapi.json", get(openapi_json))
        .route("/healthz", get(crate::health::healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(status::metrics_page))
        .route("/", get(status::status_page))
        .route("/login", post(status::login))
        .route("/logout", post(status::logout))
        .route(
            "/v1/tenants",
            post(tenants::create_tenant).get(tenants::list_tenants),
        )
        .route(
            "/v1/tenants/{tenant}/api-keys",
            post(tenants::create_api_key),
        )
        .merge(operator_routes())
        .merge(pipeline_routes())
        .merge(savepoint_routes())
        .fallback(not_found)
        // Bodies are read and limited by the handlers (so the limit answers with a problem).
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(trace)
        .with_state(state)
}

/// The routes of a tenant's operators.
fn operator_routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/operators", get(operators::list_operators))
        .route(
            "/v1/operators/{name}",
            post(operators::upload_operator).get(operators::get_operator),
        )
        .route(
            "/v1/operators/{name}/versions/{version}",
            get(operators::get_operator_version).delete(operators::delete_operator_version),
        )
}

/// The routes of a tenant's pipelines: their specs, runs, logs, state and checkpoints.
fn pipeline_routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/pipelines", get(pipelines::list_pipelines))
        .route(
            "/v1/pipelines/{name}",
            post(pipelines::create_pipeline)
                .get(pipelines::get_pipeline)
                .patch(pipelines::change_pipeline)
                .delete(pipelines::delete_pipeline),
        )
        .route(
            "/v1/pipelines/{name}/start",
            post(pipelines::start_pipeline),
        )
        .route("/v1/pipelines/{name}/stop", post(pipelines::stop_pipeline))
        .route(
            "/v1/pipelines/{name}/operator",
            axum::routing::put(pipelines::switch_operator),
        )
        .route("/v1/pipelines/{name}/logs", get(logs::pipeline_logs))
        .route(
            "/v1/pipelines/{name}/verify",
            get(pipelines::verify::verify_pipeline_state),
        )
        .route(
            "/v1/pipelines/{name}/state/{state}",
            get(pipelines::state_query::read_state),
        )
        .route(
            "/v1/pipelines/{name}/checkpoints",
            post(pipelines::trigger_checkpoint).get(pipelines::list_checkpoints),
        )
}

/// The routes of a pipeline's savepoints: taken, listed, deleted, exported, reset to.
fn savepoint_routes() -> Router<ApiState> {
    Router::new()
        .route(
            "/v1/pipelines/{name}/savepoints",
            post(pipelines::savepoints::create_savepoint)
                .get(pipelines::savepoints::list_savepoints),
        )
        .route(
            "/v1/pipelines/{name}/savepoints/{savepoint}",
            axum::routing::delete(pipelines::savepoints::delete_savepoint),
        )
        .route(
            "/v1/pipelines/{name}/savepoints/{savepoint}/exports",
            post(pipelines::savepoints::export_savepoint),
        )
        .route(
            "/v1/pipelines/{name}/savepoints/{savepoint}/exports/{partition}",
            get(pipelines::savepoints::download_export),
        )
        .route(
            "/v1/pipelines/{name}/reset",
            post(pipelines::savepoints::reset_pipeline),
        )
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves the API on `listener` until `shutdown` completes. Installs the process's Prometheus
/// recorder ([`crate::telemetry::prometheus`]) if it is not yet.
///
/// # Errors
/// The server's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    let _upkeep = AbortOnDrop(crate::telemetry::spawn_upkeep());
    let board = state.board.clone();
    let interval = state.settings.status_sample_interval;
    let sampled = state.clone();
    let _sampler = AbortOnDrop(tokio::spawn(async move {
        board.run(sampled, interval).await;
    }));
    let shutting_down = state.shutting_down.clone();
    tracing::info!(?addr, "weir serve listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            // Streams that would otherwise never end (`?follow`) end now.
            shutting_down.send_replace(true);
        })
        .await
}
