//! `weir bench`'s report: the ratios between runs and the table.

use super::{Backend, BenchRun, Implementation, Workload};
use serde::{Deserialize, Serialize};

/// One ratio of events/s between two runs of the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ratio {
    /// What is compared, e.g. `wasm / native, counter on memory`.
    pub what: String,
    /// The first run's events/s over the second's.
    pub ratio: f64,
}

/// The Wasm/native and Python/Wasm ratios (same workload and backend) and the memory/lsm
/// ratios (same workload and implementation) of events/s.
pub fn ratios(runs: &[BenchRun]) -> Vec<Ratio> {
    let name = |w: Workload| format!("{w:?}").to_lowercase();
    let mut out = Vec::new();
    let pairs = [
        (
            Implementation::Wasm,
            Implementation::Native,
            "wasm / native",
        ),
        (
            Implementation::Python,
            Implementation::Wasm,
            "python / wasm",
        ),
    ];
    for (top, bottom, label) in pairs {
        for r in runs.iter().filter(|r| r.implementation == top) {
            if let Some(other) = runs.iter().find(|n| {
                n.workload == r.workload
                    && n.implementation == bottom
                    && n.backend == r.backend
                    && n.trap_rate == r.trap_rate
            }) {
                out.push(Ratio {
                    what: format!("{label}, {} on {}", name(r.workload), r.backend),
                    ratio: r.events_per_s / other.events_per_s.max(1e-9),
                });
            }
        }
    }
    for r in runs.iter().filter(|r| r.backend == Backend::Memory) {
        for lsm in runs.iter().filter(|l| {
            l.workload == r.workload
                && l.implementation == r.implementation
                && l.trap_rate == r.trap_rate
                && matches!(l.backend, Backend::Lsm { .. })
        }) {
            out.push(Ratio {
                what: format!(
                    "memory / {}, {} {}",
                    lsm.backend,
                    name(r.workload),
                    format!("{:?}", r.implementation).to_lowercase()
                ),
                ratio: r.events_per_s / lsm.events_per_s.max(1e-9),
            });
        }
    }
    for r in runs.iter().filter(|r| r.trap_rate > 0.0) {
        if let Some(clean) = runs.iter().find(|c| {
            c.workload == r.workload
                && c.implementation == r.implementation
                && c.backend == r.backend
                && c.trap_rate == 0.0
        }) {
            out.push(Ratio {
                what: format!(
                    "{} % traps / none, {} {} on {}",
                    r.trap_rate * 100.0,
                    name(r.workload),
                    format!("{:?}", r.implementation).to_lowercase(),
                    r.backend
                ),
                ratio: r.events_per_s / clean.events_per_s.max(1e-9),
            });
        }
    }
    out
}

/// The runs as a table, then their [`ratios`]. With repeats, events/s is the median and the
/// range follows it; `*` marks a run too short to measure from its first processed event.
pub fn table(runs: &[BenchRun]) -> String {
    let mut out = format!(
        "{:<9} {:<6} {:<12} {:>6} {:>8} {:>10} {:>17} {:>8} {:>7} {:>7} {:>6} {:>8} {:>8} {:>9} {:>10}\n",
        "workload",
        "impl",
        "backend",
        "traps",
        "events",
        "events/s",
        "range",
        "call ns",
        "p50 ms",
        "p99 ms",
        "ckpts",
        "ckpt p50",
        "ckpt max",
        "req/ckpt",
        "$/month"
    );
    for r in runs {
        let range = if r.repeats > 1 {
            format!(
                "{:.0}–{:.0} ×{}",
                r.events_per_s_min, r.events_per_s_max, r.repeats
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{:<9} {:<6} {:<12} {:>6} {:>8} {:>9.0}{} {:>17} {:>8.0} {:>7.1} {:>7.1} {:>6} {:>8.0} {:>8.0} {:>9.1} {:>10.2}\n",
            format!("{:?}", r.workload).to_lowercase(),
            format!("{:?}", r.implementation).to_lowercase(),
            r.backend.to_string(),
            format!("{}%", r.trap_rate * 100.0),
            r.events,
            r.events_per_s,
            if r.includes_start { '*' } else { ' ' },
            range,
            r.call_ns_per_event,
            r.latency_p50_ms,
            r.latency_p99_ms,
            r.checkpoints,
            r.checkpoint_p50_ms,
            r.checkpoint_max_ms,
            r.requests_per_checkpoint,
            r.request_cost_per_month_usd
        ));
    }
    if runs.iter().any(|r| r.includes_start) {
        out.push_str("* too few events to measure from the first one processed: counted from the pipeline's start (group join included); use more --events\n");
    }
    out.push('\n');
    for ratio in ratios(runs) {
        out.push_str(&format!("{}: {:.2}\n", ratio.what, ratio.ratio));
    }
    out
}
