//! Transient vs corrupt at recovery (issue 4, docs/checkpoints.md "Recovery" step 3), through
//! the pipeline on the real broker and S3 server: when reading the newest checkpoint fails for
//! 30 s, recovery waits and then resumes from *that* checkpoint — never an older one, which
//! would re-read input. (The corrupt case — a truncated newest manifest falls back together
//! with the previous checkpoint's offsets — is in `checkpoint_recovery.rs`.)

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::state::lsm::backend::LsmBackend;
use weir_host::state::lsm::cache::BlockCaches;
use weir_host::state::lsm::tree::LsmSettings;
use weir_tests::*;

const PARTITIONS: i32 = 2;
const KEYS: u64 = 20;
const OUTAGE: Duration = Duration::from_secs(30);

/// Fails every GET of the `failing` objects with a generic (transient) store error until
/// `until`; everything else goes through.
#[derive(Debug)]
struct FailingGets {
    inner: Arc<dyn ObjectStore>,
    failing: HashSet<Path>,
    until: Instant,
    failed: AtomicU64,
}

impl std::fmt::Display for FailingGets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FailingGets({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for FailingGets {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        if self.failing.contains(location) && Instant::now() < self.until {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(object_store::Error::Generic {
                store: "test",
                source: "503 Slow Down (injected)".into(),
            });
        }
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<'static, object_store::Result<Path>>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_waits_out_an_outage_reading_the_newest_checkpoint_and_then_uses_it()
-> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (
        unique("outage-in"),
        unique("outage-out"),
        unique("outage-dlq"),
    );
    create_topics(&[(&input, PARTITIONS), (&output, PARTITIONS), (&dlq, 1)]).await?;
    let mut settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        Default::default(),
    );
    settings.state = lsm_state_on_s3(4 << 10).await?;
    // Only the checkpoints taken at each stop: two per shard, the second the newest.
    settings.pipeline.checkpoint_interval = Duration::from_secs(3600);
    let mut expected = BTreeMap::new();
    for (from, to) in [(0, 100), (100, 200)] {
        produce_counter(&input, PARTITIONS, (from, to), KEYS, &mut expected).await?;
        let running = RunningPipeline::start(settings.clone());
        running
            .wait_done(to - from, Duration::from_secs(60))
            .await?;
        running.stop().await?;
    }

    // The newest manifest of every shard: unreadable for the next 30 s.
    let lsm = &settings.state.lsm;
    let url = url::Url::parse(lsm.url.as_deref().expect("lsm url"))?;
    let (store, prefix) = object_store::parse_url_opts(&url, lsm.options.iter())?;
    let store: Arc<dyn ObjectStore> = Arc::from(store);
    let mut failing = HashSet::new();
    for partition in 0..PARTITIONS {
        let manifests = Path::from(format!(
            "{prefix}/pipelines/{}/shards/{partition:05}/manifest",
            settings.pipeline.name
        ));
        let newest = store
            .list(Some(&manifests))
            .map(|m| m.map(|m| m.location))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .max()
            .expect("the shard has manifests");
        failing.insert(newest);
    }
    let faulty = Arc::new(FailingGets {
        inner: store,
        failing,
        until: Instant::now() + OUTAGE,
        failed: AtomicU64::new(0),
    });
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = LsmBackend::new(
        faulty.clone(),
        prefix,
        Arc::new(BlockCaches::none()),
        LsmSettings {
            memtable_bytes_max: 4 << 10,
            ..LsmSettings::default()
        },
        clock.clone(),
    );

    produce_counter(&input, PARTITIONS, (200, 300), KEYS, &mut expected).await?;
    let running = RunningPipeline::start_on(settings.clone(), Arc::new(backend), clock);
    running
        .wait_done(100, OUTAGE + Duration::from_secs(60))
        .await?;
    let stats = running.stats.clone();
    running.stop().await?;
    assert!(
        faulty.failed.load(Ordering::Relaxed) >= 2 * PARTITIONS as u64,
        "recovery hit the outage and tried again"
    );
    assert_eq!(
        stats.records_in.load(Ordering::Relaxed),
        100,
        "resumed from the newest checkpoint: only the new records were read"
    );
    let counts = read_counts(&output, &expected, Duration::from_secs(30)).await?;
    for (key, n) in &expected {
        let once: Vec<u64> = (1..=*n).collect();
        assert_eq!(
            counts[key], once,
            "key {key}: one update per record, none repeated"
        );
    }
    Ok(())
}
