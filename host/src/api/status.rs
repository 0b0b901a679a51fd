//! What a person or a scraper looks at:
//! - `GET /metrics`: Prometheus text; the admin key sees the whole host, a tenant's key only
//!   the series labelled with its tenant (`docs/metrics.md` lists them).
//! - `GET /`: the status page, server-rendered HTML with inline SVG charts (no script), for the
//!   admin (every tenant's pipelines) or a tenant (its own). A browser signs in with a key
//!   through the form at `/` (`POST /login` keeps it in an `HttpOnly`, `SameSite=Strict`
//!   cookie; `POST /logout` forgets it); scripts may send the `Authorization` header instead.
//!
//! The page's charts come from a [`StatusBoard`] that samples every pipeline's merged status
//! every `status_sample_interval` (the reports every host writes, so any host shows the whole
//! picture) and keeps the last [`HISTORY_WINDOW`].

use super::pipelines::{PipelineStatus, merge_status};
use super::problem::{ApiError, ProblemKind};
use super::{ApiState, AuthProblems, Principal};
use crate::catalog::pipelines::Definitions;
use crate::clock::wall_now_ms;
use crate::pipeline::CheckpointRecord;
use crate::telemetry;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

mod html;
use html::*;

/// The content type of Prometheus' text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How far back the page's charts reach.
pub const HISTORY_WINDOW: Duration = Duration::from_secs(600);

/// Most entries per tenant in the page's "recent errors" (one tenant's noisy pipeline cannot
/// push another tenant's errors out).
const ERRORS_PER_TENANT_MAX: usize = 50;

/// Largest sign-in form body, bytes.
const LOGIN_BODY_BYTES_MAX: usize = 16 << 10;

/// The cookie the sign-in form sets.
const KEY_COOKIE: &str = "weir_key";

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

/// A pipeline's figures at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at_ms: u64,
    records_per_s: f64,
    lag: i64,
}

/// What the board knows of one pipeline.
#[derive(Debug)]
struct Tracked {
    status: PipelineStatus,
    samples: VecDeque<Sample>,
    /// Committed checkpoints in the window, by (partition, version).
    checkpoints: BTreeMap<(i32, u64), CheckpointRecord>,
    dead_lettered: u64,
    /// Records done by the current runs at the previous sample.
    records_done: u64,
    reasons: Vec<String>,
}

impl Tracked {
    /// Takes a new sample of its pipeline at `now` (ms since the Unix epoch; the window
    /// starts at `since`): its `status`, the `checkpoints` its hosts report; what is new among
    /// the hosts' reasons and the dead-lettered records goes to `error`.
    fn update(
        &mut self,
        status: PipelineStatus,
        checkpoints: Vec<CheckpointRecord>,
        (now, since): (u64, u64),
        error: &mut impl FnMut(String),
    ) {
        let reasons: Vec<String> = status
            .hosts
            .iter()
            .filter_map(|h| h.reason.as_ref().map(|r| format!("{}: {r}", h.host)))
            .collect();
        for reason in &reasons {
            if !self.reasons.contains(reason) {
                error(reason.clone());
            }
        }
        self.reasons = reasons;
        // The count restarts with a host's run: below the previous sample's, all of it is
        // new.
        let new_dead = if status.dead_lettered >= self.dead_lettered {
            status.dead_lettered - self.dead_lettered
        } else {
            status.dead_lettered
        };
        if new_dead > 0 {
            error(format!(
                "{new_dead} records dead-lettered since the previous sample ({} by the current runs)",
                status.dead_lettered
            ));
        }
        self.dead_lettered = status.dead_lettered;
        // Records done since the previous sample over its interval: a burst between two
        // samples shows (the hosts' own rates are over their last report's interval). A
        // restarted run counts from 0 again: then its count so far.
        let done = status.records_done;
        let records_per_s = match self.samples.back() {
            Some(previous) if now > previous.at_ms => {
                let delta = if done >= self.records_done {
                    done - self.records_done
                } else {
                    done
                };
                delta as f64 * 1000.0 / (now - previous.at_ms) as f64
            }
            _ => status.records_per_s,
        };
        self.records_done = done;
        self.samples.push_back(Sample {
            at_ms: now,
            records_per_s,
            lag: status.partitions.iter().map(|p| p.lag).sum(),
        });
        while self.samples.front().is_some_and(|s| s.at_ms < since) {
            self.samples.pop_front();
        }
        for checkpoint in checkpoints {
            self.checkpoints
                .insert((checkpoint.partition.0, checkpoint.version.0), checkpoint);
        }
        self.checkpoints.retain(|_, c| c.committed_ms >= since);
        self.status = status;
    }
}

/// One line of "recent errors".
#[derive(Debug, Clone)]
struct ErrorEntry {
    at_ms: u64,
    tenant: String,
    pipeline: String,
    message: String,
}

/// The recent history of every pipeline, sampled from the hosts' reports, for the page.
#[derive(Debug, Default)]
pub struct StatusBoard {
    pipelines: Mutex<BTreeMap<(String, String), Tracked>>,
    /// Recent errors by tenant, oldest first.
    errors: Mutex<BTreeMap<String, VecDeque<ErrorEntry>>>,
    /// The definitions, read again when they may have changed.
    definitions: tokio::sync::Mutex<Definitions>,
}

impl StatusBoard {
    /// Takes one sample of every pipeline of every tenant; forgets deleted pipelines.
    ///
    /// # Errors
    /// [`ProblemKind::Unavailable`](crate::api::problem::ProblemKind::Unavailable) when the store cannot be read (nothing changes).
    pub async fn sample(&self, state: &ApiState) -> Result<(), ApiError> {
        let mut seen = Vec::new();
        let records = (self.definitions.lock().await)
            .read(&state.catalog, false)
            .await?
            .to_vec();
        for (tenant, record) in records {
            let reports = state.catalog.host_statuses(&tenant, &record.name).await?;
            let status = merge_status(&record, &reports);
            let checkpoints: Vec<CheckpointRecord> = reports
                .iter()
                .filter(|(r, _)| r.uid == record.uid)
                .flat_map(|(r, _)| r.recent_checkpoints.iter().cloned())
                .collect();
            seen.push((tenant, record.name, status, checkpoints));
        }
        let now = wall_now_ms();
        let since = now.saturating_sub(HISTORY_WINDOW.as_millis() as u64);
        let mut errors = Vec::new();
        let mut pipelines = self.pipelines.lock().expect("board lock");
        pipelines.retain(|key, _| seen.iter().any(|(t, n, ..)| (t, n) == (&key.0, &key.1)));
        for (tenant, name, status, checkpoints) in seen {
            let tracked = pipelines
                .entry((tenant.clone(), name.clone()))
                .or_insert_with(|| Tracked {
                    status: status.clone(),
                    samples: VecDeque::new(),
                    checkpoints: BTreeMap::new(),
                    dead_lettered: status.dead_lettered,
                    records_done: status.records_done,
                    reasons: Vec::new(),
                });
            let mut error = |message: String| {
                errors.push(ErrorEntry {
                    at_ms: now,
                    tenant: tenant.clone(),
                    pipeline: name.clone(),
                    message,
                })
            };
            tracked.update(status, checkpoints, (now, since), &mut error);
        }
        drop(pipelines);
        let mut recent = self.errors.lock().expect("errors lock");
        for entry in errors {
            let mine = recent.entry(entry.tenant.clone()).or_default();
            if mine.len() == ERRORS_PER_TENANT_MAX {
                mine.pop_front();
            }
            mine.push_back(entry);
        }
        Ok(())
    }

    /// Samples every `interval` until the task is dropped.
    pub async fn run(&self, state: ApiState, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(err) = self.sample(&state).await {
                tracing::warn!(error = %crate::error::Chain(&err), "cannot sample the pipelines for the status page");
            }
        }
    }

    /// The page for `principal` at `now_ms`.
    fn render(&self, principal: &Principal, now_ms: u64) -> String {
        let visible = |tenant: &str| match principal {
            Principal::Admin => true,
            Principal::Tenant(t) => t == tenant,
        };
        let who = match principal {
            Principal::Admin => "the admin (every tenant)".to_owned(),
            Principal::Tenant(t) => format!("tenant {}", escape(t)),
        };
        let mut html = String::with_capacity(16 << 10);
        head(&mut html, "Weir status", true);
        let _ = write!(
            html,
            r#"<header><h1>Weir</h1><p>Signed in as <span id="who">{who}</span>.</p><form method="post" action="/logout"><button type="submit">Sign out</button></form></header>"#
        );
        let pipelines = self.pipelines.lock().expect("board lock");
        let shown: Vec<_> = pipelines.iter().filter(|(k, _)| visible(&k.0)).collect();
        pipelines_table(&mut html, &shown, now_ms);
        for ((tenant, name), tracked) in &shown {
            pipeline_section(&mut html, (tenant, name), tracked, now_ms);
        }
        drop(pipelines);
        let errors = self.errors.lock().expect("errors lock");
        let mine: Vec<&ErrorEntry> = errors
            .iter()
            .filter(|(tenant, _)| visible(tenant))
            .flat_map(|(_, entries)| entries.iter())
            .collect();
        errors_section(&mut html, mine, now_ms);
        html.push_str("</section></body></html>");
        html
    }
}

/// The key a page request carries: the `Authorization` header, else the sign-in cookie.
fn page_key(headers: &HeaderMap) -> Option<String> {
    if let Some(key) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(super::bearer_token)
    {
        return Some(key.to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == KEY_COOKIE)
        .and_then(|(_, value)| {
            percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .ok()
                .map(|v| v.into_owned())
        })
}

fn html_response(status: StatusCode, html: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response()
}

/// The sign-in form, with `error` above it.
fn login_page(status: StatusCode, error: Option<&str>) -> Response {
    let mut html = String::new();
    head(&mut html, "Weir — sign in", false);
    html.push_str("<header><h1>Weir</h1></header><main><h2>Sign in</h2>");
    if let Some(error) = error {
        let _ = write!(
            html,
            r#"<p class="error" role="alert">{}</p>"#,
            escape(error)
        );
    }
    html.push_str(r#"<form method="post" action="/login"><label>API key (the admin key, or a tenant's key) <input type="password" name="key" autocomplete="current-password" required></label> <button type="submit">Sign in</button></form></main></body></html>"#);
    html_response(status, html)
}

/// `GET /`: the status page for the key the request carries, or the sign-in form.
pub(super) async fn status_page(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let Some(key) = page_key(&headers) else {
        return login_page(StatusCode::OK, None);
    };
    match state.principal_of(&key).await {
        Ok(principal) => html_response(
            StatusCode::OK,
            state.board.render(&principal, wall_now_ms()),
        ),
        Err(e) if e.is(ProblemKind::Unauthorized) => login_page(
            StatusCode::UNAUTHORIZED,
            Some("That key is not known here."),
        ),
        Err(err) => err.into_response(),
    }
}

/// `POST /login` (form field `key`): checks the key and keeps it in the page's cookie.
pub(super) async fn login(State(state): State<ApiState>, body: Body) -> Response {
    let Ok(bytes) = super::read_body(body, LOGIN_BODY_BYTES_MAX).await else {
        return login_page(StatusCode::PAYLOAD_TOO_LARGE, Some("That key is too long."));
    };
    let key = url::form_urlencoded::parse(&bytes)
        .find(|(name, _)| name == "key")
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default();
    if key.is_empty() {
        return login_page(StatusCode::BAD_REQUEST, Some("Enter an API key."));
    }
    match state.principal_of(&key).await {
        Ok(_) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/".to_owned()),
                (
                    header::SET_COOKIE,
                    // Percent-encoded: any key the API takes (spaces, `;`…) fits in a cookie.
                    format!(
                        "{KEY_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
                        percent_encoding::utf8_percent_encode(
                            &key,
                            percent_encoding::NON_ALPHANUMERIC
                        )
                    ),
                ),
            ],
        )
            .into_response(),
        Err(e) if e.is(ProblemKind::Unauthorized) => login_page(
            StatusCode::UNAUTHORIZED,
            Some("That key is not known here."),
        ),
        Err(err) => err.into_response(),
    }
}

/// `POST /logout`: forgets the page's cookie.
pub(super) async fn logout() -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/".to_owned()),
            (
                header::SET_COOKIE,
                format!("{KEY_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
            ),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::PartitionProgress;

    #[test]
    fn chart_scales_round_up_to_one_two_or_five() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(5.0), 5.0);
        assert_eq!(nice_ceiling(12_000.0), 20_000.0);
        assert_eq!(nice_ceiling(0.07), 0.1);
    }

    #[test]
    fn the_watermark_lag_is_the_lowest_partitions_behind_the_clock() {
        let at = |partition, watermark_ms| PartitionProgress {
            partition,
            watermark_ms,
            ..PartitionProgress::default()
        };
        let now = 1_000_000_000;
        assert_eq!(watermark_lag(&[], now), "—");
        assert_eq!(
            watermark_lag(&[at(crate::ids::Partition(0), None)], now),
            "—"
        );
        let partitions = [
            at(crate::ids::Partition(0), Some(999_990_000)),
            at(crate::ids::Partition(1), Some(999_999_500)),
            at(crate::ids::Partition(2), None),
        ];
        assert_eq!(watermark_lag(&partitions, now), "10 s");
        // A replay of old data: days behind.
        assert_eq!(
            watermark_lag(&[at(crate::ids::Partition(0), Some(0))], now),
            "11 d"
        );
        // A watermark ahead of the clock (records from the future) is no lag.
        assert_eq!(
            watermark_lag(&[at(crate::ids::Partition(0), Some(2_000_000_000))], now),
            "0 ms"
        );
    }

    #[test]
    fn tenant_text_is_escaped() {
        assert_eq!(
            escape(r#"<script>"x" & 'y'</script>"#),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;"
        );
    }

    #[test]
    fn the_page_key_comes_from_the_header_or_the_cookie() {
        let mut headers = HeaderMap::new();
        let cookie = |v: &str| v.parse().expect("header");
        headers.insert(header::COOKIE, cookie("a=1; weir_key=weir_abc"));
        assert_eq!(page_key(&headers).as_deref(), Some("weir_abc"));
        // A key with spaces and `;` travels percent-encoded.
        headers.insert(header::COOKIE, cookie("weir_key=my%20admin%3Bkey"));
        assert_eq!(page_key(&headers).as_deref(), Some("my admin;key"));
        headers.insert(header::AUTHORIZATION, cookie("bearer weir_def"));
        assert_eq!(page_key(&headers).as_deref(), Some("weir_def"));
    }
}
