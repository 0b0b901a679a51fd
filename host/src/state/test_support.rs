//! Test support shared by the state layer's unit tests.

/// Runs `f` to completion on a fresh current-thread runtime with timers and I/O enabled.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
        .block_on(f)
}

/// What [`observed`] saw: the `audit = true` log lines and the metrics recorded.
#[derive(Debug, Default)]
pub struct Observed {
    /// Each audit line's fields, as `name=value` pairs joined by spaces.
    pub audit_lines: Vec<String>,
    /// The metrics, in the Prometheus text format.
    pub metrics: String,
}

impl Observed {
    /// The value of the unlabelled counter `name`, 0 when it was never recorded.
    pub fn counter(&self, name: &str) -> f64 {
        self.metrics
            .lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    }
}

/// Runs `f` on this thread with a log collector and a metrics recorder of its own (`f` must not
/// move its work to other threads: [`block_on`] runs it here), and returns what they saw.
pub fn observed<T>(f: impl FnOnce() -> T) -> (T, Observed) {
    use tracing_subscriber::layer::SubscriberExt;
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(AuditLines(lines.clone()));
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let value = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, f)
    });
    let audit_lines = std::mem::take(&mut *lines.lock().expect("unpoisoned"));
    (
        value,
        Observed {
            audit_lines,
            metrics: handle.render(),
        },
    )
}

/// Collects the events that carry `audit = true`.
struct AuditLines(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AuditLines {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Fields(Vec<String>, bool);
        impl tracing::field::Visit for Fields {
            fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
                if field.name() == "audit" {
                    self.1 = value;
                }
                self.0.push(format!("{}={value}", field.name()));
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push(format!("{}={value:?}", field.name()));
            }
        }
        let mut fields = Fields(Vec::new(), false);
        event.record(&mut fields);
        if fields.1 {
            self.0.lock().expect("unpoisoned").push(fields.0.join(" "));
        }
    }
}
