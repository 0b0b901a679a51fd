//! Transient vs corrupt at recovery (issue 4, docs/checkpoints.md "Recovery" step 3), through
//! the pipeline on the real broker and S3 server: when reading the newest checkpoint fails for
//! 30 s, recovery waits and then resumes from *that* checkpoint — never an older one, which
//! would re-read input. (The corrupt case — a truncated newest manifest falls back together
//! with the previous checkpoint's offsets — is in `checkpoint_recovery.rs`.)

use futures::StreamExt;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::state::hooked_store::{HookedStore, Request, RequestHook};
use weir_host::state::lsm::backend::LsmBackend;
use weir_host::state::lsm::cache::BlockCaches;
use weir_host::state::lsm::tree::LsmSettings;
use weir_tests::*;

const PARTITIONS: i32 = 2;
const KEYS: u64 = 20;
/// 30 s in the long tier (SCENARIOS.md S8); 10 s in the short one.
fn outage_length() -> Duration {
    tiered(Duration::from_secs(10), Duration::from_secs(30))
}

/// Fails every GET of the `failing` objects with a generic (transient) store error until
/// `until`; everything else goes through.
#[derive(Debug)]
struct FailingGets {
    failing: HashSet<Path>,
    until: Instant,
    failed: AtomicU64,
}

#[async_trait::async_trait]
impl RequestHook for FailingGets {
    async fn before(&self, request: Request, location: Option<&Path>) -> object_store::Result<()> {
        let failing = location.is_some_and(|l| self.failing.contains(l));
        if request == Request::Get && failing && Instant::now() < self.until {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(object_store::Error::Generic {
                store: "test",
                source: "503 Slow Down (injected)".into(),
            });
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_waits_out_an_outage_reading_the_newest_checkpoint_and_then_uses_it()
-> anyhow::Result<()> {
    let (mut settings, output) = counter_pipeline_on_s3("outage", PARTITIONS).await?;
    let input = settings.pipeline.input_topics[0].clone();
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
    let outage = Arc::new(FailingGets {
        failing,
        until: Instant::now() + outage_length(),
        failed: AtomicU64::new(0),
    });
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = LsmBackend::new(
        Arc::new(HookedStore::new(store, outage.clone())),
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
        .wait_done(100, outage_length() + Duration::from_secs(60))
        .await?;
    let stats = running.stats.clone();
    running.stop().await?;
    assert!(
        outage.failed.load(Ordering::Relaxed) >= 2 * PARTITIONS as u64,
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
