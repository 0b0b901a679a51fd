//! Test support: an object store that injects the failures real stores produce — a 409 with
//! nothing written, a lost acknowledgement, a failed PUT or GET, added latency — into the
//! operations on the paths a test names, in the order they were queued.

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One injected failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A PUT answers `AlreadyExists` without writing (a 409 "concurrent operation").
    ConflictNothingWritten,
    /// A PUT writes, then loses the acknowledgement.
    LostAck,
    /// A PUT fails without writing.
    PutFails,
    /// A GET fails.
    GetFails,
}

impl Fault {
    fn is_put(self) -> bool {
        self != Fault::GetFails
    }
}

/// Wraps the in-memory store, injecting queued faults.
#[derive(Debug, Default)]
pub struct FaultyStore {
    pub(crate) inner: InMemory,
    /// (path substring, fault), applied to the next matching operation.
    faults: Mutex<VecDeque<(&'static str, Fault)>>,
    latency_ms: AtomicU64,
}

impl FaultyStore {
    /// Queues `fault` for the next operation of its kind on any path.
    pub fn inject(&self, fault: Fault) {
        self.inject_on("", fault);
    }

    /// Queues `fault` for the next operation of its kind on a path containing `path_part`.
    pub fn inject_on(&self, path_part: &'static str, fault: Fault) {
        self.faults
            .lock()
            .expect("unpoisoned")
            .push_back((path_part, fault));
    }

    /// Drops the oldest queued fault; returns whether there was one.
    pub fn take_any(&self) -> bool {
        self.faults
            .lock()
            .expect("unpoisoned")
            .pop_front()
            .is_some()
    }

    /// Adds `latency` before every GET and PUT.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_ms
            .store(latency.as_millis() as u64, Ordering::Relaxed);
    }

    fn take(&self, location: &Path, put: bool) -> Option<Fault> {
        let mut faults = self.faults.lock().expect("unpoisoned");
        let i = faults
            .iter()
            .position(|(part, fault)| fault.is_put() == put && location.as_ref().contains(part))?;
        faults.remove(i).map(|(_, f)| f)
    }

    async fn delay(&self) {
        let ms = self.latency_ms.load(Ordering::Relaxed);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

fn injected(message: &'static str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: message.into(),
    }
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.delay().await;
        match self.take(location, true) {
            Some(Fault::ConflictNothingWritten) => Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                source: "409 ConditionalRequestConflict (injected)".into(),
            }),
            Some(Fault::LostAck) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(injected("connection reset after the PUT (injected)"))
            }
            Some(_) => Err(injected("503 SlowDown (injected)")),
            None => self.inner.put_opts(location, payload, opts).await,
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.delay().await;
        if self.take(location, false).is_some() {
            return Err(injected("500 InternalError on GET (injected)"));
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
