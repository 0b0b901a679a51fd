//! [`HookedStore`]: an object store that runs a [`RequestHook`] before every request of the
//! store it wraps — to add latency (the benchmarks) or to fail chosen requests (outage tests).
//! `object_store`'s own `ThrottledStore` covers latency only, and panics on a whole-object GET
//! from the local filesystem store.

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::sync::Arc;

/// Which kind of request a hook sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A PUT (whole object or the start of a multipart upload).
    Put,
    /// A GET, whole or ranged.
    Get,
    /// A LIST.
    List,
    /// A COPY.
    Copy,
}

/// Runs before a request of a [`HookedStore`]; an error fails the request without reaching
/// the inner store. Deletes are not hooked.
#[async_trait::async_trait]
pub trait RequestHook: std::fmt::Debug + Send + Sync + 'static {
    /// Called before `request` on `location` (the prefix, for a LIST).
    async fn before(&self, request: Request, location: Option<&Path>) -> object_store::Result<()>;
}

/// `inner` with `hook` run before each request.
#[derive(Debug)]
pub struct HookedStore<H> {
    inner: Arc<dyn ObjectStore>,
    hook: Arc<H>,
}

impl<H: RequestHook> HookedStore<H> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, hook: Arc<H>) -> Self {
        Self { inner, hook }
    }
}

impl<H: RequestHook> std::fmt::Display for HookedStore<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HookedStore({:?}, {})", self.hook, self.inner)
    }
}

#[async_trait::async_trait]
impl<H: RequestHook> ObjectStore for HookedStore<H> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.hook.before(Request::Put, Some(location)).await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.hook.before(Request::Put, Some(location)).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.hook.before(Request::Get, Some(location)).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.hook.before(Request::Get, Some(location)).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (hook, inner) = (self.hook.clone(), self.inner.clone());
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            match hook.before(Request::List, prefix.as_ref()).await {
                Ok(()) => inner.list(prefix.as_ref()),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.hook.before(Request::List, prefix).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.hook.before(Request::Copy, Some(to)).await?;
        self.inner.copy_opts(from, to, options).await
    }
}

/// A hook that waits a fixed time before every request, concurrent requests waiting in
/// parallel: an object store's latency.
#[derive(Debug, Clone, Copy)]
pub struct Latency(pub std::time::Duration);

#[async_trait::async_trait]
impl RequestHook for Latency {
    async fn before(&self, _: Request, _: Option<&Path>) -> object_store::Result<()> {
        tokio::time::sleep(self.0).await;
        Ok(())
    }
}
