//! The import half of the portable state format (module docs of [`super`]): an export read
//! line by line and built into either backend directly — `lsm` as SSTs written in key order
//! into the level that would hold them, `memory` as one snapshot — then committed as a
//! manifest-decided checkpoint.

use super::*;
use crate::ids::ManifestVersion;
use crate::state::stored::CheckpointFormat;

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
    into: CheckpointFormat,
    (version, epoch, writer_token): (u64, u64, &str),
) -> Result<ExportSummary, ExportError> {
    let meta = store.head(export).await.map_err(ExportError::Unavailable)?;
    let reader = object_store::buffered::BufReader::new(store.clone(), &meta);
    let mut lines = reader.lines();
    let header = read_header(&mut lines).await?;
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
        match parse(line_no, line)? {
            Parsed::Timer { key, value, index } => {
                sink.add(line_no, key, value, None).await?;
                time_index.push(index);
                timers += 1;
            }
            Parsed::Entry {
                key,
                value,
                expires_at_ms,
            } => {
                sink.add(line_no, key, value, expires_at_ms).await?;
                entries += 1;
            }
        }
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
    add_reserved(&mut sink, &end, timers, time_index).await?;
    let mut offsets = InputOffsets::new();
    for (topic, next) in &header.offsets {
        offsets.advance(topic, *next - 1);
    }
    let mut metadata = checkpoint_metadata(&offsets, DecidedBy::Manifest);
    let levels = sink.finish(ManifestVersion(version), &mut metadata).await?;
    let manifest = Manifest::fresh_checkpoint((version, epoch, writer_token), levels, metadata);
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

/// The export's first line, of this host's format and version.
async fn read_header(
    lines: &mut tokio::io::Lines<object_store::buffered::BufReader>,
) -> Result<ExportHeader, ExportError> {
    let header: ExportHeader = match next_line(lines).await? {
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
    Ok(header)
}

/// A line of an export as the keys and values it becomes.
enum Parsed {
    /// A timer: its per-key entry, and its time index key (written after every state key).
    Timer {
        key: Vec<u8>,
        value: Bytes,
        index: Vec<u8>,
    },
    /// A state entry.
    Entry {
        key: Vec<u8>,
        value: Bytes,
        expires_at_ms: Option<u64>,
    },
}

/// Line `line_no` (not the last) as what it becomes; invalid when a field is missing or bad.
fn parse(line_no: u64, line: ExportLine) -> Result<Parsed, ExportError> {
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
        return Ok(Parsed::Timer {
            key: time_keys::per_key(&record_key, name),
            value: Bytes::from(time_keys::per_key_value(domain, time_ms)),
            index: time_keys::time_index(domain, time_ms, &record_key, name),
        });
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
    Ok(Parsed::Entry {
        key: key::map_key(&record_key, state, &map_key),
        value: Bytes::from(value),
        expires_at_ms: line.expires_at_ms,
    })
}

/// The reserved keys, which sort after every state key: the timer count, the edge state, the
/// Iceberg sink's pending list, the time index, the watermark (`c` < `e` < `i` < `t` < `w`).
async fn add_reserved(
    sink: &mut ImportSink<'_>,
    end: &ExportLine,
    timers: u64,
    mut time_index: Vec<Vec<u8>>,
) -> Result<(), ExportError> {
    if timers > 0 {
        sink.add(
            0,
            time_keys::TIMER_COUNT_KEY.to_vec(),
            Bytes::copy_from_slice(&timers.to_be_bytes()),
            None,
        )
        .await?;
    }
    if let Some(state) = &end.edges {
        sink.add(
            0,
            crate::time::edge::EDGES_KEY.to_vec(),
            Bytes::from(state.clone().into_bytes()),
            None,
        )
        .await?;
    }
    if let Some(list) = &end.iceberg_pending {
        sink.add(
            0,
            time_keys::TABLE_PENDING_KEY.to_vec(),
            Bytes::from(list.clone().into_bytes()),
            None,
        )
        .await?;
    }
    time_index.sort_unstable();
    for index in time_index {
        sink.add(0, index, Bytes::new(), None).await?;
    }
    if let Some(ms) = end.watermark_ms {
        sink.add(
            0,
            time_keys::WATERMARK_KEY.to_vec(),
            Bytes::copy_from_slice(&ms.to_be_bytes()),
            None,
        )
        .await?;
    }
    Ok(())
}

async fn next_line(
    lines: &mut tokio::io::Lines<object_store::buffered::BufReader>,
) -> Result<Option<String>, ExportError> {
    lines
        .next_line()
        .await
        .map_err(|e| ExportError::Unavailable(io_to_store(e)))
}

/// Why a field of bytes (text, or its base64 twin) does not read.
#[derive(Debug, thiserror::Error)]
enum BytesFieldError {
    #[error("both text and base64")]
    Both,
    #[error(transparent)]
    Base64(#[from] base64::DecodeError),
}

/// Bytes from a text field or its base64 twin; `None` when both are absent.
fn bytes_of(text: Option<&str>, b64: Option<&str>) -> Result<Option<Vec<u8>>, BytesFieldError> {
    match (text, b64) {
        (Some(_), Some(_)) => Err(BytesFieldError::Both),
        (Some(text), None) => Ok(Some(text.as_bytes().to_vec())),
        (None, Some(b64)) => Ok(Some(B64.decode(b64)?)),
        (None, None) => Ok(None),
    }
}

/// Where an import puts the entries it reads, in strictly increasing key order.
struct ImportSink<'a> {
    store: &'a Arc<dyn ObjectStore>,
    target: &'a Path,
    epoch: u64,
    /// Names its objects apart from those of an import racing it (see
    /// [`crate::checkpoints::savepoint::nonce`]).
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
        into: CheckpointFormat,
        epoch: u64,
    ) -> Self {
        let kind = match into {
            CheckpointFormat::Lsm(settings) => SinkKind::Lsm {
                settings: Box::new(settings),
                builder: None,
                ssts: Vec::new(),
            },
            CheckpointFormat::Memory => SinkKind::Memory(Vec::new()),
        };
        let nonce = crate::checkpoints::savepoint::nonce();
        Self {
            store,
            target,
            epoch,
            nonce,
            seq_base: crate::checkpoints::savepoint::seq_base(nonce),
            last: None,
            kind,
        }
    }

    /// Adds the entry the export's `line` (0: none in particular) gives.
    ///
    /// # Errors
    /// [`ExportError::Invalid`] for an entry out of key order or one no SST can hold;
    /// a failed upload as [`upload_sst`] says it (the store unavailable, retry).
    async fn add(
        &mut self,
        line: u64,
        key: Vec<u8>,
        value: Bytes,
        expires_at_ms: Option<u64>,
    ) -> Result<(), ExportError> {
        if self.last.as_ref().is_some_and(|last| key <= *last) {
            return Err(invalid(line, "entries are not in increasing key order"));
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
                .map_err(|e| invalid(line, e.to_string()))?;
                if b.data_bytes() as u64 >= settings.target_file_bytes {
                    let full = builder.take().expect("just used");
                    let seq = self.seq_base + ssts.len() as u64 + 1;
                    let sst = upload_sst(self.store, self.target, self.epoch, seq, *full).await?;
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
        version: ManifestVersion,
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
