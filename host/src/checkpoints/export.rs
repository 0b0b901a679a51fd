//! The portable state format (issue 20, item 2): one checkpoint of one shard as JSON lines,
//! independent of the backend that wrote it, and the import that builds either backend from
//! it directly.
//!
//! # Why JSON lines
//! DuckDB (`read_json('00000.jsonl')`), `jq` and pandas open it as it is (pyarrow's reader
//! only when every decoded `value` has one type); it needed no dependency when it was chosen
//! (the Iceberg sink has since brought the arrow and parquet crates in), and its lines stream,
//! so neither side holds a shard. Values are bytes (`value_b64`); a value that is JSON (what the SDKs' typed states
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
//!   the table (docs/iceberg.md), as it keeps it; a shard of a stage that reads an internal
//!   topic adds `edges`, what it keeps of its upstream shards (frontiers, watermarks:
//!   `crate::time::edge::EdgeState`, its JSON text).
//! - What the backends derive (the time index that fires timers in time order, the count of
//!   pending timers) is not exported: the import builds it again from the timers.

use crate::clock::SharedClock;
use crate::ids::{ManifestVersion, Offset, Partition};
use crate::runtime::TimeDomain;
use crate::state::StateError;
use crate::state::checkpoint::{DecidedBy, InputOffsets, checkpoint_metadata};
use crate::state::key;
use crate::state::lsm::cache::{BlockCaches, SstFiles};
use crate::state::lsm::sst::Entry;
use crate::state::lsm::sst::builder::SstBuilder;
use crate::state::lsm::tree::{LsmSettings, LsmTree, SstId};
use crate::state::manifest::{Manifest, ManifestStore, SstRef};
use crate::state::snapshot;
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
    pub partition: Partition,
    /// The backend it was exported from (`lsm` or `memory`).
    pub source_backend: String,
    /// The checkpoint's manifest version in the shard it was exported from.
    pub source_version: ManifestVersion,
    /// Where the input resumes: Kafka topic → next offset.
    pub offsets: BTreeMap<String, Offset>,
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
    /// The last line: what a stage's shard keeps of its edges (`crate::time::edge::EdgeState`,
    /// the JSON text the shard keeps), if it has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edges: Option<String>,
}

/// What an export or import moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExportSummary {
    /// The input partition.
    pub partition: Partition,
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
    /// A stage's edge state (JSON text).
    Edges(String),
    /// Derived by the backends (the time index, the timer count): not exported.
    Derived,
}

/// One stored entry as the export writes it (line 0 of any error: the checkpoint, not a file
/// line, is what is wrong).
fn export_entry(
    key: &[u8],
    value: &Bytes,
    expires_at_ms: Option<u64>,
) -> Result<Exported, ExportError> {
    if key == time_keys::WATERMARK_KEY {
        let ms = value
            .as_ref()
            .try_into()
            .map(i64::from_be_bytes)
            .map_err(|_| invalid(0, "the watermark is not 8 bytes"))?;
        return Ok(Exported::Watermark(ms));
    }
    if key.starts_with(&time_keys::TIME_INDEX) || key == time_keys::TIMER_COUNT_KEY {
        return Ok(Exported::Derived);
    }
    if key == crate::time::edge::EDGES_KEY {
        return String::from_utf8(value.to_vec())
            .map(Exported::Edges)
            .map_err(|_| invalid(0, "the edge state is not UTF-8"));
    }
    if key == time_keys::TABLE_PENDING_KEY {
        return String::from_utf8(value.to_vec())
            .map(Exported::IcebergPending)
            .map_err(|_| invalid(0, "the Iceberg sink's pending list is not UTF-8"));
    }
    let Some((record_key, state, map_key)) = key::decode(key) else {
        return Err(invalid(
            0,
            format!("state key {} is not an encoding", hex::encode(key)),
        ));
    };
    let (key_text, key_b64) = text_or_b64(record_key);
    if state == time_keys::TIMER_STATE {
        let name = std::str::from_utf8(map_key).map_err(|_| {
            invalid(
                0,
                format!(
                    "a timer of key {} has a name that is not UTF-8",
                    hex::encode(record_key)
                ),
            )
        })?;
        let (domain, time_ms) = time_keys::decode_per_key_value(value)
            .ok_or_else(|| invalid(0, format!("timer `{name}` has a malformed value")))?;
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
    (backend, partition): (&str, Partition),
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
    let (mut iceberg_pending, mut edges) = (None, None);
    loop {
        let page = entries.next_page().await?;
        if page.is_empty() {
            break;
        }
        for (key, value, expires) in &page {
            match export_entry(key, value, *expires)? {
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
                Exported::Edges(state) => edges = Some(state),
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
        edges,
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

mod import;
pub use import::import_checkpoint;

#[cfg(test)]
mod tests;
