//! The portable state format (issue 20, item 2): one checkpoint of one shard as JSON lines,
//! independent of the backend that wrote it, and the import that builds either backend from
//! it directly.
//!
//! # Why JSON lines
//! DuckDB (`read_json('00000.jsonl')`), `jq` and pandas open it as it is (pyarrow's reader
//! only when every decoded `value` has one type); it needs no dependency here (Parquet would add the arrow and parquet crates
//! to a build the test budget is already tight on) and its lines stream, so neither side holds a
//! shard. Values are bytes (`value_b64`); a value that is JSON (what the SDKs' typed states
//! write) is shown decoded as `value` too, for reading — the import reads only `value_b64`.
//! The format is versioned (`version`) and frozen by a snapshot test.
//!
//! # Layout (format version 1)
//! ```text
//! {"format":"weir-state-export","version":1,"partition":2,"source_backend":"memory","source_version":2,"offsets":{"acme.in":301}}
//! {"key_b64":"/wA=","state":"count","value_b64":"eyJuIjoxfQ==","value":{"n":1}}
//! {"key":"key7","state":"seen","map_key":"a","value_b64":"cmF3IP8=","expires_at_ms":1767225600000}
//! {"key":"key7","state":"count","value_b64":"Mw==","value":3}
//! {"key":"key7","timer":"flush","domain":"event_time","time_ms":60000}
//! {"end":true,"entries":3,"timers":1,"watermark_ms":59000}
//! ```
//! - The header, then one line per live entry and per timer, in the order of their encoded
//!   state keys ([`crate::state::key`]): by record key, then state name (each shorter first,
//!   as the encoding prefixes their lengths), then map key bytes, so a key's timers sit among
//!   its states (under the reserved state `!timers`). Entries past their TTL at export time are
//!   left out (they read as absent).
//! - `key` / `map_key` hold UTF-8 text; bytes that are not UTF-8 go in `key_b64` /
//!   `map_key_b64` instead. A value state has no map key; a map entry with an empty map key
//!   looks the same (the encoding does not tell them apart, and the import does not need to).
//! - `offsets`: where the input resumes, per Kafka topic (the next offset).
//! - The last line closes the file with the counts and the watermark (ms, when the shard had
//!   one): an export without it is incomplete and is refused by the import. A shard of a
//!   pipeline with an Iceberg table adds `iceberg_pending`, its list of data files not yet in
//!   the table (docs/iceberg.md), as it keeps it.
//! - What the backends derive (the time index that fires timers in time order, the count of
//!   pending timers) is not exported: the import builds it again from the timers.

use super::StateError;
use super::checkpoint::{DecidedBy, InputOffsets, checkpoint_metadata};
use super::key;
use super::lsm::cache::{BlockCaches, SstFiles};
use super::lsm::sst::Entry;
use super::lsm::sst::builder::SstBuilder;
use super::lsm::tree::{LsmSettings, LsmTree, SstId};
use super::manifest::{Manifest, ManifestKind, ManifestStore, SstRef};
use super::snapshot;
use crate::clock::SharedClock;
use crate::runtime::TimeDomain;
use crate::sink::iceberg::shard::PENDING_KEY as ICEBERG_PENDING_KEY;
use crate::time::keys as time_keys;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The `format` of every export's header.
pub const FORMAT: &str = "weir-state-export";
/// The format version this host writes and reads.
pub const VERSION: u32 = 1;
/// Entries read from a checkpoint at a time.
const PAGE: usize = 4096;

/// An export's first line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportHeader {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The input partition of the shard.
    pub partition: i32,
    /// The backend it was exported from (`lsm` or `memory`).
    pub source_backend: String,
    /// The checkpoint's manifest version in the shard it was exported from.
    pub source_version: u64,
    /// Where the input resumes: Kafka topic → next offset.
    pub offsets: BTreeMap<String, i64>,
}

/// Every line after the header: an entry, a timer, or the end. One flat shape, so that a
/// reader infers one table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportLine {
    /// The record key, as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The record key's bytes, base64, when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_b64: Option<String>,
    /// The state's name (an entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// A map entry's key, as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_key: Option<String>,
    /// A map entry's key, base64, when not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_key_b64: Option<String>,
    /// The value's bytes, base64 (an entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
    /// The value decoded, when its bytes are JSON; for reading only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// When the entry expires, ms since the Unix epoch (entries with a TTL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// The timer's name (a timer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer: Option<String>,
    /// The timer's domain: `event_time` or `processing_time`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// When the timer fires, ms of its domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ms: Option<i64>,
    /// `true` on the last line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<bool>,
    /// The last line: entries written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// The last line: timers written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers: Option<u64>,
    /// The last line: the shard's watermark, ms, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_ms: Option<i64>,
    /// The last line: the Iceberg sink's list of data files not yet in its table
    /// (docs/iceberg.md), the JSON text the shard keeps, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iceberg_pending: Option<String>,
}

/// What an export or import moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExportSummary {
    /// The input partition.
    pub partition: i32,
    /// State entries.
    pub entries: u64,
    /// Timers.
    pub timers: u64,
    /// Bytes of the export object.
    pub bytes: u64,
}

/// Why an export or import failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The store failed: retry.
    #[error("object store unavailable for the export")]
    Unavailable(#[source] object_store::Error),
    /// The checkpoint could not be read.
    #[error("cannot read the checkpoint")]
    State(#[source] StateError),
    /// What was read is not valid: a state key that is no encoding, an export that is not one
    /// (line `line`, 1-based; 0: the file as a whole).
    #[error("invalid state export at line {line}: {reason}")]
    Invalid {
        /// The line.
        line: u64,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(line: u64, reason: impl Into<String>) -> ExportError {
    ExportError::Invalid {
        line,
        reason: reason.into(),
    }
}

/// The live entries of one checkpoint, page by page in key order, from either backend.
enum CheckpointEntries {
    Snapshot(std::vec::IntoIter<(Vec<u8>, Bytes, Option<u64>)>),
    Lsm {
        tree: LsmTree,
        after: Option<Vec<u8>>,
        done: bool,
    },
}

impl CheckpointEntries {
    async fn open(
        store: &Arc<dyn ObjectStore>,
        root: &Path,
        manifest: &Manifest,
        clock: &SharedClock,
    ) -> Result<Self, ExportError> {
        if let Some(name) = snapshot::snapshot_name(&manifest.metadata) {
            let path = Path::from(format!("{root}/{name}"));
            let bytes = store
                .get(&path)
                .await
                .map_err(ExportError::Unavailable)?
                .bytes()
                .await
                .map_err(ExportError::Unavailable)?;
            let now = clock.now_ms();
            let entries = snapshot::decode(&bytes)
                .map_err(|reason| {
                    ExportError::State(StateError::corrupt(root.to_string(), reason))
                })?
                .into_iter()
                .filter(|(_, (_, expires))| expires.is_none_or(|at| now < at))
                .map(|(k, (v, e))| (k, v, e))
                .collect::<Vec<_>>();
            return Ok(Self::Snapshot(entries.into_iter()));
        }
        // Read only: nothing is written, so nothing is flushed or compacted.
        let tree = LsmTree::open(
            SstFiles::new(store.clone(), Arc::new(BlockCaches::none())),
            root.clone(),
            manifest,
            manifest.writer_epoch,
            LsmSettings::default(),
            clock.clone(),
        )
        .map_err(ExportError::State)?;
        Ok(Self::Lsm {
            tree,
            after: None,
            done: false,
        })
    }

    async fn next_page(&mut self) -> Result<Vec<(Vec<u8>, Bytes, Option<u64>)>, ExportError> {
        match self {
            Self::Snapshot(entries) => Ok(entries.by_ref().take(PAGE).collect()),
            Self::Lsm { tree, after, done } => {
                if *done {
                    return Ok(Vec::new());
                }
                let page = tree
                    .scan_with_expiry(&[], after.as_deref(), PAGE)
                    .await
                    .map_err(ExportError::State)?;
                *done = page.len() < PAGE;
                *after = page.last().map(|(k, _, _)| k.clone());
                Ok(page)
            }
        }
    }
}

fn domain_name(domain: TimeDomain) -> &'static str {
    match domain {
        TimeDomain::EventTime => "event_time",
        TimeDomain::ProcessingTime => "processing_time",
    }
}

fn domain_of(name: &str) -> Option<TimeDomain> {
    match name {
        "event_time" => Some(TimeDomain::EventTime),
        "processing_time" => Some(TimeDomain::ProcessingTime),
        _ => None,
    }
}

/// Text when `bytes` are UTF-8, else base64: (text, base64).
fn text_or_b64(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(_) => (None, Some(B64.encode(bytes))),
    }
}

/// What one stored entry becomes in an export.
enum Exported {
    Line(Box<ExportLine>),
    Watermark(i64),
    /// The Iceberg sink's pending list (JSON text).
    IcebergPending(String),
    /// Derived by the backends (the time index, the timer count): not exported.
    Derived,
}

fn export_entry(key: &[u8], value: &Bytes, expires_at_ms: Option<u64>) -> Result<Exported, String> {
    if key == time_keys::WATERMARK_KEY {
        let ms = value
            .as_ref()
            .try_into()
            .map(i64::from_be_bytes)
            .map_err(|_| "the watermark is not 8 bytes".to_owned())?;
        return Ok(Exported::Watermark(ms));
    }
    if key.starts_with(&time_keys::TIME_INDEX) || key == time_keys::TIMER_COUNT_KEY {
        return Ok(Exported::Derived);
    }
    if key == ICEBERG_PENDING_KEY {
        return String::from_utf8(value.to_vec())
            .map(Exported::IcebergPending)
            .map_err(|_| "the Iceberg sink's pending list is not UTF-8".to_owned());
    }
    let Some((record_key, state, map_key)) = key::decode(key) else {
        return Err(format!("state key {} is not an encoding", hex::encode(key)));
    };
    let (key_text, key_b64) = text_or_b64(record_key);
    if state == time_keys::TIMER_STATE {
        let name = std::str::from_utf8(map_key).map_err(|_| {
            format!(
                "a timer of key {} has a name that is not UTF-8",
                hex::encode(record_key)
            )
        })?;
        let (domain, time_ms) = time_keys::decode_per_key_value(value)
            .ok_or_else(|| format!("timer `{name}` has a malformed value"))?;
        return Ok(Exported::Line(Box::new(ExportLine {
            key: key_text,
            key_b64,
            timer: Some(name.to_owned()),
            domain: Some(domain_name(domain).to_owned()),
            time_ms: Some(time_ms),
            ..ExportLine::default()
        })));
    }
    let (map_text, map_b64) = if map_key.is_empty() {
        (None, None)
    } else {
        text_or_b64(map_key)
    };
    Ok(Exported::Line(Box::new(ExportLine {
        key: key_text,
        key_b64,
        state: Some(state.to_owned()),
        map_key: map_text,
        map_key_b64: map_b64,
        value_b64: Some(B64.encode(value)),
        value: super::query::json_of(value),
        expires_at_ms,
        ..ExportLine::default()
    })))
}

/// Exports checkpoint `manifest` of the shard under `root` (of backend `backend`, partition
/// `partition`) to the object `target`, streamed (module docs). Entries past their TTL at the
/// clock's now are left out.
///
/// # Errors
/// [`ExportError`]; nothing usable is left at `target` (an export without its last line is
/// refused by the import).
pub async fn export_checkpoint(
    store: &Arc<dyn ObjectStore>,
    (root, manifest): (&Path, &Manifest),
    (backend, partition): (&str, i32),
    target: &Path,
    clock: &SharedClock,
) -> Result<ExportSummary, ExportError> {
    let offsets = InputOffsets::from_metadata(&manifest.metadata)
        .map_err(|reason| invalid(0, format!("the checkpoint's offsets: {reason}")))?;
    let header = ExportHeader {
        format: FORMAT.to_owned(),
        version: VERSION,
        partition,
        source_backend: backend.to_owned(),
        source_version: manifest.version,
        offsets: offsets.iter().map(|(t, n)| (t.to_owned(), n)).collect(),
    };
    let mut entries = CheckpointEntries::open(store, root, manifest, clock).await?;
    let mut out = object_store::buffered::BufWriter::new(store.clone(), target.clone());
    let mut buf = serde_json::to_vec(&header).expect("plain fields serialise");
    buf.push(b'\n');
    let (mut written, mut timers, mut bytes) = (0u64, 0u64, 0u64);
    let mut watermark_ms = None;
    let mut iceberg_pending = None;
    loop {
        let page = entries.next_page().await?;
        if page.is_empty() {
            break;
        }
        for (key, value, expires) in &page {
            match export_entry(key, value, *expires).map_err(|r| invalid(0, r))? {
                Exported::Line(line) => {
                    if line.timer.is_some() {
                        timers += 1;
                    } else {
                        written += 1;
                    }
                    serde_json::to_writer(&mut buf, &line).expect("plain fields serialise");
                    buf.push(b'\n');
                }
                Exported::Watermark(ms) => watermark_ms = Some(ms),
                Exported::IcebergPending(list) => iceberg_pending = Some(list),
                Exported::Derived => {}
            }
        }
        bytes += buf.len() as u64;
        out.write_all(&buf)
            .await
            .map_err(|e| ExportError::Unavailable(io_to_store(e)))?;
        buf.clear();
    }
    let end = ExportLine {
        end: Some(true),
        entries: Some(written),
        timers: Some(timers),
        watermark_ms,
        iceberg_pending,
        ..ExportLine::default()
    };
    serde_json::to_writer(&mut buf, &end).expect("plain fields serialise");
    buf.push(b'\n');
    bytes += buf.len() as u64;
    out.write_all(&buf)
        .await
        .map_err(|e| ExportError::Unavailable(io_to_store(e)))?;
    out.shutdown()
        .await
        .map_err(|e| ExportError::Unavailable(io_to_store(e)))?;
    Ok(ExportSummary {
        partition,
        entries: written,
        timers,
        bytes,
    })
}

fn io_to_store(e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "export",
        source: Box::new(e),
    }
}

/// The backend an import builds.
#[derive(Debug, Clone)]
pub enum ImportInto {
    /// SSTs written in key order into the level that would hold them, with `settings`' block
    /// and file sizes (a bulk load: nothing goes through a memtable).
    Lsm(LsmSettings),
    /// One snapshot.
    Memory,
}

/// Builds a checkpoint of the shard under `target` from the export at `export`: the backend's
/// objects under names of writer epoch `epoch` (above every epoch in the shard), and a
/// manifest-decided checkpoint at version `version` (above every version there) at the
/// export's offsets, written by `writer_token`. Returns what it read.
///
/// # Errors
/// [`ExportError::Invalid`] for a file that is not a complete export of format
/// [`VERSION`]; [`ExportError::Unavailable`]; a fenced commit (the shard was written
/// meanwhile) as [`ExportError::State`].
pub async fn import_checkpoint(
    store: &Arc<dyn ObjectStore>,
    export: &Path,
    target: &Path,
    into: ImportInto,
    (version, epoch, writer_token): (u64, u64, &str),
) -> Result<ExportSummary, ExportError> {
    let meta = store.head(export).await.map_err(ExportError::Unavailable)?;
    let reader = object_store::buffered::BufReader::new(store.clone(), &meta);
    let mut lines = reader.lines();
    let header: ExportHeader = match next_line(&mut lines).await? {
        Some(line) => {
            serde_json::from_str(&line).map_err(|e| invalid(1, format!("header: {e}")))?
        }
        None => return Err(invalid(1, "empty file")),
    };
    if header.format != FORMAT || header.version != VERSION {
        return Err(invalid(
            1,
            format!(
                "format `{}` version {}; this host reads `{FORMAT}` version {VERSION}",
                header.format, header.version
            ),
        ));
    }
    let mut sink = ImportSink::new(store, target, into, epoch);
    let mut time_index: Vec<Vec<u8>> = Vec::new();
    let (mut entries, mut timers) = (0u64, 0u64);
    let mut line_no = 1u64;
    let end = loop {
        line_no += 1;
        let Some(text) = next_line(&mut lines).await? else {
            return Err(invalid(
                line_no,
                "the export ends without its last line (incomplete)",
            ));
        };
        let line: ExportLine =
            serde_json::from_str(&text).map_err(|e| invalid(line_no, e.to_string()))?;
        if line.end == Some(true) {
            break line;
        }
        let record_key = bytes_of(line.key.as_deref(), line.key_b64.as_deref())
            .map_err(|r| invalid(line_no, format!("key: {r}")))?
            .ok_or_else(|| invalid(line_no, "no key"))?;
        if let Some(name) = &line.timer {
            let domain = line
                .domain
                .as_deref()
                .and_then(domain_of)
                .ok_or_else(|| invalid(line_no, "a timer without a valid domain"))?;
            let time_ms = line
                .time_ms
                .ok_or_else(|| invalid(line_no, "a timer without time_ms"))?;
            sink.add(
                time_keys::per_key(&record_key, name),
                Bytes::from(time_keys::per_key_value(domain, time_ms)),
                None,
            )
            .await
            .map_err(|r| invalid(line_no, r))?;
            time_index.push(time_keys::time_index(domain, time_ms, &record_key, name));
            timers += 1;
            continue;
        }
        let state = line
            .state
            .as_deref()
            .ok_or_else(|| invalid(line_no, "neither a state entry nor a timer"))?;
        if state.is_empty() || state.len() > 255 || state == time_keys::TIMER_STATE {
            return Err(invalid(
                line_no,
                format!("state name `{state}` is not allowed"),
            ));
        }
        let map_key = bytes_of(line.map_key.as_deref(), line.map_key_b64.as_deref())
            .map_err(|r| invalid(line_no, format!("map_key: {r}")))?
            .unwrap_or_default();
        let value = line
            .value_b64
            .as_deref()
            .map(|v| B64.decode(v))
            .transpose()
            .map_err(|e| invalid(line_no, format!("value_b64: {e}")))?
            .ok_or_else(|| invalid(line_no, "an entry without value_b64"))?;
        sink.add(
            key::map_key(&record_key, state, &map_key),
            Bytes::from(value),
            line.expires_at_ms,
        )
        .await
        .map_err(|r| invalid(line_no, r))?;
        entries += 1;
    };
    if end.entries != Some(entries) || end.timers != Some(timers) {
        return Err(invalid(
            line_no,
            format!(
                "the last line counts {:?} entries and {:?} timers; the file holds {entries} and {timers}",
                end.entries, end.timers
            ),
        ));
    }
    // The reserved keys sort after every state key: the timer count, the Iceberg sink's
    // pending list, the time index, the watermark (`c` < `i` < `t` < `w`).
    if timers > 0 {
        sink.add(
            time_keys::TIMER_COUNT_KEY.to_vec(),
            Bytes::copy_from_slice(&timers.to_be_bytes()),
            None,
        )
        .await
        .map_err(|r| invalid(0, r))?;
    }
    if let Some(list) = &end.iceberg_pending {
        sink.add(
            ICEBERG_PENDING_KEY.to_vec(),
            Bytes::from(list.clone().into_bytes()),
            None,
        )
        .await
        .map_err(|r| invalid(0, r))?;
    }
    time_index.sort_unstable();
    for index in time_index {
        sink.add(index, Bytes::new(), None)
            .await
            .map_err(|r| invalid(0, r))?;
    }
    if let Some(ms) = end.watermark_ms {
        sink.add(
            time_keys::WATERMARK_KEY.to_vec(),
            Bytes::copy_from_slice(&ms.to_be_bytes()),
            None,
        )
        .await
        .map_err(|r| invalid(0, r))?;
    }
    let mut offsets = InputOffsets::new();
    for (topic, next) in &header.offsets {
        offsets.advance(topic, next - 1);
    }
    let mut metadata = checkpoint_metadata(&offsets, DecidedBy::Manifest);
    let levels = sink.finish(version, &mut metadata).await?;
    let manifest = Manifest {
        version,
        parent: None,
        kind: ManifestKind::Checkpoint,
        writer_epoch: epoch,
        writer_token: writer_token.to_owned(),
        levels,
        metadata,
        rejected: Vec::new(),
    };
    ManifestStore::new(store.clone(), target.clone())
        .commit(&manifest)
        .await
        .map_err(|e| ExportError::State(e.into_state_error(target)))?;
    Ok(ExportSummary {
        partition: header.partition,
        entries,
        timers,
        bytes: meta.size,
    })
}

async fn next_line(
    lines: &mut tokio::io::Lines<object_store::buffered::BufReader>,
) -> Result<Option<String>, ExportError> {
    lines
        .next_line()
        .await
        .map_err(|e| ExportError::Unavailable(io_to_store(e)))
}

/// Bytes from a text field or its base64 twin; `None` when both are absent.
fn bytes_of(text: Option<&str>, b64: Option<&str>) -> Result<Option<Vec<u8>>, String> {
    match (text, b64) {
        (Some(_), Some(_)) => Err("both text and base64".into()),
        (Some(text), None) => Ok(Some(text.as_bytes().to_vec())),
        (None, Some(b64)) => B64.decode(b64).map(Some).map_err(|e| e.to_string()),
        (None, None) => Ok(None),
    }
}

/// Where an import puts the entries it reads, in strictly increasing key order.
struct ImportSink<'a> {
    store: &'a Arc<dyn ObjectStore>,
    target: &'a Path,
    epoch: u64,
    /// Names its objects apart from those of an import racing it (see
    /// [`super::savepoint::nonce`]).
    nonce: u32,
    seq_base: u64,
    last: Option<Vec<u8>>,
    kind: SinkKind,
}

enum SinkKind {
    Lsm {
        settings: Box<LsmSettings>,
        builder: Option<Box<SstBuilder>>,
        ssts: Vec<SstRef>,
    },
    Memory(Vec<(Vec<u8>, Bytes, Option<u64>)>),
}

impl<'a> ImportSink<'a> {
    fn new(
        store: &'a Arc<dyn ObjectStore>,
        target: &'a Path,
        into: ImportInto,
        epoch: u64,
    ) -> Self {
        let kind = match into {
            ImportInto::Lsm(settings) => SinkKind::Lsm {
                settings: Box::new(settings),
                builder: None,
                ssts: Vec::new(),
            },
            ImportInto::Memory => SinkKind::Memory(Vec::new()),
        };
        let nonce = super::savepoint::nonce();
        Self {
            store,
            target,
            epoch,
            nonce,
            seq_base: super::savepoint::seq_base(nonce),
            last: None,
            kind,
        }
    }

    async fn add(
        &mut self,
        key: Vec<u8>,
        value: Bytes,
        expires_at_ms: Option<u64>,
    ) -> Result<(), String> {
        if self.last.as_ref().is_some_and(|last| key <= *last) {
            return Err("entries are not in increasing key order".into());
        }
        self.last = Some(key.clone());
        match &mut self.kind {
            SinkKind::Memory(entries) => entries.push((key, value, expires_at_ms)),
            SinkKind::Lsm {
                settings,
                builder,
                ssts,
            } => {
                let b = builder.get_or_insert_with(|| {
                    Box::new(SstBuilder::new(
                        settings.block_size_bytes,
                        settings.compress,
                    ))
                });
                b.add(
                    &key,
                    &Entry::Put {
                        value,
                        expires_at_ms,
                    },
                )
                .map_err(|e| e.to_string())?;
                if b.data_bytes() as u64 >= settings.target_file_bytes {
                    let full = builder.take().expect("just used");
                    let seq = self.seq_base + ssts.len() as u64 + 1;
                    let sst = upload_sst(self.store, self.target, self.epoch, seq, *full)
                        .await
                        .map_err(|e| format!("{}", crate::error::Chain(&e)))?;
                    ssts.push(sst);
                }
            }
        }
        Ok(())
    }

    /// Writes what is left; the manifest's levels (the `lsm` SSTs in one level), and the
    /// snapshot's name in `metadata` for `memory`.
    async fn finish(
        self,
        version: u64,
        metadata: &mut BTreeMap<String, String>,
    ) -> Result<Vec<Vec<SstRef>>, ExportError> {
        match self.kind {
            SinkKind::Memory(entries) => {
                let object =
                    snapshot::encode(entries.iter().map(|(k, v, e)| (k.as_slice(), v, *e)));
                let name = format!(
                    "snapshot/{:010}-{version:020}-{:08x}.snap",
                    self.epoch, self.nonce
                );
                self.store
                    .put(
                        &Path::from(format!("{}/{name}", self.target)),
                        PutPayload::from(object),
                    )
                    .await
                    .map_err(ExportError::Unavailable)?;
                metadata.insert(snapshot::SNAPSHOT_KEY.to_owned(), name);
                Ok(Vec::new())
            }
            SinkKind::Lsm {
                settings,
                builder,
                mut ssts,
            } => {
                if let Some(rest) = builder.filter(|b| !b.is_empty()) {
                    let seq = self.seq_base + ssts.len() as u64 + 1;
                    ssts.push(upload_sst(self.store, self.target, self.epoch, seq, *rest).await?);
                }
                let mut levels = vec![Vec::new(); settings.levels_max.max(2)];
                let bytes = ssts.iter().map(|s| s.size_bytes).sum();
                levels[level_for(bytes, &settings)] = ssts;
                Ok(levels)
            }
        }
    }
}

/// The level leveled compaction would keep `bytes` of data in: the lowest whose target holds
/// them (level 1 holds `level_base_bytes`, each next `level_size_ratio` times more), so that
/// overwrites and deletes after the import compact into it as usual — in the last level they
/// would wait for every level above to fill.
fn level_for(bytes: u64, settings: &LsmSettings) -> usize {
    let levels = settings.levels_max.max(2);
    let mut target = settings.level_base_bytes;
    let mut level = 1;
    while bytes > target && level + 1 < levels {
        target = target.saturating_mul(settings.level_size_ratio);
        level += 1;
    }
    level
}

async fn upload_sst(
    store: &Arc<dyn ObjectStore>,
    target: &Path,
    epoch: u64,
    seq: u64,
    builder: SstBuilder,
) -> Result<SstRef, ExportError> {
    let (first, last) = builder
        .key_range()
        .map(|(f, l)| (f.to_vec(), l.to_vec()))
        .expect("only non-empty SSTs are written");
    let file = builder.finish();
    let id = SstId {
        writer_epoch: epoch,
        seq,
    };
    let size_bytes = file.len() as u64;
    store
        .put(
            &Path::from(format!("{target}/{}", id.object_name())),
            PutPayload::from(file),
        )
        .await
        .map_err(ExportError::Unavailable)?;
    Ok(SstRef {
        writer_epoch: epoch,
        seq,
        size_bytes,
        first_key: first,
        last_key: last,
    })
}

#[cfg(test)]
mod tests;
