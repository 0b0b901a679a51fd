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

/// Why a request failed. Each variant is one problem kind and one status code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No usable bearer token (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The caller's key may not do this (403): a tenant key on an admin route or the reverse.
    #[error("{0}")]
    Forbidden(String),
    /// No such resource for this caller (404). Another tenant's resources answer this too.
    #[error("{0}")]
    NotFound(String),
    /// The resource exists already, or is in use (409).
    #[error("{0}")]
    Conflict(String),
    /// The body is larger than the route allows (413).
    #[error("the request body is larger than {limit_bytes} bytes")]
    PayloadTooLarge {
        /// The route's limit, bytes.
        limit_bytes: u64,
    },
    /// The request is malformed: bad JSON, a bad name, an empty body (400).
    #[error("{0}")]
    BadRequest(String),
    /// An uploaded operator was refused: not a component, another world, a bad `describe`
    /// (422).
    #[error("{0}")]
    InvalidOperator(String),
    /// What the request names existed but is gone for good, such as the checkpoint an old page
    /// token reads (410).
    #[error("{0}")]
    Gone(String),
    /// The caller has too many of something open at once, such as `?follow` streams (429).
    #[error("{0}")]
    TooManyRequests(String),
    /// Object storage failed; retrying may help (503).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A fault of the host, not of the request (500); logged.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::Unauthorized(_) => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Missing or unknown API key",
            ),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Not allowed"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            ApiError::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Request body too large",
            ),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            ApiError::InvalidOperator(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-operator",
                "Not a valid Weir operator",
            ),
            ApiError::Gone(_) => (StatusCode::GONE, "gone", "Gone"),
            ApiError::TooManyRequests(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-requests",
                "Too many requests",
            ),
            ApiError::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Storage unavailable",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }

    /// The error for an uploaded operator that failed to load, by the failure's kind: the
    /// upload's fault ([`ErrorKind::InvalidInput`], [`ErrorKind::GuestFault`]) is 422 with
    /// `detail`, a dependency's is 503, and anything else is the host's (500).
    pub fn operator_refused(kind: ErrorKind, detail: String) -> Self {
        match kind {
            ErrorKind::InvalidInput | ErrorKind::GuestFault => ApiError::InvalidOperator(detail),
            ErrorKind::Unavailable => ApiError::Unavailable(detail),
            ErrorKind::Corrupt | ErrorKind::Fenced | ErrorKind::Internal => {
                ApiError::Internal(detail)
            }
        }
    }

    /// The problem detail this error answers with.
    pub fn problem(&self) -> Problem {
        let (status, kind, title) = self.parts();
        Problem {
            kind: format!("urn:weir:problem:{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: self.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        match self {
            ApiError::Unavailable(_) => {
                tracing::warn!(detail = %problem.detail, "storage unavailable");
            }
            ApiError::Internal(_) => tracing::error!(detail = %problem.detail, "internal error"),
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

impl From<object_store::Error> for ApiError {
    fn from(err: object_store::Error) -> Self {
        ApiError::Unavailable(format!("{err}"))
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
}
