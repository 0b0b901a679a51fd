//! `slatedb-compare`: the workload of `weir bench-lsm` (`cli/src/lsm_bench.rs`) run on SlateDB
//! 0.18, printed as the same Markdown table so that the two can be quoted side by side.
//!
//! Workload (as Weir's, minus the open-size measurement):
//! 1. **Load**: `keys` puts of `value_bytes` incompressible bytes, keys in pseudo-random order,
//!    one `WriteBatch` of `batch` puts at a time, WAL off and no wait for durability; then flush
//!    the memtable and wait until compaction has settled; then a checkpoint.
//! 2. For each cache size (a fraction of the data's bytes, given to both the memory block cache
//!    and the local disk cache): open a `DbReader` at the checkpoint with empty caches, then
//!    - **gets, cold**: `sample` distinct keys in batches of `batch` concurrent gets;
//!    - **gets, warm**: the same keys again;
//!    - **scan, cold / warm**: an ordered scan of every key whose first byte is below 16 (1/16
//!      of the data), twice.
//!
//! The store is the local filesystem with a fixed latency added to every request.

mod latency_store;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt as _};
use serde::Serialize;
use slatedb::admin::AdminBuilder;
use slatedb::config::{
    CheckpointOptions, CheckpointScope, CompactorOptions, DbReaderOptions, FlushOptions, FlushType,
    ObjectStoreCacheOptions, Settings,
};
use slatedb::db_cache::moka::{MokaCache, MokaCacheOptions};
use slatedb::db_cache::{DEFAULT_META_CACHE_CAPACITY, DbCache, SplitCache};
use slatedb::{
    Db, DbReader, DbReaderMode, PathResolver, SstBlockSize, VersionedManifest, WriteBatch,
};
use slatedb_common::metrics::{DefaultMetricsRecorder, MetricValue, Metrics};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Path of the database inside the store (Weir's bench uses the same root).
const DB_PATH: &str = "load";

/// Memtable / L0 SST size, as Weir's bench (`memtable_bytes_max`).
const MEMTABLE_BYTES: usize = 16 << 20;

/// How often the compactor and its worker look for work (SlateDB's default is 5 s; shorter so
/// that the settle phase is not mostly waiting for the next poll).
const COMPACTOR_POLL: Duration = Duration::from_secs(1);

/// How long the store must stay unchanged, with no compaction running, to count as settled.
const QUIET: Duration = Duration::from_secs(4);

/// How long the settle phase may take before the run gives up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(600);

/// SlateDB's size-tiered scheduler compacts L0 once it holds this many SSTs (its default).
const L0_COMPACTION_TRIGGER: usize = 4;

/// The command line: the flags of `weir bench-lsm`, with the same defaults.
#[derive(Debug, Parser)]
#[command(about = "Runs the `weir bench-lsm` workload on SlateDB 0.18")]
struct Args {
    /// Scratch directory for the store (emptied first, removed after).
    #[arg(long, default_value = "target/bench-slatedb")]
    dir: PathBuf,
    /// Keys to load.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Value size, bytes.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Latency added to every object-store request, ms.
    #[arg(long, default_value_t = 30)]
    latency_ms: u64,
    /// Cache sizes, as fractions of the data.
    #[arg(long, value_delimiter = ',', default_value = "0,0.1,1")]
    cache: Vec<f64>,
    /// Keys per write batch / per round of concurrent gets.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Keys per get pass.
    #[arg(long, default_value_t = 20_000)]
    sample: usize,
    /// SST block size, KiB: 64 is Weir's block size, 4 SlateDB's default (1, 2, 4, …, 64).
    #[arg(long, default_value_t = 64)]
    block_kib: usize,
    /// Part size of the disk cache, KiB: the unit it fetches and stores (SlateDB's default is
    /// 4096; Weir's disk cache holds single blocks).
    #[arg(long, default_value_t = 4096)]
    part_kib: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The load phase.
#[derive(Debug, Clone, Serialize)]
struct LoadResult {
    /// Puts per second, memtable flushes included (compaction runs alongside).
    puts_per_s: f64,
    /// Seconds to flush the last memtable and settle compaction after the puts.
    settle_s: f64,
    /// Bytes of the SSTs the checkpoint references.
    data_bytes: u64,
    /// SSTs in L0, then SSTs in each sorted run (newest first).
    levels: Vec<usize>,
}

/// One cache size.
#[derive(Debug, Clone, Serialize)]
struct ReadResult {
    /// Cache size as a percentage of the data.
    cache_pct: f64,
    /// Gets per second with empty caches.
    gets_cold_per_s: f64,
    /// Gets per second on the second pass over the same keys.
    gets_warm_per_s: f64,
    /// Share of the warm pass's data-block reads served by a cache tier (see `hit_ratio`).
    warm_hit_ratio: Option<f64>,
    /// Scanned entries per second, first scan.
    scan_cold_per_s: f64,
    /// Scanned entries per second, second scan.
    scan_warm_per_s: f64,
}

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
struct Report {
    /// Latency added per request, ms.
    latency_ms: u64,
    /// Keys loaded.
    keys: u64,
    /// Value size, bytes.
    value_bytes: usize,
    /// SST block size, bytes.
    block_bytes: usize,
    /// Disk-cache part size, bytes.
    part_bytes: usize,
    /// The load phase.
    load: LoadResult,
    /// One row per cache size.
    reads: Vec<ReadResult>,
}

/// Key `i` of the workload: a bijective mix of `i`, big-endian, so that load order is random
/// in key space and every key is distinct (the same function as Weir's bench).
fn key(i: u64) -> [u8; 8] {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    x.to_be_bytes()
}

/// An incompressible value for key `i` (the same function as Weir's bench).
fn value(i: u64, len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len);
    let mut x = i ^ 0xD6E8_FEB8_6659_FD93;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let report = run(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", table(&report));
    }
    Ok(())
}

/// Runs the benchmark.
async fn run(args: &Args) -> anyhow::Result<Report> {
    anyhow::ensure!(
        args.keys > 0 && args.sample > 0,
        "--keys and --sample must be positive"
    );
    anyhow::ensure!(args.part_kib > 0, "--part-kib must be positive");
    let block_size = block_size(args.block_kib)?;
    let _ = std::fs::remove_dir_all(&args.dir);
    let store_dir = args.dir.join("store");
    std::fs::create_dir_all(&store_dir)
        .with_context(|| format!("creating {}", store_dir.display()))?;
    let local: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&store_dir)?);
    let store = latency_store::throttled(local.clone(), args.latency_ms);

    let (checkpoint, load) = load(args, &local, &store, block_size).await?;
    let mut reads = Vec::new();
    for &fraction in &args.cache {
        reads.push(read(args, &store, checkpoint, load.data_bytes, fraction).await?);
    }
    let _ = std::fs::remove_dir_all(&args.dir);
    Ok(Report {
        latency_ms: args.latency_ms,
        keys: args.keys,
        value_bytes: args.value_bytes,
        block_bytes: block_size.as_bytes(),
        part_bytes: args.part_kib << 10,
        load,
        reads,
    })
}

/// The SlateDB block size of `kib` KiB.
fn block_size(kib: usize) -> anyhow::Result<SstBlockSize> {
    Ok(match kib {
        1 => SstBlockSize::Block1Kib,
        2 => SstBlockSize::Block2Kib,
        4 => SstBlockSize::Block4Kib,
        8 => SstBlockSize::Block8Kib,
        16 => SstBlockSize::Block16Kib,
        32 => SstBlockSize::Block32Kib,
        64 => SstBlockSize::Block64Kib,
        other => anyhow::bail!("--block-kib {other}: SlateDB supports 1, 2, 4, 8, 16, 32 or 64"),
    })
}

/// The writer's settings: SlateDB's defaults, but no WAL, memtables / L0 SSTs and compaction
/// output SSTs of 16 MiB and at most three memtables in memory, as Weir's bench.
fn settings() -> Settings {
    let defaults = CompactorOptions::default();
    let compactor = CompactorOptions {
        poll_interval: COMPACTOR_POLL,
        worker: defaults
            .worker
            .clone()
            .map(|worker| slatedb::config::CompactionWorkerOptions {
                compactions_poll_interval: COMPACTOR_POLL,
                max_sst_size: MEMTABLE_BYTES,
                ..worker
            }),
        ..defaults
    };
    Settings {
        wal_enabled: false,
        l0_sst_size_bytes: MEMTABLE_BYTES,
        // The active memtable and two immutable ones, as Weir's `immutable_memtables_max: 2`.
        max_unflushed_bytes: 3 * MEMTABLE_BYTES,
        compactor_options: Some(compactor),
        ..Settings::default()
    }
}

/// Loads the keys, settles the store and takes a checkpoint; returns the reader mode that
/// opens that checkpoint.
async fn load(
    args: &Args,
    local: &Arc<dyn ObjectStore>,
    store: &Arc<dyn ObjectStore>,
    block_size: SstBlockSize,
) -> anyhow::Result<(DbReaderMode, LoadResult)> {
    let db = Db::builder(DB_PATH, store.clone())
        .with_settings(settings())
        .with_sst_block_size(block_size)
        .build()
        .await
        .context("opening the database")?;
    let started = Instant::now();
    let mut i = 0;
    while i < args.keys {
        let end = (i + args.batch.max(1) as u64).min(args.keys);
        let mut batch = WriteBatch::new();
        for n in i..end {
            batch.put_bytes(Bytes::copy_from_slice(&key(n)), value(n, args.value_bytes));
        }
        // Returns once the batch is in the memtable; its durability is not awaited.
        db.write(batch).await.context("writing a batch")?;
        i = end;
    }
    let puts_per_s = args.keys as f64 / started.elapsed().as_secs_f64();

    let settle = Instant::now();
    db.flush_with_options(FlushOptions {
        flush_type: FlushType::MemTable,
    })
    .await
    .context("flushing the memtable")?;
    let settled_at = wait_until_settled(&db, local).await?;
    let settle_s = (settled_at - settle).as_secs_f64();

    let checkpoint = db
        .create_checkpoint(CheckpointScope::All, &CheckpointOptions::default())
        .await
        .context("creating the checkpoint")?;
    let manifest = db.manifest();
    let data_bytes = referenced_sst_bytes(local, &manifest).await?;
    let levels = levels(&manifest);
    db.close().await.context("closing the writer")?;
    Ok((
        DbReaderMode::Checkpoint(checkpoint.id),
        LoadResult {
            puts_per_s,
            settle_s,
            data_bytes,
            levels,
        },
    ))
}

/// The L0 SST count, then the SST count of each sorted run.
fn levels(manifest: &VersionedManifest) -> Vec<usize> {
    std::iter::once(manifest.l0().len())
        .chain(manifest.compacted().iter().map(|run| run.sst_views().len()))
        .collect()
}

/// Waits until L0 is below the compaction trigger, no compaction is running and the tree has
/// not changed for [`QUIET`]; returns when that state was first seen (so the quiet period
/// itself is not counted).
async fn wait_until_settled(db: &Db, local: &Arc<dyn ObjectStore>) -> anyhow::Result<Instant> {
    // Reads the compaction state straight from the local store: these polls are the
    // benchmark's, not the engine's, so they pay no injected latency.
    let admin = AdminBuilder::new(DB_PATH, local.clone()).build();
    let mut last: Option<(Vec<usize>, Vec<u32>)> = None;
    let started = Instant::now();
    let mut since = started;
    loop {
        anyhow::ensure!(
            started.elapsed() < SETTLE_TIMEOUT,
            "compaction has not settled after {SETTLE_TIMEOUT:?}"
        );
        db.refresh_manifest()
            .await
            .context("refreshing the manifest")?;
        let manifest = db.manifest();
        let shape = (
            levels(&manifest),
            manifest.compacted().iter().map(|run| run.id).collect(),
        );
        let running = admin
            .read_compactions(None)
            .await
            .context("reading the compactions")?
            .is_some_and(|c| c.recent_compactions().any(|c| c.active()));
        let busy = running || manifest.l0().len() >= L0_COMPACTION_TRIGGER;
        if busy || last.as_ref() != Some(&shape) {
            last = Some(shape);
            since = Instant::now();
        } else if since.elapsed() >= QUIET {
            return Ok(since);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sum of the sizes of the SST objects `manifest` references (compaction inputs that the
/// garbage collector has not deleted yet are not data).
async fn referenced_sst_bytes(
    local: &Arc<dyn ObjectStore>,
    manifest: &VersionedManifest,
) -> anyhow::Result<u64> {
    let paths = PathResolver::new(DB_PATH, manifest);
    let views = manifest.l0().iter().chain(
        manifest
            .compacted()
            .iter()
            .flat_map(|run| run.sst_views().iter()),
    );
    let mut total = 0;
    for view in views {
        let path = paths.sst_path(&view.sst.id);
        total += local
            .head(&path)
            .await
            .with_context(|| format!("sizing {path}"))?
            .size;
    }
    Ok(total)
}

/// Opens a reader in mode `checkpoint` (pinned to the loaded state) with caches of
/// `fraction` × `data_bytes` and measures it.
async fn read(
    args: &Args,
    store: &Arc<dyn ObjectStore>,
    checkpoint: DbReaderMode,
    data_bytes: u64,
    fraction: f64,
) -> anyhow::Result<ReadResult> {
    let cache_bytes = (data_bytes as f64 * fraction) as u64;
    let block_cache: Option<Arc<dyn DbCache>> = (cache_bytes > 0).then(|| {
        Arc::new(MokaCache::new_with_opts(MokaCacheOptions {
            max_capacity: cache_bytes,
            ..MokaCacheOptions::default()
        })) as Arc<dyn DbCache>
    });
    // Indexes and filters are cached whatever the block cache size, as Weir keeps the index
    // and filter of every SST it has opened in memory.
    let meta_cache: Arc<dyn DbCache> = Arc::new(MokaCache::new_with_opts(MokaCacheOptions {
        max_capacity: DEFAULT_META_CACHE_CAPACITY,
        ..MokaCacheOptions::default()
    }));
    let db_cache = Arc::new(
        SplitCache::new()
            .with_block_cache(block_cache)
            .with_meta_cache(Some(meta_cache))
            .build(),
    );
    let disk_cache_dir = args.dir.join(format!("disk-cache-{}", fraction * 100.0));
    let _ = std::fs::remove_dir_all(&disk_cache_dir);
    let object_store_cache_options = if cache_bytes > 0 {
        ObjectStoreCacheOptions {
            root_folder: Some(disk_cache_dir.clone()),
            max_cache_size_bytes: Some(usize::try_from(cache_bytes)?),
            part_size_bytes: args.part_kib << 10,
            ..ObjectStoreCacheOptions::default()
        }
    } else {
        ObjectStoreCacheOptions::default()
    };
    let metrics = Arc::new(DefaultMetricsRecorder::new());
    let reader = DbReader::builder(DB_PATH, store.clone())
        .with_reader_mode(checkpoint)
        .with_options(DbReaderOptions {
            object_store_cache_options,
            skip_wal_replay: true,
            ..DbReaderOptions::default()
        })
        .with_db_cache(db_cache, 0)
        .with_metrics_recorder(metrics.clone())
        .build()
        .await
        .context("opening the reader")?;

    let step = (args.keys / args.sample.max(1) as u64).max(1);
    let sample: Vec<[u8; 8]> = (0..args.sample as u64)
        .map(|n| key(n * step % args.keys))
        .collect();
    let gets_cold_per_s = get_pass(&reader, &sample, args.batch).await?;
    let before = metrics.snapshot();
    let gets_warm_per_s = get_pass(&reader, &sample, args.batch).await?;
    let warm_hit_ratio = hit_ratio(&before, &metrics.snapshot(), cache_bytes > 0);
    let scan_cold_per_s = scan_pass(&reader).await?;
    let scan_warm_per_s = scan_pass(&reader).await?;
    reader.close().await.context("closing the reader")?;
    let _ = std::fs::remove_dir_all(&disk_cache_dir);
    Ok(ReadResult {
        cache_pct: fraction * 100.0,
        gets_cold_per_s,
        gets_warm_per_s,
        warm_hit_ratio,
        scan_cold_per_s,
        scan_warm_per_s,
    })
}

/// Reads `sample` in rounds of `batch` concurrent gets; returns gets per second.
async fn get_pass(reader: &DbReader, sample: &[[u8; 8]], batch: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    for chunk in sample.chunks(batch.max(1)) {
        let got = futures::future::join_all(chunk.iter().map(|k| reader.get(k))).await;
        for value in got {
            anyhow::ensure!(value?.is_some(), "a loaded key is missing");
        }
    }
    Ok(sample.len() as f64 / started.elapsed().as_secs_f64())
}

/// Scans every key whose first byte is below 16, prefix by prefix; returns entries per second.
async fn scan_pass(reader: &DbReader) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut n = 0usize;
    for first in 0u8..16 {
        let mut iter = reader.scan(vec![first]..vec![first + 1]).await?;
        while iter.next().await?.is_some() {
            n += 1;
        }
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Value of the counter `name` with `labels` (0 when it was never registered).
fn counter(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
    match metrics.by_name_and_labels(name, labels).map(|m| &m.value) {
        Some(MetricValue::Counter(v)) => *v,
        _ => 0,
    }
}

/// Share of the data-block reads between two snapshots that a cache tier served:
/// (memory hits + disk-cache part hits) / (that + object-store fetches), where the fetches are
/// the disk cache's part misses (or the memory misses, without a disk cache). Weir's ratio is
/// the same quotient over its block reads. `None` when nothing was read.
fn hit_ratio(before: &Metrics, after: &Metrics, disk_cache: bool) -> Option<f64> {
    let delta = |name: &str, labels: &[(&str, &str)]| {
        counter(after, name, labels).saturating_sub(counter(before, name, labels))
    };
    let access = slatedb::db_cache_stats::ACCESS_COUNT;
    let memory_hits = delta(access, &[("entry_kind", "data_block"), ("result", "hit")]);
    let memory_misses = delta(access, &[("entry_kind", "data_block"), ("result", "miss")]);
    let (disk_hits, fetches) = if disk_cache {
        let hits = delta(slatedb::cached_object_store_stats::PART_HIT_COUNT, &[]);
        let accesses = delta(slatedb::cached_object_store_stats::PART_ACCESS_COUNT, &[]);
        (hits, accesses.saturating_sub(hits))
    } else {
        (0, memory_misses)
    };
    let hits = memory_hits + disk_hits;
    (hits + fetches > 0).then(|| hits as f64 / (hits + fetches) as f64)
}

/// The report as a Markdown table, in the shape of Weir's `lsm_bench::table`.
fn table(report: &Report) -> String {
    let mut out = format!(
        "SlateDB 0.18, local-filesystem store + {} ms per request, {} keys × {} B, {} KiB blocks, {} KiB disk-cache parts\n\n\
         load: {:.0} puts/s; settle {:.2} s; {:.1} MiB in SSTs per L0 / sorted run {:?}\n\n\
         | cache (% of data) | gets/s cold | gets/s warm | warm hit ratio | scan entries/s cold | scan entries/s warm |\n\
         |---:|---:|---:|---:|---:|---:|\n",
        report.latency_ms,
        report.keys,
        report.value_bytes,
        report.block_bytes >> 10,
        report.part_bytes >> 10,
        report.load.puts_per_s,
        report.load.settle_s,
        report.load.data_bytes as f64 / f64::from(1u32 << 20),
        report.load.levels,
    );
    for r in &report.reads {
        let ratio = r
            .warm_hit_ratio
            .map_or_else(|| "n/a".to_owned(), |h| format!("{h:.2}"));
        out.push_str(&format!(
            "| {:.0} % | {:.0} | {:.0} | {} | {:.0} | {:.0} |\n",
            r.cache_pct,
            r.gets_cold_per_s,
            r.gets_warm_per_s,
            ratio,
            r.scan_cold_per_s,
            r.scan_warm_per_s
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_values_sized() {
        let keys: std::collections::HashSet<_> = (0..10_000).map(key).collect();
        assert_eq!(keys.len(), 10_000);
        assert_eq!(value(7, 100).len(), 100);
        assert_ne!(value(7, 100), value(8, 100));
    }

    #[test]
    fn settings_are_valid() {
        assert!(settings().validate().is_ok());
    }
}
