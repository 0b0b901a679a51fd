//! `GET /v1/pipelines/{name}/state/{state}`: a pipeline's keyed state as of its newest
//! committed checkpoints (or a savepoint), read from the store by whichever host answers
//! ([`crate::checkpoints::query`]): a point read (`key`) or an ordered, paged scan (`prefix`).
//!
//! Which checkpoint: per partition, the newest decided one ([`savepoint::newest_decided`]):
//! at-least-once, the newest checkpoint; exactly-once, the newest one a later version names as
//! its parent (what Kafka's committed offsets name is not read here), so reads there lag one
//! checkpoint. A page token names the version it read per partition and a lease
//! ([`crate::state::lease`]) that keeps every shard's GC off them, renewed by each page for
//! ten minutes and released by the last; every page of a scan reads those versions. A token
//! whose lease lapsed and whose versions GC then collected answers 410: start again.
//!
//! The first page is read before its lease exists: what it reads is the newest decided
//! checkpoint, which GC keeps until three newer ones are decided, far longer than a page.

use super::runs::ShardRun;
use super::savepoints::{found_savepoint, shards_of_run};
use super::{PipelineRecord, existing};
use crate::api::problem::{ApiError, Problem};
use crate::api::{ApiState, AuthProblems, Principal};
use crate::checkpoints::query::{QueryEntry, QueryError};
use crate::checkpoints::savepoint;
use crate::clock::SystemClock;
use crate::ids::{ManifestVersion, Partition};
use crate::state::key;
use crate::state::lease;
use crate::state::manifest::ManifestStore;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, State};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD as B64_URL};
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

mod global;
mod scan;
use scan::Scan;

/// Entries per page by default.
const LIMIT_DEFAULT: usize = 100;
/// Entries per page at most.
const LIMIT_MAX: usize = 1000;
/// How long a scan's lease lasts after each page: the longest pause between two pages.
const LEASE_TTL_MS: u64 = 10 * 60 * 1000;

/// Query of `GET /v1/pipelines/{name}/state/{state}`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StateQuery {
    /// Point read of this record key (UTF-8 text): its value, or a map state's entries.
    pub key: Option<String>,
    /// Point read of this record key, base64 (standard alphabet), for keys that are not text.
    pub key_b64: Option<String>,
    /// Scan the entries whose record key starts with this text (without `key`: every key).
    pub prefix: Option<String>,
    /// The scan's prefix, base64.
    pub prefix_b64: Option<String>,
    /// Entries per page, 1..=1000 (default 100).
    pub limit: Option<u32>,
    /// The `next_page_token` of the previous page: the next page, read at the same
    /// checkpoints.
    pub page_token: Option<String>,
    /// Read this savepoint of the pipeline instead of its newest checkpoints.
    pub savepoint: Option<String>,
    /// The stage whose state to read, in a pipeline of stages (required there; left out of a
    /// one-operator pipeline).
    pub stage: Option<String>,
}

/// One page of a state read.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StatePage {
    /// The state's name.
    pub state: String,
    /// The checkpoint read in each partition (its manifest version); a partition with no
    /// checkpoint yet is not listed.
    pub checkpoints: Vec<ReadCheckpoint>,
    /// The entries, in the order of their encoded keys (record key length, then bytes, then
    /// map key): a value state's one entry per key, a map state's entries. A global table's
    /// rows are in the order of their keys' bytes.
    pub entries: Vec<StateEntry>,
    /// A global table's read (no checkpoint: its newest snapshot): per partition of its
    /// topic, the offsets its rows reflect. Absent for keyed state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub table_offsets: Vec<TableOffset>,
    /// Pass as `page_token` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

/// The checkpoint a read took in one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadCheckpoint {
    /// The input partition.
    pub partition: Partition,
    /// The checkpoint's manifest version (the checkpoint id).
    pub version: ManifestVersion,
}

/// One stored entry.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StateEntry {
    /// The record key, when it is UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The record key, base64, when it is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_b64: Option<String>,
    /// A map state's entry key, when it is text (absent for a value state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_key: Option<String>,
    /// A map state's entry key, base64, when it is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_key_b64: Option<String>,
    /// The value as stored, base64.
    pub value_b64: String,
    /// The value decoded, when it is JSON (what the SDKs' typed states write; a versioned
    /// state's value without its version header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// When it expires (ms since the Unix epoch), for a state with a TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// The partition whose shard holds it; absent for a global table's row (every host holds
    /// the whole table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
}

/// Of a global table's page: the next offset of one partition of its topic that the rows
/// reflect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TableOffset {
    /// The topic's partition.
    pub partition: i32,
    /// The next offset to read in it: every record below is in the rows.
    pub next_offset: i64,
}

/// What a page token carries: the versions read, where the page ended, and of what.
#[derive(Debug, Serialize, Deserialize)]
struct PageToken {
    /// (partition, version) read.
    v: Vec<(Partition, ManifestVersion)>,
    /// The last encoded key returned, base64.
    a: String,
    /// What the token is bound to ([`binding`]).
    q: String,
    /// The savepoint read, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    s: Option<String>,
    /// The lease that keeps GC off the versions read (none for a savepoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    l: Option<String>,
    /// A global table's scan: the ETag of the snapshot its first page read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t: Option<String>,
}

/// Reads pipeline `name`'s state `state`: a point read (`key`) or a scan (`prefix`, or every
/// key), paged, as of each partition's newest committed checkpoint or a savepoint. Timers and
/// the watermark are not queryable (reserved names starting with `!`); entries past their TTL
/// read as absent. A stage's global table (`state` its name) is read from its newest snapshot
/// instead (`table_offsets`; not in savepoints). Tenant-scoped: another tenant's pipeline
/// answers 404.
#[utoipa::path(get, path = "/v1/pipelines/{name}/state/{state}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           ("state" = String, Path, description = "The state's name, as the operator declares it"),
           StateQuery),
    responses(
        (status = 200, description = "One page of entries", body = StatePage),
        (status = 400, description = "A bad query or state name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline or savepoint", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The checkpoint a page token reads was collected, or the global table's snapshot it reads was replaced: start again", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store failed", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn read_state(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath((name, state_name)): UrlPath<(String, String)>,
    query: Result<Query<StateQuery>, QueryRejection>,
) -> Result<Json<StatePage>, ApiError> {
    let tenant = principal.tenant()?.to_owned();
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, &tenant, &name).await?;
    let run = ShardRun::of(&tenant, &record, query.stage.as_deref())?;
    check_state_name(&state_name)?;
    let read = Read::of(&query)?;
    let bound = binding(
        &record,
        (run.stage.as_deref(), &state_name),
        &read,
        query.savepoint.as_deref(),
    );
    let token = query
        .page_token
        .as_deref()
        .map(|text| decode_bound_token(text, &bound))
        .transpose()?;
    let savepoint = query.savepoint.as_deref();
    // A host reads a few pipelines' state at a time: a `memory` checkpoint, and a global
    // table's snapshot, are read whole.
    let _turn = QUERIES
        .acquire()
        .await
        .map_err(|_| ApiError::unavailable("the host is shutting down"))?;
    if let Some(topic) = global::global_table_topic(&tenant, &record, &run, &state_name) {
        let read = global::TableRead::of(state_name, &topic, &read, token, bound)?;
        let page = global::read(&state, &tenant, (&record, &run), read, savepoint).await;
        return page.map(Json);
    }
    declared(&state, &tenant, (&record, &run), &state_name, savepoint).await?;
    let roots = roots(&state, &tenant, (&record, &run), savepoint).await?;
    let scan = Scan {
        state: &state,
        record: &record,
        run: &run,
        read: &read,
        state_name: &state_name,
        savepoint,
        after: token
            .as_ref()
            .map(|t| B64.decode(&t.a))
            .transpose()
            .map_err(|_| ApiError::bad_request("the page token does not decode"))?,
        clock: Arc::new(SystemClock),
        now_ms: crate::clock::Clock::now_ms(&SystemClock),
        leases: leases_of(&state, &tenant, (&record, &run)),
    };
    // The lease a scan that goes on holds (a savepoint needs none).
    let held = token
        .as_ref()
        .filter(|_| savepoint.is_none())
        .and_then(|t| t.l.clone());
    let (checkpoints, (merged, more)) = match &token {
        Some(t) => scan.go_on(t, roots, held.as_deref()).await?,
        None => scan.first(roots).await?,
    };
    let last = merged.last().filter(|_| more).map(|(_, (last, _, _))| last);
    let next_page_token = scan.next_token(&checkpoints, last, held, bound).await?;
    Ok(Json(StatePage {
        state: state_name,
        checkpoints,
        entries: merged.into_iter().map(entry).collect(),
        table_offsets: Vec::new(),
        next_page_token,
    }))
}

/// Reads of state a host serves at a time.
static QUERIES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// What a 410 says.
const GONE: &str = "the checkpoints this scan read were collected (its lease lapsed): start it again without the page token";

/// Per shard (partition, root, version) the version to read: a savepoint's, or the newest
/// decided checkpoint (`committed`: the versions Kafka's committed offsets name, exactly-once,
/// when this host could read them); shards without one are left out.
async fn chosen(
    store: &Arc<dyn object_store::ObjectStore>,
    roots: &[(Partition, Path, Option<ManifestVersion>)],
    committed: &BTreeMap<Partition, ManifestVersion>,
) -> Result<Vec<(Partition, Path, ManifestVersion)>, savepoint::SavepointError> {
    let mut out = Vec::with_capacity(roots.len());
    for (partition, root, fixed) in roots {
        let version = match fixed {
            Some(v) => Some(*v),
            None => savepoint::newest_decided(
                &ManifestStore::new(store.clone(), root.clone()),
                committed.get(partition).copied(),
            )
            .await?
            .map(|m| m.version),
        };
        out.extend(version.map(|v| (*partition, root.clone(), v)));
    }
    Ok(out)
}

fn partitions_of(roots: &[(Partition, Path, Option<ManifestVersion>)]) -> Vec<Partition> {
    roots.iter().map(|(p, _, _)| *p).collect()
}

/// 404 for a state the operator (the running version of the `run`'s, or the savepoint's)
/// does not declare.
async fn declared(
    state: &ApiState,
    tenant: &str,
    (record, run): (&PipelineRecord, &ShardRun),
    state_name: &str,
    savepoint: Option<&str>,
) -> Result<(), ApiError> {
    let (operator, version) = match savepoint {
        Some(sp) => {
            let (_, saved) = found_savepoint(state, tenant, record, sp).await?;
            match saved
                .stages
                .iter()
                .find(|s| Some(&s.name) == run.stage.as_ref())
            {
                Some(stage) => (stage.operator.clone(), stage.operator_version),
                None => (saved.operator, saved.operator_version),
            }
        }
        None => run.operator.clone(),
    };
    match state.catalog.version(tenant, &operator, version).await? {
        Some(v) if !v.states.iter().any(|s| s.name == state_name) => Err(ApiError::not_found(
            format!("version {version} of operator `{operator}` declares no state `{state_name}`"),
        )),
        // Declared; or the version was deleted: nothing to check against.
        _ => Ok(()),
    }
}

/// What a page token is bound to: the pipeline (its uid), the stage, the state, the read and
/// the savepoint, hashed; a token is refused for any other read.
fn binding(
    record: &PipelineRecord,
    (stage, state_name): (Option<&str>, &str),
    read: &Read,
    savepoint: Option<&str>,
) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for part in [
        record.uid.as_bytes(),
        state_name.as_bytes(),
        savepoint.unwrap_or("").as_bytes(),
    ]
    .into_iter()
    // (A one-operator pipeline's tokens stay what they were.)
    .chain(stage.map(str::as_bytes))
    {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    match &read.kind {
        ReadKind::Key(k) => {
            h.update(b"k");
            h.update(k);
        }
        ReadKind::Prefix(p) => {
            h.update(b"p");
            h.update(p);
        }
    }
    hex::encode(&h.finalize()[..8])
}

/// A lease id as this host makes them: 16 lowercase hex digits.
fn valid_lease_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// 503 for a store error, its details (paths) in the log, not the answer.
fn unavailable(pipeline: &str, e: &(dyn std::error::Error + 'static)) -> ApiError {
    tracing::warn!(%pipeline, error = %crate::error::Chain(e), "state query: the store failed");
    ApiError::unavailable("the pipeline's state could not be read; try again")
}

/// What a request asks for.
struct Read {
    kind: ReadKind,
    limit: usize,
}

#[derive(Clone)]
enum ReadKind {
    /// Every entry of one record key (a value, or a map's entries).
    Key(Vec<u8>),
    /// Every entry whose record key starts with these bytes.
    Prefix(Vec<u8>),
}

impl Read {
    fn of(query: &StateQuery) -> Result<Self, ApiError> {
        let bytes = |text: &Option<String>, b64: &Option<String>, what: &str| match (text, b64) {
            (Some(_), Some(_)) => Err(ApiError::bad_request(format!(
                "give `{what}` or `{what}_b64`, not both"
            ))),
            (Some(t), None) => Ok(Some(t.as_bytes().to_vec())),
            (None, Some(b)) => decode_b64(b)
                .map(Some)
                .ok_or_else(|| ApiError::bad_request(format!("`{what}_b64` is not base64"))),
            (None, None) => Ok(None),
        };
        let record_key = bytes(&query.key, &query.key_b64, "key")?;
        let prefix = bytes(&query.prefix, &query.prefix_b64, "prefix")?;
        let limit = match query.limit {
            None => LIMIT_DEFAULT,
            Some(n) if (1..=LIMIT_MAX).contains(&(n as usize)) => n as usize,
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "`limit` is {n}; it must be 1..={LIMIT_MAX}"
                )));
            }
        };
        let kind = match (record_key, prefix) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "a read is of one `key` or of a `prefix`, not both",
                ));
            }
            (Some(k), None) => ReadKind::Key(k),
            (None, p) => ReadKind::Prefix(p.unwrap_or_default()),
        };
        Ok(Self { kind, limit })
    }
}

/// A state name as operators declare them: 1..=64 bytes, not a reserved one (`!…`: timers).
fn check_state_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > 64 {
        return Err(ApiError::bad_request(format!(
            "a state name is 1..=64 bytes; `{name}` is {}",
            name.len()
        )));
    }
    if name.starts_with('!') {
        return Err(ApiError::bad_request(format!(
            "`{name}` is reserved (timers and the watermark are not queryable; the export has them)"
        )));
    }
    Ok(())
}

/// The shards to read, each (partition, root, the version to read when fixed — a savepoint's).
async fn roots(
    state: &ApiState,
    tenant: &str,
    (record, run): (&PipelineRecord, &ShardRun),
    savepoint: Option<&str>,
) -> Result<Vec<(Partition, Path, Option<ManifestVersion>)>, ApiError> {
    match savepoint {
        None => Ok(shards_of_run(state, tenant, record, run)
            .await?
            .into_iter()
            .map(|(p, root)| (p, root, None))
            .collect()),
        Some(name) => {
            let (dir, saved) = found_savepoint(state, tenant, record, name).await?;
            // A pipeline of stages' savepoint: the stage's shards.
            let (dir, shards) = match &run.stage {
                Some(stage) => (
                    dir.stage(stage),
                    saved
                        .stages
                        .iter()
                        .find(|s| &s.name == stage)
                        .map(|s| s.shards.clone())
                        .unwrap_or_default(),
                ),
                None => (dir, saved.shards),
            };
            Ok(shards
                .iter()
                .map(|s| (s.partition, dir.shard(s.partition), Some(s.version)))
                .collect())
        }
    }
}

/// Where the read leases of the `run`'s shards live: where their GC looks for them.
fn leases_of(state: &ApiState, tenant: &str, (record, run): (&PipelineRecord, &ShardRun)) -> Path {
    let shard = crate::state::ShardId {
        pipeline: run.shards.clone(),
        partition: Partition(0),
    }
    .root_under(&state.catalog.pipeline_state_prefix(tenant, &record.uid));
    lease::leases_of_shard(&shard)
        .map(|(dir, _)| dir)
        .expect("a shard root is `…/shards/{partition}`")
}

fn query_error(pipeline: &str, e: QueryError) -> ApiError {
    match e {
        QueryError::Gone { .. } => ApiError::gone(GONE.to_owned()),
        QueryError::NotCheckpoint { .. } => {
            ApiError::bad_request(format!("the page token names {e}"))
        }
        QueryError::State(e) => unavailable(pipeline, &e),
    }
}

/// Base64 in either alphabet, padded or not.
fn decode_b64(text: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE};
    [&B64, &STANDARD_NO_PAD, &URL_SAFE, &B64_URL]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
}

fn encode_token(token: &PageToken) -> String {
    B64_URL.encode(serde_json::to_vec(token).expect("plain fields serialise"))
}

fn decode_token(text: &str) -> Result<PageToken, ApiError> {
    B64_URL
        .decode(text)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| ApiError::bad_request("the page token does not decode"))
}

/// The page token `text`, which must be bound to this read (`bound`: [`binding`]) and name a
/// lease as this host makes them.
fn decode_bound_token(text: &str, bound: &str) -> Result<PageToken, ApiError> {
    let token = decode_token(text)?;
    if token.q != bound {
        return Err(ApiError::bad_request(
            "the page token is of another read (pipeline, state, key or prefix, savepoint)"
                .to_owned(),
        ));
    }
    if token.l.as_deref().is_some_and(|id| !valid_lease_id(id)) {
        return Err(ApiError::bad_request("the page token does not decode"));
    }
    Ok(token)
}

/// Text when `bytes` are UTF-8, else base64: (text, base64).
fn text_or_b64(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(_) => (None, Some(B64.encode(bytes))),
    }
}

fn entry((partition, (encoded, value, expires_at_ms)): (Partition, QueryEntry)) -> StateEntry {
    let (record_key, map_key) = match key::decode(&encoded) {
        Some((k, _, m)) => (k, m),
        None => (&encoded[..], &[][..]),
    };
    let (key, key_b64) = text_or_b64(record_key);
    let (map_key, map_key_b64) = if map_key.is_empty() {
        (None, None)
    } else {
        text_or_b64(map_key)
    };
    StateEntry {
        key,
        key_b64,
        map_key,
        map_key_b64,
        value_b64: B64.encode(&value),
        value: crate::checkpoints::query::json_of(&value),
        expires_at_ms,
        partition: Some(partition),
    }
}

#[cfg(test)]
mod tests;
