//! A client of the HTTP API, for the `weir operator|pipeline|tenant …` commands: each call
//! returns the answer's JSON, or the API's problem detail as the error.

use super::NewApiKey;
use super::catalog::{OperatorSummary, OperatorVersion, Tenant};
use super::logs::LogEntry;
use super::pipelines::{CheckpointRequested, PipelineChange, PipelineSpec, PipelineView};
use super::problem::Problem;
use crate::pipeline::CheckpointRecord;
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

    /// Switches pipeline `name` to version `version` of its operator.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn switch_operator(
        &self,
        name: &str,
        version: u64,
    ) -> Result<PipelineView, ClientError> {
        let url = format!("{}/v1/pipelines/{name}/operator", self.base);
        let body = serde_json::json!({ "operator_version": version });
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
    ) -> Result<crate::api::pipelines::verify::PipelineVerify, ClientError> {
        let url = format!(
            "{}/v1/pipelines/{name}/verify?checksums={checksums}",
            self.base
        );
        self.expect(self.http.get(&url), &url).await
    }

    /// One page of pipeline `name`'s state `state` (`GET /v1/pipelines/{name}/state/{state}`),
    /// `query` as that route's parameters (`key`, `prefix`, `limit`, `page_token`, `savepoint`).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn read_state(
        &self,
        name: &str,
        state: &str,
        query: &[(&str, &str)],
    ) -> Result<crate::api::pipelines::state_query::StatePage, ClientError> {
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
    ) -> Result<crate::state::savepoint::SavepointDescriptor, ClientError> {
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
    ) -> Result<Vec<crate::state::savepoint::SavepointDescriptor>, ClientError> {
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
    ) -> Result<crate::api::pipelines::savepoints::Restored, ClientError> {
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
    ) -> Result<Vec<crate::api::pipelines::savepoints::ExportedPartition>, ClientError> {
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

/// How the API spells `value` (an enum variant): `exactly_once`, `dead_letter`, ….
fn wire_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

/// `entry` as one line of text: time (UTC, ms), host and partition, level, message; for
/// example `2026-12-03T17:20:01.123Z host-a/2 INFO  counted 10 keys`. Control characters in
/// the message are escaped (`\n`, `\u{1b}`), so that an operator cannot print a line that
/// looks like another, or drive the terminal.
pub fn log_line(entry: &LogEntry<'_>) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(entry.time_ms);
    let partition = entry.partition.map(|p| format!("/{p}")).unwrap_or_default();
    format!(
        "{} {}{partition} {:<5} {}",
        humantime::format_rfc3339_millis(time),
        escape_controls(&entry.host),
        escape_controls(&entry.level).to_uppercase(),
        escape_controls(&entry.message)
    )
}

/// `text` with its control characters escaped as Rust escapes them.
fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// `pipelines` as a table: name, state, operator and version, records/s, lag, hosts.
pub fn pipelines_table(pipelines: &[PipelineView]) -> String {
    let mut out = format!(
        "{:<24} {:<9} {:<24} {:>10} {:>8} {:>5}\n",
        "NAME", "STATE", "OPERATOR", "RECORDS/S", "LAG", "HOSTS"
    );
    for p in pipelines {
        let lag: i64 = p.status.partitions.iter().map(|p| p.lag).sum();
        out.push_str(&format!(
            "{:<24} {:<9} {:<24} {:>10.0} {:>8} {:>5}\n",
            p.definition.name,
            wire_name(&p.status.state),
            format!(
                "{}:{}",
                p.definition.spec.operator, p.definition.spec.operator_version
            ),
            p.status.records_per_s,
            lag,
            p.status.hosts.len()
        ));
    }
    out
}

/// `weir pipeline savepoint ls`'s table: one savepoint a line, oldest first, with its time
/// (UTC), operator, partitions, bytes and offsets.
pub fn savepoints_table(savepoints: &[crate::state::savepoint::SavepointDescriptor]) -> String {
    let mut out = format!(
        "{:<24} {:<24} {:<20} {:>10} {:>12}  {}\n",
        "NAME", "TAKEN (UTC)", "OPERATOR", "PARTITIONS", "BYTES", "OFFSETS (partition:next)"
    );
    for sp in savepoints {
        let taken = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(sp.created_ms),
        );
        let offsets: Vec<String> = sp
            .shards
            .iter()
            .map(|s| {
                let next: Vec<String> = s.offsets.values().map(i64::to_string).collect();
                if next.is_empty() {
                    format!("{}:-", s.partition)
                } else {
                    format!("{}:{}", s.partition, next.join("/"))
                }
            })
            .collect();
        out.push_str(&format!(
            "{:<24} {:<24} {:<20} {:>10} {:>12}  {}\n",
            sp.name,
            taken.to_string(),
            format!("{}:{}", sp.operator, sp.operator_version),
            sp.shards.len(),
            sp.bytes,
            offsets.join(" ")
        ));
    }
    out
}

/// One pipeline's status, for a person: state and reason, counters, last checkpoint, then
/// one line per partition.
pub fn pipeline_status_text(p: &PipelineView) -> String {
    let (d, s) = (&p.definition, &p.status);
    let mut out = format!(
        "pipeline   {} ({}:{}, {} delivery, failure policy {})\n",
        d.name,
        d.spec.operator,
        d.spec.operator_version,
        wire_name(&d.spec.delivery),
        wire_name(&d.spec.failure_policy)
    );
    out.push_str(&format!(
        "state      {}{}\n",
        wire_name(&s.state),
        s.reason
            .as_deref()
            .map(|r| match s.reason_kind {
                Some(kind) => format!(" ({}): {r}", wire_name(&kind)),
                None => format!(": {r}"),
            })
            .unwrap_or_default()
    ));
    out.push_str(&format!(
        "records    {} done, {:.0}/s, {} emitted, {} dead-lettered, {} skipped\n",
        s.records_done, s.records_per_s, s.emitted, s.dead_lettered, s.skipped_failed
    ));
    out.push_str(&format!(
        "state      {} bytes on {}{}, cache hit rate {}\n",
        s.state_bytes,
        wire_name(&d.spec.state_backend),
        d.spec
            .state_bytes_max
            .map(|max| format!(" (quota {max} bytes)"))
            .unwrap_or_default(),
        s.cache_hit_rate
            .map_or("-".to_owned(), |r| format!("{:.1} %", r * 100.0))
    ));
    if let Some(c) = &s.last_checkpoint {
        let age_s = super::now_ms().saturating_sub(c.committed_ms) as f64 / 1000.0;
        out.push_str(&format!(
            "checkpoint partition {} version {}, {age_s:.1} s ago, took {} ms, uploaded {} bytes\n",
            c.partition, c.version, c.duration_ms, c.uploaded_bytes
        ));
    }
    let hosts: Vec<String> = s
        .hosts
        .iter()
        .map(|h| {
            format!(
                "{} ({}, partitions {:?})",
                h.host,
                wire_name(&h.phase),
                h.partitions
            )
        })
        .collect();
    out.push_str(&format!("hosts      {}\n", hosts.join(", ")));
    out.push_str(&format!(
        "{:>9} {:>12} {:>12} {:>8} {:>12} {:>10}\n",
        "PARTITION", "CHECKPOINTED", "HIGH", "LAG", "STATE BYTES", "CHECKPOINT"
    ));
    for part in &s.partitions {
        let checkpointed: i64 = part.checkpointed_offsets.values().sum();
        let high: i64 = part.high_watermarks.values().filter(|h| **h >= 0).sum();
        out.push_str(&format!(
            "{:>9} {:>12} {:>12} {:>8} {:>12} {:>10}\n",
            part.partition,
            checkpointed,
            high,
            part.lag,
            part.state_bytes,
            part.checkpoint_version
                .map_or("-".to_owned(), |v| v.to_string())
        ));
        if let Some(problem) = &part.problem {
            out.push_str(&format!(
                "{:>9} {}: {}\n",
                "",
                wire_name(&problem.state),
                problem.reason
            ));
        }
    }
    out
}

/// `tenants` as a table: id, created (RFC 3339, UTC), name.
pub fn tenants_table(tenants: &[Tenant]) -> String {
    let mut out = format!("{:<32} {:<20} {}\n", "ID", "CREATED", "NAME");
    for t in tenants {
        let created = humantime_serde::re::humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.created_ms),
        );
        out.push_str(&format!("{:<32} {:<20} {}\n", t.id, created, t.name));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_escapes_control_characters_so_it_cannot_forge_another() {
        let entry = LogEntry {
            time_ms: 1_764_782_401_123,
            host: "host-a".into(),
            partition: Some(2),
            level: "info".into(),
            message: "first\n2026-12-03T00:00:00.000Z host-a/0 ERROR forged \u{1b}[31m".into(),
        };
        assert_eq!(
            log_line(&entry),
            "2025-12-03T17:20:01.123Z host-a/2 INFO  first\\n2026-12-03T00:00:00.000Z host-a/0 ERROR forged \\u{1b}[31m"
        );
    }
}
