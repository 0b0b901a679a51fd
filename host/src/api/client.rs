//! A client of the HTTP API, for the `weir operator …` and `weir tenant …` commands: each call
//! returns the answer's JSON, or the API's problem detail as the error.

use super::NewApiKey;
use super::catalog::{OperatorSummary, OperatorVersion, Tenant};
use super::problem::Problem;
use serde::de::DeserializeOwned;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API could not be reached.
    #[error("cannot reach the Weir API at {url}")]
    Connect {
        /// The URL called.
        url: String,
        /// The HTTP client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The API answered with a problem.
    #[error("{status} {title}: {detail}")]
    Problem {
        /// HTTP status.
        status: u16,
        /// The problem's title.
        title: String,
        /// What went wrong.
        detail: String,
    },
    /// The answer was not what the API documents.
    #[error("unexpected answer from {url}: {reason}")]
    Unexpected {
        /// The URL called.
        url: String,
        /// What was wrong with it.
        reason: String,
    },
}

/// A client for one API base URL and one key.
#[derive(Debug, Clone)]
pub struct ApiClient {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl ApiClient {
    /// A client of the API at `base` (e.g. `http://127.0.0.1:8080`) using `key`.
    pub fn new(base: &str, key: &str) -> Self {
        // reqwest needs a TLS provider installed even for plain HTTP.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            base: base.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<Option<T>, ClientError> {
        let response = request
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(|source| ClientError::Connect {
                url: url.to_owned(),
                source,
            })?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|source| ClientError::Connect {
                url: url.to_owned(),
                source,
            })?;
        let unexpected = |reason: String| ClientError::Unexpected {
            url: url.to_owned(),
            reason,
        };
        if !status.is_success() {
            let problem: Problem = serde_json::from_slice(&bytes)
                .map_err(|_| unexpected(format!("{status} without a problem detail")))?;
            return Err(ClientError::Problem {
                status: problem.status,
                title: problem.title,
                detail: problem.detail,
            });
        }
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| unexpected(e.to_string()))
    }

    async fn expect<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<T, ClientError> {
        self.send(request, url)
            .await?
            .ok_or_else(|| ClientError::Unexpected {
                url: url.to_owned(),
                reason: "empty answer".into(),
            })
    }

    /// Uploads `component` as the next version of operator `name`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn push_operator(
        &self,
        name: &str,
        component: Vec<u8>,
    ) -> Result<OperatorVersion, ClientError> {
        let url = format!("{}/v1/operators/{name}", self.base);
        let request = self
            .http
            .post(&url)
            .header("content-type", "application/wasm")
            .body(component);
        self.expect(request, &url).await
    }

    /// The caller's operators.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn operators(&self) -> Result<Vec<OperatorSummary>, ClientError> {
        let url = format!("{}/v1/operators", self.base);
        self.expect(self.http.get(&url), &url).await
    }

    /// The versions of operator `name`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn operator_versions(&self, name: &str) -> Result<Vec<OperatorVersion>, ClientError> {
        let url = format!("{}/v1/operators/{name}", self.base);
        self.expect(self.http.get(&url), &url).await
    }

    /// Deletes version `version` of operator `name`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn delete_operator_version(
        &self,
        name: &str,
        version: u64,
    ) -> Result<(), ClientError> {
        let url = format!("{}/v1/operators/{name}/versions/{version}", self.base);
        self.send::<serde_json::Value>(self.http.delete(&url), &url)
            .await
            .map(|_| ())
    }

    /// Creates tenant `id` (admin key).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn create_tenant(&self, id: &str, name: Option<&str>) -> Result<Tenant, ClientError> {
        let url = format!("{}/v1/tenants", self.base);
        let body = serde_json::json!({ "id": id, "name": name });
        let request = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string());
        self.expect(request, &url).await
    }

    /// Creates an API key for tenant `id` (admin key).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn create_api_key(&self, tenant: &str) -> Result<NewApiKey, ClientError> {
        let url = format!("{}/v1/tenants/{tenant}/api-keys", self.base);
        self.expect(self.http.post(&url), &url).await
    }
}

/// `operators` as a table: name, versions.
pub fn operators_table(operators: &[OperatorSummary]) -> String {
    let mut out = format!("{:<32} {}\n", "NAME", "VERSIONS");
    for op in operators {
        let versions: Vec<String> = op.versions.iter().map(u64::to_string).collect();
        out.push_str(&format!("{:<32} {}\n", op.name, versions.join(",")));
    }
    out
}

/// `versions` as a table: version, size, SHA-256 prefix, declared name and version, states.
pub fn versions_table(versions: &[OperatorVersion]) -> String {
    let mut out = format!(
        "{:>7} {:>10} {:<14} {:<24} {}\n",
        "VERSION", "BYTES", "SHA256", "DECLARED", "STATES"
    );
    for v in versions {
        let states: Vec<String> = v
            .states
            .iter()
            .map(|s| format!("{}:{}", s.name, s.kind))
            .collect();
        out.push_str(&format!(
            "{:>7} {:>10} {:<14} {:<24} {}\n",
            v.version,
            v.size_bytes,
            &v.sha256[..12.min(v.sha256.len())],
            format!("{} {}", v.declared_name, v.declared_version),
            states.join(",")
        ));
    }
    out
}
