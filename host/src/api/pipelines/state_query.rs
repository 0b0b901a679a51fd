//! `GET /v1/pipelines/{name}/state/{state}`: a pipeline's keyed state as of its newest
//! committed checkpoints (or a savepoint), read from the store by whichever host answers
//! ([`crate::state::query`]): a point read (`key`) or an ordered, paged scan (`prefix`).
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

use super::savepoints::{found_savepoint, shards_of};
use super::{PipelineRecord, existing};
use crate::api::problem::{ApiError, Problem};
use crate::api::{ApiState, AuthProblems, Principal};
use crate::clock::{SharedClock, SystemClock};
use crate::state::key;
use crate::state::lease::{self, Lease};
use crate::state::manifest::ManifestStore;
use crate::state::query::{QueryEntry, QueryError, QueryShard, merge_pages};
use crate::state::savepoint;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, State};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD as B64_URL};
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

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
    /// map key): a value state's one entry per key, a map state's entries.
    pub entries: Vec<StateEntry>,
    /// Pass as `page_token` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

/// The checkpoint a read took in one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadCheckpoint {
    /// The input partition.
    pub partition: i32,
    /// The checkpoint's manifest version (the checkpoint id).
    pub version: u64,
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
    /// The value decoded, when it is JSON (what the SDKs' typed states write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// When it expires (ms since the Unix epoch), for a state with a TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// The partition whose shard holds it.
    pub partition: i32,
}

/// What a page token carries: the versions read, where the page ended, and of what.
#[derive(Debug, Serialize, Deserialize)]
struct PageToken {
    /// (partition, version) read.
    v: Vec<(i32, u64)>,
    /// The last encoded key returned, base64.
    a: String,
    /// The savepoint read, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    s: Option<String>,
    /// The lease that keeps GC off the versions read (none for a savepoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    l: Option<String>,
}

/// Reads pipeline `name`'s state `state`: a point read (`key`) or a scan (`prefix`, or every
/// key), paged, as of each partition's newest committed checkpoint or a savepoint. Timers and
/// the watermark are not queryable (reserved names starting with `!`); entries past their TTL
/// read as absent. Tenant-scoped: another tenant's pipeline answers 404.
#[utoipa::path(get, path = "/v1/pipelines/{name}/state/{state}", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           ("state" = String, Path, description = "The state's name, as the operator declares it"),
           StateQuery),
    responses(
        (status = 200, description = "One page of entries", body = StatePage),
        (status = 400, description = "A bad query or state name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline or savepoint", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The checkpoint a page token reads was collected: start again", body = Problem, content_type = "application/problem+json"),
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
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, &tenant, &name).await?;
    check_state_name(&state_name)?;
    let read = Read::of(&query)?;
    let token = query.page_token.as_deref().map(decode_token).transpose()?;
    if let Some(t) = &token
        && t.s != query.savepoint
    {
        return Err(ApiError::BadRequest(
            "the page token is of another savepoint (or of none)".to_owned(),
        ));
    }
    let roots = roots(&state, &tenant, &record, query.savepoint.as_deref()).await?;
    let clock: SharedClock = Arc::new(SystemClock);
    let store = state.catalog.store();
    let leases = leases_of(&state, &tenant, &record);
    if let Some(PageToken { v, l: Some(id), .. }) = &token {
        // Renewed before this page reads: GC passes from now on keep the versions.
        let renewed = Lease {
            versions: v.iter().copied().collect(),
            expires_at_ms: clock.now_ms().saturating_add(LEASE_TTL_MS),
        };
        lease::put(store, &leases, id, &renewed)
            .await
            .map_err(|e| ApiError::Unavailable(crate::error::Chain(&e).to_string()))?;
    }
    let mut shards = Vec::with_capacity(roots.len());
    for (partition, root, version) in roots {
        let version = match &token {
            // The token's versions; a partition it does not name had no checkpoint then.
            Some(t) => match t.v.iter().find(|(p, _)| *p == partition) {
                Some((_, v)) => *v,
                None => continue,
            },
            None => match version {
                Some(v) => v,
                None => match savepoint::newest_decided(
                    &ManifestStore::new(store.clone(), root.clone()),
                    None,
                )
                .await
                .map_err(|e| ApiError::Unavailable(crate::error::Chain(&e).to_string()))?
                {
                    Some(m) => m.version,
                    None => continue,
                },
            },
        };
        let opened = QueryShard::open(
            store,
            (&root, partition),
            version,
            &state.query_caches,
            &clock,
        )
        .await
        .map_err(query_error)?;
        shards.push(opened);
    }
    let after = token
        .as_ref()
        .map(|t| B64.decode(&t.a))
        .transpose()
        .map_err(|_| ApiError::BadRequest("the page token does not decode".to_owned()))?;
    let now_ms = clock.now_ms();
    let mut pages = Vec::with_capacity(shards.len());
    for shard in &shards {
        let page = match &read.kind {
            ReadKind::Key(record_key) => {
                let mut prefix = Vec::new();
                key::encode_prefix(&mut prefix, record_key, &state_name);
                shard
                    .scan(&prefix, after.as_deref(), read.limit + 1, now_ms)
                    .await
            }
            ReadKind::Prefix(key_prefix) => {
                shard
                    .scan_state(
                        &state_name,
                        key_prefix,
                        after.as_deref(),
                        read.limit + 1,
                        now_ms,
                    )
                    .await
            }
        }
        .map_err(|e| query_error(QueryError::State(e)))?;
        pages.push((shard.partition, page));
    }
    let (merged, more) = merge_pages(pages, read.limit);
    let checkpoints: Vec<ReadCheckpoint> = shards
        .iter()
        .map(|s| ReadCheckpoint {
            partition: s.partition,
            version: s.version,
        })
        .collect();
    let versions: Vec<(i32, u64)> = checkpoints
        .iter()
        .map(|c| (c.partition, c.version))
        .collect();
    let held = token.as_ref().and_then(|t| t.l.clone());
    let next_page_token = match merged.last().filter(|_| more) {
        Some((_, (last, _, _))) => {
            // A scan that goes on holds a lease on what it reads (a savepoint needs none).
            let lease_id = match (&held, &query.savepoint) {
                (Some(id), _) => Some(id.clone()),
                (None, Some(_)) => None,
                (None, None) => {
                    let id = format!("{:016x}", rand::random::<u64>());
                    let taken = Lease {
                        versions: versions.iter().copied().collect(),
                        expires_at_ms: now_ms.saturating_add(LEASE_TTL_MS),
                    };
                    lease::put(store, &leases, &id, &taken)
                        .await
                        .map_err(|e| ApiError::Unavailable(crate::error::Chain(&e).to_string()))?;
                    Some(id)
                }
            };
            Some(encode_token(&PageToken {
                v: versions,
                a: B64.encode(last),
                s: query.savepoint.clone(),
                l: lease_id,
            }))
        }
        None => {
            // The last page: its lease is no longer needed (one left behind expires).
            if let Some(id) = &held
                && let Err(e) = lease::release(store, &leases, id).await
            {
                tracing::warn!(error = %e, "cannot release a state query's lease; it expires");
            }
            None
        }
    };
    Ok(Json(StatePage {
        state: state_name,
        checkpoints,
        entries: merged.into_iter().map(entry).collect(),
        next_page_token,
    }))
}

/// What a request asks for.
struct Read {
    kind: ReadKind,
    limit: usize,
}

enum ReadKind {
    /// Every entry of one record key (a value, or a map's entries).
    Key(Vec<u8>),
    /// Every entry whose record key starts with these bytes.
    Prefix(Vec<u8>),
}

impl Read {
    fn of(query: &StateQuery) -> Result<Self, ApiError> {
        let bytes = |text: &Option<String>, b64: &Option<String>, what: &str| match (text, b64) {
            (Some(_), Some(_)) => Err(ApiError::BadRequest(format!(
                "give `{what}` or `{what}_b64`, not both"
            ))),
            (Some(t), None) => Ok(Some(t.as_bytes().to_vec())),
            (None, Some(b)) => B64.decode(b).map(Some).map_err(|_| {
                ApiError::BadRequest(format!("`{what}_b64` is not base64 (standard alphabet)"))
            }),
            (None, None) => Ok(None),
        };
        let record_key = bytes(&query.key, &query.key_b64, "key")?;
        let prefix = bytes(&query.prefix, &query.prefix_b64, "prefix")?;
        let limit = match query.limit {
            None => LIMIT_DEFAULT,
            Some(n) if (1..=LIMIT_MAX).contains(&(n as usize)) => n as usize,
            Some(n) => {
                return Err(ApiError::BadRequest(format!(
                    "`limit` is {n}; it must be 1..={LIMIT_MAX}"
                )));
            }
        };
        let kind = match (record_key, prefix) {
            (Some(_), Some(_)) => {
                return Err(ApiError::BadRequest(
                    "a read is of one `key` or of a `prefix`, not both".to_owned(),
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
        return Err(ApiError::BadRequest(format!(
            "a state name is 1..=64 bytes; `{name}` is {}",
            name.len()
        )));
    }
    if name.starts_with('!') {
        return Err(ApiError::BadRequest(format!(
            "`{name}` is reserved (timers and the watermark are not queryable; the export has them)"
        )));
    }
    Ok(())
}

/// The shards to read, each (partition, root, the version to read when fixed — a savepoint's).
async fn roots(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    savepoint: Option<&str>,
) -> Result<Vec<(i32, Path, Option<u64>)>, ApiError> {
    match savepoint {
        None => Ok(shards_of(state, tenant, record)
            .await?
            .into_iter()
            .map(|(p, root)| (p, root, None))
            .collect()),
        Some(name) => {
            let (dir, saved) = found_savepoint(state, tenant, record, name).await?;
            Ok(saved
                .shards
                .iter()
                .map(|s| (s.partition, dir.shard(s.partition), Some(s.version)))
                .collect())
        }
    }
}

/// Where the pipeline's read leases live: where its shards' GC looks for them.
fn leases_of(state: &ApiState, tenant: &str, record: &PipelineRecord) -> Path {
    let shard = crate::state::ShardId {
        pipeline: format!("{tenant}.{}", record.name),
        partition: 0,
    }
    .root_under(&state.catalog.pipeline_state_prefix(tenant, &record.uid));
    lease::leases_of_shard(&shard)
        .map(|(dir, _)| dir)
        .expect("a shard root is `…/shards/{partition}`")
}

fn query_error(e: QueryError) -> ApiError {
    match e {
        QueryError::Gone { .. } => ApiError::Gone(format!(
            "{e}: the checkpoints this scan read were collected; start it again without the page token"
        )),
        QueryError::State(e) => ApiError::Unavailable(crate::error::Chain(&e).to_string()),
    }
}

fn encode_token(token: &PageToken) -> String {
    B64_URL.encode(serde_json::to_vec(token).expect("plain fields serialise"))
}

fn decode_token(text: &str) -> Result<PageToken, ApiError> {
    B64_URL
        .decode(text)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| ApiError::BadRequest("the page token does not decode".to_owned()))
}

/// Text when `bytes` are UTF-8, else base64: (text, base64).
fn text_or_b64(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(_) => (None, Some(B64.encode(bytes))),
    }
}

fn entry((partition, (encoded, value, expires_at_ms)): (i32, QueryEntry)) -> StateEntry {
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
        value: serde_json::from_slice(&value).ok(),
        expires_at_ms,
        partition,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_round_trips_and_garbage_is_a_bad_request() {
        let token = PageToken {
            v: vec![(0, 12), (1, 9)],
            a: B64.encode(b"\0\0\0\x02k1\x05count"),
            s: Some("sp".to_owned()),
            l: Some("00ff".to_owned()),
        };
        let back = decode_token(&encode_token(&token)).expect("decodes");
        assert_eq!(
            (back.v, back.a, back.s, back.l),
            (token.v, token.a, token.s, token.l)
        );
        assert!(matches!(
            decode_token("not a token"),
            Err(ApiError::BadRequest(_))
        ));
    }

    #[test]
    fn a_read_is_of_a_key_or_a_prefix_within_the_limits() {
        let q = |key: Option<&str>, prefix: Option<&str>, limit: Option<u32>| StateQuery {
            key: key.map(str::to_owned),
            prefix: prefix.map(str::to_owned),
            limit,
            ..StateQuery::default()
        };
        assert!(matches!(
            Read::of(&q(Some("k"), None, None)),
            Ok(Read { kind: ReadKind::Key(k), limit: 100 }) if k == b"k"
        ));
        assert!(matches!(
            Read::of(&q(None, None, Some(1000))),
            Ok(Read { kind: ReadKind::Prefix(p), limit: 1000 }) if p.is_empty()
        ));
        assert!(Read::of(&q(Some("k"), Some("p"), None)).is_err());
        assert!(Read::of(&q(None, None, Some(0))).is_err());
        assert!(Read::of(&q(None, None, Some(1001))).is_err());
        let bad_b64 = StateQuery {
            key_b64: Some("%%".to_owned()),
            ..StateQuery::default()
        };
        assert!(Read::of(&bad_b64).is_err());
        assert!(check_state_name("!timers").is_err());
        assert!(check_state_name("").is_err());
        assert!(check_state_name("count").is_ok());
    }
}
