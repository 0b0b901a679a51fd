//! `weir bench-lsm`: the LSM backend on a local-filesystem object store with injected request
//! latency (moto answers a range GET by reading the whole
//! object, so it cannot stand in for S3 here).
//!
//! The latency is added per request by a small wrapper (`object_store`'s own `ThrottledStore`
//! panics on a whole-object GET from the local filesystem store).
//!
//! Workload (the same one `bench/slatedb-compare` runs on SlateDB):
//! 1. **Load**: `keys` puts of `value_bytes` incompressible bytes, keys in pseudo-random order
//!    (8-byte big-endian of a bijective mix of 0..keys), applied `batch` at a time; then flush
//!    and settle compaction; then a checkpoint manifest.
//! 2. For each cache size (a fraction of the data's bytes, given to both the memory block cache
//!    and the disk cache): open the tree at the checkpoint with empty caches, then
//!    - **gets, cold**: `sample` distinct keys in batches of `batch`, each batch one
//!      concurrent `get_many` (as the runtime's prefetch does);
//!    - **gets, warm**: the same keys again;
//!    - **scan, cold / warm**: an ordered scan of every key whose first byte is below 16 (1/16
//!      of the data), in pages of 1000, twice.
//! 3. **Open**: bulk-load a store of each `open_sizes_mb` (bottom-level SSTs of 64 MiB written
//!    directly), then time claim + open at the checkpoint, and claim + open + one get.

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::state::hooked_store::{HookedStore, Latency};
use weir_host::state::lsm::cache::{BlockCaches, CacheSettings, CacheStats, SstFiles};
use weir_host::state::lsm::sst::Entry;
use weir_host::state::lsm::sst::SstBuilder;
use weir_host::state::lsm::tree::{LsmSettings, LsmTree, SstId};
use weir_host::state::manifest::{Manifest, ManifestKind, ManifestStore, SstRef};
use weir_host::state::{Shard, StateWrite};

/// What to run (`weir bench-lsm`'s options).
#[derive(Debug, Clone, clap::Args)]
pub struct LsmBenchOptions {
    /// Scratch directory for the local-filesystem store: must be new, empty or a previous
    /// run's; emptied first, removed after.
    #[arg(long, default_value = "target/bench-lsm")]
    pub dir: std::path::PathBuf,
    /// Keys to load.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Value size, bytes.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Latency added to every object-store request, ms.
    #[arg(long, default_value_t = 30)]
    pub latency_ms: u64,
    /// Cache sizes, as fractions of the loaded bytes.
    #[arg(
        long = "cache",
        value_name = "FRACTIONS",
        value_delimiter = ',',
        default_value = "0,0.1,1"
    )]
    pub cache_fractions: Vec<f64>,
    /// Keys per `apply` / `get_many`.
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Keys read per get pass.
    #[arg(long, default_value_t = 20_000)]
    pub sample: usize,
    /// Store sizes for the open measurement, MiB (0 skips it).
    #[arg(long, value_delimiter = ',', default_value = "10,1024")]
    pub open_sizes_mb: Vec<u64>,
}

/// The load phase.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    /// Puts per second, flushes included (compaction runs alongside).
    pub puts_per_s: f64,
    /// Seconds to flush the last memtable and settle compaction after the puts.
    pub settle_s: f64,
    /// Bytes of SSTs in the checkpoint.
    pub data_bytes: u64,
    /// SSTs per level in the checkpoint.
    pub levels: Vec<usize>,
}

/// One cache size.
#[derive(Debug, Clone, Serialize)]
pub struct ReadResult {
    /// Cache size as a percentage of the data.
    pub cache_pct: f64,
    /// Gets per second with empty caches.
    pub gets_cold_per_s: f64,
    /// Gets per second on the second pass over the same keys.
    pub gets_warm_per_s: f64,
    /// Share of the warm pass's block reads served by a cache tier.
    pub warm_hit_ratio: f64,
    /// Scanned entries per second, first scan.
    pub scan_cold_per_s: f64,
    /// Scanned entries per second, second scan.
    pub scan_warm_per_s: f64,
}

/// One store size of the open measurement.
#[derive(Debug, Clone, Serialize)]
pub struct OpenResult {
    /// Store size, MiB of SSTs.
    pub size_mb: u64,
    /// Claim + open at the checkpoint, ms (median of 5).
    pub open_ms: f64,
    /// Claim + open + one get, ms (median of 5).
    pub open_and_first_get_ms: f64,
}

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
pub struct LsmBenchReport {
    /// Latency added per request, ms.
    pub latency_ms: u64,
    /// Keys and value size.
    pub keys: u64,
    /// Value size, bytes.
    pub value_bytes: usize,
    /// The load phase.
    pub load: LoadResult,
    /// One row per cache size.
    pub reads: Vec<ReadResult>,
    /// One row per store size.
    pub open: Vec<OpenResult>,
}

/// Key `i` of the workload: a bijective mix of `i`, big-endian, so that load order is random
/// in key space and every key is distinct.
pub fn key(i: u64) -> [u8; 8] {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    x.to_be_bytes()
}

/// An incompressible value for key `i`.
pub fn value(i: u64, len: usize) -> Bytes {
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

/// `inner` with `latency_ms` added to every request ([`Latency`]).
pub(crate) fn throttled(inner: Arc<dyn ObjectStore>, latency_ms: u64) -> Arc<dyn ObjectStore> {
    Arc::new(HookedStore::new(
        inner,
        Arc::new(Latency(Duration::from_millis(latency_ms))),
    ))
}

fn tree_settings() -> LsmSettings {
    LsmSettings {
        memtable_bytes_max: 16 << 20,
        target_file_bytes: 16 << 20,
        level_base_bytes: 64 << 20,
        ..LsmSettings::default()
    }
}

/// Runs the benchmark.
///
/// # Errors
/// When the scratch directory or the store fails.
pub async fn run(opts: &LsmBenchOptions) -> anyhow::Result<LsmBenchReport> {
    anyhow::ensure!(opts.keys > 0, "--keys must be at least 1");
    anyhow::ensure!(opts.batch > 0, "--batch must be at least 1");
    anyhow::ensure!(opts.sample > 0, "--sample must be at least 1");
    anyhow::ensure!(
        opts.cache_fractions
            .iter()
            .all(|f| f.is_finite() && (0.0..=1.0).contains(f)),
        "--cache takes fractions of the data between 0 and 1, e.g. 0,0.1,1"
    );
    prepare_scratch(&opts.dir)?;
    let local: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&opts.dir)?);
    let store = throttled(local.clone(), opts.latency_ms);
    let clock: SharedClock = Arc::new(SystemClock);
    let root = Path::from("load");

    let (checkpoint, load) = load(opts, &store, &root, &clock).await?;
    let mut reads = Vec::new();
    for &fraction in &opts.cache_fractions {
        reads.push(
            read(
                opts,
                &store,
                &root,
                &checkpoint,
                load.data_bytes,
                fraction,
                &clock,
            )
            .await?,
        );
    }
    let mut open = Vec::new();
    for &size_mb in opts.open_sizes_mb.iter().filter(|s| **s > 0) {
        open.push(measure_open(opts, &local, &store, size_mb, &clock).await?);
    }
    let _ = std::fs::remove_dir_all(&opts.dir);
    Ok(LsmBenchReport {
        latency_ms: opts.latency_ms,
        keys: opts.keys,
        value_bytes: opts.value_bytes,
        load,
        reads,
        open,
    })
}

/// Marks a scratch directory as the benchmark's own.
const SCRATCH_MARKER: &str = ".weir-bench-lsm";

/// Empties `dir` for a run — only when it is absent, empty, or marked as a previous run's —
/// and marks it.
pub(crate) fn prepare_scratch(dir: &std::path::Path) -> anyhow::Result<()> {
    if dir.exists() {
        let ours = dir.join(SCRATCH_MARKER).exists();
        let empty = std::fs::read_dir(dir)?.next().is_none();
        anyhow::ensure!(
            ours || empty,
            "--dir {} holds files this benchmark did not write; give an empty or new directory",
            dir.display()
        );
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(SCRATCH_MARKER), b"")?;
    Ok(())
}

async fn load(
    opts: &LsmBenchOptions,
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    clock: &SharedClock,
) -> anyhow::Result<(Manifest, LoadResult)> {
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let claim = manifests.claim("bench", None, &[]).await?;
    let files = SstFiles::new(store.clone(), Arc::new(BlockCaches::none()));
    let tree = LsmTree::new(
        files,
        root.clone(),
        claim.writer_epoch,
        tree_settings(),
        clock.clone(),
    );
    let started = Instant::now();
    let mut i = 0;
    while i < opts.keys {
        let end = (i + opts.batch as u64).min(opts.keys);
        let writes = (i..end)
            .map(|n| StateWrite {
                key: key(n).to_vec(),
                value: Some(value(n, opts.value_bytes)),
                expires_at_ms: None,
            })
            .collect();
        tree.apply(writes).await?;
        i = end;
    }
    let puts_per_s = opts.keys as f64 / started.elapsed().as_secs_f64();
    let settle = Instant::now();
    tree.flush().await?;
    tree.compact_until_settled().await?;
    let settle_s = settle.elapsed().as_secs_f64();
    let levels = tree.levels();
    let checkpoint = claim.next_checkpoint(levels.clone(), Default::default());
    manifests.commit(&checkpoint).await?;
    let data_bytes = levels.iter().flatten().map(|r| r.size_bytes).sum();
    Ok((
        checkpoint,
        LoadResult {
            puts_per_s,
            settle_s,
            data_bytes,
            levels: levels.iter().map(Vec::len).collect(),
        },
    ))
}

async fn read(
    opts: &LsmBenchOptions,
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    checkpoint: &Manifest,
    data_bytes: u64,
    fraction: f64,
    clock: &SharedClock,
) -> anyhow::Result<ReadResult> {
    let cache_bytes = (data_bytes as f64 * fraction) as u64;
    let caches = Arc::new(BlockCaches::new(&CacheSettings {
        block_cache_bytes: cache_bytes,
        disk_cache_bytes: cache_bytes,
        disk_cache_dir: Some(opts.dir.join("disk-cache")),
    })?);
    let files = SstFiles::new(store.clone(), caches.clone());
    let tree = LsmTree::open(
        files,
        root.clone(),
        checkpoint,
        u64::MAX,
        tree_settings(),
        clock.clone(),
    )?;
    let sample: Vec<Vec<u8>> = (0..opts.sample as u64)
        .map(|n| key(n * (opts.keys / opts.sample.max(1) as u64).max(1) % opts.keys).to_vec())
        .collect();
    let gets_cold_per_s = get_pass(&tree, &sample, opts.batch).await?;
    let before = caches.stats();
    let gets_warm_per_s = get_pass(&tree, &sample, opts.batch).await?;
    let warm_hit_ratio = hit_ratio(before, caches.stats());
    let scan_cold_per_s = scan_pass(&tree).await?;
    let scan_warm_per_s = scan_pass(&tree).await?;
    Ok(ReadResult {
        cache_pct: fraction * 100.0,
        gets_cold_per_s,
        gets_warm_per_s,
        warm_hit_ratio,
        scan_cold_per_s,
        scan_warm_per_s,
    })
}

/// Reads `sample` in batches of `batch` concurrent gets; returns gets per second.
async fn get_pass(tree: &LsmTree, sample: &[Vec<u8>], batch: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    for chunk in sample.chunks(batch.max(1)) {
        let got = tree.get_many(chunk).await?;
        anyhow::ensure!(got.iter().all(Option::is_some), "a loaded key is missing");
    }
    Ok(sample.len() as f64 / started.elapsed().as_secs_f64())
}

/// Scans every key whose first byte is below 16 in pages of 1000; returns entries per second.
async fn scan_pass(tree: &LsmTree) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut n = 0usize;
    for first in 0u8..16 {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = tree.scan(&[first], after.as_deref(), 1000).await?;
            n += page.len();
            match page.last() {
                Some((k, _)) if page.len() == 1000 => after = Some(k.clone()),
                _ => break,
            }
        }
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

fn hit_ratio(before: CacheStats, after: CacheStats) -> f64 {
    let hits = (after.memory_hits - before.memory_hits) + (after.disk_hits - before.disk_hits);
    let gets = after.block_gets - before.block_gets;
    if hits + gets == 0 {
        return 0.0;
    }
    hits as f64 / (hits + gets) as f64
}

/// Writes a store of about `size_mb` MiB as SSTs of 64 MiB in level `in_level` straight into the
/// store (no throttling), with a checkpoint manifest; returns the key count. Key `n` is
/// `n.to_be_bytes()`, its value [`value`]`(n, value_bytes)`.
pub(crate) async fn bulk_load(
    local: &Arc<dyn ObjectStore>,
    root: &Path,
    size_mb: u64,
    value_bytes: usize,
    in_level: usize,
) -> anyhow::Result<u64> {
    let manifests = ManifestStore::new(local.clone(), root.clone());
    let claim = manifests.claim("bulk", None, &[]).await?;
    let keys = (size_mb << 20) / (value_bytes as u64 + 16);
    let mut level = Vec::new();
    let mut builder = SstBuilder::new(64 << 10, true);
    let mut seq = 0;
    let flush = |builder: SstBuilder, seq: &mut u64| -> Option<(SstRef, Bytes)> {
        let (first, last) = builder.key_range().map(|(f, l)| (f.to_vec(), l.to_vec()))?;
        let file = builder.finish();
        let r = SstRef {
            writer_epoch: claim.writer_epoch,
            seq: *seq,
            size_bytes: file.len() as u64,
            first_key: first,
            last_key: last,
        };
        *seq += 1;
        Some((r, file))
    };
    for n in 0..keys {
        let entry = Entry::Put {
            value: value(n, value_bytes),
            expires_at_ms: None,
        };
        builder.add(&n.to_be_bytes(), &entry)?;
        if builder.data_bytes() >= 64 << 20 {
            let full = std::mem::replace(&mut builder, SstBuilder::new(64 << 10, true));
            level.extend(flush(full, &mut seq));
        }
    }
    level.extend(flush(builder, &mut seq));
    let mut refs = Vec::new();
    for (r, file) in level {
        let id = SstId {
            writer_epoch: r.writer_epoch,
            seq: r.seq,
        };
        let path = Path::from(format!("{root}/{}", id.object_name()));
        local.put(&path, PutPayload::from(file)).await?;
        refs.push(r);
    }
    let mut levels = vec![Vec::new(); in_level + 1];
    levels[in_level] = refs;
    let checkpoint = claim.next_checkpoint(levels, Default::default());
    manifests.commit(&checkpoint).await?;
    Ok(keys)
}

async fn measure_open(
    opts: &LsmBenchOptions,
    local: &Arc<dyn ObjectStore>,
    store: &Arc<dyn ObjectStore>,
    size_mb: u64,
    clock: &SharedClock,
) -> anyhow::Result<OpenResult> {
    let root = Path::from(format!("open-{size_mb}"));
    let keys = bulk_load(local, &root, size_mb, opts.value_bytes, 1).await?;
    let mut open_ms = Vec::new();
    let mut first_get_ms = Vec::new();
    for attempt in 0..5u64 {
        let started = Instant::now();
        let manifests = ManifestStore::new(store.clone(), root.clone());
        let versions = manifests.versions().await?;
        let mut base = None;
        for &v in versions.iter().rev() {
            let m = manifests.read(v).await?;
            if m.kind == ManifestKind::Checkpoint {
                base = Some(m);
                break;
            }
        }
        let claim = manifests.claim("bench-open", base.as_ref(), &[]).await?;
        let files = SstFiles::new(store.clone(), Arc::new(BlockCaches::none()));
        let tree = LsmTree::open(
            files,
            root.clone(),
            &claim,
            claim.writer_epoch,
            tree_settings(),
            clock.clone(),
        )?;
        open_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        let k = (attempt * 7919 + keys / 2) % keys;
        let got = tree.get(&k.to_be_bytes()).await?;
        anyhow::ensure!(
            got == Some(value(k, opts.value_bytes)),
            "bulk-loaded key {k} reads back"
        );
        first_get_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(OpenResult {
        size_mb,
        open_ms: median(&mut open_ms),
        open_and_first_get_ms: median(&mut first_get_ms),
    })
}

pub(crate) fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The report as a Markdown table.
pub fn table(report: &LsmBenchReport) -> String {
    let mut out = format!(
        "Weir LSM, local-filesystem store + {} ms per request, {} keys × {} B\n\n\
         load: {:.0} puts/s; settle {:.2} s; {:.1} MiB in SSTs per level {:?}\n\n\
         | cache (% of data) | gets/s cold | gets/s warm | warm hit ratio | scan entries/s cold | scan entries/s warm |\n\
         |---:|---:|---:|---:|---:|---:|\n",
        report.latency_ms,
        report.keys,
        report.value_bytes,
        report.load.puts_per_s,
        report.load.settle_s,
        report.load.data_bytes as f64 / f64::from(1u32 << 20),
        report.load.levels,
    );
    for r in &report.reads {
        out.push_str(&format!(
            "| {:.0} % | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} |\n",
            r.cache_pct,
            r.gets_cold_per_s,
            r.gets_warm_per_s,
            r.warm_hit_ratio,
            r.scan_cold_per_s,
            r.scan_warm_per_s
        ));
    }
    if !report.open.is_empty() {
        out.push_str("\n| store size | claim + open (ms) | claim + open + first get (ms) |\n|---:|---:|---:|\n");
        for o in &report.open {
            out.push_str(&format!(
                "| {} MiB | {:.1} | {:.1} |\n",
                o.size_mb, o.open_ms, o.open_and_first_get_ms
            ));
        }
    }
    out
}
