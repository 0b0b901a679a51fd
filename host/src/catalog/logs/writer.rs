//! One host's writer of a pipeline run's log segments: lines are buffered in memory and
//! written as a segment object each `flush_interval` (or sooner when a segment is full), under
//! the host's directory; retention deletes the host's oldest segments past its byte budget and
//! anyone's older than the retention period.

use super::{LogEntry, SegmentName, list_segments};
use crate::runtime::guest_log::{LogLine, LogSink};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Deserialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

/// The `[pipelines.logs]` section of serve.toml: how each host keeps its operators' log lines.
/// Each run's writer deletes its host's oldest segments of the pipeline past `host_bytes_max`
/// or `retention`; every [`SWEEP_INTERVAL`] each host deletes every pipeline's segments past
/// `retention`, whoever wrote them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorLogSettings {
    /// Longest a line waits in memory before its segment is written; default 1 s (what
    /// `?follow` lags behind the operator).
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Largest segment object, bytes; a fuller buffer is written at once; default 1 MiB.
    pub segment_bytes_max: usize,
    /// Most bytes buffered per pipeline run while the store cannot take them; lines past it
    /// are dropped and counted (a notice line says how many); default 8 MiB.
    pub buffer_bytes_max: usize,
    /// Segments older than this are deleted; default 1 day.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Most bytes of segments each host keeps per pipeline: its oldest go first; default
    /// 64 MiB.
    pub host_bytes_max: u64,
}

impl Default for OperatorLogSettings {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_secs(1),
            segment_bytes_max: 1 << 20,
            buffer_bytes_max: 8 << 20,
            retention: Duration::from_secs(24 * 3600),
            host_bytes_max: 64 << 20,
        }
    }
}

/// How often each host deletes the segments past the retention period of every pipeline,
/// running or not (`crate::runner`): hosts that are gone leave theirs behind, and a
/// stopped pipeline has no writer.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(600);

/// The [`LogSink`] of one pipeline run on one host: takes lines without blocking, and a task
/// ([`SegmentWriter::spawn`]) writes them out.
#[derive(Debug)]
pub struct SegmentWriter {
    host: Arc<str>,
    settings: OperatorLogSettings,
    pending: Mutex<Pending>,
    full: Notify,
}

/// Lines not yet written, as JSON lines.
#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    /// Lines dropped because the buffer was full, since the last notice.
    dropped: u64,
}

/// Ends a [`SegmentWriter`]'s task: [`WriterTask::close`] writes what is buffered first.
#[derive(Debug)]
pub struct WriterTask {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl WriterTask {
    /// Writes the lines still buffered (one attempt) and ends the task.
    pub async fn close(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for WriterTask {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

impl SegmentWriter {
    /// A writer of `host`'s segments under `dir` (a pipeline's log directory) of `store`, and
    /// its task.
    pub fn spawn(
        store: Arc<dyn ObjectStore>,
        dir: Path,
        host: &str,
        settings: OperatorLogSettings,
    ) -> (Arc<Self>, WriterTask) {
        let writer = Arc::new(Self {
            host: host.into(),
            settings,
            pending: Mutex::new(Pending::default()),
            full: Notify::new(),
        });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(writer.clone().run(store, dir, stopped));
        (
            writer,
            WriterTask {
                stop: Some(stop),
                task,
            },
        )
    }

    fn append(&self, entry: &LogEntry<'_>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let before = pending.bytes.len();
        if pending.dropped > 0 {
            let notice = format!(
                "weir: {} log lines dropped: the log store did not take them in time",
                pending.dropped
            );
            write_line(
                &mut pending.bytes,
                &LogEntry {
                    message: notice.into(),
                    level: "warn".into(),
                    partition: None,
                    stage: None,
                    ..entry.clone()
                },
            );
        }
        write_line(&mut pending.bytes, entry);
        if pending.bytes.len() > self.settings.buffer_bytes_max {
            pending.bytes.truncate(before);
            pending.dropped += 1;
            metrics::counter!("weir_guest_log_lines_unwritten_total").increment(1);
            return;
        }
        pending.dropped = 0;
        if pending.bytes.len() >= self.settings.segment_bytes_max {
            self.full.notify_one();
        }
    }

    /// Puts `unwritten` back before the lines buffered since, dropping the oldest lines (and
    /// counting them for the notice) past `buffer_bytes_max`.
    fn put_back(&self, unwritten: &[u8]) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut back = Vec::with_capacity(unwritten.len() + pending.bytes.len());
        back.extend_from_slice(unwritten);
        back.extend_from_slice(&pending.bytes);
        let excess = back.len().saturating_sub(self.settings.buffer_bytes_max);
        if excess > 0 {
            // Whole lines only: up to the line end at or after the excess.
            let cut = back[excess - 1..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(back.len(), |i| excess + i);
            let lines = back[..cut].iter().filter(|b| **b == b'\n').count() as u64;
            back.drain(..cut);
            pending.dropped += lines;
            metrics::counter!("weir_guest_log_lines_unwritten_total").increment(lines);
        }
        pending.bytes = back;
    }

    async fn run(
        self: Arc<Self>,
        store: Arc<dyn ObjectStore>,
        dir: Path,
        mut stopped: oneshot::Receiver<()>,
    ) {
        let host_dir = dir.clone().join(&*self.host);
        let mut kept = Kept::default();
        match list_segments(&*store, &host_dir).await {
            Ok(mut segments) => {
                segments.sort_by_key(|s| s.0.time_ms);
                for (name, size) in segments {
                    kept.push(host_dir.clone().join(name.file_name()), name.time_ms, size);
                }
            }
            Err(err) => {
                tracing::warn!(%host_dir, error = %err, "cannot list this host's log segments")
            }
        }
        let mut failing = false;
        loop {
            let stop = tokio::select! {
                _ = tokio::time::sleep(self.settings.flush_interval) => false,
                _ = self.full.notified() => false,
                _ = &mut stopped => true,
            };
            match self.flush(&*store, &host_dir, &mut kept).await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!(%host_dir, "operator log segments written again");
                }
                Ok(()) => {}
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(%host_dir, error = %err, "cannot write an operator log segment; lines stay buffered");
                }
                Err(_) => {}
            }
            kept.expire(&*store, &self.settings).await;
            if stop {
                return;
            }
        }
    }

    /// Writes the buffered lines as segments of at most `segment_bytes_max` (at line ends);
    /// on a store error puts back what was not written.
    async fn flush(
        &self,
        store: &dyn ObjectStore,
        host_dir: &Path,
        kept: &mut Kept,
    ) -> object_store::Result<()> {
        let bytes = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut pending.bytes)
        };
        let mut rest = Bytes::from(bytes);
        while !rest.is_empty() {
            let cut = segment_end(&rest, self.settings.segment_bytes_max);
            let segment = rest.slice(..cut);
            let name = SegmentName::now();
            let path = host_dir.clone().join(name.file_name());
            if let Err(err) = store
                .put(&path, PutPayload::from_bytes(segment.clone()))
                .await
            {
                // Lines keep their order: what was not written goes before what came since.
                self.put_back(&rest);
                return Err(err);
            }
            metrics::counter!("weir_guest_log_segments_written_total").increment(1);
            kept.push(path, name.time_ms, segment.len() as u64);
            rest = rest.slice(cut..);
        }
        Ok(())
    }
}

impl LogSink for SegmentWriter {
    fn line(&self, line: LogLine<'_>) {
        self.append(&LogEntry {
            time_ms: line.time_ms,
            host: (&*self.host).into(),
            stage: line.stage.map(Into::into),
            partition: line.partition,
            level: line.level.as_str().into(),
            message: line.message.into(),
        });
    }
}

/// Appends `entry` as one JSON line.
fn write_line(out: &mut Vec<u8>, entry: &LogEntry<'_>) {
    if serde_json::to_writer(&mut *out, entry).is_ok() {
        out.push(b'\n');
    }
}

/// Where the first segment of `bytes` ends: after the last line end within `max` bytes, or
/// after the first line end when one line is longer.
fn segment_end(bytes: &[u8], max: usize) -> usize {
    if bytes.len() <= max {
        return bytes.len();
    }
    match bytes[..max].iter().rposition(|b| *b == b'\n') {
        Some(i) => i + 1,
        None => bytes
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |i| i + 1),
    }
}

/// This host's segments, oldest first, and their total size.
#[derive(Debug, Default)]
struct Kept {
    segments: VecDeque<(Path, u64, u64)>,
    bytes: u64,
}

impl Kept {
    fn push(&mut self, path: Path, time_ms: u64, size: u64) {
        self.segments.push_back((path, time_ms, size));
        self.bytes += size;
    }

    /// Deletes the oldest segments while over the byte budget or past the retention.
    async fn expire(&mut self, store: &dyn ObjectStore, settings: &OperatorLogSettings) {
        let oldest_kept_ms =
            crate::clock::wall_now_ms().saturating_sub(settings.retention.as_millis() as u64);
        while let Some((path, time_ms, size)) = self.segments.front() {
            if self.bytes <= settings.host_bytes_max && *time_ms >= oldest_kept_ms {
                return;
            }
            match store.delete(path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(err) => {
                    tracing::debug!(%path, error = %err, "cannot delete an old log segment yet");
                    return;
                }
            }
            self.bytes -= size;
            self.segments.pop_front();
        }
    }
}

/// Deletes every host's segments under `dir` older than `retention` (stores list in no
/// promised order, so each host's directory is listed whole).
pub async fn sweep_expired(store: &dyn ObjectStore, dir: &Path, retention: Duration) {
    let oldest_kept_ms = crate::clock::wall_now_ms().saturating_sub(retention.as_millis() as u64);
    let hosts = match super::host_dirs(store, dir).await {
        Ok(hosts) => hosts,
        Err(err) => {
            tracing::debug!(%dir, error = %err, "cannot list log segments to expire");
            return;
        }
    };
    for host_dir in hosts.values() {
        // Listed whole before any delete: a listing holds one of the host's object-store
        // requests in flight while it is read (state::store_guard).
        let listed: Vec<_> = match store.list(Some(host_dir)).try_collect().await {
            Ok(listed) => listed,
            Err(err) => {
                tracing::debug!(%host_dir, error = %err, "cannot list log segments to expire");
                continue;
            }
        };
        for meta in listed {
            let path = meta.location;
            let Some(name) = path.filename().and_then(SegmentName::parse) else {
                continue;
            };
            if name.time_ms >= oldest_kept_ms {
                continue;
            }
            if let Err(err) = store.delete(&path).await
                && !matches!(err, object_store::Error::NotFound { .. })
            {
                tracing::debug!(%path, error = %err, "cannot delete an expired log segment yet");
            }
        }
    }
}

/// Segments named by this process, for [`SegmentName::now`].
static WRITTEN: AtomicU64 = AtomicU64::new(0);

impl SegmentName {
    /// A name for a segment written now: the time, then this process's count.
    pub(super) fn now() -> Self {
        Self {
            time_ms: crate::clock::wall_now_ms(),
            seq: WRITTEN.fetch_add(1, Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::guest_log::GuestLevel;
    use object_store::memory::InMemory;

    fn line(message: &str) -> LogLine<'_> {
        LogLine {
            time_ms: 1_000,
            level: GuestLevel::Info,
            partition: Some(crate::ids::Partition(2)),
            stage: None,
            message,
        }
    }

    #[test]
    fn segments_end_at_line_ends_within_the_limit() {
        assert_eq!(segment_end(b"ab\ncd\nef\n", 7), 6);
        assert_eq!(segment_end(b"abcdef\ng\n", 3), 7);
        assert_eq!(segment_end(b"ab\n", 7), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn lines_are_written_as_segments_and_the_oldest_go_past_the_hosts_budget() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let dir = Path::from("logs/p");
        let settings = OperatorLogSettings {
            segment_bytes_max: 200,
            host_bytes_max: 1_000,
            ..Default::default()
        };
        let (writer, task) = SegmentWriter::spawn(store.clone(), dir.clone(), "h1", settings);
        for i in 0..40 {
            writer.line(line(&format!("line {i}")));
        }
        task.close().await;
        let segments = super::super::list_all_segments(&*store, &dir)
            .await
            .expect("listed");
        let total: u64 = segments.iter().map(|s| s.2).sum();
        assert!(total <= 1_000, "kept {total} bytes");
        assert!(segments.iter().all(|s| s.2 <= 200));
        let lines =
            super::super::read_segments(&*store, segments.iter().map(|s| s.0.clone()).collect())
                .await
                .expect("read");
        // The newest lines are kept, in order, each whole.
        let messages: Vec<_> = lines.iter().map(|l| l.message.to_string()).collect();
        assert_eq!(messages.last().map(String::as_str), Some("line 39"));
        let first: usize = messages[0]["line ".len()..].parse().expect("a line number");
        let expected: Vec<_> = (first..40).map(|i| format!("line {i}")).collect();
        assert_eq!(messages, expected);
        assert!(
            lines
                .iter()
                .all(|l| l.host == "h1" && l.partition == Some(crate::ids::Partition(2)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stages_lines_name_the_stage_and_a_pipelines_lines_name_none() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let dir = Path::from("logs/p");
        let (writer, task) =
            SegmentWriter::spawn(store.clone(), dir.clone(), "h1", Default::default());
        let stage = crate::runtime::guest_log::StageLogSink::new("count", writer.clone());
        stage.line(line("from the count stage"));
        writer.line(line("from a one-operator run"));
        task.close().await;
        let segments = super::super::list_all_segments(&*store, &dir)
            .await
            .expect("listed");
        let lines =
            super::super::read_segments(&*store, segments.iter().map(|s| s.0.clone()).collect())
                .await
                .expect("read");
        let seen: Vec<_> = lines
            .iter()
            .map(|l| (l.stage.as_deref(), l.message.as_ref()))
            .collect();
        assert_eq!(
            seen,
            vec![
                (Some("count"), "from the count stage"),
                (None, "from a one-operator run")
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_buffer_drops_lines_and_the_next_line_says_how_many() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let dir = Path::from("logs/p");
        let settings = OperatorLogSettings {
            buffer_bytes_max: 600,
            ..Default::default()
        };
        let (writer, task) = SegmentWriter::spawn(store.clone(), dir.clone(), "h1", settings);
        // Nothing is written meanwhile (as when the store is down): the buffer fills.
        for i in 0..10 {
            writer.line(line(&format!("line {i}")));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        writer.line(line("after"));
        task.close().await;
        let segments = super::super::list_all_segments(&*store, &dir)
            .await
            .expect("listed");
        let mut names: Vec<_> = segments.iter().map(|s| (s.1, s.0.clone())).collect();
        names.sort();
        let lines = super::super::read_segments(&*store, names.into_iter().map(|s| s.1).collect())
            .await
            .expect("read");
        let kept = lines.len() - 2;
        assert!((1..10).contains(&kept), "{lines:?}");
        let messages: Vec<_> = lines.iter().map(|l| l.message.to_string()).collect();
        let mut expected: Vec<_> = (0..kept).map(|i| format!("line {i}")).collect();
        expected.push(format!(
            "weir: {} log lines dropped: the log store did not take them in time",
            10 - kept
        ));
        expected.push("after".into());
        assert_eq!(messages, expected);
        assert_eq!(lines[kept].level, "warn");
        assert_eq!(lines[kept].partition, None);
    }

    #[tokio::test]
    async fn lines_put_back_after_a_failed_write_keep_their_order_within_the_buffer() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let settings = OperatorLogSettings {
            buffer_bytes_max: 250,
            ..Default::default()
        };
        let (writer, _task) = SegmentWriter::spawn(store, Path::from("logs/p"), "h1", settings);
        writer.line(line("new 1"));
        let mut unwritten = Vec::new();
        for i in 0..3 {
            write_line(
                &mut unwritten,
                &LogEntry {
                    time_ms: 1,
                    host: "h1".into(),
                    stage: None,
                    partition: Some(crate::ids::Partition(2)),
                    level: "info".into(),
                    message: format!("old {i}").into(),
                },
            );
        }
        writer.put_back(&unwritten);
        let pending = writer.pending.lock().expect("unpoisoned");
        assert!(pending.bytes.len() <= 250, "{}", pending.bytes.len());
        let messages: Vec<String> = pending
            .bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let entry: LogEntry<'_> = serde_json::from_slice(l).expect("whole lines");
                entry.message.into_owned()
            })
            .collect();
        // The oldest go first: 4 lines of ~72 bytes do not fit in 250.
        assert_eq!(messages, ["old 1", "old 2", "new 1"]);
        assert_eq!(pending.dropped, 1);
    }
}
