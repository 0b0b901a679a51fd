//! Errors of the HTTP API as RFC 9457 problem details (`application/problem+json`), mapped from
//! error kinds in one place: [`ApiError`]'s `IntoResponse`.

use crate::error::ErrorKind;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// An RFC 9457 problem detail, as every error response of the API carries it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the problem kind (`urn:weir:problem:{kind}`).
    #[serde(rename = "type")]
    pub kind: String,
    /// A short, fixed summary of the kind.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request, for a person.
    pub detail: String,
}

/// The API's kinds of problem, each one status code and one problem type: the crate's
/// [`ErrorKind`]s as HTTP tells them apart (a request can be refused for who sent it, for what
/// it names, for its size, for its rate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// No usable bearer token (401).
    Unauthorized,
    /// The caller's key may not do this (403): a tenant key on an admin route or the reverse.
    Forbidden,
    /// No such resource for this caller (404). Another tenant's resources answer this too.
    NotFound,
    /// The resource exists already, or is in use (409).
    Conflict,
    /// The body is larger than the route allows (413).
    PayloadTooLarge,
    /// The request is malformed: bad JSON, a bad name, an empty body (400).
    BadRequest,
    /// An uploaded operator was refused: not a component, another world, a bad `describe`
    /// (422).
    InvalidOperator,
    /// What the request names existed but is gone for good, such as the checkpoint an old page
    /// token reads (410).
    Gone,
    /// The caller has too many of something open at once, such as `?follow` streams (429).
    TooManyRequests,
    /// Object storage failed; retrying may help (503).
    Unavailable,
    /// A fault of the host, not of the request (500); logged.
    Internal,
}

impl ProblemKind {
    /// The status, the problem type's last segment and the fixed title: the one map from kinds
    /// to HTTP.
    fn parts(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Missing or unknown API key",
            ),
            Self::Forbidden => (StatusCode::FORBIDDEN, "forbidden", "Not allowed"),
            Self::NotFound => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            Self::Conflict => (StatusCode::CONFLICT, "conflict", "Conflict"),
            Self::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Request body too large",
            ),
            Self::BadRequest => (StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            Self::InvalidOperator => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-operator",
                "Not a valid Weir operator",
            ),
            Self::Gone => (StatusCode::GONE, "gone", "Gone"),
            Self::TooManyRequests => (
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-requests",
                "Too many requests",
            ),
            Self::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Storage unavailable",
            ),
            Self::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }

    /// The crate's kind (STYLE.md's six) this problem is: what the caller should do.
    pub fn error_kind(self) -> ErrorKind {
        match self {
            Self::Unavailable | Self::TooManyRequests => ErrorKind::Unavailable,
            Self::Internal => ErrorKind::Internal,
            Self::InvalidOperator => ErrorKind::GuestFault,
            Self::Unauthorized
            | Self::Forbidden
            | Self::NotFound
            | Self::Conflict
            | Self::PayloadTooLarge
            | Self::BadRequest
            | Self::Gone => ErrorKind::InvalidInput,
        }
    }
}

/// Why a request failed: its [`ProblemKind`] (one status code), what went wrong for a person,
/// and the error that caused it, if one did (kept as the source, never re-printed in the
/// message: the problem's `detail` and the log show the whole chain).
#[derive(Debug, thiserror::Error)]
pub struct ApiError {
    kind: ProblemKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            ProblemKind::Unavailable => write!(f, "storage unavailable: {}", self.message),
            ProblemKind::Internal => write!(f, "internal error: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl ApiError {
    /// A problem of `kind`, saying `message`.
    pub fn new(kind: ProblemKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The same problem, caused by `source`.
    #[must_use]
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// 401: no usable bearer token.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::Unauthorized, message)
    }

    /// 403: the caller's key may not do this.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::Forbidden, message)
    }

    /// 404: no such resource for this caller.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::NotFound, message)
    }

    /// 409: the resource exists already, or is in use.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::Conflict, message)
    }

    /// 413: the body is larger than the route's `limit_bytes`.
    pub fn payload_too_large(limit_bytes: u64) -> Self {
        Self::new(
            ProblemKind::PayloadTooLarge,
            format!("the request body is larger than {limit_bytes} bytes"),
        )
    }

    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::BadRequest, message)
    }

    /// 422: an uploaded operator was refused.
    pub fn invalid_operator(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::InvalidOperator, message)
    }

    /// 410: what the request names is gone for good.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::Gone, message)
    }

    /// 429: too many of something open at once.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::TooManyRequests, message)
    }

    /// 503: object storage (or another dependency) failed; retrying may help.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::Unavailable, message)
    }

    /// 500: a fault of the host.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ProblemKind::Internal, message)
    }

    /// Its problem kind.
    pub fn problem_kind(&self) -> ProblemKind {
        self.kind
    }

    /// The crate's kind of this problem ([`ProblemKind::error_kind`]).
    pub fn kind(&self) -> ErrorKind {
        self.kind.error_kind()
    }

    /// Whether it is a problem of `kind`.
    pub fn is(&self, kind: ProblemKind) -> bool {
        self.kind == kind
    }

    /// The same message and source as a problem of `kind` (a 404 of what a request's body
    /// names is its 400).
    #[must_use]
    pub fn as_kind(mut self, kind: ProblemKind) -> Self {
        self.kind = kind;
        self
    }

    /// The error for an uploaded operator that failed to load, by the failure's kind: the
    /// upload's fault ([`ErrorKind::InvalidInput`], [`ErrorKind::GuestFault`]) is 422 with
    /// `detail`, a dependency's is 503, and anything else is the host's (500).
    pub fn operator_refused(kind: ErrorKind, detail: String) -> Self {
        match kind {
            ErrorKind::InvalidInput | ErrorKind::GuestFault => ApiError::invalid_operator(detail),
            ErrorKind::Unavailable => ApiError::unavailable(detail),
            ErrorKind::Corrupt | ErrorKind::Fenced | ErrorKind::Internal => {
                ApiError::internal(detail)
            }
        }
    }

    /// The problem detail this error answers with: its message and the chain of its causes.
    pub fn problem(&self) -> Problem {
        let (status, kind, title) = self.kind.parts();
        Problem {
            kind: format!("urn:weir:problem:{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: crate::error::Chain(self).to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        match self.kind {
            ProblemKind::Unavailable => {
                tracing::warn!(detail = %problem.detail, "storage unavailable");
            }
            ProblemKind::Internal => tracing::error!(detail = %problem.detail, "internal error"),
            _ => {}
        }
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(problem)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<crate::catalog::CatalogError> for ApiError {
    fn from(err: crate::catalog::CatalogError) -> Self {
        use crate::catalog::CatalogError;
        match err {
            CatalogError::Exists { .. }
            | CatalogError::Changed { .. }
            | CatalogError::Busy { .. } => ApiError::conflict(err.to_string()),
            CatalogError::NotFound { .. } | CatalogError::Missing { .. } => {
                ApiError::not_found(err.to_string())
            }
            CatalogError::Unreadable { path, source } => {
                ApiError::unavailable(format!("unreadable catalog record `{path}`"))
                    .with_source(source)
            }
            CatalogError::Store(err) => err.into(),
        }
    }
}

impl From<object_store::Error> for ApiError {
    fn from(err: object_store::Error) -> Self {
        ApiError::unavailable("the object store failed").with_source(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_operator_answers_by_the_kind_of_its_failure() {
        let status = |kind| {
            ApiError::operator_refused(kind, "detail".into())
                .problem()
                .status
        };
        assert_eq!(status(ErrorKind::InvalidInput), 422);
        assert_eq!(status(ErrorKind::GuestFault), 422);
        assert_eq!(status(ErrorKind::Unavailable), 503);
        assert_eq!(status(ErrorKind::Corrupt), 500);
        assert_eq!(status(ErrorKind::Fenced), 500);
        assert_eq!(status(ErrorKind::Internal), 500);
        let problem = ApiError::operator_refused(ErrorKind::Internal, "no engine".into()).problem();
        assert_eq!(problem.kind, "urn:weir:problem:internal");
        assert_eq!(problem.detail, "internal error: no engine");
    }

    #[test]
    fn an_api_error_keeps_its_cause_as_its_source_and_its_detail_shows_the_chain() {
        let cause = std::io::Error::other("connection reset");
        let err = ApiError::unavailable("cannot read the catalog").with_source(cause);
        assert_eq!(
            err.to_string(),
            "storage unavailable: cannot read the catalog"
        );
        let source = std::error::Error::source(&err).expect("the cause is kept");
        assert_eq!(source.to_string(), "connection reset");
        let problem = err.problem();
        assert_eq!(problem.status, 503);
        assert_eq!(
            problem.detail,
            "storage unavailable: cannot read the catalog: connection reset"
        );
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        let moved = ApiError::not_found("no pipeline `p`").as_kind(ProblemKind::BadRequest);
        assert_eq!(
            (moved.problem().status, moved.to_string().as_str()),
            (400, "no pipeline `p`")
        );
    }
}
