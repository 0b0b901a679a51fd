//! Tenants' operator logs. A pipeline's partitions run on several hosts that share only object
//! storage, so each host writes its operators' log lines (past the per-partition rate limit)
//! as small JSON-lines segments under the pipeline's log directory
//! ([`crate::catalog::logs`]), and any host
//! serves them: `GET /v1/pipelines/{name}/logs`, newest lines last, `?follow` streaming new
//! ones as they are written (as `kubectl logs -f` across a Deployment's pods).
//!
//! Layout under the catalog prefix (beside [`crate::catalog::pipelines`]'s):
//! `tenants/{tenant}/logs/{pipeline uid}/{host}/{written ms:013}-{seq:010}.jsonl`, one
//! [`LogEntry`] a line. A segment's name is the time it was written, so it holds no line newer
//! than its name and each host's names sort in writing order; a reader following the log lists
//! each host's directory after the last name it read. Segments go after the retention period,
//! or when their host's budget is full ([`OperatorLogSettings`]), and with the pipeline.

use crate::catalog::logs::{
    FETCHES_IN_FLIGHT, HostDirs, LogEntry, SegmentName, host_dirs, read_segments,
};
#[cfg(test)]
use crate::catalog::logs::{OperatorLogSettings, SegmentWriter, sweep_expired};
use crate::clock::wall_now_ms;

use super::problem::{ApiError, Problem};
use super::{ApiState, AuthProblems, Principal};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use object_store::path::Path;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use utoipa::IntoParams;

/// Lines returned without `tail`.
const TAIL_DEFAULT: usize = 1000;

/// Most lines one request returns before following.
const TAIL_MAX: usize = 10_000;

/// How often `?follow` looks for new segments.
const FOLLOW_POLL: Duration = Duration::from_millis(500);

/// Polls of `?follow` between checks that the pipeline still exists.
const FOLLOW_POLLS_PER_CHECK: u32 = 20;

/// Most `?follow` streams one tenant keeps open on one host; more answer 429.
pub const FOLLOWS_PER_TENANT_MAX: usize = 8;

/// How far behind its cursor a follower lists each host's directory again, ms: a segment
/// whose write took longer than another's named after it (two runs of a pipeline on one host
/// while one drains) is still found, once.
const FOLLOW_RELIST_MS: u64 = 30_000;

/// Where a follower has read to: segments named before `floor_ms` are never new; each host's
/// newest segment read, by its name's time; the segments read whose names are recent enough to
/// be listed again.
#[derive(Debug, Default)]
struct Cursors {
    floor_ms: u64,
    last_ms: BTreeMap<String, u64>,
    seen: std::collections::BTreeSet<Path>,
}

/// The time in a segment path's name.
fn name_ms(path: &Path) -> Option<u64> {
    path.filename()
        .and_then(SegmentName::parse)
        .map(|name| name.time_ms)
}

/// How far back a tail read first looks, then looks again, ms: the newest segments are found by
/// listing each host's directory from that time on (object stores list in ascending order
/// only), so a chatty pipeline's day of segments is not listed to print its last lines.
const TAIL_LOOK_BACK_MS: [u64; 2] = [10 * 60_000, 6 * 3_600_000];

/// The last `tail` lines under `dir` logged at or after `since_ms`, oldest first, and where
/// they end.
async fn recent(
    store: &dyn ObjectStore,
    dir: &Path,
    since_ms: u64,
    tail: usize,
) -> object_store::Result<(Vec<LogEntry<'static>>, Cursors)> {
    let hosts = host_dirs(store, dir).await?;
    let now = wall_now_ms();
    let mut starts: Vec<u64> = TAIL_LOOK_BACK_MS
        .iter()
        .map(|back| now.saturating_sub(*back))
        .filter(|start| *start > since_ms)
        .collect();
    starts.push(since_ms);
    for (attempt, start) in starts.iter().enumerate() {
        let (entries, cursors) = recent_from(store, &hosts, *start, since_ms, tail).await?;
        if entries.len() >= tail || attempt + 1 == starts.len() {
            return Ok((entries, cursors));
        }
    }
    unreachable!("the last start returns")
}

/// [`recent`] over the segments of `hosts` written at or after `start_ms`.
async fn recent_from(
    store: &dyn ObjectStore,
    hosts: &HostDirs,
    start_ms: u64,
    since_ms: u64,
    tail: usize,
) -> object_store::Result<(Vec<LogEntry<'static>>, Cursors)> {
    let mut segments = Vec::new();
    let mut cursors = Cursors {
        floor_ms: start_ms,
        ..Cursors::default()
    };
    for (host, host_dir) in hosts {
        // Before every segment written at or after `start_ms` (a prefix of their names).
        let offset = host_dir.clone().join(format!("{start_ms:013}"));
        let listed: Vec<_> = store
            .list_with_offset(Some(host_dir), &offset)
            .try_collect()
            .await?;
        let mut last_ms = start_ms;
        for meta in listed {
            let Some(name) = meta.location.filename().and_then(SegmentName::parse) else {
                continue;
            };
            last_ms = last_ms.max(name.time_ms);
            cursors.seen.insert(meta.location.clone());
            segments.push((meta.location, name));
        }
        cursors.last_ms.insert(host.clone(), last_ms);
    }
    // The newest segments until there are `tail` lines, then read in writing order, so that
    // lines of one time keep the order they were logged in.
    segments.sort_by_key(|(_, name)| std::cmp::Reverse(*name));
    let mut batches = Vec::new();
    let mut lines = 0;
    for batch in segments.chunks(FETCHES_IN_FLIGHT) {
        if lines >= tail {
            break;
        }
        let paths: Vec<Path> = batch.iter().rev().map(|s| s.0.clone()).collect();
        let read = read_segments(store, paths).await?;
        lines += read.len();
        batches.push(read);
    }
    let mut entries: Vec<_> = batches.into_iter().rev().flatten().collect();
    entries.retain(|e| e.time_ms >= since_ms);
    entries.sort_by_key(|e| e.time_ms);
    let skip = entries.len().saturating_sub(tail);
    entries.drain(..skip);
    Ok((entries, cursors))
}

/// The lines written under `dir` after `cursors`, oldest first; moves the cursors past them.
/// Each host's directory is listed from [`FOLLOW_RELIST_MS`] before its newest segment read,
/// skipping the segments already read.
async fn newer(
    store: &dyn ObjectStore,
    dir: &Path,
    cursors: &mut Cursors,
) -> object_store::Result<Vec<LogEntry<'static>>> {
    let mut paths = Vec::new();
    for (host, host_dir) in host_dirs(store, dir).await? {
        let from_ms = cursors.last_ms.get(&host).map_or(cursors.floor_ms, |last| {
            last.saturating_sub(FOLLOW_RELIST_MS).max(cursors.floor_ms)
        });
        let offset = host_dir.clone().join(format!("{from_ms:013}"));
        let listed: Vec<_> = store
            .list_with_offset(Some(&host_dir), &offset)
            .try_collect()
            .await?;
        let mut last_ms = cursors.last_ms.get(&host).copied().unwrap_or(from_ms);
        for meta in listed {
            let Some(time_ms) = name_ms(&meta.location) else {
                continue;
            };
            if cursors.seen.insert(meta.location.clone()) {
                last_ms = last_ms.max(time_ms);
                paths.push(meta.location);
            }
        }
        cursors.last_ms.insert(host, last_ms);
    }
    // What no host's next listing reaches need not be remembered.
    if let Some(relisted_from) = cursors
        .last_ms
        .values()
        .map(|last| last.saturating_sub(FOLLOW_RELIST_MS))
        .min()
    {
        cursors
            .seen
            .retain(|p| name_ms(p).is_some_and(|t| t >= relisted_from));
    }
    paths.sort_by_key(|p| p.filename().and_then(SegmentName::parse));
    let mut entries = read_segments(store, paths).await?;
    entries.sort_by_key(|e| e.time_ms);
    Ok(entries)
}

/// `entries` as JSON lines.
fn json_lines(entries: &[LogEntry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in entries {
        if serde_json::to_writer(&mut out, entry).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// Query of `GET /v1/pipelines/{name}/logs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// The last this many lines (default 1000, at most 10,000); 0 with `follow` for new lines
    /// only.
    pub tail: Option<usize>,
    /// Only lines logged at or after this time, ms since the Unix epoch.
    pub since_ms: Option<u64>,
    /// Keep the response open and stream lines as hosts write them (within about a second):
    /// `?follow`, `?follow=true`.
    #[param(value_type = Option<bool>)]
    pub follow: Option<String>,
}

/// Reads the operator's log lines of pipeline `name` from every host that runs or ran it, as
/// JSON lines ([`LogEntry`]), oldest first; with `?follow`, then streams new ones.
#[utoipa::path(get, path = "/v1/pipelines/{name}/logs", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           LogsQuery),
    responses(
        (status = 200, description = "One log line a line, oldest first", body = LogEntry, content_type = "application/x-ndjson"),
        (status = 400, description = "A bad query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many `?follow` streams of the tenant open on this host", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(super) async fn pipeline_logs(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    query: Result<Query<LogsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let tenant = principal.tenant()?.to_owned();
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    tracing::Span::current().record("pipeline", name.as_str());
    let follow = match query.follow.as_deref() {
        None | Some("false" | "0") => false,
        Some("" | "true" | "1") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "follow must be true or false, not `{other}`"
            )));
        }
    };
    let tail = query.tail.unwrap_or(TAIL_DEFAULT).min(TAIL_MAX);
    let record = super::pipelines::existing(&state, &tenant, &name).await?;
    let catalog = state.catalog.clone();
    let dir = catalog.pipeline_logs_prefix(&tenant, &record.uid);
    let (entries, cursors) =
        recent(&**catalog.store(), &dir, query.since_ms.unwrap_or(0), tail).await?;
    let first = json_lines(&entries);
    let ndjson = [(header::CONTENT_TYPE, "application/x-ndjson")];
    if !follow {
        return Ok((ndjson, first).into_response());
    }
    let slot = state.follows.take(&tenant).ok_or_else(|| {
        ApiError::too_many_requests(format!(
            "you have {FOLLOWS_PER_TENANT_MAX} log streams open on this host, the most it allows; close one first"
        ))
    })?;
    let follower = Follower {
        catalog,
        tenant,
        name,
        uid: record.uid,
        dir,
        cursors,
        polls: 0,
        shutting_down: state.shutting_down.subscribe(),
        _slot: slot,
    };
    let rest = futures::stream::unfold(follower, |mut f| async move {
        let chunk = f.next_chunk().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), f))
    });
    let body = futures::stream::once(async move { Ok(first) }).chain(rest);
    Ok((ndjson, Body::from_stream(body)).into_response())
}

/// The open `?follow` streams of each tenant on this host.
#[derive(Debug, Clone, Default)]
pub(super) struct Follows(Arc<Mutex<HashMap<String, usize>>>);

/// One open `?follow` stream of a tenant: counted until dropped.
struct FollowSlot {
    follows: Follows,
    tenant: String,
}

impl Follows {
    /// A slot for one more stream of `tenant`, unless it has [`FOLLOWS_PER_TENANT_MAX`].
    fn take(&self, tenant: &str) -> Option<FollowSlot> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(tenant.to_owned()).or_default();
        if *count >= FOLLOWS_PER_TENANT_MAX {
            return None;
        }
        *count += 1;
        Some(FollowSlot {
            follows: self.clone(),
            tenant: tenant.to_owned(),
        })
    }
}

impl Drop for FollowSlot {
    fn drop(&mut self) {
        let mut open = self.follows.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

/// A `?follow` response's reader.
struct Follower {
    catalog: crate::catalog::Catalog,
    tenant: String,
    name: String,
    uid: String,
    dir: Path,
    cursors: Cursors,
    polls: u32,
    /// Ends the stream when the host shuts down.
    shutting_down: tokio::sync::watch::Receiver<bool>,
    /// Counts the stream against its tenant's open streams while it lives.
    _slot: FollowSlot,
}

impl Follower {
    /// The next lines, waiting for them; `None` once the pipeline is gone (deleted, or
    /// replaced by a new one of its name) or the host shuts down.
    async fn next_chunk(&mut self) -> Option<Vec<u8>> {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
                _ = self.shutting_down.wait_for(|down| *down) => return None,
            }
            self.polls += 1;
            if self.polls.is_multiple_of(FOLLOW_POLLS_PER_CHECK) {
                match self.catalog.pipeline(&self.tenant, &self.name).await {
                    Ok(Some(record)) if record.uid == self.uid => {}
                    Ok(_) => return None,
                    Err(_) => {}
                }
            }
            match newer(&**self.catalog.store(), &self.dir, &mut self.cursors).await {
                Ok(entries) if !entries.is_empty() => return Some(json_lines(&entries)),
                Ok(_) => {}
                Err(err) => {
                    tracing::debug!(dir = %self.dir, error = %err, "cannot read new log segments; trying again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
