//! The operator's log: WIT `log` calls and stdout/stderr lines, tagged with the pipeline and
//! partition, within two budgets — the partition's (`runtime.log_lines_per_second_max`, shared
//! by every instance of it, replaced after traps or not) and the pipeline's (four times that,
//! shared by its partitions) — with excess lines dropped and counted, and a line repeated
//! back to back summarised once the next one comes (SCENARIOS.md S21: a trap storm's log).
//!
//! Stderr written during a call is held until the call ends: logged if it succeeded, folded
//! into the trap's report if it trapped (a panic message, the same for every re-run of the
//! trapping record while it is isolated; the record's dead letter and one line carry it).

use crate::clock::SharedClock;
use crate::ids::Partition;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Longest line kept, bytes; longer lines are truncated.
pub const LINE_BYTES_MAX: usize = 4096;

/// Severity, mirroring WIT `log.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestLevel {
    /// WIT `trace`.
    Trace,
    /// WIT `debug`.
    Debug,
    /// WIT `info` and stdout.
    Info,
    /// WIT `warn` and stderr.
    Warn,
    /// WIT `error`.
    Error,
}

impl GuestLevel {
    /// The WIT name: `trace`, `debug`, `info`, `warn` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

/// One line an operator logged, as a [`LogSink`] receives it: past the rate limit, at most
/// [`LINE_BYTES_MAX`] bytes.
#[derive(Debug, Clone, Copy)]
pub struct LogLine<'a> {
    /// When it was logged, ms since the Unix epoch (the operator's processing-time clock).
    pub time_ms: u64,
    /// Its severity.
    pub level: GuestLevel,
    /// The partition whose instance logged it, if any.
    pub partition: Option<Partition>,
    /// The stage whose instance logged it, in a pipeline of stages ([`StageLogSink`]).
    pub stage: Option<&'a str>,
    /// The text, one line.
    pub message: &'a str,
}

/// Where an operator's log lines go besides the host's log: for `weir serve`, the pipeline's
/// log segments in object storage, which the tenant reads through the API
/// (`crate::api::logs`).
pub trait LogSink: Send + Sync + std::fmt::Debug {
    /// Takes one line. Called on the instance's call path: must not block or fail.
    fn line(&self, line: LogLine<'_>);
}

/// A pipeline's [`LogSink`] as one of its stages logs to it: each line names the stage.
#[derive(Debug)]
pub struct StageLogSink {
    stage: String,
    inner: Arc<dyn LogSink>,
}

impl StageLogSink {
    /// `inner`, for the lines of stage `stage`.
    pub fn new(stage: &str, inner: Arc<dyn LogSink>) -> Self {
        Self {
            stage: stage.to_owned(),
            inner,
        }
    }
}

impl LogSink for StageLogSink {
    fn line(&self, line: LogLine<'_>) {
        self.inner.line(LogLine {
            stage: Some(&self.stage),
            ..line
        });
    }
}

/// Who logs: a label for the host's log (for example `flights/3`), the partition, and the
/// pipeline's [`LogSink`] if it has one. A string converts to a label alone.
#[derive(Debug, Clone)]
pub struct LogSource {
    /// The label in the host's log; the rate limit's budget is per label.
    pub label: Arc<str>,
    /// The partition, given to the sink with each line.
    pub partition: Option<Partition>,
    /// Where lines go besides the host's log.
    pub sink: Option<Arc<dyn LogSink>>,
}

impl LogSource {
    /// Partition `partition` of pipeline `pipeline`, labelled `{pipeline}/{partition}`.
    pub fn partition(pipeline: &str, partition: Partition, sink: Option<Arc<dyn LogSink>>) -> Self {
        Self {
            label: format!("{pipeline}/{partition}").into(),
            partition: Some(partition),
            sink,
        }
    }
}

impl std::fmt::Display for LogSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label)
    }
}

impl From<Arc<str>> for LogSource {
    fn from(label: Arc<str>) -> Self {
        Self {
            label,
            partition: None,
            sink: None,
        }
    }
}

impl From<&str> for LogSource {
    fn from(label: &str) -> Self {
        Arc::<str>::from(label).into()
    }
}

/// A budget of `lines_per_second_max` lines per second of processing time. A partition's is
/// shared by every instance of the operator in that partition, so that instances replaced
/// after traps do not each start with a fresh budget; a pipeline's by all its partitions.
#[derive(Debug)]
pub(crate) struct Limiter {
    lines_per_second_max: u32,
    window_start_ms: u64,
    lines_in_window: u32,
    dropped_in_window: u64,
    dropped: u64,
    /// The last line let through (a hash of its level and text), and how many times it came
    /// again right after it, not logged yet.
    last: Option<u64>,
    repeats: u64,
}

/// The budgets a [`GuestLog`] draws on: its partition's, and its pipeline's.
#[derive(Debug, Clone)]
pub(crate) struct Budgets {
    pub partition: Arc<Mutex<Limiter>>,
    pub pipeline: Arc<Mutex<Limiter>>,
}

/// How many times a partition's budget a pipeline's is.
pub const PIPELINE_BUDGET_PARTITIONS: u32 = 4;

impl Budgets {
    /// Budgets of `lines_per_second_max` a second for one partition, and
    /// [`PIPELINE_BUDGET_PARTITIONS`] times that for the pipeline, each new.
    pub(crate) fn new(lines_per_second_max: u32) -> Self {
        Self {
            partition: Limiter::shared(lines_per_second_max),
            pipeline: Limiter::shared(
                lines_per_second_max.saturating_mul(PIPELINE_BUDGET_PARTITIONS),
            ),
        }
    }
}

/// The log of one instance; cheap to clone (shared by the WIT import and the WASI stdout and
/// stderr streams).
#[derive(Debug, Clone)]
pub struct GuestLog {
    source: LogSource,
    clock: SharedClock,
    budgets: Budgets,
    recent_stderr: Arc<Mutex<VecDeque<String>>>,
    /// Stderr lines written during the call running now, logged when it ends well (module
    /// docs); `None` between calls, when lines are logged at once.
    held: Arc<Mutex<Option<Vec<String>>>>,
}

/// Stderr lines held during one call at most; more are dropped and counted.
pub const HELD_LINES_MAX: usize = 64;

impl Limiter {
    /// A bucket of `lines_per_second_max` lines per second.
    pub(crate) fn shared(lines_per_second_max: u32) -> Arc<Mutex<Limiter>> {
        Arc::new(Mutex::new(Limiter {
            lines_per_second_max,
            window_start_ms: 0,
            lines_in_window: 0,
            dropped_in_window: 0,
            dropped: 0,
            last: None,
            repeats: 0,
        }))
    }

    /// Starts a new window at `now_ms` if the current one is a second old; returns the lines
    /// dropped in the one that ended.
    fn roll(&mut self, now_ms: u64) -> u64 {
        if now_ms.saturating_sub(self.window_start_ms) < 1000 {
            return 0;
        }
        self.window_start_ms = now_ms;
        self.lines_in_window = 0;
        std::mem::take(&mut self.dropped_in_window)
    }

    /// Takes a line from this window's budget, or counts it dropped.
    fn admit(&mut self) -> bool {
        if self.lines_in_window >= self.lines_per_second_max {
            self.dropped += 1;
            self.dropped_in_window += 1;
            metrics::counter!("weir_guest_log_lines_dropped_total").increment(1);
            return false;
        }
        self.lines_in_window += 1;
        true
    }
}

impl GuestLog {
    /// A log for `source` (for example `flights/3`), at most `lines_per_second_max` lines/s
    /// (its pipeline's budget its own).
    pub fn new(source: LogSource, clock: SharedClock, lines_per_second_max: u32) -> Self {
        Self::with_budgets(source, clock, Budgets::new(lines_per_second_max))
    }

    /// A log for `source` drawing on `budgets`, shared with other instances.
    pub(crate) fn with_budgets(source: LogSource, clock: SharedClock, budgets: Budgets) -> Self {
        Self {
            source,
            clock,
            budgets,
            recent_stderr: Arc::new(Mutex::new(VecDeque::new())),
            held: Arc::new(Mutex::new(None)),
        }
    }

    /// Lines dropped by the partition's and the pipeline's budgets so far.
    pub fn dropped(&self) -> u64 {
        let dropped = |l: &Arc<Mutex<Limiter>>| l.lock().map_or(0, |l| l.dropped);
        dropped(&self.budgets.partition) + dropped(&self.budgets.pipeline)
    }

    /// Writes one line if the budgets allow (module docs): to the host's log and to the
    /// source's sink. The sink learns of lines the budgets dropped, and of a line repeated,
    /// with the next line let through after them.
    pub fn line(&self, level: GuestLevel, message: &str) {
        let now_ms = self.clock.now_ms();
        let message = truncate(message, LINE_BYTES_MAX);
        let fingerprint = {
            use std::hash::BuildHasher;
            foldhash::fast::FixedState::with_seed(0).hash_one((level as u8, message))
        };
        let (dropped_before, repeated) = {
            let mut partition = self
                .budgets
                .partition
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let dropped_before = partition.roll(now_ms);
            if dropped_before > 0 {
                tracing::warn!(operator = %self.source.label, dropped_total = partition.dropped, "operator log lines dropped by the rate limit");
            }
            if partition.last == Some(fingerprint) {
                // The same line again, back to back: counted, summarised with the next one.
                partition.repeats += 1;
                return;
            }
            if !partition.admit() {
                return;
            }
            let mut pipeline = self
                .budgets
                .pipeline
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            pipeline.roll(now_ms);
            if !pipeline.admit() {
                return;
            }
            partition.last = Some(fingerprint);
            let repeated = std::mem::take(&mut partition.repeats);
            (dropped_before, repeated)
        };
        if repeated > 0 {
            self.write(
                now_ms,
                GuestLevel::Info,
                &format!("weir: the line before repeated {repeated} more times"),
            );
        }
        if dropped_before > 0 {
            let max = self
                .budgets
                .partition
                .lock()
                .map_or(0, |l| l.lines_per_second_max);
            self.write_to_sink(
                now_ms,
                GuestLevel::Warn,
                &format!(
                    "weir: {dropped_before} log lines dropped by the rate limit ({max} lines/s per partition)"
                ),
            );
        }
        self.write(now_ms, level, message);
    }

    /// Writes `message` to the host's log and the sink.
    fn write(&self, now_ms: u64, level: GuestLevel, message: &str) {
        self.write_to_sink(now_ms, level, message);
        let source = &*self.source.label;
        match level {
            GuestLevel::Trace => tracing::trace!(operator = source, "{message}"),
            GuestLevel::Debug => tracing::debug!(operator = source, "{message}"),
            GuestLevel::Info => tracing::info!(operator = source, "{message}"),
            GuestLevel::Warn => tracing::warn!(operator = source, "{message}"),
            GuestLevel::Error => tracing::error!(operator = source, "{message}"),
        }
    }

    fn write_to_sink(&self, now_ms: u64, level: GuestLevel, message: &str) {
        if let Some(sink) = &self.source.sink {
            sink.line(LogLine {
                time_ms: now_ms,
                level,
                partition: self.source.partition,
                stage: None,
                message,
            });
        }
    }

    /// A call starts: stderr is held until it ends ([`GuestLog::call_ended`]).
    pub fn call_started(&self) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    }

    /// The call ended: its stderr is logged if it `succeeded`, and otherwise dropped — a
    /// trap's report carries it ([`GuestLog::take_recent_stderr`]).
    pub fn call_ended(&self, succeeded: bool) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        if succeeded {
            for line in held.unwrap_or_default() {
                self.line(GuestLevel::Warn, &line);
            }
        }
    }

    /// A stderr line: held during a call, logged at once otherwise.
    fn stderr_line(&self, line: &str) {
        self.remember_stderr(line);
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(held) = held.as_mut() {
                if held.len() < HELD_LINES_MAX {
                    held.push(truncate(line, LINE_BYTES_MAX).to_owned());
                }
                return;
            }
        }
        self.line(GuestLevel::Warn, line);
    }

    /// A stdout/stderr stream that turns written bytes into log lines at `level`. It accepts
    /// every byte synchronously, so a chatty guest never fails (and so never panics) on a write,
    /// and lines are logged before the call returns. Lines at `Warn` (stderr) are also kept in
    /// [`GuestLog::take_recent_stderr`] so that a trap can be reported with the panic message.
    pub fn stream(&self, level: GuestLevel) -> LineSink {
        LineSink {
            log: self.clone(),
            level,
            pending: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Takes the stderr lines written since the last call (at most [`RECENT_STDERR_LINES_MAX`]).
    pub fn take_recent_stderr(&self) -> Vec<String> {
        std::mem::take(&mut *self.recent_stderr.lock().unwrap_or_else(|e| e.into_inner())).into()
    }

    fn remember_stderr(&self, line: &str) {
        let mut recent = self.recent_stderr.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == RECENT_STDERR_LINES_MAX {
            recent.pop_front();
        }
        recent.push_back(truncate(line, LINE_BYTES_MAX).to_owned());
    }
}

/// Stderr lines kept for trap reports.
pub const RECENT_STDERR_LINES_MAX: usize = 8;

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Splits a guest's stdout or stderr byte stream into lines for [`GuestLog`]. Clones share
/// the partial line.
#[derive(Debug, Clone)]
pub struct LineSink {
    log: GuestLog,
    level: GuestLevel,
    pending: Arc<Mutex<Vec<u8>>>,
}

impl LineSink {
    fn push(&self, buf: &[u8]) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for chunk in buf.split_inclusive(|b| *b == b'\n') {
            if pending.len() < LINE_BYTES_MAX {
                let room = LINE_BYTES_MAX - pending.len();
                pending.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            if chunk.ends_with(b"\n") {
                self.flush_line(&mut pending);
            }
        }
    }

    fn flush_line(&self, pending: &mut Vec<u8>) {
        let text = String::from_utf8_lossy(pending);
        let line = text.trim_end_matches(['\n', '\r']);
        if !line.is_empty() {
            if self.level == GuestLevel::Warn {
                self.log.stderr_line(line);
            } else {
                self.log.line(self.level, line);
            }
        }
        pending.clear();
    }
}

impl IsTerminal for LineSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LineSink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for LineSink {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(STDIO_WRITE_BYTES_MAX)
    }
}

/// Bytes a guest may write to stdout/stderr in one `write` call.
const STDIO_WRITE_BYTES_MAX: usize = 64 << 10;

impl Pollable for LineSink {
    // Written out as `async_trait` expands it: the sink is always ready.
    fn ready<'life0, 'async_trait>(
        &'life0 mut self,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(std::future::ready(()))
    }
}

impl AsyncWrite for LineSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        self.flush_line(&mut pending);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests;
