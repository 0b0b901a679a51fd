//! A client of the HTTP API, for the `weir operator|pipeline|tenant …` commands: each call
//! returns the answer's JSON, or the API's problem detail as the error.

use serde::de::DeserializeOwned;
use weir_host::api::NewApiKey;
use weir_host::api::pipelines::{CheckpointRequested, PipelineChange, PipelineSpec, PipelineView};
use weir_host::api::problem::Problem;
use weir_host::catalog::logs::LogEntry;
use weir_host::catalog::{OperatorSummary, OperatorVersion, Tenant};
use weir_host::pipeline::CheckpointRecord;

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
            return Err(problem(status, &bytes, url));
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

    /// Every tenant (admin key).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn tenants(&self) -> Result<Vec<Tenant>, ClientError> {
        let url = format!("{}/v1/tenants", self.base);
        self.expect(self.http.get(&url), &url).await
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

impl ApiClient {
    /// Creates and starts pipeline `name`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn create_pipeline(
        &self,
        name: &str,
        spec: &PipelineSpec,
    ) -> Result<PipelineView, ClientError> {
        let url = format!("{}/v1/pipelines/{name}", self.base);
        let request = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(spec).expect("a spec serializes"));
        self.expect(request, &url).await
    }

    /// The caller's pipelines.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn pipelines(&self) -> Result<Vec<PipelineView>, ClientError> {
        let url = format!("{}/v1/pipelines", self.base);
        self.expect(self.http.get(&url), &url).await
    }

    /// Pipeline `name`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn pipeline(&self, name: &str) -> Result<PipelineView, ClientError> {
        let url = format!("{}/v1/pipelines/{name}", self.base);
        self.expect(self.http.get(&url), &url).await
    }

    /// `POST /v1/pipelines/{name}/{action}` (`start` or `stop`).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn pipeline_action(
        &self,
        name: &str,
        action: &str,
    ) -> Result<PipelineView, ClientError> {
        let url = format!("{}/v1/pipelines/{name}/{action}", self.base);
        self.expect(self.http.post(&url), &url).await
    }

    /// Switches pipeline `name` to version `version` of its operator (of `stage`'s, in a
    /// pipeline of stages).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn switch_operator(
        &self,
        name: &str,
        version: u64,
        stage: Option<&str>,
    ) -> Result<PipelineView, ClientError> {
        let url = format!("{}/v1/pipelines/{name}/operator", self.base);
        let switch = weir_host::api::pipelines::OperatorSwitch {
            operator_version: version,
            stage: stage.map(str::to_owned),
        };
        let body = serde_json::to_value(&switch).expect("a switch is JSON");
        let request = self
            .http
            .put(&url)
            .header("content-type", "application/json")
            .body(body.to_string());
        self.expect(request, &url).await
    }

    /// Changes the settings of pipeline `name` (a restart keeping state).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn change_pipeline(
        &self,
        name: &str,
        change: &PipelineChange,
    ) -> Result<PipelineView, ClientError> {
        let url = format!("{}/v1/pipelines/{name}", self.base);
        let request = self
            .http
            .patch(&url)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(change).expect("a change serializes"));
        self.expect(request, &url).await
    }

    /// Asks for a checkpoint of pipeline `name`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn trigger_checkpoint(&self, name: &str) -> Result<CheckpointRequested, ClientError> {
        let url = format!("{}/v1/pipelines/{name}/checkpoints", self.base);
        self.expect(self.http.post(&url), &url).await
    }

    /// The newest checkpoints of pipeline `name`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn checkpoints(&self, name: &str) -> Result<Vec<CheckpointRecord>, ClientError> {
        let url = format!("{}/v1/pipelines/{name}/checkpoints", self.base);
        self.expect(self.http.get(&url), &url).await
    }

    /// `GET /v1/pipelines/{name}/verify`: which stored checkpoints could be restored, with
    /// every object's checksums read when `checksums`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn verify_pipeline(
        &self,
        name: &str,
        checksums: bool,
    ) -> Result<weir_host::api::pipelines::verify::PipelineVerify, ClientError> {
        let url = format!(
            "{}/v1/pipelines/{name}/verify?checksums={checksums}",
            self.base
        );
        self.expect(self.http.get(&url), &url).await
    }

    /// One page of pipeline `name`'s state `state` (`GET /v1/pipelines/{name}/state/{state}`),
    /// `query` as that route's parameters (`key`, `prefix`, `limit`, `page_token`, `savepoint`,
    /// `stage`).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn read_state(
        &self,
        name: &str,
        state: &str,
        query: &[(&str, &str)],
    ) -> Result<weir_host::api::pipelines::state_query::StatePage, ClientError> {
        let mut url = url::Url::parse(&self.base).map_err(|e| ClientError::Unexpected {
            url: self.base.clone(),
            reason: format!("not a URL: {e}"),
        })?;
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty()
                .extend(["v1", "pipelines", name, "state", state]);
        }
        url.query_pairs_mut().extend_pairs(query);
        let url = url.to_string();
        self.expect(self.http.get(&url), &url).await
    }

    /// Takes a savepoint of pipeline `name` (`POST /v1/pipelines/{name}/savepoints`), named
    /// `savepoint` (the API names it when `None`); answers once every partition's is copied.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn create_savepoint(
        &self,
        name: &str,
        savepoint: Option<&str>,
    ) -> Result<weir_host::checkpoints::savepoint::SavepointDescriptor, ClientError> {
        let url = format!("{}/v1/pipelines/{name}/savepoints", self.base);
        let body = match savepoint {
            Some(savepoint) => serde_json::json!({ "name": savepoint }),
            None => serde_json::json!({}),
        };
        let request = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string());
        self.expect(request, &url).await
    }

    /// The savepoints of pipeline `name`, oldest first.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn savepoints(
        &self,
        name: &str,
    ) -> Result<Vec<weir_host::checkpoints::savepoint::SavepointDescriptor>, ClientError> {
        let url = format!("{}/v1/pipelines/{name}/savepoints", self.base);
        self.expect(self.http.get(&url), &url).await
    }

    /// Deletes savepoint `savepoint` of pipeline `name`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn delete_savepoint(&self, name: &str, savepoint: &str) -> Result<(), ClientError> {
        let url = format!("{}/v1/pipelines/{name}/savepoints/{savepoint}", self.base);
        self.send::<serde_json::Value>(self.http.delete(&url), &url)
            .await
            .map(|_| ())
    }

    /// Resets stopped pipeline `name` to savepoint `savepoint` of pipeline `from` (this one
    /// when `None`).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn reset_pipeline(
        &self,
        name: &str,
        savepoint: &str,
        from: Option<&str>,
    ) -> Result<weir_host::api::pipelines::savepoints::Restored, ClientError> {
        let url = format!("{}/v1/pipelines/{name}/reset", self.base);
        let body = serde_json::json!({ "savepoint": savepoint, "pipeline": from });
        let request = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string());
        self.expect(request, &url).await
    }

    /// Exports savepoint `savepoint` of pipeline `name` in the portable format (once; later
    /// calls list what is there).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn export_savepoint(
        &self,
        name: &str,
        savepoint: &str,
    ) -> Result<Vec<weir_host::api::pipelines::savepoints::ExportedPartition>, ClientError> {
        let url = format!(
            "{}/v1/pipelines/{name}/savepoints/{savepoint}/exports",
            self.base
        );
        self.expect(self.http.post(&url), &url).await
    }

    /// Downloads `path` (an API path, as an export's `download`) into `file`, streamed; the
    /// bytes written.
    ///
    /// # Errors
    /// [`ClientError`]; a local write error as [`ClientError::Unexpected`].
    pub async fn download(&self, path: &str, file: &std::path::Path) -> Result<u64, ClientError> {
        use tokio::io::AsyncWriteExt as _;
        let url = format!("{}{path}", self.base);
        let connect = |source| ClientError::Connect {
            url: url.clone(),
            source,
        };
        let mut response = self
            .http
            .get(&url)
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(connect)?;
        if !response.status().is_success() {
            let status = response.status();
            let bytes = response.bytes().await.map_err(connect)?;
            return Err(problem(status, &bytes, &url));
        }
        let local = |e: std::io::Error| ClientError::Unexpected {
            url: url.clone(),
            reason: format!("cannot write {}: {e}", file.display()),
        };
        let mut out = tokio::fs::File::create(file).await.map_err(local)?;
        let mut written = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(connect)? {
            out.write_all(&chunk).await.map_err(local)?;
            written += chunk.len() as u64;
        }
        out.flush().await.map_err(local)?;
        Ok(written)
    }

    /// Reads the operator's log of pipeline `name` (`GET /v1/pipelines/{name}/logs`): the last
    /// `tail` lines (the API's default when `None`) logged at or after `since_ms`, oldest
    /// first, each given to `each` as it arrives; with `follow`, then new lines until the
    /// pipeline is deleted or the host shuts down. Stops early when `each` returns `false`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn pipeline_logs(
        &self,
        name: &str,
        tail: Option<usize>,
        since_ms: Option<u64>,
        follow: bool,
        mut each: impl FnMut(LogEntry<'static>) -> bool,
    ) -> Result<(), ClientError> {
        let mut url = format!("{}/v1/pipelines/{name}/logs?follow={follow}", self.base);
        url.extend(tail.map(|t| format!("&tail={t}")));
        url.extend(since_ms.map(|t| format!("&since_ms={t}")));
        let connect = |source| ClientError::Connect {
            url: url.clone(),
            source,
        };
        let mut response = self
            .http
            .get(&url)
            .bearer_auth(&self.key)
            .send()
            .await
            .map_err(connect)?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response.bytes().await.map_err(connect)?;
            return Err(problem(status, &bytes, &url));
        }
        let mut pending = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(connect)? {
            let chunk: bytes::Bytes = chunk;
            pending.extend_from_slice(&chunk);
            let complete = pending
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            for line in pending[..complete]
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
            {
                let entry: LogEntry<'_> =
                    serde_json::from_slice(line).map_err(|e| ClientError::Unexpected {
                        url: url.clone(),
                        reason: format!("a log line that is not a log entry: {e}"),
                    })?;
                if !each(entry.into_owned()) {
                    return Ok(());
                }
            }
            pending.drain(..complete);
        }
        Ok(())
    }

    /// Deletes stopped pipeline `name` with its state.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn delete_pipeline(&self, name: &str) -> Result<(), ClientError> {
        let url = format!("{}/v1/pipelines/{name}", self.base);
        self.send::<serde_json::Value>(self.http.delete(&url), &url)
            .await
            .map(|_| ())
    }
}

/// The error of an answer with `status` and body `bytes`: its problem detail.
fn problem(status: reqwest::StatusCode, bytes: &[u8], url: &str) -> ClientError {
    match serde_json::from_slice::<Problem>(bytes) {
        Ok(problem) => ClientError::Problem {
            status: problem.status,
            title: problem.title,
            detail: problem.detail,
        },
        Err(_) => ClientError::Unexpected {
            url: url.to_owned(),
            reason: format!("{status} without a problem detail"),
        },
    }
}
