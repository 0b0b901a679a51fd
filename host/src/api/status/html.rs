//! The status page's HTML: the pipelines' table, each pipeline's charts (inline SVG, no
//! script), the recent errors; every text from a tenant escaped.

use super::{ErrorEntry, HISTORY_WINDOW, Tracked};
use crate::api::pipelines::PipelineState;
use crate::pipeline::PartitionProgress;
use std::fmt::Write as _;

/// The table of the `shown` pipelines, one row each.
pub(super) fn pipelines_table(
    html: &mut String,
    shown: &[(&(String, String), &Tracked)],
    now_ms: u64,
) {
    html.push_str(r#"<section id="pipelines"><h2>Pipelines</h2>"#);
    if shown.is_empty() {
        html.push_str(r#"<p class="empty">No pipelines yet.</p>"#);
    } else {
        html.push_str("<table><thead><tr><th>tenant</th><th>pipeline</th><th>state</th><th>records/s</th><th>lag (records)</th><th>last checkpoint</th><th>state size</th><th>cache hit rate</th><th>dead-lettered</th><th>watermark lag</th></tr></thead><tbody>");
        for ((tenant, name), tracked) in shown {
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
}

/// A pipeline's section: its charts over the history window (or what there is of it, at
/// least a minute), and its failure's reason.
pub(super) fn pipeline_section(
    html: &mut String,
    (tenant, name): (&str, &str),
    tracked: &Tracked,
    now_ms: u64,
) {
    let window_ms = HISTORY_WINDOW.as_millis() as u64;
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
    chart(html, "throughput", "records/s", &throughput, from, now_ms);
    chart(html, "lag", "lag, records", &lag, from, now_ms);
    chart(
        html,
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

/// The recent errors of the tenants shown (`mine`), newest first.
pub(super) fn errors_section(html: &mut String, mut mine: Vec<&ErrorEntry>, now_ms: u64) {
    html.push_str(r#"<section id="errors"><h2>Recent errors</h2>"#);
    mine.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
    if mine.is_empty() {
        html.push_str(r#"<p class="empty">None in this host's memory.</p>"#);
    } else {
        html.push_str(
            "<table><thead><tr><th>when</th><th>pipeline</th><th>error</th></tr></thead><tbody>",
        );
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
}

/// Writes `<!doctype html>…<body>`; `refresh` reloads the page every 5 s.
pub(super) fn head(html: &mut String, title: &str, refresh: bool) {
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
pub(super) fn chart(
    html: &mut String,
    id: &str,
    caption: &str,
    points: &[(u64, f64)],
    from: u64,
    to: u64,
) {
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
pub(super) fn nice_ceiling(v: f64) -> f64 {
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

pub(super) fn number(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

pub(super) fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

pub(super) fn age(ms: u64) -> String {
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
pub(super) fn watermark_lag(partitions: &[PartitionProgress], now_ms: u64) -> String {
    match partitions.iter().filter_map(|p| p.watermark_ms).min() {
        Some(w) => {
            let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
            age(u64::try_from(now.saturating_sub(w)).unwrap_or(0))
        }
        None => "—".to_owned(),
    }
}

pub(super) fn state_name(state: PipelineState) -> &'static str {
    match state {
        PipelineState::Starting => "starting",
        PipelineState::Running => "running",
        PipelineState::Failed => "failed",
        PipelineState::Stopping => "stopping",
        PipelineState::Stopped => "stopped",
    }
}

/// `text` with `&`, `<`, `>`, `"` and `'` escaped for HTML text and attribute values.
pub(super) fn escape(text: &str) -> String {
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
