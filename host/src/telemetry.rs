//! Prometheus metrics: the process's recorder, and the labelled handles of one pipeline run.
//!
//! Every metric is named, with its unit and labels, in `docs/metrics.md`. A pipeline run's
//! series carry `tenant` and `pipeline` labels (`weir run` and `weir dev` use an empty tenant);
//! its handles are registered once, when the run starts, so the per-batch cost is an atomic
//! add, never a registry lookup. Histograms are exported as Prometheus histograms (buckets,
//! not client-side quantiles) so that hosts can be summed.

use crate::config::LateRecords;
use crate::ids::Partition;
use crate::pipeline::ports::DeadLetterKind;
use metrics::{Counter, Gauge, Histogram, Label};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::Duration;

/// Buckets of every `*_seconds` histogram: 100 µs to 60 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// Buckets of every `*_bytes` histogram: 1 KiB to 1 GiB, by 4×.
const BYTES_BUCKETS: &[f64] = &[
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
    268_435_456.0,
    1_073_741_824.0,
];

/// The host-wide counters without labels (docs/metrics.md, "Per host").
const HOST_COUNTERS: &[&str] = &[
    "weir_checkpoint_fallbacks_total",
    "weir_lsm_flushes_total",
    "weir_lsm_compactions_total",
    "weir_lsm_write_stall_micros_total",
    "weir_guest_log_lines_dropped_total",
];

/// The process's Prometheus recorder, installed as the global `metrics` recorder on first use.
/// When another recorder was installed first (a test harness), the handle renders a recorder
/// that nothing records into: an empty page, not a panic.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = || {
            PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_bytes".into()), BYTES_BUCKETS)
                })
                .expect("bucket lists are non-empty")
            // No idle timeout: a run holds its handles, and a series dropped while idle (a
            // quiet pipeline) would never come back for that run.
        };
        match builder().install_recorder() {
            Ok(handle) => {
                // Host-wide counters exist from the start at 0, so that their first increment
                // shows in `increase()` (an alert on the first checkpoint fallback fires).
                for name in HOST_COUNTERS {
                    metrics::counter!(*name).increment(0);
                }
                for (label, value) in [("direction", "read"), ("direction", "written")] {
                    metrics::counter!("weir_lsm_compaction_bytes_total", label => value).increment(0);
                }
                for (label, value) in [("kind", "sst"), ("kind", "manifest")] {
                    metrics::counter!("weir_lsm_gc_deleted_total", label => value).increment(0);
                }
                handle
            }
            Err(err) => {
                tracing::warn!(error = %err, "another metrics recorder is installed; /metrics will be empty");
                builder().build_recorder().handle()
            }
        }
    })
}

/// Runs the recorder's upkeep (drains histogram samples, drops idle series) every 5 s, as
/// `metrics-exporter-prometheus` asks of a recorder installed without its HTTP listener.
pub fn spawn_upkeep() -> tokio::task::JoinHandle<()> {
    let handle = prometheus();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    })
}

/// Keeps, of a Prometheus text page, the samples whose `label` is `value` and the `# HELP` /
/// `# TYPE` lines of the families that keep a sample: what a tenant may see of the host's page.
pub fn filter_by_label(page: &str, label: &str, value: &str) -> String {
    let wanted = format!("{label}=\"{}\"", escape_label_value(value));
    let mut out = String::new();
    let mut header = String::new();
    for line in page.lines() {
        if line.starts_with('#') {
            // A family's header comes before its samples; keep it only if one of them is kept.
            if line.starts_with("# HELP") || line.starts_with("# TYPE") {
                if !header.is_empty() && !header_family_matches(&header, line) {
                    header.clear();
                }
                header.push_str(line);
                header.push('\n');
            }
            continue;
        }
        let labels = line
            .find('{')
            .and_then(|start| line[start..].find('}').map(|end| &line[start..start + end]));
        if labels.is_some_and(|l| label_set_has(l, &wanted)) {
            out.push_str(&header);
            header.clear();
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether `header` (lines already gathered) belongs to the family `line` describes.
fn header_family_matches(header: &str, line: &str) -> bool {
    let family = |l: &str| l.split_whitespace().nth(2).map(str::to_owned);
    header.lines().next().and_then(family) == family(line)
}

/// Whether the `{…}` label set (without its closing brace) holds exactly `pair`.
fn label_set_has(labels: &str, pair: &str) -> bool {
    let inner = labels.trim_start_matches('{');
    // Label values are escaped, so `",` only ends a pair: split on it.
    inner
        .split("\",")
        .map(|p| p.trim_end_matches('"'))
        .any(|p| format!("{p}\"") == pair)
}

/// A label value escaped as in the text format (`\`, `"` and newline).
fn escape_label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The handles of one pipeline run's labelled series (`tenant`, `pipeline`). `Default` gives
/// handles that record nothing (unit tests, benchmarks that read [`crate::pipeline::PipelineStats`]).
#[derive(Debug, Clone)]
pub struct RunMetrics {
    labels: Vec<Label>,
    /// `weir_records_in_total`: records admitted by the partitions' workers.
    pub records_in: Counter,
    /// `weir_records_out_total`: records emitted to the output topic.
    pub records_out: Counter,
    /// `weir_records_dead_lettered_total{kind}`: records sent to the dead-letter topic, one
    /// series per [`DeadLetterKind`] (index [`DeadLetterKind::index`]).
    dead_lettered: [Counter; DeadLetterKind::ALL.len()],
    /// `weir_batch_processing_seconds`: from the start of a batch's attempt (instance,
    /// prefetch, call) until its effects are applied and its emits handed to the producer.
    pub batch_processing: Histogram,
    /// `weir_state_get_seconds`: one batch's prefetch of its keys' declared states (a
    /// multi-get through memtable, caches and object store).
    pub state_get: Histogram,
    /// `weir_state_put_seconds`: applying one batch's state writes to the shard.
    pub state_put: Histogram,
    /// `weir_checkpoint_duration_seconds`: one committed checkpoint of one shard.
    pub checkpoint_duration: Histogram,
    /// `weir_checkpoint_uploaded_bytes`: bytes one committed checkpoint uploaded.
    pub checkpoint_bytes: Histogram,
    /// `weir_recovery_duration_seconds`: opening a shard until its first processed record.
    pub recovery: Histogram,
    /// `weir_timers_fired_total`: timers whose `on-timers` call ended (applied, rejected or
    /// failed).
    pub timers_fired: Counter,
    /// `weir_late_records_total{policy}`: records behind the watermark, one series per
    /// [`LateRecords`] (index [`LateRecords::index`]).
    late_records: [Counter; LateRecords::ALL.len()],
    /// `weir_edge_repeats_dropped_total`: records of an edge dropped as repeats of what their
    /// upstream shard sent before a frontier it marked (`crate::time::edge`).
    pub edge_repeats: Counter,
}

impl Default for RunMetrics {
    fn default() -> Self {
        Self {
            labels: Vec::new(),
            records_in: Counter::noop(),
            records_out: Counter::noop(),
            dead_lettered: std::array::from_fn(|_| Counter::noop()),
            batch_processing: Histogram::noop(),
            state_get: Histogram::noop(),
            state_put: Histogram::noop(),
            checkpoint_duration: Histogram::noop(),
            checkpoint_bytes: Histogram::noop(),
            recovery: Histogram::noop(),
            timers_fired: Counter::noop(),
            late_records: std::array::from_fn(|_| Counter::noop()),
            edge_repeats: Counter::noop(),
        }
    }
}

impl RunMetrics {
    /// Registers the series of pipeline `pipeline` of `tenant` (empty for `weir run`).
    pub fn new(tenant: &str, pipeline: &str) -> Self {
        Self::with_labels(vec![
            Label::new("tenant", tenant.to_owned()),
            Label::new("pipeline", pipeline.to_owned()),
        ])
    }

    /// Registers the series of stage `stage` of pipeline `pipeline` of `tenant`: the
    /// pipeline's labels and `stage` (docs/topologies.md).
    pub fn for_stage(tenant: &str, pipeline: &str, stage: &str) -> Self {
        Self::with_labels(vec![
            Label::new("tenant", tenant.to_owned()),
            Label::new("pipeline", pipeline.to_owned()),
            Label::new("stage", stage.to_owned()),
        ])
    }

    fn with_labels(labels: Vec<Label>) -> Self {
        let l = || labels.clone();
        Self {
            records_in: metrics::counter!("weir_records_in_total", l()),
            records_out: metrics::counter!("weir_records_out_total", l()),
            dead_lettered: DeadLetterKind::ALL.map(|kind| {
                let mut labels = l();
                labels.push(Label::new("kind", kind.as_str()));
                metrics::counter!("weir_records_dead_lettered_total", labels)
            }),
            batch_processing: metrics::histogram!("weir_batch_processing_seconds", l()),
            state_get: metrics::histogram!("weir_state_get_seconds", l()),
            state_put: metrics::histogram!("weir_state_put_seconds", l()),
            checkpoint_duration: metrics::histogram!("weir_checkpoint_duration_seconds", l()),
            checkpoint_bytes: metrics::histogram!("weir_checkpoint_uploaded_bytes", l()),
            recovery: metrics::histogram!("weir_recovery_duration_seconds", l()),
            timers_fired: metrics::counter!("weir_timers_fired_total", l()),
            late_records: LateRecords::ALL.map(|policy| {
                let mut labels = l();
                labels.push(Label::new("policy", policy.as_str()));
                metrics::counter!("weir_late_records_total", labels)
            }),
            edge_repeats: metrics::counter!("weir_edge_repeats_dropped_total", l()),
            labels,
        }
    }

    /// `weir_records_dead_lettered_total{kind}` of `kind`.
    pub fn dead_lettered(&self, kind: DeadLetterKind) -> &Counter {
        &self.dead_lettered[kind.index()]
    }

    /// `weir_late_records_total{policy}` of `policy`.
    pub fn late_records(&self, policy: LateRecords) -> &Counter {
        &self.late_records[policy.index()]
    }

    /// `weir_watermark_lag_seconds{partition}`: how far `partition`'s applied event-time
    /// watermark is behind the host's clock, set when it moves and at each checkpoint.
    /// Registered on use.
    pub fn watermark_lag(&self, partition: Partition) -> Gauge {
        if self.labels.is_empty() {
            return Gauge::noop();
        }
        let mut labels = self.labels.clone();
        labels.push(Label::new("partition", partition.to_string()));
        metrics::gauge!("weir_watermark_lag_seconds", labels)
    }

    /// `weir_timers_pending{partition}`: timers set in `partition`'s shard and not fired or
    /// cleared, set at each timer round and checkpoint. Registered on use.
    pub fn timers_pending(&self, partition: Partition) -> Gauge {
        if self.labels.is_empty() {
            return Gauge::noop();
        }
        let mut labels = self.labels.clone();
        labels.push(Label::new("partition", partition.to_string()));
        metrics::gauge!("weir_timers_pending", labels)
    }

    /// The run's labels (`tenant`, `pipeline`, and `stage` for a stage's run).
    pub fn labels(&self) -> &[Label] {
        &self.labels
    }

    /// `weir_consumer_lag_records{partition}`: records of `partition` behind the high
    /// watermarks from the checkpointed offsets (summed over input topics). Registered on
    /// use: it changes about once a second.
    pub fn consumer_lag(&self, partition: Partition) -> Gauge {
        if self.labels.is_empty() {
            return Gauge::noop();
        }
        let mut labels = self.labels.clone();
        labels.push(Label::new("partition", partition.to_string()));
        metrics::gauge!("weir_consumer_lag_records", labels)
    }

    /// A counter of this run named `name` with the run's labels and `extra` ones (the object
    /// store's and caches' counters).
    pub fn counter(&self, name: &'static str, extra: &[(&'static str, &'static str)]) -> Counter {
        if self.labels.is_empty() {
            return Counter::noop();
        }
        let mut labels = self.labels.clone();
        labels.extend(extra.iter().map(|(k, v)| Label::new(*k, *v)));
        metrics::counter!(name, labels)
    }
}

/// A log line budget: lets at most `lines_per_second_max` lines through per second and
/// counts the ones it holds back, so that a storm of failures (every record of a topic
/// trapping) logs a bounded number of lines while metrics count every one.
#[derive(Debug)]
pub struct LogBudget {
    lines_per_second_max: u32,
    /// (window start, lines let through in it, lines held back since the last one let
    /// through).
    window: std::sync::Mutex<(Option<std::time::Instant>, u32, u64)>,
}

impl LogBudget {
    /// A budget of `lines_per_second_max` lines per second.
    pub fn new(lines_per_second_max: u32) -> Self {
        Self {
            lines_per_second_max,
            window: std::sync::Mutex::new((None, 0, 0)),
        }
    }

    /// Whether a line may be written now: `Some(n)` with the `n` lines held back since the
    /// last one let through (for the line to say so), or `None` to hold this one back.
    pub fn admit(&self) -> Option<u64> {
        let now = crate::clock::monotonic_now();
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let (start, used, held) = &mut *window;
        if start.is_none_or(|s| now.duration_since(s) >= std::time::Duration::from_secs(1)) {
            *start = Some(now);
            *used = 0;
        }
        if *used >= self.lines_per_second_max {
            *held += 1;
            return None;
        }
        *used += 1;
        Some(std::mem::take(held))
    }
}

impl Default for LogBudget {
    /// 10 lines per second.
    fn default() -> Self {
        Self::new(10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP weir_records_in_total records in\n\
# TYPE weir_records_in_total counter\n\
weir_records_in_total{tenant=\"acme\",pipeline=\"a\"} 5\n\
weir_records_in_total{tenant=\"acme-2\",pipeline=\"b\"} 7\n\
# TYPE weir_records_out_total counter\n\
weir_records_out_total{tenant=\"other\",pipeline=\"acme\"} 1\n\
# TYPE weir_lsm_flushes_total counter\n\
weir_lsm_flushes_total 3\n\
# TYPE weir_state_get_seconds histogram\n\
weir_state_get_seconds_bucket{tenant=\"acme\",pipeline=\"a\",le=\"0.001\"} 2\n\
weir_state_get_seconds_count{tenant=\"acme\",pipeline=\"a\"} 2\n";

    #[test]
    fn a_tenant_sees_only_its_own_series_with_their_headers() {
        let page = filter_by_label(PAGE, "tenant", "acme");
        assert_eq!(
            page,
            "# HELP weir_records_in_total records in\n\
# TYPE weir_records_in_total counter\n\
weir_records_in_total{tenant=\"acme\",pipeline=\"a\"} 5\n\
# TYPE weir_state_get_seconds histogram\n\
weir_state_get_seconds_bucket{tenant=\"acme\",pipeline=\"a\",le=\"0.001\"} 2\n\
weir_state_get_seconds_count{tenant=\"acme\",pipeline=\"a\"} 2\n"
        );
    }

    #[test]
    fn a_label_value_that_is_another_tenants_prefix_or_pipeline_does_not_match() {
        assert_eq!(filter_by_label(PAGE, "tenant", "acm"), "");
        assert!(!filter_by_label(PAGE, "tenant", "other").contains("acme-2"));
    }

    #[test]
    fn a_log_budget_lets_its_lines_per_second_through_and_counts_the_rest() {
        let budget = LogBudget::new(3);
        let admitted: Vec<Option<u64>> = (0..5).map(|_| budget.admit()).collect();
        assert_eq!(admitted, vec![Some(0), Some(0), Some(0), None, None]);
        // The next window's first line says how many were held back.
        budget.window.lock().expect("lock").0 =
            Some(crate::clock::monotonic_now() - std::time::Duration::from_secs(2));
        assert_eq!(budget.admit(), Some(2));
    }

    #[test]
    fn run_metrics_without_labels_record_nothing_and_do_not_register() {
        let metrics = RunMetrics::default();
        metrics.records_in.increment(1);
        metrics.consumer_lag(Partition(3)).set(1.0);
        assert!(metrics.labels().is_empty());
    }
}
