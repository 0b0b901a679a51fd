//! The Apache Iceberg sink's parts (docs/iceberg.md): a pipeline's emits as rows of a table
//! on object storage, committed exactly once through a catalog.
//!
//! - [`schema`]   the table's columns from the pipeline spec; JSON emits checked and turned
//!   into Arrow rows;
//! - [`storage`]  the `iceberg` crate's file IO over our `object_store` client, confined to
//!   the warehouse;
//! - [`catalog`]  the host's catalog (SQL on SQLite) and warehouse; a tenant's table;
//! - [`files`]    one shard's Parquet data files, closed at each checkpoint;
//! - [`commit`]   prepared checkpoints' files appended in one snapshot, exactly once;
//! - [`shard`]    a shard's open files and its pending list, kept in its state;
//! - [`committer`] the pipeline's committer, run by the owner of partition 0;
//! - [`orphans`]  data files of checkpoints that never became decided, deleted;
//! - [`output`]   the pipeline's output with the table beside its Kafka sinks.

pub mod catalog;
pub mod commit;
pub mod committer;
pub mod files;
pub mod orphans;
pub mod output;
pub mod schema;
pub mod shard;
pub mod storage;

pub use crate::row::{ColumnSpec, ColumnType, RowError};
pub use catalog::{Lakehouse, LakehouseError, LakehouseSettings};
pub use commit::{CommitReport, PendingCheckpoint};
pub use committer::Committer;
pub use files::ShardFiles;
pub use output::{TableOutput, TableTarget};
pub use schema::{TableSchema, check_table_name};

#[cfg(test)]
mod tests;
