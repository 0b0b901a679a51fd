//! Deleting a pipeline's orphan data files (docs/iceberg.md, "Exactly once"): files a shard
//! wrote for a checkpoint that never became decided (a crash between the upload and the
//! manifest, an exactly-once transaction that did not commit), which no snapshot will ever
//! list.
//!
//! A file of the pipeline (named `weir-{uid}-…` in the table's data directory) is deleted when
//! it is older than the grace period, no snapshot the table still has lists it (time travel to
//! any of them keeps working), and no shard's pending list names it. The grace period covers
//! a file uploaded for a checkpoint not yet decided: an exactly-once checkpoint is decided
//! within its transaction's timeout (at most 15 minutes) or never.

use futures::TryStreamExt;
use iceberg::table::Table;
use object_store::ObjectStoreExt;
use std::collections::BTreeSet;
use std::time::Duration;

/// How old an unlisted file must be before it is deleted, by default
/// (`iceberg.orphan_file_age`): well past the longest an
/// exactly-once checkpoint can stay undecided (the transaction timeout, at most 15 minutes).
pub const ORPHAN_GRACE: Duration = Duration::from_secs(3600);

/// Every data file any snapshot of `table` lists (reads each manifest once).
///
/// # Errors
/// [`iceberg::Error`] when a manifest cannot be read.
pub async fn files_in_any_snapshot(table: &Table) -> iceberg::Result<BTreeSet<String>> {
    let mut manifests = BTreeSet::new();
    let mut files = BTreeSet::new();
    for snapshot in table.metadata().snapshots() {
        let list = table.manifest_list_reader(snapshot).load().await?;
        for manifest in list.entries() {
            if !manifests.insert(manifest.manifest_path.clone()) {
                continue;
            }
            let manifest = manifest.load_manifest(table.file_io()).await?;
            files.extend(
                manifest
                    .entries()
                    .iter()
                    .map(|e| e.data_file().file_path().to_owned()),
            );
        }
    }
    Ok(files)
}

/// Deletes pipeline `uid`'s orphan data files of `table` (module docs) older than `grace` at
/// `now_ms`; `pending` names the files shards still list; `warehouse` reaches the files.
/// Returns the locations deleted.
///
/// # Errors
/// [`iceberg::Error`] when the table's manifests cannot be read or the store fails; nothing
/// listed in the table is deleted then.
pub async fn delete_orphans(
    table: &Table,
    uid: &str,
    pending: &BTreeSet<String>,
    warehouse: &super::storage::WarehouseStorage,
    grace: Duration,
    now_ms: u64,
) -> iceberg::Result<Vec<String>> {
    let store = warehouse.store()?;
    let failed = |e: object_store::Error| {
        iceberg::Error::new(iceberg::ErrorKind::Unexpected, "listing data files failed")
            .with_source(e)
    };
    let data = format!("{}/data", table.metadata().location());
    let prefix = warehouse.object_path(&data)?;
    let ours = format!("weir-{uid}-");
    let listed: Vec<_> = store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(failed)?;
    let candidates: Vec<(String, object_store::path::Path)> = listed
        .into_iter()
        .filter(|m| m.location.filename().is_some_and(|n| n.starts_with(&ours)))
        .filter(|m| {
            let age_ms = now_ms.saturating_sub(m.last_modified.timestamp_millis().max(0) as u64);
            age_ms >= grace.as_millis() as u64
        })
        .map(|m| {
            let rest = m
                .location
                .as_ref()
                .strip_prefix(prefix.as_ref())
                .unwrap_or_default()
                .to_owned();
            (format!("{data}{rest}"), m.location)
        })
        .filter(|(location, _)| !pending.contains(location))
        .collect();
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let in_table = files_in_any_snapshot(table).await?;
    let mut deleted = Vec::new();
    for (location, path) in candidates {
        if in_table.contains(&location) {
            continue;
        }
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted.push(location),
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(deleted)
}
