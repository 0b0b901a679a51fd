//! What a person or a scraper looks at: `GET /metrics` (Prometheus text; the admin key sees the
//! whole host, a tenant's key only the series labelled with its tenant). Metrics are listed,
//! with units and labels, in `docs/metrics.md`.

use super::problem::ApiError;
use super::{AuthProblems, Principal};
use crate::telemetry;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The content type of Prometheus' text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// This host's metrics in Prometheus' text format: every series for the admin key; for a
/// tenant's key, only the series labelled `tenant="<its id>"` (its pipelines' figures).
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses(
        (status = 200, description = "Prometheus text exposition (version 0.0.4)", body = String, content_type = "text/plain"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn metrics_page(principal: Principal) -> Result<Response, ApiError> {
    let page = telemetry::prometheus().render();
    let page = match &principal {
        Principal::Admin => page,
        Principal::Tenant(tenant) => telemetry::filter_by_label(&page, "tenant", tenant),
    };
    Ok(([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], page).into_response())
}
