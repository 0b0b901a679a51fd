//! The guard against a store slowed to a fixed request rate (SCENARIOS.md S20), in paused time.

use super::*;
use object_store::memory::InMemory;
use object_store::{ObjectStoreExt, PutMode, PutPayload};

/// A server that answers `rate` requests a second, one at a time, and a client that gives up
/// on a request after `timeout` (a 503 or a timeout, both `Generic`): a degraded S3 server.
#[derive(Debug)]
struct SlowServer {
    inner: InMemory,
    turn: tokio::sync::Mutex<()>,
    per_request: Duration,
    timeout: Duration,
    waiting: AtomicU64,
    waiting_peak: AtomicU64,
    served: AtomicU64,
}

impl SlowServer {
    fn new(rate: u32, timeout: Duration) -> Self {
        Self {
            inner: InMemory::new(),
            turn: tokio::sync::Mutex::new(()),
            per_request: Duration::from_secs(1) / rate,
            timeout,
            waiting: AtomicU64::new(0),
            waiting_peak: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    /// Waits for the server's turn (or times out), then takes `per_request`.
    async fn serve(&self) -> object_store::Result<()> {
        let now = self.waiting.fetch_add(1, Ordering::Relaxed) + 1;
        self.waiting_peak.fetch_max(now, Ordering::Relaxed);
        let answered = tokio::time::timeout(self.timeout, async {
            let _turn = self.turn.lock().await;
            tokio::time::sleep(self.per_request).await;
        })
        .await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        match answered {
            Ok(()) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(_) => Err(object_store::Error::Generic {
                store: "slow",
                source: "request timed out".into(),
            }),
        }
    }
}

impl std::fmt::Display for SlowServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlowServer")
    }
}

#[async_trait::async_trait]
impl ObjectStore for SlowServer {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.serve().await?;
        self.inner.put_opts(location, payload, opts).await
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
        self.serve().await?;
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

/// 1,000 reads at once (many partitions' prefetches) from a server answering 10 requests a
/// second, whose client gives up after 0.5 s; returns how many succeeded.
async fn read_storm(store: &Arc<dyn ObjectStore>) -> usize {
    let path = Path::from("p/block");
    let reads = (0..1000).map(|_| {
        let store = store.clone();
        let path = path.clone();
        async move { store.get(&path).await.is_ok() }
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_store_slowed_to_a_fixed_rate_sees_bounded_requests_in_flight_and_retries_within_the_budget()
 {
    let server = Arc::new(SlowServer::new(10, Duration::from_millis(500)));
    server
        .inner
        .put(&Path::from("p/block"), PutPayload::from_static(b"x"))
        .await
        .expect("seeded");

    // Unguarded, every read waits at the server at once.
    let unguarded: Arc<dyn ObjectStore> = server.clone();
    read_storm(&unguarded).await;
    assert_eq!(server.waiting_peak.load(Ordering::Relaxed), 1000);

    let server = Arc::new(SlowServer::new(10, Duration::from_millis(500)));
    server
        .inner
        .put(&Path::from("p/block"), PutPayload::from_static(b"x"))
        .await
        .expect("seeded");
    let guard = Arc::new(StoreGuard::new(REQUESTS_IN_FLIGHT_MAX));
    let store: Arc<dyn ObjectStore> = Arc::new(GuardedStore::new(server.clone(), guard.clone()));
    let started = Instant::now();
    let ok = read_storm(&store).await;
    let elapsed = started.elapsed().as_secs_f64();

    assert!(
        server.waiting_peak.load(Ordering::Relaxed) <= REQUESTS_IN_FLIGHT_MAX as u64,
        "the server never sees more than the guard's {REQUESTS_IN_FLIGHT_MAX} requests: {}",
        server.waiting_peak.load(Ordering::Relaxed)
    );
    assert_eq!(
        guard.in_flight_peak(),
        REQUESTS_IN_FLIGHT_MAX as u64,
        "requests in flight reach the bound"
    );
    assert_eq!(guard.requests(), 1000);
    // Retries: the budget's burst, a tenth of the first attempts, its refill per second.
    let allowed =
        RETRY_BUDGET_TOKENS_MAX + 1000.0 * RETRY_BUDGET_RATIO + RETRY_BUDGET_PER_SECOND * elapsed;
    assert!(
        (guard.retries() as f64) <= allowed,
        "{} retries in {elapsed:.1} s, the budget allows {allowed:.0}",
        guard.retries()
    );
    assert!(
        guard.retries_denied() > 0,
        "the budget ran out and the errors went to the callers"
    );
    assert!(
        guard.retries() <= 1000 * u64::from(RETRIES_PER_CALL_MAX),
        "at most three retries a call"
    );
    assert_eq!(
        ok as u64 + (1000 - ok as u64),
        1000,
        "every read ended, succeeded or failed"
    );
    assert!(ok > 0, "the server answered some reads");
    eprintln!(
        "{ok} of 1000 reads in {elapsed:.1} s; {} retries, {} refused by the budget",
        guard.retries(),
        guard.retries_denied()
    );
}

#[tokio::test(start_paused = true)]
async fn only_transient_errors_are_retried() {
    let guard = Arc::new(StoreGuard::new(4));
    let store = GuardedStore::new(Arc::new(InMemory::new()), guard.clone());
    let missing = store.get(&Path::from("absent")).await;
    assert!(matches!(missing, Err(object_store::Error::NotFound { .. })));
    assert_eq!(
        guard.retries(),
        0,
        "a missing object is an answer, not an outage"
    );
    // A create-only PUT of an existing object: an answer too.
    let path = Path::from("once");
    store
        .put_opts(&path, PutPayload::from_static(b"a"), PutMode::Create.into())
        .await
        .expect("created");
    let again = store
        .put_opts(&path, PutPayload::from_static(b"b"), PutMode::Create.into())
        .await;
    assert!(matches!(
        again,
        Err(object_store::Error::AlreadyExists { .. })
    ));
    assert_eq!(guard.retries(), 0);
}

#[test]
fn the_jittered_backoff_stays_under_its_doubling_cap() {
    for n in 0..8 {
        let cap = BACKOFF_BASE.saturating_mul(1 << n).min(BACKOFF_CAP);
        for _ in 0..100 {
            assert!(jittered(n) <= cap);
        }
    }
}

/// `InMemory` whose LIST answers as a stream that must not be polled once it ended (as the S3
/// client's paginated one, built with `unfold`).
#[derive(Debug, Default)]
struct StrictLists(InMemory);

impl std::fmt::Display for StrictLists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StrictLists")
    }
}

#[async_trait::async_trait]
impl ObjectStore for StrictLists {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.0.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.0.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.0.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let listed = self.0.list(prefix);
        futures::stream::unfold(listed, |mut listed| async move {
            listed.next().await.map(|item| (item, listed))
        })
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.0.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

#[tokio::test]
async fn a_listing_that_ends_at_once_is_not_polled_again() {
    let store = GuardedStore::new(
        Arc::new(StrictLists::default()),
        Arc::new(StoreGuard::new(4)),
    );
    let empty: Vec<_> = store.list(Some(&Path::from("none"))).collect().await;
    assert!(empty.is_empty());
    store
        .put(&Path::from("some/a"), PutPayload::from_static(b"a"))
        .await
        .expect("put");
    let one: Vec<_> = store.list(Some(&Path::from("some"))).collect().await;
    assert_eq!(one.len(), 1);
}
