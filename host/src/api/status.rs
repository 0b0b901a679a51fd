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

use super::pipelines::{PipelineState, PipelineStatus, merge_status};
use super::problem::ApiError;
use super::{ApiState, AuthProblems, Principal, now_ms};
use crate::pipeline::{CheckpointRecord, PartitionProgress};
use crate::telemetry;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

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
}

impl StatusBoard {
    /// Takes one sample of every pipeline of every tenant; forgets deleted pipelines.
    ///
    /// # Errors
    /// [`ApiError::Unavailable`] when the store cannot be read (nothing changes).
    pub async fn sample(&self, state: &ApiState) -> Result<(), ApiError> {
        let mut seen = Vec::new();
        for (tenant, record) in state.catalog.all_pipelines().await? {
            let reports = state.catalog.host_statuses(&tenant, &record.name).await?;
            let status = merge_status(&record, &reports);
            let checkpoints: Vec<CheckpointRecord> = reports
                .iter()
                .filter(|(r, _)| r.uid == record.uid)
                .flat_map(|(r, _)| r.recent_checkpoints.iter().cloned())
                .collect();
            seen.push((tenant, record.name, status, checkpoints));
        }
        let now = now_ms();
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
            let reasons: Vec<String> = status
                .hosts
                .iter()
                .filter_map(|h| h.reason.as_ref().map(|r| format!("{}: {r}", h.host)))
                .collect();
            for reason in &reasons {
                if !tracked.reasons.contains(reason) {
                    error(reason.clone());
                }
            }
            tracked.reasons = reasons;
            // The count restarts with a host's run: below the previous sample's, all of it is
            // new.
            let new_dead = if status.dead_lettered >= tracked.dead_lettered {
                status.dead_lettered - tracked.dead_lettered
            } else {
                status.dead_lettered
            };
            if new_dead > 0 {
                error(format!(
                    "{new_dead} records dead-lettered since the previous sample ({} by the current runs)",
                    status.dead_lettered
                ));
            }
            tracked.dead_lettered = status.dead_lettered;
            // Records done since the previous sample over its interval: a burst between two
            // samples shows (the hosts' own rates are over their last report's interval). A
            // restarted run counts from 0 again: then its count so far.
            let done = status.records_done;
            let records_per_s = match tracked.samples.back() {
                Some(previous) if now > previous.at_ms => {
                    let delta = if done >= tracked.records_done {
                        done - tracked.records_done
                    } else {
                        done
                    };
                    delta as f64 * 1000.0 / (now - previous.at_ms) as f64
                }
                _ => status.records_per_s,
            };
            tracked.records_done = done;
            tracked.samples.push_back(Sample {
                at_ms: now,
                records_per_s,
                lag: status.partitions.iter().map(|p| p.lag).sum(),
            });
            while tracked.samples.front().is_some_and(|s| s.at_ms < since) {
                tracked.samples.pop_front();
            }
            for checkpoint in checkpoints {
                tracked
                    .checkpoints
                    .insert((checkpoint.partition, checkpoint.version), checkpoint);
            }
            tracked.checkpoints.retain(|_, c| c.committed_ms >= since);
            tracked.status = status;
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
                tracing::warn!(error = %err, "cannot sample the pipelines for the status page");
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
        html.push_str(r#"<section id="pipelines"><h2>Pipelines</h2>"#);
        if shown.is_empty() {
            html.push_str(r#"<p class="empty">No pipelines yet.</p>"#);
        } else {
            html.push_str("<table><thead><tr><th>tenant</th><th>pipeline</th><th>state</th><th>records/s</th><th>lag (records)</th><th>last checkpoint</th><th>state size</th><th>cache hit rate</th><th>dead-lettered</th><th>watermark lag</th></tr></thead><tbody>");
            for ((tenant, name), tracked) in &shown {
                let s = &tracked.status;
                let lag: i64 = s.partitions.iter().map(|p| p.lag).sum();
                let checkpoint = s.last_checkpoint.as_ref().map_or("—".to_owned(), |c| {
                    format!(
                        "{} ms, {} ago",
                        c.duration_ms,
                        age(now_ms.saturating_sub(c.committed_ms))
                    )
                });
                let hit_rate = s
                    .cache_hit_rate
                    .map_or("—".to_owned(), |r| format!("{:.1} %", r * 100.0));
                let _ = write!(
                    html,
                    r##"<tr data-pipeline="{t}/{n}"><td>{t}</td><td><a href="#p-{t}-{n}">{n}</a></td><td class="state {state}">{state}</td><td class="num">{rps:.0}</td><td class="num">{lag}</td><td>{checkpoint}</td><td class="num">{bytes}</td><td class="num">{hit_rate}</td><td class="num">{dead}</td><td class="num">{watermark_lag}</td></tr>"##,
                    t = escape(tenant),
                    n = escape(name),
                    state = state_name(s.state),
                    rps = s.records_per_s,
                    bytes = size(s.state_bytes),
                    dead = s.dead_lettered,
                    watermark_lag = watermark_lag(&s.partitions, now_ms),
                );
            }
            html.push_str("</tbody></table>");
        }
        html.push_str("</section>");
        let window_ms = HISTORY_WINDOW.as_millis() as u64;
        for ((tenant, name), tracked) in &shown {
            let _ = write!(
                html,
                r#"<section class="pipeline" id="p-{t}-{n}" data-pipeline="{t}/{n}"><h2>{t} / {n}</h2><div class="charts">"#,
                t = escape(tenant),
                n = escape(name),
            );
            let throughput: Vec<(u64, f64)> = tracked
                .samples
                .iter()
                .map(|s| (s.at_ms, s.records_per_s))
                .collect();
            let lag: Vec<(u64, f64)> = tracked
                .samples
                .iter()
                .map(|s| (s.at_ms, s.lag as f64))
                .collect();
            let checkpoints: Vec<(u64, f64)> = {
                let mut points: Vec<(u64, f64)> = tracked
                    .checkpoints
                    .values()
                    .map(|c| (c.committed_ms, c.duration_ms as f64))
                    .collect();
                points.sort_by_key(|p| p.0);
                points
            };
            // The window, or the history there is when it is shorter (a new host), but at
            // least a minute.
            let first = throughput
                .first()
                .into_iter()
                .chain(checkpoints.first())
                .map(|p| p.0)
                .min()
                .unwrap_or(now_ms);
            let from = now_ms
                .saturating_sub(window_ms)
                .max(first.min(now_ms.saturating_sub(60_000)));
            chart(
                &mut html,
                "throughput",
                "records/s",
                &throughput,
                from,
                now_ms,
            );
            chart(&mut html, "lag", "lag, records", &lag, from, now_ms);
            chart(
                &mut html,
                "checkpoints",
                "checkpoint duration, ms",
                &checkpoints,
                from,
                now_ms,
            );
            html.push_str("</div>");
            if let Some(reason) = &tracked.status.reason {
                let _ = write!(html, r#"<p class="reason">{}</p>"#, escape(reason));
            }
            html.push_str("</section>");
        }
        drop(pipelines);
        html.push_str(r#"<section id="errors"><h2>Recent errors</h2>"#);
        let errors = self.errors.lock().expect("errors lock");
        let mut mine: Vec<&ErrorEntry> = errors
            .iter()
            .filter(|(tenant, _)| visible(tenant))
            .flat_map(|(_, entries)| entries.iter())
            .collect();
        mine.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
        if mine.is_empty() {
            html.push_str(r#"<p class="empty">None in this host's memory.</p>"#);
        } else {
            html.push_str("<table><thead><tr><th>when</th><th>pipeline</th><th>error</th></tr></thead><tbody>");
            for e in mine {
                let _ = write!(
                    html,
                    "<tr><td>{} ago</td><td>{}/{}</td><td>{}</td></tr>",
                    age(now_ms.saturating_sub(e.at_ms)),
                    escape(&e.tenant),
                    escape(&e.pipeline),
                    escape(&e.message)
                );
            }
            html.push_str("</tbody></table>");
        }
        html.push_str("</section></body></html>");
        html
    }
}

/// Writes `<!doctype html>…<body>`; `refresh` reloads the page every 5 s.
fn head(html: &mut String, title: &str, refresh: bool) {
    let refresh = if refresh {
        r#"<meta http-equiv="refresh" content="5">"#
    } else {
        ""
    };
    let _ = write!(
        html,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">{refresh}<title>{title}</title><style>{STYLE}</style></head><body>"#
    );
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5rem;color:#1d2330;background:#fafbfc}\
header{display:flex;gap:1rem;align-items:baseline}h1{margin:0}header form{margin-left:auto}\
table{border-collapse:collapse;background:#fff;margin:.5rem 0}th,td{padding:.3rem .6rem;border-bottom:1px solid #e3e6ea;text-align:left}\
td.num{text-align:right;font-variant-numeric:tabular-nums}.state.running{color:#11772d}.state.failed{color:#b3261e;font-weight:600}\
.state.starting,.state.stopping{color:#8a5a00}.charts{display:flex;flex-wrap:wrap;gap:1rem}\
figure{margin:0;background:#fff;border:1px solid #e3e6ea;padding:.4rem}figcaption{font-size:12px;color:#56606e}\
svg polyline{fill:none;stroke:#2a62c9;stroke-width:1.5}svg circle{fill:#2a62c9}svg line{stroke:#c9ced6}\
.reason{color:#b3261e}.error{color:#b3261e}.empty{color:#56606e}";

/// An inline SVG line chart of `points` (ms since the epoch, value) over `from..=to`.
fn chart(html: &mut String, id: &str, caption: &str, points: &[(u64, f64)], from: u64, to: u64) {
    const W: f64 = 320.0;
    const H: f64 = 90.0;
    let top = points.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let scale = nice_ceiling(top);
    let span = (to - from).max(1) as f64;
    let xy = |(at, v): (u64, f64)| {
        let x = (at.saturating_sub(from) as f64 / span * W).clamp(0.0, W);
        let y = H - (v / scale * H).clamp(0.0, H);
        (x, y)
    };
    let mut svg_points = String::new();
    for &p in points {
        let (x, y) = xy(p);
        let _ = write!(svg_points, "{x:.1},{y:.1} ");
    }
    let latest = points
        .last()
        .map_or("no data yet".to_owned(), |p| format!("now {}", number(p.1)));
    let _ = write!(
        html,
        r#"<figure data-chart="{id}" data-points="{n}" data-max="{top}"><svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{caption}"><line x1="0" y1="{H}" x2="{W}" y2="{H}"/><line x1="0" y1="0" x2="{W}" y2="0"/><polyline points="{svg_points}"/>"#,
        n = points.len(),
    );
    if let Some(&last) = points.last() {
        let (x, y) = xy(last);
        let _ = write!(html, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5"/>"#);
    }
    let _ = write!(
        html,
        r#"</svg><figcaption>{caption} — last {}; top line {}; {latest}</figcaption></figure>"#,
        age(to - from),
        number(scale),
    );
}

/// The smallest 1, 2 or 5 × 10ⁿ at or above `v` (1 for nothing).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * magnitude)
}

fn number(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn age(ms: u64) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms < 120_000 => format!("{} s", ms / 1_000),
        ms if ms < 7_200_000 => format!("{} min", ms / 60_000),
        ms if ms < 172_800_000 => format!("{} h", ms / 3_600_000),
        ms => format!("{} d", ms / 86_400_000),
    }
}

/// How far the pipeline's event time is behind the clock at `now_ms`: the lowest watermark
/// of its partitions (the one holding windows back), or "—" when it has none (no event-time
/// timers, or nothing read yet).
fn watermark_lag(partitions: &[PartitionProgress], now_ms: u64) -> String {
    match partitions.iter().filter_map(|p| p.watermark_ms).min() {
        Some(w) => {
            let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
            age(u64::try_from(now.saturating_sub(w)).unwrap_or(0))
        }
        None => "—".to_owned(),
    }
}

fn state_name(state: PipelineState) -> &'static str {
    match state {
        PipelineState::Starting => "starting",
        PipelineState::Running => "running",
        PipelineState::Failed => "failed",
        PipelineState::Stopping => "stopping",
        PipelineState::Stopped => "stopped",
    }
}

/// `text` with `&`, `<`, `>`, `"` and `'` escaped for HTML text and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
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
        Ok(principal) => html_response(StatusCode::OK, state.board.render(&principal, now_ms())),
        Err(ApiError::Unauthorized(_)) => login_page(
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
        Err(ApiError::Unauthorized(_)) => login_page(
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
        assert_eq!(watermark_lag(&[at(0, None)], now), "—");
        let partitions = [
            at(0, Some(999_990_000)),
            at(1, Some(999_999_500)),
            at(2, None),
        ];
        assert_eq!(watermark_lag(&partitions, now), "10 s");
        // A replay of old data: days behind.
        assert_eq!(watermark_lag(&[at(0, Some(0))], now), "11 d");
        // A watermark ahead of the clock (records from the future) is no lag.
        assert_eq!(watermark_lag(&[at(0, Some(2_000_000_000))], now), "0 ms");
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
