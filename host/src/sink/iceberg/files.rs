//! One shard's data files: rows appended as emits arrive, written as Parquet through the
//! `iceberg` crate's rolling data file writer, and closed at each checkpoint
//! ([`ShardFiles::close`]), which returns them as [`DataFile`]s to prepare.
//!
//! File names are unique to the writer (`weir-{pipeline}-{partition}-{random}-{n}.parquet`),
//! so that "is this checkpoint's file already in the table" is a question about names.
//! A file is invisible to readers until a table snapshot lists it; one that never gets there
//! is an orphan for GC.

use super::schema::{RowBuffer, TableSchema};
use crate::row::RowError;
use iceberg::spec::{
    DataFile, DataFileFormat, FormatVersion, Schema, StructType, deserialize_data_file_from_json,
    serialize_data_file_to_json,
};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

/// Rows buffered as Arrow columns before they go to the Parquet writer (which buffers a row
/// group of its own): bounds the buffer whatever the checkpoint interval.
pub const BATCH_ROWS_MAX: usize = 8192;

/// Encoded bytes of a row group the Parquet writer buffers before it writes it out (as
/// Parquet's `parquet.block.size`, 128 MiB, kept smaller: a host holds one per shard).
pub const ROW_GROUP_BYTES_MAX: usize = 32 << 20;

type Builder =
    DataFileWriterBuilder<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;
type Writer =
    DataFileWriter<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;

/// The open data files of one shard.
pub struct ShardFiles {
    builder: Builder,
    writer: Option<Writer>,
    rows: RowBuffer,
    rows_written: u64,
}

impl std::fmt::Debug for ShardFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardFiles")
            .field("rows", &self.rows)
            .field("rows_written", &self.rows_written)
            .finish_non_exhaustive()
    }
}

impl ShardFiles {
    /// Files of `table` named `{prefix}-{n}.parquet` in its data directory, of about
    /// `target_file_size_bytes` each (zstd-compressed Parquet).
    ///
    /// # Errors
    /// [`iceberg::Error`] when the table's metadata has no usable location.
    pub fn new(
        table: &Table,
        schema: TableSchema,
        prefix: String,
        target_file_size_bytes: u64,
    ) -> iceberg::Result<Self> {
        let properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES_MAX))
            .build();
        let parquet = ParquetWriterBuilder::new(properties, schema.iceberg().clone());
        let rolling = RollingFileWriterBuilder::new(
            parquet,
            usize::try_from(target_file_size_bytes).unwrap_or(usize::MAX),
            table.file_io().clone(),
            // `{table}/data`, whatever the table's `write.data.path` says: the sink writes only
            // under the table's own location.
            DefaultLocationGenerator::with_data_location(format!(
                "{}/data",
                table.metadata().location()
            )),
            DefaultFileNameGenerator::new(prefix, None, DataFileFormat::Parquet),
        );
        Ok(Self {
            builder: DataFileWriterBuilder::new(rolling),
            writer: None,
            rows: RowBuffer::new(schema),
            rows_written: 0,
        })
    }

    /// Appends the row an emit's `value` is; writes buffered rows out once
    /// [`BATCH_ROWS_MAX`] are waiting.
    ///
    /// # Errors
    /// [`FilesError::Row`] when the value does not fit (nothing appended);
    /// [`FilesError::Write`] when writing failed (the open file is lost: reopen the shard).
    pub async fn push(&mut self, value: &[u8]) -> Result<(), FilesError> {
        self.rows.push(value).map_err(FilesError::Row)?;
        if self.rows.rows() >= BATCH_ROWS_MAX {
            self.write_rows().await.map_err(FilesError::Write)?;
        }
        Ok(())
    }

    /// Rows appended since the last [`ShardFiles::close`].
    pub fn rows(&self) -> u64 {
        self.rows_written + self.rows.rows() as u64
    }

    async fn write_rows(&mut self) -> iceberg::Result<()> {
        if self.rows.rows() == 0 {
            return Ok(());
        }
        let batch = self.rows.take();
        if self.writer.is_none() {
            self.writer = Some(self.builder.build(None).await?);
        }
        let writer = self.writer.as_mut().expect("opened above");
        self.rows_written += batch.num_rows() as u64;
        writer.write(batch).await
    }

    /// Writes what is buffered and closes the open files: the data files of everything
    /// appended since the last close (none when nothing was).
    ///
    /// # Errors
    /// [`iceberg::Error`] when writing or completing an upload failed; the rows are lost with
    /// the open files (the shard reopens from its checkpoint, which replays them).
    pub async fn close(&mut self) -> iceberg::Result<Vec<DataFile>> {
        self.write_rows().await?;
        self.rows_written = 0;
        match self.writer.take() {
            Some(mut writer) => writer.close().await,
            None => Ok(Vec::new()),
        }
    }
}

/// Why an emit could not be appended.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The emit is not a row of the table.
    #[error(transparent)]
    Row(RowError),
    /// Writing a data file failed.
    #[error("writing a data file failed")]
    Write(#[source] iceberg::Error),
}

/// A data file as a checkpoint's manifest records it: Iceberg's JSON form of a data file
/// (as its REST protocol uses), so that the committer can append it as written, statistics
/// included, without reading the file.
///
/// # Errors
/// [`iceberg::Error`] for a file of a partitioned spec (the sink writes unpartitioned tables).
pub fn encode_data_file(file: DataFile) -> iceberg::Result<String> {
    serialize_data_file_to_json(file, &StructType::new(Vec::new()), FormatVersion::V2)
}

/// The data file [`encode_data_file`] wrote, against the table's `schema`.
///
/// # Errors
/// [`iceberg::Error`] for text that is not one.
pub fn decode_data_file(text: &str, schema: &Schema) -> iceberg::Result<DataFile> {
    deserialize_data_file_from_json(text, 0, &StructType::new(Vec::new()), schema)
}
