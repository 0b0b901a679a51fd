//! A stage's global table through `GET /v1/pipelines/{name}/state/{table}?stage=…`: its rows
//! as the table's newest snapshot holds them (docs/topologies.md, "Global tables"), read by
//! whichever host answers. A point read (`key`) or an ordered, paged scan (`prefix`), as for
//! keyed state; the page says the topic offsets its rows reflect (`table_offsets`).
//!
//! Every host that runs the stage writes the whole table to one object now and then (the last
//! write wins). A scan's pages read the snapshot of its first page, named in the page token by
//! its ETag: when another host has written a newer one since, the next page answers 410 and
//! the scan starts again, as one whose checkpoints were collected. Savepoints do not hold
//! global tables (a restore reads them from their topics), so a read of one with `savepoint`
//! answers 400.

use super::{
    PipelineRecord, Read, ReadKind, ShardRun, StateEntry, StatePage, TableOffset, encode_token,
    text_or_b64, unavailable,
};
use crate::api::ApiState;
use crate::api::problem::ApiError;
use crate::catalog::pipelines::kafka_topic;
use crate::ids::Partition;
use crate::pipeline::global_tables::Snapshots;
use crate::state::global_table::GlobalTable;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

/// The Kafka topic of the global table `name` that `run`'s stage reads; `None` when the stage
/// reads no global table of that name (or `run` is a one-operator pipeline's).
pub(super) fn global_table_topic(
    tenant: &str,
    record: &PipelineRecord,
    run: &ShardRun,
    name: &str,
) -> Option<String> {
    let stage = record
        .spec
        .stages
        .iter()
        .find(|s| Some(&s.name) == run.stage.as_ref())?;
    stage.inputs.iter().find_map(|input| {
        let (topic, table) = input.as_global_table()?;
        (table == name).then(|| kafka_topic(tenant, topic))
    })
}

/// What one read of a global table asks: which table, what, and from where.
pub(super) struct TableRead<'a> {
    /// The table's name, as the stage names it.
    pub name: String,
    /// Its topic, as Kafka names it.
    pub topic: &'a str,
    /// The key or prefix, and the page size.
    pub read: &'a Read,
    /// The page token's snapshot ETag and last key, when a scan goes on.
    pub after: Option<(Option<String>, Vec<u8>)>,
    /// The token's binding ([`super::binding`]), for the next token.
    pub bound: String,
}

impl<'a> TableRead<'a> {
    /// The read of table `name` (topic `topic`) that `read` and the page `token` ask.
    ///
    /// # Errors
    /// 400 when the token's last key is not base64.
    pub(super) fn of(
        name: String,
        topic: &'a str,
        read: &'a Read,
        token: Option<super::PageToken>,
        bound: String,
    ) -> Result<Self, ApiError> {
        let after = token
            .map(|t| Ok::<_, base64::DecodeError>((t.t, B64.decode(&t.a)?)))
            .transpose()
            .map_err(|_| ApiError::bad_request("the page token does not decode"))?;
        Ok(Self {
            name,
            topic,
            read,
            after,
            bound,
        })
    }
}

/// One page of the global table `read.topic` of `run`'s stage, from its newest snapshot; an
/// empty page when none is saved yet.
///
/// # Errors
/// 400 for a savepoint's; 410 when a scan's snapshot was replaced since its first page; 503
/// when the store fails or the snapshot is damaged.
pub(super) async fn read(
    state: &ApiState,
    tenant: &str,
    (record, run): (&PipelineRecord, &ShardRun),
    read: TableRead<'_>,
    savepoint: Option<&str>,
) -> Result<StatePage, ApiError> {
    if savepoint.is_some() {
        return Err(ApiError::bad_request(format!(
            "`{}` is a global table: savepoints do not hold global tables (a restore reads them \
             from their topic); read it without `savepoint`",
            read.name
        )));
    }
    let Some((bytes, e_tag)) = snapshot(state, tenant, (record, run), &read).await? else {
        return Ok(page(read.name, Vec::new(), Vec::new(), None));
    };
    // Decoding a large table, and sorting its keys, take a while: not on the API's workers.
    let (kind, limit) = (read.read.kind.clone(), read.read.limit);
    let after = read.after.as_ref().map(|(_, key)| key.clone());
    let selected = tokio::task::spawn_blocking(move || {
        let table = GlobalTable::from_snapshot(&bytes)?;
        let (rows, more) = match &kind {
            ReadKind::Key(key) => (
                table
                    .get(key)
                    .map(|v| (key.clone(), v))
                    .into_iter()
                    .collect(),
                false,
            ),
            ReadKind::Prefix(prefix) => table.scan(prefix, after.as_deref(), limit),
        };
        Ok::<_, crate::state::global_table::SnapshotError>((rows, more, table.offsets()))
    })
    .await;
    let (rows, more, offsets) = match selected {
        Ok(Ok(selected)) => selected,
        Ok(Err(e)) => return Err(unavailable(&record.name, &e)),
        Err(e) => return Err(unavailable(&record.name, &e)),
    };
    let next_page_token = match rows.last() {
        Some((last, _)) if more => Some(encode_token(&super::PageToken {
            v: Vec::new(),
            a: B64.encode(last),
            q: read.bound,
            s: None,
            l: None,
            t: e_tag,
        })),
        _ => None,
    };
    let offsets = offsets
        .into_iter()
        .map(|(partition, next_offset)| TableOffset {
            partition,
            next_offset,
        })
        .collect();
    Ok(page(read.name, offsets, rows, next_page_token))
}

/// The table's newest snapshot, and its ETag; `None` when none is saved yet.
///
/// # Errors
/// 410 when a scan's first page read another snapshot (or one that is gone since); 503 when
/// the store fails.
async fn snapshot(
    state: &ApiState,
    tenant: &str,
    (record, run): (&PipelineRecord, &ShardRun),
    read: &TableRead<'_>,
) -> Result<Option<(bytes::Bytes, Option<String>)>, ApiError> {
    let replaced = || {
        ApiError::gone(
            "the global table's snapshot was replaced since this scan's first page: start it \
             again without the page token",
        )
    };
    let shard0 = crate::state::ShardId {
        pipeline: run.shards.clone(),
        partition: Partition(0),
    }
    .root_under(&state.catalog.pipeline_state_prefix(tenant, &record.uid));
    let store = state.catalog.store().clone();
    let path = Snapshots::beside_shards(store.clone(), &shard0).path(read.topic);
    let first = read.after.as_ref().and_then(|(e_tag, _)| e_tag.clone());
    // A later page reads the first page's snapshot or none: a replaced one is not downloaded.
    let options = object_store::GetOptions {
        if_match: first.clone(),
        ..Default::default()
    };
    let got = match store.get_opts(&path, options).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) if first.is_some() => return Err(replaced()),
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(object_store::Error::Precondition { .. }) => return Err(replaced()),
        Err(e) => return Err(unavailable(&record.name, &e)),
    };
    let e_tag = got.meta.e_tag.clone();
    // (A store that ignores `If-Match`.)
    if first.is_some() && e_tag != first {
        return Err(replaced());
    }
    let bytes = got
        .bytes()
        .await
        .map_err(|e| unavailable(&record.name, &e))?;
    Ok(Some((bytes, e_tag)))
}

/// A page of rows (key, the topic's value as produced: no state version header).
fn page(
    name: String,
    table_offsets: Vec<TableOffset>,
    rows: Vec<(Vec<u8>, bytes::Bytes)>,
    next_page_token: Option<String>,
) -> StatePage {
    let entries = rows
        .into_iter()
        .map(|(key, value)| {
            let (key, key_b64) = text_or_b64(&key);
            StateEntry {
                key,
                key_b64,
                map_key: None,
                map_key_b64: None,
                value_b64: B64.encode(&value),
                value: serde_json::from_slice(&value).ok(),
                expires_at_ms: None,
                partition: None,
            }
        })
        .collect();
    StatePage {
        state: name,
        checkpoints: Vec::new(),
        table_offsets,
        entries,
        next_page_token,
    }
}
