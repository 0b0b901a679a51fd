//! [`HookedStore`]: an object store that runs a [`RequestHook`] before (and after) every request
//! of the store it wraps — to add latency (the benchmarks), to fail chosen requests (outage
//! tests) or to count requests and bytes ([`Metering`], a pipeline run's metrics).
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
    /// A DELETE (seen by [`RequestHook::after`] only, once per deleted object).
    Delete,
}

impl Request {
    /// The request's name in metrics: `put`, `get`, `list`, `copy`, `delete`.
    pub fn name(self) -> &'static str {
        match self {
            Request::Put => "put",
            Request::Get => "get",
            Request::List => "list",
            Request::Copy => "copy",
            Request::Delete => "delete",
        }
    }
}

/// Runs before a request of a [`HookedStore`]; an error fails the request without reaching
/// the inner store. Deletes are not hooked.
#[async_trait::async_trait]
pub trait RequestHook: std::fmt::Debug + Send + Sync + 'static {
    /// Called before `request` on `location` (for a LIST the prefix, or the offset of a LIST
    /// after one).
    async fn before(&self, request: Request, location: Option<&Path>) -> object_store::Result<()>;

    /// Called after `request` succeeded, with the bytes it moved (a PUT's payload, a GET's
    /// body; 0 for the others). A multipart upload counts its start only.
    fn after(&self, request: Request, bytes: u64) {
        let _ = (request, bytes);
    }

    /// Awaited after `request` succeeded and before it returns, with the bytes it moved (as
    /// [`Self::after`]): where a hook charges for the transfer itself ([`CostModel`]'s time
    /// per MiB). Nothing by default.
    async fn transferred(&self, request: Request, bytes: u64) {
        let _ = (request, bytes);
    }
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
        let bytes = payload.content_length() as u64;
        let result = self.inner.put_opts(location, payload, opts).await?;
        self.hook.transferred(Request::Put, bytes).await;
        self.hook.after(Request::Put, bytes);
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.hook.before(Request::Put, Some(location)).await?;
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        self.hook.after(Request::Put, 0);
        Ok(upload)
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.hook.before(Request::Get, Some(location)).await?;
        // A HEAD (object_store's `head` is a GET with `head` set) moves no body, though its
        // result names the object's whole range.
        let head = options.head;
        let result = self.inner.get_opts(location, options).await?;
        let bytes = if head {
            0
        } else {
            result.range.end - result.range.start
        };
        self.hook.transferred(Request::Get, bytes).await;
        self.hook.after(Request::Get, bytes);
        Ok(result)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.hook.before(Request::Get, Some(location)).await?;
        let got = self.inner.get_ranges(location, ranges).await?;
        let bytes = got.iter().map(|b| b.len() as u64).sum();
        self.hook.transferred(Request::Get, bytes).await;
        // object_store may coalesce the ranges; count them as the caller asked.
        for bytes in &got {
            self.hook.after(Request::Get, bytes.len() as u64);
        }
        Ok(got)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let hook = self.hook.clone();
        self.inner
            .delete_stream(locations)
            .inspect(move |deleted| {
                if deleted.is_ok() {
                    hook.after(Request::Delete, 0);
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (hook, inner) = (self.hook.clone(), self.inner.clone());
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            match hook.before(Request::List, prefix.as_ref()).await {
                Ok(()) => {
                    hook.after(Request::List, 0);
                    inner.list(prefix.as_ref())
                }
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    /// Passed down as a LIST after `offset` (S3's `start-after`), not a whole LIST filtered
    /// here; the hook sees the offset as the location.
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (hook, inner) = (self.hook.clone(), self.inner.clone());
        let (prefix, offset) = (prefix.cloned(), offset.clone());
        futures::stream::once(async move {
            match hook.before(Request::List, Some(&offset)).await {
                Ok(()) => {
                    hook.after(Request::List, 0);
                    inner.list_with_offset(prefix.as_ref(), &offset)
                }
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.hook.before(Request::List, prefix).await?;
        let listed = self.inner.list_with_delimiter(prefix).await?;
        self.hook.after(Request::List, 0);
        Ok(listed)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.hook.before(Request::Copy, Some(to)).await?;
        self.inner.copy_opts(from, to, options).await?;
        self.hook.after(Request::Copy, 0);
        Ok(())
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

/// A hook that charges each request a fixed time before it and a time per MiB it moved after
/// it (a PUT's payload, a GET's body), concurrent requests waiting in parallel: a simple cost
/// model of an object store, where larger fetch units are not free (`weir bench-big-state`).
/// Counts the requests and bytes of each kind, for the report.
#[derive(Debug, Default)]
pub struct CostModel {
    /// Waited before every request.
    pub per_request: std::time::Duration,
    /// Waited per MiB (2^20 bytes) a PUT or GET moved, pro rata.
    pub per_mib: std::time::Duration,
    requests: [std::sync::atomic::AtomicU64; 5],
    bytes: [std::sync::atomic::AtomicU64; 5],
}

impl CostModel {
    /// A model of `per_request` before each request and `per_mib` per MiB moved.
    pub fn new(per_request: std::time::Duration, per_mib: std::time::Duration) -> Self {
        Self {
            per_request,
            per_mib,
            ..Self::default()
        }
    }

    /// Requests of `request`'s kind that succeeded so far, and the bytes they moved.
    pub fn totals(&self, request: Request) -> (u64, u64) {
        let i = request as usize;
        (
            self.requests[i].load(std::sync::atomic::Ordering::Relaxed),
            self.bytes[i].load(std::sync::atomic::Ordering::Relaxed),
        )
    }
}

#[async_trait::async_trait]
impl RequestHook for CostModel {
    async fn before(&self, _: Request, _: Option<&Path>) -> object_store::Result<()> {
        tokio::time::sleep(self.per_request).await;
        Ok(())
    }

    async fn transferred(&self, _: Request, bytes: u64) {
        let wait = self.per_mib.mul_f64(bytes as f64 / f64::from(1u32 << 20));
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    fn after(&self, request: Request, bytes: u64) {
        let i = request as usize;
        self.requests[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.bytes[i].fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A hook that counts each request and its bytes into a pipeline run's
/// `weir_object_store_requests_total{op}` and `weir_object_store_bytes_total{op}` (and reads
/// them back, for `weir bench`). A LIST counts once per call, not per page.
#[derive(Debug)]
pub struct Metering {
    requests: [metrics::Counter; 5],
    bytes: [metrics::Counter; 5],
    totals: [std::sync::atomic::AtomicU64; 5],
}

const REQUESTS: [Request; 5] = [
    Request::Put,
    Request::Get,
    Request::List,
    Request::Copy,
    Request::Delete,
];

impl Metering {
    /// Counts into `metrics`' series (nothing is exported for unlabelled metrics).
    pub fn new(metrics: &crate::telemetry::RunMetrics) -> Self {
        Self {
            requests: REQUESTS
                .map(|r| metrics.counter("weir_object_store_requests_total", &[("op", r.name())])),
            bytes: REQUESTS
                .map(|r| metrics.counter("weir_object_store_bytes_total", &[("op", r.name())])),
            totals: Default::default(),
        }
    }

    /// Requests of `request`'s kind counted so far.
    pub fn requests(&self, request: Request) -> u64 {
        self.totals[request as usize].load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[async_trait::async_trait]
impl RequestHook for Metering {
    async fn before(&self, _: Request, _: Option<&Path>) -> object_store::Result<()> {
        Ok(())
    }

    fn after(&self, request: Request, bytes: u64) {
        let i = request as usize;
        self.totals[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.requests[i].increment(1);
        self.bytes[i].increment(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_cost_model_charges_each_request_and_each_mib_it_moved() -> object_store::Result<()>
    {
        let model = Arc::new(CostModel::new(
            Duration::from_millis(30),
            Duration::from_millis(10),
        ));
        let store = HookedStore::new(Arc::new(InMemory::new()), model.clone());
        let path = Path::from("sst/1");
        let started = tokio::time::Instant::now();
        store
            .put(&path, PutPayload::from(vec![7u8; 2 << 20]))
            .await?;
        assert_eq!(started.elapsed(), Duration::from_millis(30 + 20));

        let started = tokio::time::Instant::now();
        let half = store.get_range(&path, 0..(1 << 19)).await?;
        assert_eq!(half.len(), 1 << 19);
        assert_eq!(started.elapsed(), Duration::from_millis(30 + 5));

        let started = tokio::time::Instant::now();
        let whole = store.get(&path).await?.bytes().await?;
        assert_eq!(whole.len(), 2 << 20);
        assert_eq!(started.elapsed(), Duration::from_millis(30 + 20));

        // A HEAD is charged as a request that moved nothing.
        let started = tokio::time::Instant::now();
        assert_eq!(store.head(&path).await?.size, 2 << 20);
        assert_eq!(started.elapsed(), Duration::from_millis(30));

        assert_eq!(model.totals(Request::Put), (1, 2 << 20));
        assert_eq!(model.totals(Request::Get), (3, (2 << 20) + (1 << 19)));
        assert_eq!(model.totals(Request::List), (0, 0));
        Ok(())
    }
}
