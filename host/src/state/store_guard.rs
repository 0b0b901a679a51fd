//! [`GuardedStore`]: every object store the host opens goes through one [`StoreGuard`] per
//! process, which bounds the requests in flight and gives retries a budget (SCENARIOS.md S20: a
//! host against an S3 server slowed to ~15 requests/s made ~66,000 retries in 13 minutes with
//! no bound on concurrent requests, and the server, at 14,000 threads, took minutes to answer
//! one).
//!
//! - **Requests in flight** are bounded by a semaphore shared by every store of the process
//!   (`runtime.store_requests_in_flight_max`, default [`REQUESTS_IN_FLIGHT_MAX`]): sized so
//!   that the latency-bound reads of many partitions still overlap, small enough that a
//!   degraded store sees a bounded load. A request holds its permit until its answer is read
//!   (a GET's body, a LIST's pages); a retry waits for a permit again, and gives its own back
//!   while it backs off.
//! - **Retries** are this layer's (the S3 client's own are off: `max_retries = 0`), for
//!   transient errors only (`object_store::Error::Generic`: a transport error, a timeout, a
//!   5xx; never a missing object, a precondition, a denial), at most [`RETRIES_PER_CALL_MAX`]
//!   per call, after a backoff with full jitter (`random(0, min(cap, base × 2^n))`, as in the
//!   AWS Builders' Library's "Timeouts, retries and backoff with jitter"), and only while the
//!   process's [`RetryBudget`] allows: a token bucket refilled by a tenth of a token per first
//!   attempt and [`RETRY_BUDGET_PER_SECOND`] tokens a second (Finagle's retry budget). Once it
//!   is empty the error goes to the caller at once: the partition pauses and backs off
//!   (docs/checkpoints.md), and the store can recover.
//!
//! Why one guard per process rather than per store: the bound is on what one host asks of the
//! store, whatever the number of pipelines, shards and tables it runs (each of which opens a
//! store). It is set once, at start, from the host's settings ([`StoreGuard::configure`]).

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Default of `runtime.store_requests_in_flight_max`: object-store requests one host has in
/// flight at most.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;

/// Retries of one call at most (after its first attempt).
pub const RETRIES_PER_CALL_MAX: u32 = 3;

/// Tokens a second the retry budget refills by, besides a tenth of a token per first attempt:
/// the retries a host may make each second when nothing succeeds.
pub const RETRY_BUDGET_PER_SECOND: f64 = 10.0;

/// Tokens a first attempt adds to the retry budget: retries are at most this share of
/// requests (plus the per-second allowance).
pub const RETRY_BUDGET_RATIO: f64 = 0.1;

/// Most tokens the budget holds: the burst of retries after a quiet spell.
pub const RETRY_BUDGET_TOKENS_MAX: f64 = 100.0;

/// First backoff cap; doubles per retry up to [`BACKOFF_CAP`].
const BACKOFF_BASE: Duration = Duration::from_millis(50);

/// Longest backoff before a retry.
const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// A token bucket that retries draw on (module docs).
#[derive(Debug)]
pub struct RetryBudget {
    tokens: f64,
    refilled: Instant,
}

impl RetryBudget {
    /// A full budget.
    pub fn new() -> Self {
        Self {
            tokens: RETRY_BUDGET_TOKENS_MAX,
            refilled: Instant::now(),
        }
    }

    /// A first attempt was made: a tenth of a token.
    pub fn deposit(&mut self) {
        self.tokens = (self.tokens + RETRY_BUDGET_RATIO).min(RETRY_BUDGET_TOKENS_MAX);
    }

    /// Takes a token for a retry now, if there is one.
    pub fn withdraw(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.refilled).as_secs_f64() * RETRY_BUDGET_PER_SECOND;
        self.refilled = now;
        self.tokens = (self.tokens + refill).min(RETRY_BUDGET_TOKENS_MAX);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new()
    }
}

/// What a process asks of object storage: the permits of requests in flight, the retry budget
/// and their counts (module docs).
#[derive(Debug)]
pub struct StoreGuard {
    permits: Arc<Semaphore>,
    in_flight_max: usize,
    budget: Mutex<RetryBudget>,
    /// Requests in flight now, and the most at once.
    in_flight: AtomicU64,
    in_flight_peak: AtomicU64,
    /// First attempts, retries made, retries the budget refused.
    requests: AtomicU64,
    retries: AtomicU64,
    retries_denied: AtomicU64,
    denials_logged: crate::telemetry::LogBudget,
}

/// The process's guard, once configured or first used.
static PROCESS: OnceLock<Arc<StoreGuard>> = OnceLock::new();

impl StoreGuard {
    /// A guard of `in_flight_max` requests in flight (at least 1) and a full retry budget.
    pub fn new(in_flight_max: usize) -> Self {
        let in_flight_max = in_flight_max.max(1);
        Self {
            permits: Arc::new(Semaphore::new(in_flight_max)),
            in_flight_max,
            budget: Mutex::new(RetryBudget::new()),
            in_flight: AtomicU64::new(0),
            in_flight_peak: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            retries_denied: AtomicU64::new(0),
            denials_logged: crate::telemetry::LogBudget::new(1),
        }
    }

    /// Sets the process's guard to `in_flight_max` requests in flight, if no store was opened
    /// yet (a host calls this at start, from `runtime.store_requests_in_flight_max`); returns
    /// the guard in force.
    pub fn configure(in_flight_max: usize) -> Arc<StoreGuard> {
        PROCESS
            .get_or_init(|| Arc::new(StoreGuard::new(in_flight_max)))
            .clone()
    }

    /// The process's guard ([`REQUESTS_IN_FLIGHT_MAX`] unless configured first).
    pub fn process() -> Arc<StoreGuard> {
        Self::configure(REQUESTS_IN_FLIGHT_MAX)
    }

    /// Requests in flight at most.
    pub fn in_flight_max(&self) -> usize {
        self.in_flight_max
    }

    /// The most requests that were in flight at once.
    pub fn in_flight_peak(&self) -> u64 {
        self.in_flight_peak.load(Ordering::Relaxed)
    }

    /// First attempts made.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Retries made.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Retries the budget refused (the error went to the caller).
    pub fn retries_denied(&self) -> u64 {
        self.retries_denied.load(Ordering::Relaxed)
    }

    /// Waits for a request's permit.
    async fn permit(self: &Arc<Self>) -> Permit {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the guard never closes its semaphore");
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.in_flight_peak.fetch_max(now, Ordering::Relaxed);
        metrics::gauge!("weir_object_store_requests_in_flight").increment(1.0);
        Permit {
            _permit: permit,
            guard: self.clone(),
        }
    }

    /// Whether a call that failed with `error` after `retries` retries may try again: a
    /// transient error, retries left, and a token in the budget.
    fn may_retry(&self, error: &object_store::Error, retries: u32) -> bool {
        if !transient(error) || retries >= RETRIES_PER_CALL_MAX {
            return false;
        }
        let granted = self
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .withdraw();
        if granted {
            self.retries.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("weir_object_store_retries_total").increment(1);
        } else {
            self.retries_denied.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("weir_object_store_retries_denied_total").increment(1);
            if let Some(suppressed) = self.denials_logged.admit() {
                tracing::warn!(%error, suppressed, "object store failing: the retry budget is spent, the error goes to the caller (its partition backs off)");
            }
        }
        granted
    }

    fn first_attempt(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deposit();
    }

    /// Runs `call` (one request) under a permit, retrying as the module docs say.
    async fn run<T, F, Fut>(self: &Arc<Self>, mut call: F) -> object_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        self.first_attempt();
        let mut retries = 0;
        loop {
            let permit = self.permit().await;
            let result = call().await;
            drop(permit);
            match result {
                Err(error) if self.may_retry(&error, retries) => {
                    tokio::time::sleep(jittered(retries)).await;
                    retries += 1;
                }
                done => return done,
            }
        }
    }

    /// Runs a streaming `call` (a LIST) under a permit held while its stream is read; retried
    /// as [`StoreGuard::run`] when its first item is a transient error (nothing was yielded).
    fn run_stream<T: Send + 'static>(
        self: &Arc<Self>,
        call: impl Fn() -> BoxStream<'static, object_store::Result<T>> + Send + 'static,
    ) -> BoxStream<'static, object_store::Result<T>> {
        let guard = self.clone();
        futures::stream::once(async move {
            guard.first_attempt();
            let mut retries = 0;
            loop {
                let permit = guard.permit().await;
                let mut stream = call();
                match stream.next().await {
                    Some(Err(error)) if guard.may_retry(&error, retries) => {
                        drop(permit);
                        tokio::time::sleep(jittered(retries)).await;
                        retries += 1;
                    }
                    // Ended at once (nothing listed): never polled again.
                    None => return futures::stream::empty().boxed(),
                    Some(first) => {
                        let rest = stream.map(move |item| {
                            let _held = &permit;
                            item
                        });
                        return futures::stream::once(async { first }).chain(rest).boxed();
                    }
                }
            }
        })
        .flatten()
        .boxed()
    }
}

/// A request's permit; counted out when dropped.
struct Permit {
    _permit: OwnedSemaphorePermit,
    guard: Arc<StoreGuard>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.guard.in_flight.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!("weir_object_store_requests_in_flight").decrement(1.0);
    }
}

/// Whether `error` is worth a retry: a transport error, a timeout or a server error, which
/// `object_store` reports as `Generic`; never an answer about the object (missing, exists,
/// precondition, not modified) or the caller (denied, unauthenticated, a bad path).
fn transient(error: &object_store::Error) -> bool {
    matches!(error, object_store::Error::Generic { .. })
}

/// The wait before retry `n` (from 0): full jitter over `min(cap, base × 2^n)`.
fn jittered(n: u32) -> Duration {
    use rand::Rng;
    let ceiling = BACKOFF_BASE.saturating_mul(1 << n.min(16)).min(BACKOFF_CAP);
    ceiling.mul_f64(rand::thread_rng().r#gen::<f64>())
}

/// `inner` behind the process's [`StoreGuard`] (module docs).
#[derive(Debug)]
pub struct GuardedStore {
    inner: Arc<dyn ObjectStore>,
    guard: Arc<StoreGuard>,
}

impl GuardedStore {
    /// `inner` behind `guard`.
    pub fn new(inner: Arc<dyn ObjectStore>, guard: Arc<StoreGuard>) -> Self {
        Self { inner, guard }
    }
}

impl std::fmt::Display for GuardedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GuardedStore({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for GuardedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        // A retry after a lost answer meets its own write: a create-only PUT then says
        // `AlreadyExists`, which its caller reads back (docs/checkpoints.md step 5).
        self.guard
            .run(|| self.inner.put_opts(location, payload.clone(), opts.clone()))
            .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        // The upload's parts are the caller's to retry; its start is bounded like any call.
        let permit = self.guard.permit().await;
        let upload = self.inner.put_multipart_opts(location, opts).await;
        drop(permit);
        upload
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.guard.first_attempt();
        let mut retries = 0;
        loop {
            let permit = self.guard.permit().await;
            match self.inner.get_opts(location, options.clone()).await {
                Err(error) if self.guard.may_retry(&error, retries) => {
                    drop(permit);
                    tokio::time::sleep(jittered(retries)).await;
                    retries += 1;
                }
                Err(error) => return Err(error),
                Ok(mut got) => {
                    // The body is part of the request: the permit goes once it is read.
                    if let GetResultPayload::Stream(body) = got.payload {
                        let body = body.map(move |chunk| {
                            let _held = &permit;
                            chunk
                        });
                        got.payload = GetResultPayload::Stream(body.boxed());
                    }
                    return Ok(got);
                }
            }
        }
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.guard
            .run(|| self.inner.get_ranges(location, ranges))
            .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        // Bulk deletes (up to 1,000 objects a request) under one permit, held while they run.
        let (guard, inner) = (self.guard.clone(), self.inner.clone());
        futures::stream::once(async move {
            guard.first_attempt();
            let permit = guard.permit().await;
            inner
                .delete_stream(locations)
                .map(move |deleted| {
                    let _held = &permit;
                    deleted
                })
                .boxed()
        })
        .flatten()
        .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (inner, prefix) = (self.inner.clone(), prefix.cloned());
        self.guard.run_stream(move || inner.list(prefix.as_ref()))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (inner, prefix, offset) = (self.inner.clone(), prefix.cloned(), offset.clone());
        self.guard
            .run_stream(move || inner.list_with_offset(prefix.as_ref(), &offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.guard
            .run(|| self.inner.list_with_delimiter(prefix))
            .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.guard
            .run(|| self.inner.copy_opts(from, to, options.clone()))
            .await
    }
}

#[cfg(test)]
mod tests;
