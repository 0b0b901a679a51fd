//! The pipeline's one committer (docs/iceberg.md, "Exactly once"; as Flink's single Iceberg
//! files committer): run by the owner of partition 0 while it owns it, every
//! `commit_interval` it reads every shard's pending list from that shard's newest decided
//! checkpoint in the store and commits what the table does not have yet ([`super::commit`]).
//! Its first pass also looks for the pending files by name in the table.
//!
//! It reads only decided checkpoints, so files of a checkpoint that never became decided are
//! never committed. Exactly-once, a checkpoint is decided when the consumer group's committed
//! offsets name it (read each pass, [`GroupOffsets`]) or a later version names it as its
//! parent.

use super::catalog::Lakehouse;
use super::commit::{self, CommitReport, PendingCheckpoint};
use super::shard::{PENDING_KEY, PendingList, pending_checkpoints};
use crate::checkpoints::query::QueryShard;
use crate::checkpoints::savepoint::newest_decided;
use crate::clock::SharedClock;
use crate::ids::{ManifestVersion, Partition};
use crate::state::lsm::cache::{BlockCaches, CacheSettings};
use crate::state::manifest::ManifestStore;
use iceberg::TableIdent;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Memory for the `lsm` blocks a committer reads (a few per shard).
const COMMITTER_CACHE_BYTES: u64 = 4 << 20;

/// What a committer reads and where it commits.
#[derive(Debug, Clone)]
pub struct Committer {
    /// The catalog and warehouse.
    pub lakehouse: Lakehouse,
    /// The table.
    pub ident: TableIdent,
    /// The pipeline's unique id.
    pub uid: String,
    /// The state store.
    pub store: Arc<dyn ObjectStore>,
    /// The pipeline's shards' directory in it (`…/pipelines/{name}/shards`).
    pub shards: Path,
    /// How often it commits.
    pub interval: Duration,
    /// The clock TTLs are read with.
    pub clock: SharedClock,
    /// Exactly-once: where the decided checkpoints are named.
    pub group: Option<GroupOffsets>,
    /// How old an unlisted data file must be to be deleted: `orphan_file_age`, or the
    /// pipeline's transaction timeout if that is longer ([`orphan_grace`]).
    pub orphan_grace: Duration,
}

/// How old a data file of a pipeline checkpointing every `checkpoint_interval` must be before
/// the committer takes it for an orphan: `orphan_file_age`, or the longest its checkpoint can
/// stay undecided if that is longer (its exactly-once transaction's timeout: three intervals,
/// 1..=15 minutes, as the shard's transactional producer sets it).
pub fn orphan_grace(orphan_file_age: Duration, checkpoint_interval: Duration) -> Duration {
    let transaction =
        (checkpoint_interval * 3).clamp(Duration::from_secs(60), Duration::from_secs(15 * 60));
    orphan_file_age.max(transaction)
}

/// The consumer group whose committed offsets name each shard's decided checkpoint
/// (exactly-once).
#[derive(Debug, Clone)]
pub struct GroupOffsets {
    /// How to reach the brokers.
    pub kafka: crate::config::KafkaSettings,
    /// The pipeline's consumer group.
    pub group: String,
    /// Its input topics.
    pub topics: Vec<String>,
}

/// A running committer; dropping it stops it (a commit it was making either completed or
/// did not happen: the catalog's swap is atomic).
#[derive(Debug)]
pub struct CommitterHandle(tokio::task::JoinHandle<()>);

impl Drop for CommitterHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a commit pass failed (it is tried again at the next interval).
#[derive(Debug, thiserror::Error)]
pub enum CommitterError {
    /// Reading a shard's checkpoint failed.
    #[error("reading the shards' pending lists failed")]
    State(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The catalog or the warehouse failed.
    #[error("the table commit failed")]
    Table(#[source] iceberg::Error),
}

impl Committer {
    /// Starts committing: a first pass at once, then one every `interval`.
    pub fn start(&self) -> CommitterHandle {
        let committer = self.clone();
        CommitterHandle(tokio::spawn(async move {
            let caches = Arc::new(
                BlockCaches::new(&CacheSettings {
                    block_cache_bytes: COMMITTER_CACHE_BYTES,
                    disk_cache_bytes: 0,
                    disk_cache_dir: None,
                })
                .unwrap_or_else(|_| BlockCaches::none()),
            );
            let mut first = true;
            // Housekeeping, not urgent: the first look one `orphan_file_age` into the run.
            let mut orphans_checked = tokio::time::Instant::now();
            let mut passes = 0u64;
            // As often as a file can become an orphan to collect: it lists the table's data
            // directory and reads every manifest the table's snapshots list.
            let orphan_age = committer.lakehouse.settings().orphan_file_age;
            loop {
                if passes > 0 {
                    tokio::time::sleep(committer.interval).await;
                }
                passes += 1;
                if orphans_checked.elapsed() >= orphan_age {
                    orphans_checked = tokio::time::Instant::now();
                    match committer
                        .collect_orphans(&caches, committer.orphan_grace)
                        .await
                    {
                        Ok(deleted) if !deleted.is_empty() => {
                            tracing::info!(table = %committer.ident, files = deleted.len(), "orphan data files deleted");
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(table = %committer.ident, error = %crate::error::Chain(&e), "deleting orphan data files failed; trying again later");
                        }
                    }
                }
                match committer.commit_once(&caches, first).await {
                    Ok(report) => {
                        first = false;
                        tracing::debug!(table = %committer.ident, ?report, "iceberg commit pass done");
                        if report.snapshot_id.is_some() {
                            tracing::info!(table = %committer.ident, snapshot = ?report.snapshot_id, files = report.files, rows = report.rows, skipped = report.skipped, "iceberg snapshot committed");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(table = %committer.ident, error = %crate::error::Chain(&e), "iceberg commit failed; trying again at the next interval");
                    }
                }
            }
        }))
    }

    /// One pass: every shard's pending checkpoints, committed.
    ///
    /// # Errors
    /// [`CommitterError`].
    pub async fn commit_once(
        &self,
        caches: &Arc<BlockCaches>,
        look_for_files: bool,
    ) -> Result<CommitReport, CommitterError> {
        let table = self.table().await?;
        let pending = self.pending(caches, &table).await?;
        tracing::debug!(table = %self.ident, checkpoints = pending.len(), files = pending.iter().map(|c| c.files.len()).sum::<usize>(), "iceberg commit pass");
        commit::commit(
            self.lakehouse.catalog(),
            &self.ident,
            &self.uid,
            &pending,
            look_for_files,
        )
        .await
        .map_err(CommitterError::Table)
    }

    /// Deletes the pipeline's orphan data files older than `grace` ([`super::orphans`]).
    /// Returns their locations.
    ///
    /// # Errors
    /// [`CommitterError`]; nothing the table or a shard lists is deleted then.
    pub async fn collect_orphans(
        &self,
        caches: &Arc<BlockCaches>,
        grace: Duration,
    ) -> Result<Vec<String>, CommitterError> {
        // The lists first, then the table: a file a shard stops listing because it was
        // committed meanwhile is in the table loaded after.
        let schema_of = self.table().await?;
        let pending: BTreeSet<String> = self
            .pending(caches, &schema_of)
            .await?
            .iter()
            .flat_map(|c| c.files.iter().map(|f| f.file_path().to_owned()))
            .collect();
        let table = self.table().await?;
        // Only ever under the table's own location, as the sink created it.
        let expected = self
            .lakehouse
            .location(&self.ident.namespace().join("."), self.ident.name());
        if table.metadata().location() != expected {
            return Err(CommitterError::Table(iceberg::Error::new(
                iceberg::ErrorKind::DataInvalid,
                format!(
                    "the table moved to `{}`; not collecting files there",
                    table.metadata().location()
                ),
            )));
        }
        super::orphans::delete_orphans(
            &table,
            &self.uid,
            &pending,
            self.lakehouse.storage(),
            grace,
            self.clock.now_ms(),
        )
        .await
        .map_err(CommitterError::Table)
    }

    /// The table as the catalog has it now.
    async fn table(&self) -> Result<iceberg::table::Table, CommitterError> {
        self.lakehouse
            .catalog()
            .load_table(&self.ident)
            .await
            .map_err(CommitterError::Table)
    }

    /// Every shard's pending checkpoints, as its newest decided checkpoint lists them.
    async fn pending(
        &self,
        caches: &Arc<BlockCaches>,
        table: &iceberg::table::Table,
    ) -> Result<Vec<PendingCheckpoint>, CommitterError> {
        let schema = table.metadata().current_schema().clone();
        let mut pending: Vec<PendingCheckpoint> = Vec::new();
        let roots = self.shard_roots().await?;
        let committed = match &self.group {
            Some(g) => {
                let (g, partitions) =
                    (g.clone(), roots.iter().map(|(p, _)| *p).collect::<Vec<_>>());
                tokio::task::spawn_blocking(move || {
                    crate::source::kafka::broker::committed_checkpoint_versions(
                        &g.kafka,
                        &g.group,
                        &g.topics,
                        &partitions,
                    )
                })
                .await
                .map_err(|e| CommitterError::State(Box::new(e)))?
                .map_err(|e| CommitterError::State(e.into()))?
            }
            None => Default::default(),
        };
        for (partition, root) in roots {
            // One shard that cannot be read holds back its own files only.
            let list = match self
                .pending_list(caches, partition, &root, committed.get(&partition).copied())
                .await
            {
                Ok(list) => list,
                Err(e) => {
                    tracing::warn!(table = %self.ident, partition = partition.0, error = %crate::error::Chain(&e), "cannot read the shard's pending data files; committing the other shards'");
                    continue;
                }
            };
            pending.extend(
                pending_checkpoints(partition, &list, &schema).map_err(CommitterError::Table)?,
            );
        }
        Ok(pending)
    }

    /// (partition, root) of every shard stored under the pipeline.
    async fn shard_roots(&self) -> Result<Vec<(Partition, Path)>, CommitterError> {
        let listed = self
            .store
            .list_with_delimiter(Some(&self.shards))
            .await
            .map_err(|e| CommitterError::State(Box::new(e)))?;
        Ok(listed
            .common_prefixes
            .into_iter()
            .filter_map(|root| {
                let partition = root.filename()?.parse().ok()?;
                Some((partition, root))
            })
            .collect())
    }

    /// The pending list of the shard's newest decided checkpoint (empty without one).
    async fn pending_list(
        &self,
        caches: &Arc<BlockCaches>,
        partition: Partition,
        root: &Path,
        committed: Option<ManifestVersion>,
    ) -> Result<PendingList, CommitterError> {
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| CommitterError::State(e);
        let manifests = ManifestStore::new(self.store.clone(), root.clone());
        let Some(manifest) = newest_decided(&manifests, committed)
            .await
            .map_err(|e| failed(Box::new(e)))?
        else {
            return Ok(PendingList::default());
        };
        let shard = QueryShard::open(
            &self.store,
            (root, partition),
            manifest.version,
            caches,
            &self.clock,
        )
        .await
        .map_err(|e| failed(Box::new(e)))?;
        let now_ms = self.clock.now_ms();
        let found = shard
            .scan(&PENDING_KEY, None, 1, now_ms)
            .await
            .map_err(|e| failed(Box::new(e)))?;
        let value = found
            .into_iter()
            .find(|(k, _, _)| k.as_slice() == PENDING_KEY)
            .map(|(_, v, _)| v);
        PendingList::decode(value.as_deref()).map_err(|e| failed(Box::new(e)))
    }
}
