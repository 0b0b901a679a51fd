//! The host's Iceberg catalog and warehouse ([`LakehouseSettings`]), and a tenant's table in
//! them ([`Lakehouse::table`]).
//!
//! Where tables live is the host's decision, never a tenant's: the catalog (a SQL catalog on
//! SQLite here, the layout `pyiceberg`'s `SqlCatalog` shares) and the warehouse URL come from
//! the host's configuration; a tenant names only a table, which is created in the namespace
//! of the tenant's id at `{warehouse}/{tenant}/{table}`, and every file the host reads or
//! writes for it goes through [`WarehouseStorage`], which refuses locations outside the
//! warehouse. An existing table is used only when its location is that one and its schema is
//! the spec's (table schema evolution is not supported; docs/iceberg.md).

use super::schema::TableSchema;
use super::storage::{WarehouseStorage, WarehouseStorageFactory};
use iceberg::spec::Schema;
use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{SQL_CATALOG_PROP_URI, SQL_CATALOG_PROP_WAREHOUSE, SqlCatalogBuilder};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Table properties the sink sets on tables it creates: snapshots older than a day expire,
/// keeping at least the last 100 (as Iceberg's `history.expire.*`, which table maintenance —
/// Spark's `expire_snapshots`, `pyiceberg` — applies; Weir does not run it), and old metadata
/// files are deleted after each commit, keeping 100.
pub const TABLE_PROPERTIES: [(&str, &str); 5] = [
    ("history.expire.max-snapshot-age-ms", "86400000"),
    ("history.expire.min-snapshots-to-keep", "100"),
    ("write.metadata.delete-after-commit.enabled", "true"),
    ("write.metadata.previous-versions-max", "100"),
    ("write.parquet.compression-codec", "zstd"),
];

/// The least `orphan_file_age`: a checkpoint's files are closed before its manifest and
/// listed where the committer reads only once it is decided — at-least-once with the
/// manifest, exactly-once when its transaction commits, which can take up to the
/// transaction's timeout (a pipeline's committer waits at least that long anyway:
/// [`super::committer::orphan_grace`]).
pub const ORPHAN_FILE_AGE_MIN: Duration = Duration::from_secs(60);

/// The host's Iceberg settings (`[iceberg]`): where tables are and how the sink writes them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LakehouseSettings {
    /// The SQL catalog's database, e.g. `sqlite:///var/lib/weir/catalog.db` (created if
    /// missing: `?mode=rwc`). Unset: no pipeline may write to a table.
    pub catalog_uri: Option<String>,
    /// The catalog's name in that database (several catalogs can share one); default `weir`.
    pub catalog_name: String,
    /// Where tables' files go: `s3://bucket/prefix`, `file:///dir`. Required with
    /// `catalog_uri`.
    pub warehouse: Option<String>,
    /// `object_store` options for the warehouse URL (as `state.lsm.options`).
    #[serde(deserialize_with = "crate::config::string_map")]
    pub options: BTreeMap<String, String>,
    /// A data file is closed once it holds about this many bytes (and at every checkpoint);
    /// default 128 MiB (as Iceberg's `write.target-file-size-bytes`, 512 MiB, for batch jobs).
    pub target_file_size_bytes: u64,
    /// At most one table snapshot per pipeline this often (as Flink's Iceberg sink commits
    /// per checkpoint, but decoupled from it, so that a short checkpoint interval does not
    /// make a snapshot and small files every few seconds); default 60 s.
    #[serde(with = "humantime_serde")]
    pub commit_interval: Duration,
    /// A pipeline's data file in no snapshot of the table and no shard's pending list (a
    /// checkpoint that never completed) is deleted once it is this old; the committer looks
    /// this often. Default 1 h ([`super::orphans::ORPHAN_GRACE`]): well past the longest an
    /// exactly-once checkpoint can stay undecided (its transaction's timeout). At least
    /// [`ORPHAN_FILE_AGE_MIN`].
    #[serde(with = "humantime_serde")]
    pub orphan_file_age: Duration,
    /// A shard whose pending list holds this many checkpoints' files (its table commits lag:
    /// a catalog outage, a stopped committer) takes no more input — its partition pauses —
    /// until commits land; default 100 (with 10 s checkpoints, ~17 minutes of lag). Bounds
    /// the list, which every checkpoint rewrites whole, and the snapshot that clears it.
    pub pending_checkpoints_max: usize,
}

impl Default for LakehouseSettings {
    fn default() -> Self {
        Self {
            catalog_uri: None,
            catalog_name: "weir".into(),
            warehouse: None,
            options: BTreeMap::new(),
            target_file_size_bytes: 128 << 20,
            commit_interval: Duration::from_secs(60),
            orphan_file_age: super::orphans::ORPHAN_GRACE,
            pending_checkpoints_max: 100,
        }
    }
}

impl LakehouseSettings {
    /// What is wrong with these settings, each naming its field under `section` (e.g.
    /// `iceberg`).
    pub fn problems(&self, section: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.catalog_uri.is_some() != self.warehouse.is_some() {
            problems.push(format!(
                "{section}.catalog_uri and {section}.warehouse go together"
            ));
        }
        if let Some(Err(e)) = self.warehouse.as_deref().map(url::Url::parse) {
            problems.push(format!("{section}.warehouse is not a URL: {e}"));
        }
        if self.commit_interval < Duration::from_millis(10) {
            problems.push(format!(
                "{section}.commit_interval must be at least 10ms. commit_interval={:?}",
                self.commit_interval
            ));
        }
        if self.orphan_file_age < ORPHAN_FILE_AGE_MIN {
            problems.push(format!(
                "{section}.orphan_file_age must be at least {ORPHAN_FILE_AGE_MIN:?}: a checkpoint's files are listed only once it is decided. orphan_file_age={:?}",
                self.orphan_file_age
            ));
        }
        if !(1..=100_000).contains(&self.pending_checkpoints_max) {
            problems.push(format!(
                "{section}.pending_checkpoints_max must be 1..=100000. value={}",
                self.pending_checkpoints_max
            ));
        }
        if self.target_file_size_bytes < 1 << 10 {
            problems.push(format!(
                "{section}.target_file_size_bytes must be at least 1024. value={}",
                self.target_file_size_bytes
            ));
        }
        problems
    }
}

/// Why a catalog or table could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LakehouseError {
    /// The host has no `[iceberg]` catalog and warehouse.
    #[error("this host has no Iceberg catalog: set `iceberg.catalog_uri` and `iceberg.warehouse`")]
    NotConfigured,
    /// The table exists with another schema or location.
    #[error("the table exists and does not match the spec. table=`{table}` reason=`{reason}`")]
    Mismatch {
        /// The table.
        table: String,
        /// What differs.
        reason: String,
    },
    /// A catalog or storage operation failed.
    #[error("iceberg catalog operation failed. what=`{what}`")]
    Iceberg {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: iceberg::Error,
    },
}

fn failed(what: &'static str) -> impl FnOnce(iceberg::Error) -> LakehouseError {
    move |source| LakehouseError::Iceberg { what, source }
}

/// The host's catalog and warehouse.
#[derive(Debug, Clone)]
pub struct Lakehouse {
    catalog: Arc<dyn Catalog>,
    storage: WarehouseStorage,
    settings: LakehouseSettings,
}

impl Lakehouse {
    /// Opens the catalog `settings` name (creating its tables in the database if missing).
    ///
    /// # Errors
    /// [`LakehouseError::NotConfigured`]; [`LakehouseError::Iceberg`] when the database cannot
    /// be opened.
    pub async fn open(settings: &LakehouseSettings) -> Result<Self, LakehouseError> {
        let Some(warehouse) = &settings.warehouse else {
            return Err(LakehouseError::NotConfigured);
        };
        let storage = WarehouseStorage::new(warehouse, settings.options.clone());
        Self::open_with(settings, storage).await
    }

    /// [`Lakehouse::open`] with the warehouse reached through `storage` (its URL is the
    /// warehouse's; tests count its requests).
    ///
    /// # Errors
    /// As [`Lakehouse::open`].
    pub async fn open_with(
        settings: &LakehouseSettings,
        storage: WarehouseStorage,
    ) -> Result<Self, LakehouseError> {
        let Some(uri) = &settings.catalog_uri else {
            return Err(LakehouseError::NotConfigured);
        };
        let props = HashMap::from([
            (SQL_CATALOG_PROP_URI.to_owned(), uri.clone()),
            (
                SQL_CATALOG_PROP_WAREHOUSE.to_owned(),
                storage.url().to_owned(),
            ),
        ]);
        let catalog = SqlCatalogBuilder::default()
            .with_storage_factory(Arc::new(WarehouseStorageFactory(storage.clone())))
            .load(settings.catalog_name.clone(), props)
            .await
            .map_err(failed("open the catalog"))?;
        Ok(Self {
            catalog: Arc::new(catalog),
            storage,
            settings: settings.clone(),
        })
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// The settings it was opened with.
    pub fn settings(&self) -> &LakehouseSettings {
        &self.settings
    }

    /// The warehouse's storage.
    pub fn storage(&self) -> &WarehouseStorage {
        &self.storage
    }

    /// The identifier of `tenant`'s table `name`: namespace `tenant`.
    pub fn ident(tenant: &str, name: &str) -> TableIdent {
        TableIdent::new(NamespaceIdent::new(tenant.to_owned()), name.to_owned())
    }

    /// Where `tenant`'s table `name` lives: `{warehouse}/{tenant}/{name}`.
    pub fn location(&self, tenant: &str, name: &str) -> String {
        format!("{}/{tenant}/{name}", self.storage.url())
    }

    /// `tenant`'s table `name` with `schema`, created (with its namespace) if missing.
    ///
    /// # Errors
    /// [`LakehouseError::Mismatch`] when it exists elsewhere or with another schema;
    /// [`LakehouseError::Iceberg`].
    pub async fn table(
        &self,
        tenant: &str,
        name: &str,
        schema: &TableSchema,
    ) -> Result<Table, LakehouseError> {
        let ident = Self::ident(tenant, name);
        let namespace = ident.namespace().clone();
        if !self
            .catalog
            .namespace_exists(&namespace)
            .await
            .map_err(failed("check the namespace"))?
        {
            // Another host may create it meanwhile: an error is final only if it still is not.
            if let Err(e) = self
                .catalog
                .create_namespace(&namespace, HashMap::new())
                .await
                && !self
                    .catalog
                    .namespace_exists(&namespace)
                    .await
                    .unwrap_or(false)
            {
                return Err(failed("create the namespace")(e));
            }
        }
        let location = self.location(tenant, name);
        if !self
            .catalog
            .table_exists(&ident)
            .await
            .map_err(failed("check the table"))?
        {
            let creation = TableCreation::builder()
                .name(name.to_owned())
                .location(location.clone())
                .schema(schema.iceberg().as_ref().clone())
                .properties(
                    TABLE_PROPERTIES
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
                )
                .build();
            if let Err(e) = self.catalog.create_table(&namespace, creation).await
                && !self.catalog.table_exists(&ident).await.unwrap_or(false)
            {
                return Err(failed("create the table")(e));
            }
        }
        let table = self
            .catalog
            .load_table(&ident)
            .await
            .map_err(failed("load the table"))?;
        let mismatch = |reason: String| LakehouseError::Mismatch {
            table: format!("{tenant}.{name}"),
            reason,
        };
        if table.metadata().location() != location {
            return Err(mismatch(format!(
                "it is at `{}`, not `{location}`",
                table.metadata().location()
            )));
        }
        if !table.metadata().default_partition_spec().is_unpartitioned() {
            return Err(mismatch(
                "it is partitioned; the sink writes unpartitioned tables".into(),
            ));
        }
        if !same_columns(table.metadata().current_schema(), schema.iceberg()) {
            return Err(mismatch(
                "its columns differ from the spec's (ids, names, types, required, order)".into(),
            ));
        }
        Ok(table)
    }
}

/// Whether two schemas have the same columns: ids, names, types, requiredness and order (the
/// data files are written with the spec's field ids).
fn same_columns(a: &Schema, b: &Schema) -> bool {
    let (a, b) = (a.as_struct().fields(), b.as_struct().fields());
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.id == y.id
                && x.name == y.name
                && x.field_type == y.field_type
                && x.required == y.required
        })
}
