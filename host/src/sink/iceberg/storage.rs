//! The `iceberg` crate's file IO over our `object_store` client: the warehouse's data files,
//! manifests and table metadata go through the same HTTP client, credentials and options as
//! the state store, rather than a second S3 stack (the `iceberg` crate leaves storage to a
//! [`Storage`] implementation since 0.10).
//!
//! Confinement: a [`WarehouseStorage`] serves only locations under its warehouse URL. A path
//! elsewhere (another bucket, `..` segments, another scheme) is refused, so that no table
//! metadata a tenant could influence makes the host read or write outside the warehouse.

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

/// Bytes a data file's writer buffers before it starts a multipart upload (object_store's
/// [`BufWriter`] capacity): files under it are one PUT.
const WRITE_BUFFER_BYTES: usize = 8 << 20;

/// A warehouse root (`s3://bucket/prefix`, `file:///dir`, `memory:///`) and the
/// `object_store` options to reach it. The client is built on first use.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WarehouseStorage {
    url: String,
    options: BTreeMap<String, String>,
    #[serde(skip)]
    store: Arc<OnceLock<(Arc<dyn ObjectStore>, Path)>>,
}

impl WarehouseStorage {
    /// The storage of the warehouse at `url`, reached with `options`.
    pub fn new(url: &str, options: BTreeMap<String, String>) -> Self {
        Self {
            url: url.trim_end_matches('/').to_owned(),
            options,
            store: Arc::default(),
        }
    }

    /// The storage of the warehouse at `url` over an existing client whose root is the URL's
    /// (tests: an in-memory store).
    pub fn with_store(url: &str, store: Arc<dyn ObjectStore>, prefix: Path) -> Self {
        let storage = Self::new(url, BTreeMap::new());
        let _ = storage.store.set((store, prefix));
        storage
    }

    /// The warehouse's URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn client(&self) -> iceberg::Result<&(Arc<dyn ObjectStore>, Path)> {
        if let Some(client) = self.store.get() {
            return Ok(client);
        }
        let built = crate::state::lsm::backend::object_store_from_url(&self.url, &self.options)
            .map_err(|e| {
                Error::new(ErrorKind::DataInvalid, "cannot reach the warehouse").with_source(e)
            })?;
        Ok(self.store.get_or_init(|| built))
    }

    /// The object path of `location`, an absolute location inside the warehouse.
    ///
    /// # Errors
    /// [`ErrorKind::DataInvalid`] for a location outside it.
    pub fn object_path(&self, location: &str) -> iceberg::Result<Path> {
        let outside = || {
            Error::new(
                ErrorKind::DataInvalid,
                format!("the location is outside the warehouse. location=`{location}`"),
            )
        };
        let rest = location
            .strip_prefix(&self.url)
            .and_then(|rest| rest.strip_prefix('/'))
            .ok_or_else(outside)?;
        let mut path = self.client()?.1.clone();
        for part in rest.split('/') {
            if part.is_empty() || part == "." || part == ".." {
                return Err(outside());
            }
            path = path.clone().join(part);
        }
        Ok(path)
    }

    /// The warehouse's client.
    ///
    /// # Errors
    /// When it cannot be built from the URL and options.
    pub fn store(&self) -> iceberg::Result<Arc<dyn ObjectStore>> {
        Ok(self.client()?.0.clone())
    }
}

fn store_error(e: object_store::Error) -> Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => ErrorKind::DataInvalid,
        _ => ErrorKind::Unexpected,
    };
    Error::new(kind, "object store request failed")
        .with_retryable(!matches!(e, object_store::Error::NotFound { .. }))
        .with_source(e)
}

#[async_trait]
#[typetag::serde(name = "weir-warehouse")]
impl Storage for WarehouseStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        match self.store()?.head(&self.object_path(path)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error(e)),
        }
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let meta = self
            .store()?
            .head(&self.object_path(path)?)
            .await
            .map_err(store_error)?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        let got = self
            .store()?
            .get(&self.object_path(path)?)
            .await
            .map_err(store_error)?;
        got.bytes().await.map_err(store_error)
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        Ok(Box::new(RangeReader {
            store: self.store()?,
            path: self.object_path(path)?,
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        self.store()?
            .put(&self.object_path(path)?, bs.into())
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        let writer =
            BufWriter::with_capacity(self.store()?, self.object_path(path)?, WRITE_BUFFER_BYTES);
        Ok(Box::new(Writer(Some(writer))))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        match self.store()?.delete(&self.object_path(path)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let store = self.store()?;
        let prefix = self.object_path(path.trim_end_matches('/'))?;
        // Listed whole before the deletes: a listing holds one of the host's object-store
        // requests in flight while it is read (state::store_guard).
        let listed: Vec<_> = store
            .list(Some(&prefix))
            .map(|m| m.map(|m| m.location))
            .collect()
            .await;
        let mut deleted = store.delete_stream(futures::stream::iter(listed).boxed());
        while let Some(result) = deleted.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_error(e)),
            }
        }
        Ok(())
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        let mut paths = paths;
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        self.object_path(path)?;
        Ok(InputFile::new(Arc::new(self.clone()), path.to_owned()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        self.object_path(path)?;
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_owned()))
    }
}

/// Ranged reads of one object (Parquet footers and column chunks).
#[derive(Debug)]
struct RangeReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
}

#[async_trait]
impl FileRead for RangeReader {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        self.store
            .get_range(&self.path, range)
            .await
            .map_err(store_error)
    }
}

/// A data file being written: one PUT when small, a multipart upload past
/// [`WRITE_BUFFER_BYTES`]. Nothing is visible until [`FileWrite::close`] completes it.
struct Writer(Option<BufWriter>);

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        let writer = self
            .0
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, "the file is closed"))?;
        writer.put(bs).await.map_err(store_error)
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut writer = self
            .0
            .take()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, "the file is closed"))?;
        writer.shutdown().await.map_err(|e| {
            Error::new(ErrorKind::Unexpected, "completing the upload failed").with_source(e)
        })
    }
}

/// Builds [`WarehouseStorage`] for the catalog's file IO: always the one warehouse it was made
/// for, whatever the configuration's properties say (a tenant's table cannot point its IO
/// elsewhere).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WarehouseStorageFactory(pub WarehouseStorage);

#[typetag::serde(name = "weir-warehouse")]
impl StorageFactory for WarehouseStorageFactory {
    fn build(&self, _config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn storage() -> WarehouseStorage {
        WarehouseStorage::with_store(
            "s3://bucket/warehouse/",
            Arc::new(InMemory::new()),
            Path::from("warehouse"),
        )
    }

    #[test]
    fn locations_outside_the_warehouse_are_refused() {
        let storage = storage();
        assert_eq!(
            storage
                .object_path("s3://bucket/warehouse/t1/flights/data/a.parquet")
                .expect("inside")
                .as_ref(),
            "warehouse/t1/flights/data/a.parquet"
        );
        for outside in [
            "s3://bucket/other/a",
            "s3://bucket/warehouse2/a",
            "s3://other/warehouse/a",
            "s3://bucket/warehouse/../state/a",
            "s3://bucket/warehouse//a",
            "s3://bucket/warehouse",
            "file:///etc/passwd",
        ] {
            assert!(storage.object_path(outside).is_err(), "{outside}");
            assert!(storage.new_output(outside).is_err(), "{outside}");
        }
    }

    #[tokio::test]
    async fn files_written_in_pieces_read_back_whole_and_by_range() {
        let storage = storage();
        let location = "s3://bucket/warehouse/t/x/data/f.parquet";
        let mut writer = storage.writer(location).await.expect("writer");
        writer
            .write(Bytes::from_static(b"hello "))
            .await
            .expect("write");
        writer
            .write(Bytes::from_static(b"world"))
            .await
            .expect("write");
        assert!(!storage.exists(location).await.expect("head"));
        writer.close().await.expect("close");
        assert_eq!(storage.read(location).await.expect("read"), "hello world");
        assert_eq!(storage.metadata(location).await.expect("head").size, 11);
        let reader = storage.reader(location).await.expect("reader");
        assert_eq!(reader.read(6..11).await.expect("range"), "world");
        storage
            .delete_prefix("s3://bucket/warehouse/t/x/")
            .await
            .expect("delete");
        assert!(!storage.exists(location).await.expect("head"));
        storage
            .delete(location)
            .await
            .expect("deleting twice is fine");
    }
}
