//! A pipeline's output with an Iceberg table beside (or instead of) its Kafka topic: the
//! [`Output`] that opens, for each partition, the inner sink (Kafka: the output topic unless
//! the pipeline writes only to the table, and always the dead-letter topic) and the shard's
//! [`IcebergShard`]; the owner of partition 0 also runs the pipeline's committer
//! ([`super::committer`]).

use super::catalog::{Lakehouse, LakehouseError, LakehouseSettings};
use super::committer::{Committer, CommitterHandle, GroupOffsets};
use super::schema::TableSchema;
use super::shard::{IcebergShard, PENDING_KEY};
use crate::clock::SharedClock;
use crate::config::{Delivery, Settings};
use crate::ids::{ManifestVersion, Partition};
use crate::pipeline::ports::{
    CommitError, DeadLetterKind, DeliveryGuard, Output, ShardSink, SinkError,
};
use crate::runtime::{InputRecord, StagedEmit};
use crate::state::StateWrite;
use crate::state::checkpoint::InputOffsets;
use object_store::ObjectStore;
use object_store::path::Path;
use std::sync::Arc;

/// Where a pipeline's rows go: the table and what its committer needs.
#[derive(Debug, Clone)]
pub struct TableTarget {
    /// The host's catalog and warehouse.
    pub lakehouse: Lakehouse,
    /// The tenant (the table's namespace).
    pub tenant: String,
    /// The table's name.
    pub table: String,
    /// Its columns.
    pub schema: Arc<TableSchema>,
    /// The pipeline's unique id (file names, snapshot summaries).
    pub uid: String,
    /// Whether emits also go to the Kafka output topic.
    pub to_topic: bool,
    /// The committer, run by the owner of partition 0.
    pub committer: Committer,
}

impl TableTarget {
    /// The table `namespace.table` with `schema` for the pipeline `settings` run (its id
    /// `uid`), its committer reading the shards' checkpoints from `store` under `prefix` (the
    /// state backend's) and committing every `lakehouse.commit_interval`. The table itself is
    /// created or checked when the first shard opens.
    ///
    /// # Errors
    /// [`LakehouseError::NotConfigured`] without a catalog; [`LakehouseError::Iceberg`] when
    /// the catalog cannot be opened.
    #[allow(clippy::too_many_arguments)]
    pub async fn open(
        lakehouse: &LakehouseSettings,
        (namespace, table): (&str, &str),
        schema: TableSchema,
        uid: &str,
        settings: &Settings,
        (store, prefix): (Arc<dyn ObjectStore>, &Path),
        clock: SharedClock,
    ) -> Result<Self, LakehouseError> {
        let lakehouse = Lakehouse::open(lakehouse).await?;
        let pipeline = &settings.pipeline;
        let shards = crate::state::ShardId {
            pipeline: pipeline.name.clone(),
            partition: Partition(0),
        }
        .shards_under(prefix);
        Ok(Self {
            committer: Committer {
                lakehouse: lakehouse.clone(),
                ident: Lakehouse::ident(namespace, table),
                uid: uid.to_owned(),
                store,
                shards,
                interval: lakehouse.settings().commit_interval,
                clock,
                group: (pipeline.delivery == Delivery::ExactlyOnce).then(|| GroupOffsets {
                    kafka: settings.kafka.clone(),
                    group: pipeline.group_id(),
                    topics: pipeline.input_topics.clone(),
                }),
                orphan_grace: super::committer::orphan_grace(
                    lakehouse.settings().orphan_file_age,
                    pipeline.checkpoint_interval,
                )
                .max(
                    // One the operator set on the producer, if longer.
                    settings
                        .kafka
                        .producer
                        .get("transaction.timeout.ms")
                        .and_then(|ms| ms.parse().ok())
                        .map(std::time::Duration::from_millis)
                        .unwrap_or_default(),
                ),
            },
            lakehouse,
            tenant: namespace.to_owned(),
            table: table.to_owned(),
            schema: Arc::new(schema),
            uid: uid.to_owned(),
            to_topic: pipeline.output_topic.is_some(),
        })
    }
}

/// The id of a `weir run` pipeline named `pipeline` whose state is in `store` under `prefix`:
/// made (16 hex digits) at its first run and kept at `{prefix}/pipelines/{pipeline}/uid`,
/// written once, beside its shards, so that it lives as long as the state. A table's record
/// of which checkpoints it holds is per id: deleting a pipeline's state means deleting its
/// whole `pipelines/{pipeline}/` (the id with the shards), so that a pipeline started again on
/// empty state (checkpoint versions from 1 again) gets a new id rather than having its rows
/// taken for ones the table already holds. Its orphan files are all under the one id.
///
/// # Errors
/// The store's, when the id can be neither written nor read, or a stored id that is not one.
pub async fn stored_pipeline_uid(
    store: &dyn ObjectStore,
    prefix: &Path,
    pipeline: &str,
) -> object_store::Result<String> {
    use object_store::{ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
    let location = prefix
        .parts()
        .chain(["pipelines", pipeline, "uid"].map(Into::into))
        .collect::<Path>();
    let mut fresh = [0u8; 8];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut fresh);
    let fresh = hex::encode(fresh);
    let put = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match store
        .put_opts(&location, PutPayload::from(fresh.clone()), put)
        .await
    {
        Ok(_) => Ok(fresh),
        Err(object_store::Error::AlreadyExists { .. }) => {
            let stored = store.get(&location).await?.bytes().await?;
            match std::str::from_utf8(&stored) {
                Ok(id)
                    if (1..=64).contains(&id.len())
                        && id.bytes().all(|b| b.is_ascii_hexdigit()) =>
                {
                    Ok(id.to_owned())
                }
                _ => Err(object_store::Error::Generic {
                    store: "pipeline uid",
                    source: format!("{location} does not hold a pipeline id").into(),
                }),
            }
        }
        Err(e) => Err(e),
    }
}

/// An [`Output`] that adds a table to `O`'s sinks (or nothing, without a target: one type
/// either way, so that the pipeline is compiled once).
#[derive(Debug)]
pub struct TableOutput<O> {
    inner: O,
    target: Option<Arc<TableTarget>>,
}

impl<O> TableOutput<O> {
    /// `inner`'s sinks with `target`'s table beside them.
    pub fn new(inner: O, target: Option<TableTarget>) -> Self {
        Self {
            inner,
            target: target.map(Arc::new),
        }
    }
}

fn table_failed(
    target: &TableTarget,
    source: impl std::error::Error + Send + Sync + 'static,
) -> SinkError {
    SinkError {
        topic: format!("iceberg:{}.{}", target.tenant, target.table),
        source: Box::new(source),
    }
}

impl<O: Output> Output for TableOutput<O> {
    type Sink = TableSink<O::Sink>;

    async fn open(
        &self,
        partition: Partition,
        transactional: bool,
        guard: DeliveryGuard,
    ) -> Result<Self::Sink, SinkError> {
        let inner = self.inner.open(partition, transactional, guard).await?;
        let Some(t) = &self.target else {
            return Ok(TableSink { inner, table: None });
        };
        let shard = IcebergShard::open(
            &t.lakehouse,
            (&t.tenant, &t.table),
            &t.schema,
            &t.uid,
            partition,
        )
        .await
        .map_err(|e| table_failed(t, e))?;
        let committer = (partition == Partition(0)).then(|| t.committer.start());
        Ok(TableSink {
            inner,
            table: Some(ShardTable {
                shard,
                target: t.clone(),
                _committer: committer,
            }),
        })
    }
}

/// One partition's sinks: the inner one's, and the shard's table files if it has a table.
#[derive(Debug)]
pub struct TableSink<K> {
    inner: K,
    table: Option<ShardTable>,
}

#[derive(Debug)]
struct ShardTable {
    shard: IcebergShard,
    target: Arc<TableTarget>,
    /// Partition 0's: the pipeline's committer, stopped when the shard closes.
    _committer: Option<CommitterHandle>,
}

impl<K: ShardSink> ShardSink for TableSink<K> {
    fn output_bytes_max(&self) -> u64 {
        match &self.table {
            // Rows only: bounded by `runtime.emit_bytes_per_record_max` alone.
            Some(t) if !t.target.to_topic => u64::MAX,
            _ => self.inner.output_bytes_max(),
        }
    }

    fn emit_table(&self) -> Option<Arc<crate::row::RowSchema>> {
        self.table.as_ref().map(|t| t.target.schema.row().clone())
    }

    fn transactional(&self) -> bool {
        self.inner.transactional()
    }

    fn transaction_timeout(&self) -> Option<std::time::Duration> {
        self.inner.transaction_timeout()
    }

    fn writes_watermarks(&self) -> bool {
        self.inner.writes_watermarks()
    }

    fn replay_below(&mut self, committed: &crate::state::checkpoint::InputOffsets) {
        self.inner.replay_below(committed);
    }

    async fn watermark(
        &mut self,
        marker: crate::time::watermark::Marker,
        frontier: Option<&crate::time::edge::Frontier>,
    ) -> Result<(), SinkError> {
        self.inner.watermark(marker, frontier).await
    }

    async fn emit(&mut self, emit: &StagedEmit, source: &InputRecord) -> Result<(), SinkError> {
        let Some(t) = &mut self.table else {
            return self.inner.emit(emit, source).await;
        };
        if t.target.to_topic {
            self.inner.emit(emit, source).await?;
        }
        if t.shard.written(source) {
            return Ok(()); // replayed input whose rows the table has (a reset, a fallback)
        }
        t.shard
            .push(&emit.value)
            .await
            .map_err(|e| table_failed(&t.target, e))
    }

    async fn dead_letter(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> Result<(), SinkError> {
        self.inner.dead_letter(record, kind, error).await
    }

    async fn drain(&mut self) -> Result<(), SinkError> {
        self.inner.drain().await
    }

    async fn commit(
        &mut self,
        partition: Partition,
        offsets: &InputOffsets,
        version: ManifestVersion,
    ) -> Result<(), CommitError> {
        self.inner.commit(partition, offsets, version).await
    }

    fn state_key(&self) -> Option<&'static [u8]> {
        self.table.as_ref().map(|_| &PENDING_KEY[..])
    }

    fn restore(&mut self, value: Option<&[u8]>, resume: &InputOffsets) -> Result<(), SinkError> {
        match &mut self.table {
            Some(t) => t
                .shard
                .restore(value, resume)
                .map_err(|e| table_failed(&t.target, e)),
            None => Ok(()),
        }
    }

    fn position(&mut self, offsets: &InputOffsets) {
        if let Some(t) = &mut self.table {
            t.shard.position(offsets);
        }
    }

    fn held_back(&self) -> bool {
        self.table.as_ref().is_some_and(|t| {
            t.shard.pending().entries.len() >= t.target.lakehouse.settings().pending_checkpoints_max
        })
    }

    async fn prepare(
        &mut self,
        version: ManifestVersion,
        offsets: &InputOffsets,
        timers_through_ms: Option<i64>,
    ) -> Result<Option<StateWrite>, SinkError> {
        match &mut self.table {
            Some(t) => t
                .shard
                .prepare(version, offsets, timers_through_ms)
                .await
                .map_err(|e| table_failed(&t.target, e)),
            None => Ok(None),
        }
    }
}
