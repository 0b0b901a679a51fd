//! A fixed wait before every object-store request, the same wrapper as `LatencyStore` in
//! `cli/src/lsm_bench.rs` (`object_store`'s own `ThrottledStore` panics on a whole-object GET
//! from the local filesystem store, so it cannot be used here).

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use std::sync::Arc;
use std::time::Duration;

/// Wraps `inner` so that every request first waits `latency_ms`.
pub fn throttled(inner: Arc<dyn ObjectStore>, latency_ms: u64) -> Arc<dyn ObjectStore> {
    Arc::new(LatencyStore {
        inner,
        wait: Duration::from_millis(latency_ms),
    })
}

/// Adds a fixed wait before every request, concurrent requests waiting in parallel (as
/// `object_store`'s `ThrottledStore` per call). Deletes are not delayed, as in Weir's bench.
#[derive(Debug)]
struct LatencyStore {
    inner: Arc<dyn ObjectStore>,
    wait: Duration,
}

impl std::fmt::Display for LatencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LatencyStore({:?}, {})", self.wait, self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for LatencyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        tokio::time::sleep(self.wait).await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        tokio::time::sleep(self.wait).await;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        tokio::time::sleep(self.wait).await;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        tokio::time::sleep(self.wait).await;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let wait = self.wait;
        let inner = self.inner.list(prefix);
        Box::pin(
            futures::stream::once(async move {
                tokio::time::sleep(wait).await;
                inner
            })
            .flatten(),
        )
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        tokio::time::sleep(self.wait).await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        tokio::time::sleep(self.wait).await;
        self.inner.copy_opts(from, to, options).await
    }

    /// One request (the default would be a delayed copy plus a delete); Weir's wrapper leaves
    /// this to the default, but Weir never renames.
    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        tokio::time::sleep(self.wait).await;
        self.inner.rename_opts(from, to, options).await
    }
}
