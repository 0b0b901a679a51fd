//! A run's global tables (docs/topologies.md, "Global tables"): each topic of
//! `pipeline.global_tables` held whole on this host ([`GlobalTable`]), restored from its
//! snapshot, read on to the topic's end before the run consumes anything
//! ([`GlobalTablesRun::start`]), then kept up to date by a reader of its own while the run
//! lasts, and saved again at most once per checkpoint interval when it changed.
//!
//! Snapshots live with the pipeline's state, at
//! `{prefix}/pipelines/{pipeline}/global-tables/{topic}`. Every host that runs the pipeline
//! writes its own table there, whole: the last write wins, and any of them is a table at the
//! offsets it names, so a restore from an older one only reads more of the topic.

use super::ports::{Source, SourceError, TableUpdate};
use crate::runtime::GlobalTables;
use crate::state::global_table::GlobalTable;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// How often a changing global table is saved at most: every checkpoint interval, and not
/// more often than every 10 s (each save writes the whole table, from every host).
pub(crate) fn save_interval(checkpoint_interval: Duration) -> Duration {
    checkpoint_interval.max(Duration::from_secs(10))
}

/// Where a run's global tables are saved.
#[derive(Debug, Clone)]
pub(crate) struct Snapshots {
    pub store: Arc<dyn ObjectStore>,
    /// `{prefix}/pipelines/{pipeline}/global-tables`.
    pub dir: Path,
}

impl Snapshots {
    /// The snapshots of the pipeline whose shard 0 is stored at `shard_root`
    /// (`{prefix}/pipelines/{pipeline}/shards/00000`): beside its shards.
    pub fn beside_shards(store: Arc<dyn ObjectStore>, shard_root: &Path) -> Self {
        let parts: Vec<_> = shard_root.parts().collect();
        let pipeline = parts[..parts.len().saturating_sub(2)].iter().cloned();
        let dir =
            Path::from_iter(pipeline.chain([object_store::path::PathPart::from("global-tables")]));
        Self { store, dir }
    }

    pub(crate) fn path(&self, topic: &str) -> Path {
        self.dir.clone().join(topic)
    }

    /// `topic`'s table as last saved; an empty one when none was, or when the saved one is
    /// unreadable or damaged (the reader then reads the topic from its beginning).
    async fn restore(&self, topic: &str) -> GlobalTable {
        use object_store::ObjectStoreExt as _;
        let path = self.path(topic);
        let bytes = match self.store.get(&path).await {
            Ok(got) => got.bytes().await,
            Err(err) => Err(err),
        };
        match bytes {
            Ok(bytes) => match GlobalTable::from_snapshot(&bytes) {
                Ok(table) => {
                    tracing::info!(topic, rows = table.len(), offsets = ?table.offsets(), "global table restored from its snapshot");
                    table
                }
                Err(err) => {
                    tracing::warn!(topic, error = %err, "global table snapshot unusable; reading the topic from its beginning");
                    GlobalTable::default()
                }
            },
            Err(object_store::Error::NotFound { .. }) => GlobalTable::default(),
            Err(err) => {
                tracing::warn!(topic, error = %crate::error::Chain(&err), "global table snapshot unreadable; reading the topic from its beginning");
                GlobalTable::default()
            }
        }
    }

    /// Saves `table` as `topic`'s snapshot, if it changed since its last one. A failure is
    /// logged: the next try saves it.
    async fn save(&self, topic: &str, table: &Arc<GlobalTable>) {
        use object_store::ObjectStoreExt as _;
        if table.unsaved() == 0 {
            return;
        }
        // Encoding a large table takes a while: not on the runtime's workers.
        let encoding = table.clone();
        let Ok((bytes, applied)) = tokio::task::spawn_blocking(move || encoding.snapshot()).await
        else {
            return;
        };
        let len = bytes.len();
        match self.store.put(&self.path(topic), bytes.into()).await {
            Ok(_) => {
                table.saved(applied);
                tracing::debug!(topic, bytes = len, rows = table.len(), "global table saved");
            }
            Err(err) => {
                // Still unsaved: the next interval tries again.
                tracing::warn!(topic, error = %crate::error::Chain(&err), "cannot save the global table's snapshot");
            }
        }
    }
}

/// Why a run's global tables could not be loaded: the run fails and is started again.
#[derive(Debug, thiserror::Error)]
#[error("global table `{topic}` could not be loaded")]
pub struct GlobalTableError {
    /// The table's topic.
    pub topic: String,
    /// The reader's error.
    #[source]
    pub source: SourceError,
}

/// A run's global tables and the tasks that keep them up to date (ended when it is dropped).
#[derive(Debug, Default)]
pub(crate) struct GlobalTablesRun {
    /// The tables, by name.
    pub tables: GlobalTables,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for GlobalTablesRun {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl GlobalTablesRun {
    /// Restores each of `tables` (topic → name) from its snapshot in `snapshots` (if any),
    /// reads it on from `source` to the topic's end, and keeps reading; saves it at most once
    /// per `save_interval` after that.
    ///
    /// # Errors
    /// [`GlobalTableError`] when a table's topic cannot be read to its end.
    pub async fn start<Src: Source>(
        tables: &BTreeMap<String, String>,
        source: &Arc<Src>,
        snapshots: Option<Snapshots>,
        save_interval: Duration,
    ) -> Result<Self, GlobalTableError> {
        let mut run = Self::default();
        let mut by_name = BTreeMap::new();
        for (topic, name) in tables {
            let table = match &snapshots {
                Some(snapshots) => snapshots.restore(topic).await,
                None => GlobalTable::default(),
            };
            let table = Arc::new(table);
            let (updates, received) = mpsc::channel(2);
            let (loaded, is_loaded) = oneshot::channel();
            let reader = {
                let (source, topic, from) = (source.clone(), topic.clone(), table.offsets());
                tokio::spawn(async move { source.follow_table(&topic, from, updates).await })
            };
            let keeper = Keeper {
                topic: topic.clone(),
                table: table.clone(),
                snapshots: snapshots.clone(),
                save_interval,
            };
            run.tasks.push(tokio::spawn(keeper.run(received, loaded)));
            let started = tokio::time::Instant::now();
            match await_load(reader, is_loaded).await {
                Ok(reader) => run.tasks.push(reader),
                Err(source) => {
                    return Err(GlobalTableError {
                        topic: topic.clone(),
                        source,
                    });
                }
            }
            tracing::info!(topic = %topic, table = %name, rows = table.len(), load_ms = started.elapsed().as_millis() as u64, "global table loaded");
            by_name.insert(name.clone(), table);
        }
        run.tables = Arc::new(by_name);
        Ok(run)
    }
}

/// Waits until the table is loaded, or its reader ended first (with its error). Returns the
/// reader's task, which goes on.
async fn await_load(
    mut reader: JoinHandle<Result<(), SourceError>>,
    loaded: oneshot::Receiver<()>,
) -> Result<JoinHandle<()>, SourceError> {
    let ended_early = |ended: Result<Result<(), SourceError>, tokio::task::JoinError>| {
        let what = "global table".to_owned();
        match ended {
            Ok(Err(err)) => err,
            Ok(Ok(())) => SourceError {
                what,
                source: "its reader ended before it was loaded".into(),
            },
            Err(err) => SourceError {
                what,
                source: Box::new(err),
            },
        }
    };
    tokio::select! {
        done = loaded => {
            if done.is_err() {
                // The keeper ended because the reader did: its error is the cause.
                return Err(ended_early(reader.await));
            }
            // The reader's later errors are its own to log.
            Ok(tokio::spawn(async move {
                match reader.await {
                    Ok(Ok(())) | Err(_) => {}
                    Ok(Err(err)) => tracing::error!(error = %crate::error::Chain(&err), "a global table's reader ended; the table no longer changes"),
                }
            }))
        }
        ended = &mut reader => Err(ended_early(ended)),
    }
}

/// Applies a table's updates as they come and saves it now and then.
struct Keeper {
    topic: String,
    table: Arc<GlobalTable>,
    snapshots: Option<Snapshots>,
    save_interval: Duration,
}

impl Keeper {
    async fn run(self, mut updates: mpsc::Receiver<TableUpdate>, loaded: oneshot::Sender<()>) {
        let mut loaded = Some(loaded);
        let mut saves = tokio::time::interval(self.save_interval.max(Duration::from_millis(10)));
        saves.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                update = updates.recv() => match update {
                    Some(TableUpdate::Records(records)) => {
                        self.table.apply(&records);
                        if loaded.is_some() {
                            fail::fail_point!("global-table-mid-load", |_| {
                                crate::fail_points::crash("global-table-mid-load")
                            });
                        }
                    }
                    Some(TableUpdate::CaughtUp(positions)) => {
                        for (partition, next) in positions {
                            self.table.advance(partition, next);
                        }
                        if let Some(loaded) = loaded.take() {
                            let _ = loaded.send(());
                        }
                        // Saved at once (the run goes on meanwhile): the next start reads only
                        // what came after.
                        self.save().await;
                    }
                    Some(TableUpdate::Reset) => {
                        tracing::warn!(topic = %self.topic, "global table: its snapshot is of offsets past the topic's end (the topic was made again?); its rows are dropped and the topic read from its beginning");
                        self.table.clear();
                    }
                    None => return,
                },
                _ = saves.tick(), if loaded.is_none() => self.save().await,
            }
        }
    }

    async fn save(&self) {
        if let Some(snapshots) = &self.snapshots {
            snapshots.save(&self.topic, &self.table).await;
        }
    }
}
