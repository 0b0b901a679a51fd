//! `weir bench-checkpoint`: checkpoint duration, bytes uploaded and recovery time of one `lsm`
//! shard by state size, on a local-filesystem object store with injected request latency (the
//! same wrapper as `weir bench-lsm`). The goal (issue 4): durations that do not grow with the
//! state size, because earlier SSTs are already in the store and recovery reads lazily.
//!
//! For each size:
//! 1. **State**: bulk-load about `size` MiB of `value_bytes` values as 64 MiB SSTs in the level
//!    leveled compaction would hold them (written straight to the filesystem, no latency), with
//!    a checkpoint manifest.
//! 2. **Checkpoints**: open the shard through the real backend (recover, claim), then `rounds`
//!    times: apply `rate` updates/s of random existing keys (batches of 512, every 10 ms) for
//!    `interval`, then [`Shard::checkpoint`] — memtable flush, create-only manifest, GC — timed.
//!    The update rate is the same for every size.
//! 3. **Recovery**, `rounds` times with cold caches (a new backend, as a new process): open the
//!    shard (list manifests, read the newest checkpoint, list SSTs, claim) and process a first
//!    batch of 512 random keys — one concurrent `get_many`, as the runtime's prefetch, then an
//!    `apply` — timed from the start of the open to the end of that batch. Kafka's part
//!    (rebalance, seek) does not depend on the state size and is not included.

use crate::lsm_bench::{bulk_load, median, prepare_scratch, throttled, value};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::ids::{Offset, Partition};
use weir_host::state::checkpoint::{DecidedBy, InputOffsets};
use weir_host::state::lsm::backend::LsmBackend;
use weir_host::state::lsm::cache::{BlockCaches, CacheSettings};
use weir_host::state::lsm::tree::LsmSettings;
use weir_host::state::{Shard, ShardId, StateBackend, StateWrite};

/// Keys per update batch and per recovery batch.
const BATCH: usize = 512;

/// What to run (`weir bench-checkpoint`'s options).
#[derive(Debug, Clone, clap::Args)]
pub struct CheckpointBenchOptions {
    /// Scratch directory for the store: must be new, empty or a previous run's; emptied first,
    /// removed after.
    #[arg(long, default_value = "target/bench-checkpoint")]
    pub dir: std::path::PathBuf,
    /// State sizes, MiB.
    #[arg(long, value_delimiter = ',', default_value = "100,1024,5120")]
    pub sizes_mb: Vec<u64>,
    /// Bytes per value.
    #[arg(long, default_value_t = 1000)]
    pub value_bytes: usize,
    /// Latency added to every object-store request, ms.
    #[arg(long, default_value_t = 30)]
    pub latency_ms: u64,
    /// Updates per second between checkpoints (the same for every size).
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Time between checkpoints, ms.
    #[arg(
        long = "interval-ms",
        value_name = "MS",
        default_value = "2000",
        value_parser = crate::millis
    )]
    pub interval: Duration,
    /// Checkpoints, and recoveries, per size.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

/// Results for one state size.
#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    /// Requested size, MiB.
    pub size_mb: u64,
    /// Keys in the state.
    pub keys: u64,
    /// Bytes of SSTs the shard's checkpoint references after the rounds.
    pub state_bytes: u64,
    /// Median checkpoint duration, ms.
    pub checkpoint_ms: f64,
    /// Slowest checkpoint, ms.
    pub checkpoint_ms_max: f64,
    /// Median bytes one checkpoint uploaded.
    pub uploaded_bytes: f64,
    /// Updates applied per second (achieved).
    pub updates_per_s: f64,
    /// Median time to open the shard (recover + claim), ms.
    pub open_ms: f64,
    /// Median time from the start of the open to the end of the first batch, ms.
    pub recovery_ms: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointBenchReport {
    /// Latency per request, ms.
    pub latency_ms: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// Updates per second asked for.
    pub rate: u64,
    /// Time between checkpoints, ms.
    pub interval_ms: u64,
    /// One row per size.
    pub sizes: Vec<SizeResult>,
}

/// Runs the benchmark.
///
/// # Errors
/// When the options are out of range, or the scratch directory or the store fails.
pub async fn run(opts: &CheckpointBenchOptions) -> anyhow::Result<CheckpointBenchReport> {
    anyhow::ensure!(!opts.sizes_mb.is_empty(), "--sizes-mb needs a size");
    anyhow::ensure!(
        opts.sizes_mb.iter().all(|s| *s > 0),
        "--sizes-mb takes sizes of at least 1 MiB"
    );
    anyhow::ensure!(opts.value_bytes > 0, "--value-bytes must be at least 1");
    anyhow::ensure!(opts.rate > 0, "--rate must be at least 1");
    anyhow::ensure!(opts.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(
        opts.interval >= Duration::from_millis(10),
        "--interval-ms must be at least 10"
    );
    prepare_scratch(&opts.dir)?;
    let local: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&opts.dir)?);
    let store = throttled(local.clone(), opts.latency_ms);
    let mut sizes = Vec::new();
    for &size_mb in &opts.sizes_mb {
        let result = one_size(opts, &local, &store, size_mb).await;
        // Each size's files go before the next is written (5 GiB adds up).
        let _ = std::fs::remove_dir_all(opts.dir.join(format!("size-{size_mb}")));
        sizes.push(result?);
    }
    let _ = std::fs::remove_dir_all(&opts.dir);
    Ok(CheckpointBenchReport {
        latency_ms: opts.latency_ms,
        value_bytes: opts.value_bytes,
        rate: opts.rate,
        interval_ms: opts.interval.as_millis() as u64,
        sizes,
    })
}

/// The level leveled compaction would keep `size_mb` of data in (level 1 holds 256 MiB, each
/// next level 10 times more), so that the bulk-loaded state needs no compaction.
fn level_for(size_mb: u64) -> usize {
    let settings = LsmSettings::default();
    let mut target = settings.level_base_bytes;
    let mut level = 1;
    while size_mb << 20 > target && level + 1 < settings.levels_max {
        target = target.saturating_mul(settings.level_size_ratio);
        level += 1;
    }
    level
}

fn backend(store: &Arc<dyn ObjectStore>, size_mb: u64) -> anyhow::Result<LsmBackend> {
    let clock: SharedClock = Arc::new(SystemClock);
    // The production defaults: 256 MiB memory block cache, 1 GiB disk cache, both empty.
    let caches = BlockCaches::new(&CacheSettings {
        block_cache_bytes: 256 << 20,
        disk_cache_bytes: 1 << 30,
        disk_cache_dir: None,
    })?;
    Ok(LsmBackend::new(
        store.clone(),
        Path::from(format!("size-{size_mb}")),
        Arc::new(caches),
        LsmSettings::default(),
        clock,
    ))
}

fn shard_id() -> ShardId {
    ShardId {
        pipeline: "bench".into(),
        partition: Partition(0),
    }
}

/// A pseudo-random key below `keys` for step `i`.
fn random_key(i: u64, keys: u64) -> u64 {
    crate::lsm_bench::key(i)
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
        % keys
}

async fn one_size(
    opts: &CheckpointBenchOptions,
    local: &Arc<dyn ObjectStore>,
    store: &Arc<dyn ObjectStore>,
    size_mb: u64,
) -> anyhow::Result<SizeResult> {
    let writer = backend(store, size_mb)?;
    let root = writer.shard_root(&shard_id());
    let keys = bulk_load(local, &root, size_mb, opts.value_bytes, level_for(size_mb)).await?;
    let shard = writer.open_shard(&shard_id()).await?;

    let mut offsets = InputOffsets::new();
    let mut step = 0u64;
    let mut checkpoint_ms = Vec::new();
    let mut uploaded = Vec::new();
    let mut state_bytes = 0;
    let per_tick = (opts.rate / 100).max(1);
    let mut updating = Duration::ZERO;
    for _ in 0..opts.rounds {
        let round_started = Instant::now();
        let mut ticks = tokio::time::interval(Duration::from_millis(10));
        while round_started.elapsed() < opts.interval {
            ticks.tick().await;
            for chunk_start in (0..per_tick).step_by(BATCH) {
                let n = (per_tick - chunk_start).min(BATCH as u64);
                let writes = (step..step + n)
                    .map(|i| {
                        let k = random_key(i, keys);
                        StateWrite {
                            key: k.to_be_bytes().to_vec(),
                            value: Some(value(k ^ i, opts.value_bytes)),
                            expires_at_ms: None,
                        }
                    })
                    .collect();
                shard.apply(writes).await?;
                step += n;
            }
        }
        updating += round_started.elapsed();
        offsets.advance("bench", Offset(step as i64));
        let started = Instant::now();
        let report = shard
            .checkpoint(&offsets, DecidedBy::Manifest)
            .await?
            .ok_or_else(|| anyhow::anyhow!("an lsm shard checkpoints durably"))?;
        checkpoint_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        uploaded.push(report.uploaded_bytes as f64);
        state_bytes = report.state_bytes;
    }
    let updates_per_s = step as f64 / updating.as_secs_f64();
    drop(shard);
    drop(writer);

    let mut open_ms = Vec::new();
    let mut recovery_ms = Vec::new();
    for attempt in 0..opts.rounds as u64 {
        let reader = backend(store, size_mb)?;
        let started = Instant::now();
        let shard = reader.open_shard(&shard_id()).await?;
        open_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            shard.recovered_offsets()? == Some(offsets.clone()),
            "recovery resumes from the last checkpoint"
        );
        let batch: Vec<Vec<u8>> = (0..BATCH as u64)
            .map(|i| {
                random_key(attempt * 1_000_003 + i, keys)
                    .to_be_bytes()
                    .to_vec()
            })
            .collect();
        let values = shard.get_many(&batch).await?;
        anyhow::ensure!(
            values.iter().all(Option::is_some),
            "every key of the state reads back"
        );
        let writes = batch
            .into_iter()
            .map(|key| StateWrite {
                key,
                value: Some(value(attempt, opts.value_bytes)),
                expires_at_ms: None,
            })
            .collect();
        shard.apply(writes).await?;
        recovery_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let max = checkpoint_ms.iter().copied().fold(0.0, f64::max);
    Ok(SizeResult {
        size_mb,
        keys,
        state_bytes,
        checkpoint_ms: median(&mut checkpoint_ms),
        checkpoint_ms_max: max,
        uploaded_bytes: median(&mut uploaded),
        updates_per_s,
        open_ms: median(&mut open_ms),
        recovery_ms: median(&mut recovery_ms),
    })
}

/// The report as a Markdown table.
pub fn table(report: &CheckpointBenchReport) -> String {
    let mut out = format!(
        "{} ms per request, {} B values, {} updates/s asked, checkpoint every {} ms\n\n",
        report.latency_ms, report.value_bytes, report.rate, report.interval_ms
    );
    out.push_str("| state | keys | updates/s | checkpoint ms (median / max) | uploaded per checkpoint | open ms | open + first batch ms |\n");
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|\n");
    for s in &report.sizes {
        out.push_str(&format!(
            "| {:.0} MiB | {} | {:.0} | {:.0} / {:.0} | {:.1} MiB | {:.0} | {:.0} |\n",
            s.state_bytes as f64 / f64::from(1 << 20),
            s.keys,
            s.updates_per_s,
            s.checkpoint_ms,
            s.checkpoint_ms_max,
            s.uploaded_bytes / f64::from(1 << 20),
            s.open_ms,
            s.recovery_ms,
        ));
    }
    out
}
