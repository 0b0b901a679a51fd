//! Committing prepared checkpoints' data files to the table, exactly once (docs/iceberg.md,
//! "Exactly once").
//!
//! Each shard's checkpoint versions only grow (a claim, a fallback and a reset all take a
//! version above every earlier one), so "what is in the table" is, per shard of the pipeline,
//! the highest checkpoint whose files were committed. A commit records it twice, atomically
//! with the append:
//!
//! - in the snapshot's summary: `weir.pipeline-id` and `weir.shard.{partition}` = version,
//!   for each shard the snapshot carries (as Flink's Iceberg sink records
//!   `flink.max-committed-checkpoint-id`);
//! - in the table property `weir.committed.{pipeline id}` (a JSON map partition → version),
//!   which snapshot expiry cannot remove.
//!
//! [`committed_versions`] takes the highest of both over *every* snapshot the table still
//! has (not only the current one's ancestry: another writer may have committed after ours).
//! A committer that starts (recovery) also looks for the pending checkpoints' uniquely named
//! files in the table's manifests ([`files_in_table`]), so that a table whose property was
//! lost and whose snapshots expired still does not get them twice.
//!
//! The same commit raises the table property `weir.covered.{pipeline id}` (a JSON map
//! partition → [`Covered`]): per shard, the input offsets and the event-time timers whose
//! rows the table holds ([`committed_covered`]). A shard that resumes behind it — reset to a
//! savepoint, or fallen back past a committed checkpoint — does not write its replayed rows
//! again.
//!
//! Commits are compare-and-swap on the catalog's metadata pointer and are not retried by the
//! `iceberg` crate (a catalog wrapper, `NoRetry`, that also pins the table decided on): on a conflict the committer reloads the table and decides
//! again, so that two committers of one pipeline (a zombie and its successor) never both
//! append one checkpoint.

use crate::ids::{ManifestVersion, Offset, Partition};
use async_trait::async_trait;
use iceberg::spec::{DataFile, Snapshot};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{
    Catalog, Error, ErrorKind, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// The snapshot summary key naming the pipeline (its uid) that committed the snapshot.
pub const SUMMARY_PIPELINE: &str = "weir.pipeline-id";
/// The snapshot summary key prefix of a shard's highest committed checkpoint:
/// `weir.shard.{partition}`.
pub const SUMMARY_SHARD_PREFIX: &str = "weir.shard.";
/// The table property prefix of a pipeline's committed checkpoints: `weir.committed.{uid}`.
pub const PROPERTY_COMMITTED_PREFIX: &str = "weir.committed.";

/// The table property prefix of what a pipeline's committed checkpoints cover:
/// `weir.covered.{uid}`, a JSON map partition → [`Covered`].
pub const PROPERTY_COVERED_PREFIX: &str = "weir.covered.";

/// What a shard's checkpoint covers: the rows of the input below `offsets`, and of the
/// event-time timers fired through `timers_through_ms`. For the table, the most of its
/// committed checkpoints' ([`committed_covered`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Covered {
    /// Per input topic, the next offset to read.
    #[serde(default)]
    pub offsets: BTreeMap<String, Offset>,
    /// Every event-time timer with a time (ms since the epoch) at or before this had fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers_through_ms: Option<i64>,
}

impl Covered {
    /// Raises each offset and the timer time to `other`'s where it is ahead.
    pub fn raise(&mut self, other: &Covered) {
        for (topic, &next) in &other.offsets {
            let o = self.offsets.entry(topic.clone()).or_insert(next);
            *o = (*o).max(next);
        }
        self.timers_through_ms = self.timers_through_ms.max(other.timers_through_ms);
    }
}

/// Per shard (partition), what the table holds of pipeline `uid`'s output, as [`commit`]
/// recorded it (empty without it).
pub fn committed_covered(table: &Table, uid: &str) -> BTreeMap<Partition, Covered> {
    table
        .metadata()
        .properties()
        .get(&format!("{PROPERTY_COVERED_PREFIX}{uid}"))
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// How many times a commit reloads and decides again after a conflict before it gives up
/// until the next commit interval.
const CONFLICT_RETRIES_MAX: usize = 8;

/// One shard's checkpoint whose files wait for a table commit.
#[derive(Debug, Clone)]
pub struct PendingCheckpoint {
    /// The shard (input partition).
    pub partition: Partition,
    /// The checkpoint's manifest version.
    pub version: ManifestVersion,
    /// Its data files.
    pub files: Vec<DataFile>,
    /// What it covers (empty in lists written before it was recorded).
    pub covered: Covered,
}

/// What a commit did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitReport {
    /// The table snapshot made, if any.
    pub snapshot_id: Option<i64>,
    /// Files appended.
    pub files: usize,
    /// Rows appended.
    pub rows: u64,
    /// Pending checkpoints found already committed and skipped.
    pub skipped: usize,
    /// Per shard, the highest committed checkpoint after the commit.
    pub committed: BTreeMap<Partition, ManifestVersion>,
}

/// Per shard, the highest checkpoint of pipeline `uid` whose files are in `table`: the most
/// of the table property and every snapshot's summary.
pub fn committed_versions(table: &Table, uid: &str) -> BTreeMap<Partition, ManifestVersion> {
    let mut committed = BTreeMap::new();
    let mut raise = |partition: Partition, version: ManifestVersion| {
        let entry = committed.entry(partition).or_insert(version);
        *entry = (*entry).max(version);
    };
    let metadata = table.metadata();
    if let Some(text) = metadata
        .properties()
        .get(&format!("{PROPERTY_COMMITTED_PREFIX}{uid}"))
        && let Ok(map) = serde_json::from_str::<BTreeMap<i32, u64>>(text)
    {
        map.into_iter()
            .for_each(|(p, v)| raise(Partition(p), ManifestVersion(v)));
    }
    for snapshot in metadata.snapshots() {
        for (partition, version) in summary_versions(snapshot, uid) {
            raise(partition, ManifestVersion(version));
        }
    }
    committed
}

fn summary_versions(snapshot: &Snapshot, uid: &str) -> Vec<(Partition, u64)> {
    let properties = &snapshot.summary().additional_properties;
    if properties.get(SUMMARY_PIPELINE).map(String::as_str) != Some(uid) {
        return Vec::new();
    }
    properties
        .iter()
        .filter_map(|(k, v)| {
            let partition = k.strip_prefix(SUMMARY_SHARD_PREFIX)?.parse().ok()?;
            Some((Partition(partition), v.parse().ok()?))
        })
        .collect()
}

/// Which of `paths` any snapshot the table still has lists (reads every manifest once: the
/// recovery check, not the steady state's). A file that table maintenance rewrote and whose
/// older snapshots expired is not found: the table property is what remembers it then.
///
/// # Errors
/// [`iceberg::Error`] when a manifest cannot be read.
pub async fn files_in_table(
    table: &Table,
    paths: &BTreeSet<&str>,
) -> iceberg::Result<BTreeSet<String>> {
    let listed = super::orphans::files_in_any_snapshot(table).await?;
    Ok(paths
        .iter()
        .filter(|p| listed.contains(**p))
        .map(|p| (*p).to_owned())
        .collect())
}

/// Appends the files of every pending checkpoint above what the table already has of
/// pipeline `uid`, in one snapshot, recording each shard's highest checkpoint.
/// `look_for_files` also skips checkpoints whose files the table lists (a committer's first
/// commit: see the module docs). Checkpoints with no files only move nothing.
///
/// # Errors
/// [`iceberg::Error`] when the catalog or the warehouse fails, or conflicts persist; nothing
/// was committed by this call then — or it was, and the next call sees it.
pub async fn commit(
    catalog: &Arc<dyn Catalog>,
    ident: &TableIdent,
    uid: &str,
    pending: &[PendingCheckpoint],
    look_for_files: bool,
) -> iceberg::Result<CommitReport> {
    let mut attempt = 0;
    loop {
        let table = catalog.load_table(ident).await?;
        let (chosen, mut committed, skipped) = choose(&table, uid, pending, look_for_files).await?;
        let mut report = CommitReport {
            skipped,
            ..CommitReport::default()
        };
        if chosen.is_empty() {
            report.committed = committed;
            return Ok(report);
        }
        let tx = append(&table, uid, &chosen, &mut committed, &mut report)?;
        // The transaction commits onto exactly the table decided on: a table another
        // committer changed meanwhile fails the swap, and the loop decides again.
        let decided = NoRetry {
            inner: catalog.clone(),
            decided: table.clone(),
        };
        fail::fail_point!("iceberg-before-commit", |_| crate::fail_points::crash(
            "iceberg-before-commit"
        ));
        match tx.commit(&decided).await {
            Ok(table) => {
                fail::fail_point!("iceberg-after-commit", |_| crate::fail_points::crash(
                    "iceberg-after-commit"
                ));
                report.snapshot_id = table.metadata().current_snapshot_id();
                report.committed = committed;
                return Ok(report);
            }
            Err(e) if e.kind() == ErrorKind::CatalogCommitConflicts => {
                attempt += 1;
                if attempt > CONFLICT_RETRIES_MAX {
                    return Err(e);
                }
                tracing::debug!(table = %ident, attempt, "iceberg commit conflicted; deciding again");
            }
            Err(e) => return Err(e),
        }
    }
}

/// The pending checkpoints with files that `table` does not have yet (above the versions it
/// records for pipeline `uid`, and with `look_for_files` none of whose files it lists), the
/// versions it has (raised by the checkpoints found listed), and how many were skipped.
async fn choose<'p>(
    table: &Table,
    uid: &str,
    pending: &'p [PendingCheckpoint],
    look_for_files: bool,
) -> iceberg::Result<(
    Vec<&'p PendingCheckpoint>,
    BTreeMap<Partition, ManifestVersion>,
    usize,
)> {
    let mut committed = committed_versions(table, uid);
    let mut chosen: Vec<&PendingCheckpoint> = pending
        .iter()
        .filter(|c| !c.files.is_empty())
        .filter(|c| committed.get(&c.partition).is_none_or(|&v| c.version > v))
        .collect();
    if look_for_files && !chosen.is_empty() {
        let paths = chosen
            .iter()
            .flat_map(|c| c.files.iter().map(|f| f.file_path()))
            .collect();
        let present = files_in_table(table, &paths).await?;
        chosen.retain(|c| {
            let listed = c.files.iter().any(|f| present.contains(f.file_path()));
            if listed {
                let v = committed.entry(c.partition).or_insert(c.version);
                *v = (*v).max(c.version);
            }
            !listed
        });
    }
    let skipped = pending.iter().filter(|c| !c.files.is_empty()).count() - chosen.len();
    Ok((chosen, committed, skipped))
}

/// The transaction that appends the `chosen` checkpoints' files to `table` in one snapshot,
/// whose summary names pipeline `uid` and each shard's highest checkpoint, and that records
/// the versions now `committed` (raised by the chosen) and the input they cover in the table's
/// properties. Counts the files and rows in `report`.
fn append(
    table: &Table,
    uid: &str,
    chosen: &[&PendingCheckpoint],
    committed: &mut BTreeMap<Partition, ManifestVersion>,
    report: &mut CommitReport,
) -> iceberg::Result<Transaction> {
    let mut shards = BTreeMap::new();
    for c in chosen {
        let v = shards.entry(c.partition).or_insert(c.version);
        *v = (*v).max(c.version);
    }
    for (&partition, &version) in &shards {
        let v = committed.entry(partition).or_insert(version);
        *v = (*v).max(version);
    }
    let mut summary = HashMap::from([(SUMMARY_PIPELINE.to_owned(), uid.to_owned())]);
    summary.extend(
        shards
            .iter()
            .map(|(p, v)| (format!("{SUMMARY_SHARD_PREFIX}{p}"), v.to_string())),
    );
    let files: Vec<DataFile> = chosen.iter().flat_map(|c| c.files.clone()).collect();
    report.files = files.len();
    report.rows = files.iter().map(DataFile::record_count).sum();
    let committed_text = serde_json::to_string(&committed).expect("a map of numbers encodes");
    let mut covered = committed_covered(table, uid);
    for c in chosen {
        covered.entry(c.partition).or_default().raise(&c.covered);
    }
    let covered_text = serde_json::to_string(&covered).expect("a map of numbers encodes");
    let tx = Transaction::new(table);
    let append = tx
        .fast_append()
        // The check reads every manifest; ours is the summary and property above, and
        // `files_in_table` once per committer.
        .with_check_duplicate(false)
        .set_snapshot_properties(summary)
        .add_data_files(files);
    let tx = append.apply(tx)?;
    let properties = tx
        .update_table_properties()
        .set(format!("{PROPERTY_COMMITTED_PREFIX}{uid}"), committed_text)
        .set(format!("{PROPERTY_COVERED_PREFIX}{uid}"), covered_text);
    properties.apply(tx)
}

/// A catalog for one commit decided on one version of the table: loading that table answers
/// the version decided on (the `iceberg` crate's transaction reloads the table before it
/// commits and would otherwise re-apply our append onto a newer one — another committer's
/// append included), and a conflict is final rather than retried by the crate: the caller
/// reloads and decides again. The swap itself (the SQL catalog's compare of the metadata
/// location, the append's requirement that the main branch is still at the snapshot decided
/// on) refuses a table that changed.
#[derive(Debug)]
pub(super) struct NoRetry {
    pub(super) inner: Arc<dyn Catalog>,
    pub(super) decided: Table,
}

#[async_trait]
impl Catalog for NoRetry {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        self.inner.list_namespaces(parent).await
    }
    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.inner.create_namespace(namespace, properties).await
    }
    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        self.inner.get_namespace(namespace).await
    }
    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        self.inner.namespace_exists(namespace).await
    }
    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.inner.update_namespace(namespace, properties).await
    }
    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
        self.inner.drop_namespace(namespace).await
    }
    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.inner.list_tables(namespace).await
    }
    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        self.inner.create_table(namespace, creation).await
    }
    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        if table == self.decided.identifier() {
            return Ok(self.decided.clone());
        }
        self.inner.load_table(table).await
    }
    async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.inner.drop_table(table).await
    }
    async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.inner.purge_table(table).await
    }
    async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
        self.inner.table_exists(table).await
    }
    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        self.inner.rename_table(src, dest).await
    }
    async fn register_table(
        &self,
        table: &TableIdent,
        metadata_location: String,
    ) -> iceberg::Result<Table> {
        self.inner.register_table(table, metadata_location).await
    }
    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        self.inner.update_table(commit).await.map_err(|e| {
            if e.kind() == ErrorKind::CatalogCommitConflicts {
                Error::new(ErrorKind::CatalogCommitConflicts, e.message().to_owned())
                    .with_retryable(false)
            } else {
                e
            }
        })
    }
}
