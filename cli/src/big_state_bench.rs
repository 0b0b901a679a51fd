//! `weir bench-big-state`: the `lsm` backend with state much larger than its caches, on a
//! local-filesystem object store behind a cost model ([`CostModel`]: a fixed time per request
//! plus a time per MiB moved, so that larger fetch units are not free).
//!
//! Workload, per value size (8 bytes: the keyed counter's state; 1 KiB: a job that reads and
//! writes 1 KiB values):
//! 1. **Load**: `keys` keys spread over `partitions` shards (one tree each, as a pipeline's
//!    shards are), written straight into the store as bottom-level SSTs with a checkpoint
//!    manifest (outside the cost model: the set-up, not the measurement).
//! 2. For each key distribution (uniform; Zipf with exponent `zipf_s` over key ranks, the
//!    hottest keys spread over the key space and the shards) and each cache (`cache_mib`,
//!    shared by the shards as a host's are, half memory blocks and half local disk, empty at
//!    the start; and all state cached, every key read once first): every shard opens its tree
//!    at the checkpoint and processes its share of `events` events in batches of `batch`, as a
//!    pipeline worker does: one `get_many` of the batch's keys (the prefetch), then one `apply`
//!    of each key's new value (its count plus one, in the value's first 8 bytes).
//!
//! Reported per row: events/s over the second half of the events (the first half warms the
//! caches), and the store's GET and PUT requests and bytes per event over the same half.
//! Compaction and memtable flushes run as they do in a pipeline; the checkpoint manifests do
//! not (the `weir bench-checkpoint` measures those).

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::state::hooked_store::{CostModel, HookedStore, Request};
use weir_host::state::lsm::cache::{BlockCaches, CacheSettings, SstFiles};
use weir_host::state::lsm::sst::{Entry, SstBuilder};
use weir_host::state::lsm::tree::{LsmSettings, LsmTree, SstId};
use weir_host::state::manifest::{Manifest, ManifestStore, SstRef};
use weir_host::state::{Shard, StateWrite};

/// What to run (`weir bench-big-state`'s options).
#[derive(Debug, Clone, clap::Args)]
pub struct BigStateBenchOptions {
    /// Scratch directory for the local-filesystem store: must be new, empty or a previous
    /// run's; emptied first, removed after.
    #[arg(long, default_value = "target/bench-big-state")]
    pub dir: std::path::PathBuf,
    /// Distinct keys, over all shards.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Shards (input partitions), each with its own tree.
    #[arg(long, default_value_t = 4)]
    pub partitions: u64,
    /// Value sizes to run, bytes (8: the counter's state).
    #[arg(long, value_delimiter = ',', default_value = "8,1024")]
    pub value_bytes: Vec<usize>,
    /// Memory block cache plus disk cache, MiB, shared by the shards (half each).
    #[arg(long, default_value_t = 100)]
    pub cache_mib: u64,
    /// Time added to every object-store request, ms.
    #[arg(long, default_value_t = 30)]
    pub latency_ms: u64,
    /// Time added per MiB a GET or PUT moves, ms.
    #[arg(long, default_value_t = 10)]
    pub ms_per_mib: u64,
    /// Events per row, over all shards.
    #[arg(long, default_value_t = 400_000)]
    pub events: u64,
    /// Events per batch (one prefetch and one apply).
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Exponent of the Zipf distribution of key ranks.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_s: f64,
    /// Seed of the events.
    #[arg(long, default_value_t = 45)]
    pub seed: u64,
}

/// How events pick their keys.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Keys {
    /// Every key equally likely.
    Uniform,
    /// Key ranks drawn from a Zipf distribution with this exponent.
    Zipf(f64),
}

/// One row: a value size, a key distribution and a cache.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Value size, bytes.
    pub value_bytes: usize,
    /// The key distribution.
    pub keys: Keys,
    /// Cache, MiB (memory plus disk); `None`: all state cached.
    pub cache_mib: Option<u64>,
    /// Events per second over the measured half.
    pub events_per_s: f64,
    /// Store GETs per event, and their bytes.
    pub gets_per_event: f64,
    /// GET bytes per event.
    pub get_bytes_per_event: f64,
    /// Store PUTs per event (memtable flushes, compactions).
    pub puts_per_event: f64,
    /// PUT bytes per event.
    pub put_bytes_per_event: f64,
    /// Blocks per event the disk cache did not keep (its writes in flight at their bound).
    pub disk_writes_skipped_per_event: f64,
}

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
pub struct BigStateReport {
    /// The options' model and sizes.
    pub keys: u64,
    /// Shards.
    pub partitions: u64,
    /// Time per request, ms.
    pub latency_ms: u64,
    /// Time per MiB, ms.
    pub ms_per_mib: u64,
    /// Bytes of SSTs loaded, per value size.
    pub state_bytes: Vec<(usize, u64)>,
    /// One row per value size, distribution and cache.
    pub rows: Vec<Row>,
}

/// Runs the benchmark.
///
/// # Errors
/// When an option is out of range, or the scratch directory or the store fails.
pub async fn run(opts: &BigStateBenchOptions) -> anyhow::Result<BigStateReport> {
    anyhow::ensure!(
        opts.keys > 0 && opts.partitions > 0,
        "--keys and --partitions must be at least 1"
    );
    anyhow::ensure!(
        opts.batch > 0 && opts.events > 1,
        "--batch must be at least 1, --events at least 2"
    );
    anyhow::ensure!(opts.zipf_s > 0.0, "--zipf-s must be above 0");
    anyhow::ensure!(
        opts.value_bytes.iter().all(|&b| b >= 8),
        "--value-bytes must be at least 8 (the count)"
    );
    crate::lsm_bench::prepare_scratch(&opts.dir)?;
    let local: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&opts.dir)?);
    let clock: SharedClock = Arc::new(SystemClock);
    let mut state_bytes = Vec::new();
    let mut rows = Vec::new();
    for &value_bytes in &opts.value_bytes {
        let mut checkpoints = Vec::new();
        let mut bytes = 0;
        for p in 0..opts.partitions {
            let root = Path::from(format!("v{value_bytes}/p{p}"));
            let (checkpoint, size) = bulk_load(&local, &root, opts, p, value_bytes).await?;
            bytes += size;
            checkpoints.push((root, checkpoint));
        }
        state_bytes.push((value_bytes, bytes));
        for keys in [Keys::Uniform, Keys::Zipf(opts.zipf_s)] {
            let events = events(opts, keys);
            for cache_mib in [Some(opts.cache_mib), None] {
                let row = Row {
                    value_bytes,
                    keys,
                    cache_mib,
                    ..measure(
                        opts,
                        &local,
                        &checkpoints,
                        &events,
                        cache_mib,
                        bytes,
                        &clock,
                    )
                    .await?
                };
                tracing::info!(?row, "measured");
                rows.push(row);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&opts.dir);
    Ok(BigStateReport {
        keys: opts.keys,
        partitions: opts.partitions,
        latency_ms: opts.latency_ms,
        ms_per_mib: opts.ms_per_mib,
        state_bytes,
        rows,
    })
}

/// The shard of key `n`: a mix of `n`, so that neighbouring ranks land on different shards.
fn partition_of(n: u64, partitions: u64) -> u64 {
    (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % partitions
}

/// Zipf ranks to keys (`ranks[r]`, 0 the hottest): a permutation of `0..keys` drawn from
/// `seed`, so that the hot keys are scattered over the key space, its SSTs and blocks, as a
/// real job's are.
fn rank_order(keys: u64, seed: u64) -> Vec<u64> {
    use rand::seq::SliceRandom;
    let mut ranks: Vec<u64> = (0..keys).collect();
    ranks.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ 0x5EED));
    ranks
}

/// Each shard's events (key numbers), in order.
fn events(opts: &BigStateBenchOptions, keys: Keys) -> Vec<Vec<u64>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let zipf = match keys {
        Keys::Zipf(s) => Some((
            Zipf::new(opts.keys, s).expect("s > 0 and keys > 0 were checked"),
            rank_order(opts.keys, opts.seed),
        )),
        Keys::Uniform => None,
    };
    let mut shards = vec![Vec::new(); opts.partitions as usize];
    for _ in 0..opts.events {
        let n = match &zipf {
            // Ranks 1..=keys.
            Some((zipf, ranks)) => ranks[zipf.sample(&mut rng) as usize - 1],
            None => rng.gen_range(0..opts.keys),
        };
        shards[partition_of(n, opts.partitions) as usize].push(n);
    }
    shards
}

/// Key `n`'s first value, `len` bytes: a count of 0 in its first 8 (little-endian), then
/// incompressible filler of its own (so that blocks compress as real values do, barely).
fn first_value(n: u64, len: usize) -> Bytes {
    let mut v = crate::lsm_bench::value(n, len).to_vec();
    v[..8].copy_from_slice(&0u64.to_le_bytes());
    Bytes::from(v)
}

/// Writes shard `p`'s keys (their count 0) as bottom-level SSTs of the tree's target size
/// straight into `local`, with a checkpoint manifest; returns it and the SSTs' bytes.
async fn bulk_load(
    local: &Arc<dyn ObjectStore>,
    root: &Path,
    opts: &BigStateBenchOptions,
    p: u64,
    value_bytes: usize,
) -> anyhow::Result<(Manifest, u64)> {
    let settings = LsmSettings::default();
    let manifests = ManifestStore::new(local.clone(), root.clone());
    let claim = manifests.claim("bulk", None, &[]).await?;
    let new_builder = || SstBuilder::new(settings.block_size_bytes, settings.compress);
    let mut builder = new_builder();
    let mut refs = Vec::new();
    let mut bytes = 0;
    // Keys are `n.to_be_bytes()`, so ascending `n` is ascending key order.
    for n in (0..opts.keys).filter(|&n| partition_of(n, opts.partitions) == p) {
        let entry = Entry::Put {
            value: first_value(n, value_bytes),
            expires_at_ms: None,
        };
        builder.add(&n.to_be_bytes(), &entry)?;
        if builder.data_bytes() as u64 >= settings.target_file_bytes {
            let full = std::mem::replace(&mut builder, new_builder());
            bytes += write_sst(local, root, full, claim.writer_epoch, &mut refs).await?;
        }
    }
    bytes += write_sst(local, root, builder, claim.writer_epoch, &mut refs).await?;
    // The level whose target holds the data, as compaction would have left it.
    let mut level = 1;
    let mut target = settings.level_base_bytes;
    while target < bytes && level + 1 < settings.levels_max {
        level += 1;
        target *= settings.level_size_ratio;
    }
    let mut levels = vec![Vec::new(); level + 1];
    levels[level] = refs;
    let checkpoint = claim.next_checkpoint(levels, Default::default());
    manifests.commit(&checkpoint).await?;
    Ok((checkpoint, bytes))
}

async fn write_sst(
    local: &Arc<dyn ObjectStore>,
    root: &Path,
    builder: SstBuilder,
    writer_epoch: u64,
    refs: &mut Vec<SstRef>,
) -> anyhow::Result<u64> {
    let Some((first, last)) = builder.key_range().map(|(f, l)| (f.to_vec(), l.to_vec())) else {
        return Ok(0);
    };
    let file = builder.finish();
    let id = SstId {
        writer_epoch,
        seq: refs.len() as u64,
    };
    let size = file.len() as u64;
    local
        .put(
            &Path::from(format!("{root}/{}", id.object_name())),
            file.into(),
        )
        .await?;
    refs.push(SstRef {
        writer_epoch,
        seq: id.seq,
        size_bytes: size,
        first_key: first,
        last_key: last,
    });
    Ok(size)
}

/// Opens every shard at its checkpoint behind a fresh cost model and caches, runs each
/// shard's events, and measures the second half.
async fn measure(
    opts: &BigStateBenchOptions,
    local: &Arc<dyn ObjectStore>,
    checkpoints: &[(Path, Manifest)],
    events: &[Vec<u64>],
    cache_mib: Option<u64>,
    state_bytes: u64,
    clock: &SharedClock,
) -> anyhow::Result<Row> {
    let model = Arc::new(CostModel::new(
        Duration::from_millis(opts.latency_ms),
        Duration::from_millis(opts.ms_per_mib),
    ));
    let store: Arc<dyn ObjectStore> = Arc::new(HookedStore::new(local.clone(), model.clone()));
    let settings = match cache_mib {
        Some(mib) => CacheSettings {
            block_cache_bytes: (mib << 20) / 2,
            disk_cache_bytes: (mib << 20) / 2,
            disk_cache_dir: Some(opts.dir.join("disk-cache")),
        },
        // Room for every block opened, twice over, and the blocks flushes write.
        None => CacheSettings {
            block_cache_bytes: state_bytes.saturating_mul(2).saturating_add(256 << 20),
            disk_cache_bytes: 0,
            disk_cache_dir: None,
        },
    };
    let caches = Arc::new(BlockCaches::new(&settings)?);
    let mut trees = Vec::new();
    for (root, checkpoint) in checkpoints {
        let manifests = ManifestStore::new(store.clone(), root.clone());
        let claim = manifests.claim("bench", Some(checkpoint), &[]).await?;
        trees.push(Arc::new(LsmTree::open(
            SstFiles::new(store.clone(), caches.clone()),
            root.clone(),
            &claim,
            claim.writer_epoch,
            LsmSettings::default(),
            clock.clone(),
        )?));
    }
    if cache_mib.is_none() {
        warm(&trees, opts).await?;
    }
    let halves: Vec<(Vec<u64>, Vec<u64>)> = events
        .iter()
        .map(|e| {
            let (a, b) = e.split_at(e.len() / 2);
            (a.to_vec(), b.to_vec())
        })
        .collect();
    run_shards(&trees, halves.iter().map(|h| h.0.clone()), opts).await?;
    let (gets, get_bytes) = model.totals(Request::Get);
    let (puts, put_bytes) = model.totals(Request::Put);
    let skipped = caches.stats().disk_writes_skipped;
    let started = Instant::now();
    let measured = run_shards(&trees, halves.iter().map(|h| h.1.clone()), opts).await?;
    let secs = started.elapsed().as_secs_f64();
    let (gets_after, get_bytes_after) = model.totals(Request::Get);
    let (puts_after, put_bytes_after) = model.totals(Request::Put);
    let per_event = |a: u64, b: u64| (a - b) as f64 / measured as f64;
    Ok(Row {
        value_bytes: 0,
        keys: Keys::Uniform,
        cache_mib,
        events_per_s: measured as f64 / secs,
        gets_per_event: per_event(gets_after, gets),
        get_bytes_per_event: per_event(get_bytes_after, get_bytes),
        puts_per_event: per_event(puts_after, puts),
        put_bytes_per_event: per_event(put_bytes_after, put_bytes),
        disk_writes_skipped_per_event: per_event(caches.stats().disk_writes_skipped, skipped),
    })
}

/// Reads every key once, in key order, `batch` keys at a time on each shard at once.
async fn warm(trees: &[Arc<LsmTree>], opts: &BigStateBenchOptions) -> anyhow::Result<()> {
    let all = (0..opts.partitions).map(|p| {
        let tree = trees[p as usize].clone();
        let keys: Vec<Vec<u8>> = (0..opts.keys)
            .filter(|&n| partition_of(n, opts.partitions) == p)
            .map(|n| n.to_be_bytes().to_vec())
            .collect();
        let batch = opts.batch;
        tokio::spawn(async move {
            for chunk in keys.chunks(batch) {
                tree.get_many(chunk).await?;
            }
            anyhow::Ok(())
        })
    });
    for done in futures::future::join_all(all).await {
        done??;
    }
    Ok(())
}

/// Runs each shard's events on its own task, `batch` at a time: a prefetch of the batch's
/// distinct keys, then each key's count plus its events in the batch applied. Returns the
/// events run.
async fn run_shards(
    trees: &[Arc<LsmTree>],
    events: impl Iterator<Item = Vec<u64>>,
    opts: &BigStateBenchOptions,
) -> anyhow::Result<u64> {
    let tasks = trees.iter().zip(events).map(|(tree, events)| {
        let tree = tree.clone();
        let batch = opts.batch;
        tokio::spawn(async move {
            for chunk in events.chunks(batch) {
                // Each distinct key once, with its events in the batch, as the worker's
                // prefetch reads it once and the batch's writes to it end in one.
                let mut repeats = std::collections::BTreeMap::<u64, u64>::new();
                for &n in chunk {
                    *repeats.entry(n).or_default() += 1;
                }
                let keys: Vec<Vec<u8>> = repeats.keys().map(|n| n.to_be_bytes().to_vec()).collect();
                let values = tree.get_many(&keys).await?;
                let mut writes = Vec::with_capacity(keys.len());
                for ((key, value), events) in
                    keys.into_iter().zip(values).zip(repeats.into_values())
                {
                    let value = value.ok_or_else(|| anyhow::anyhow!("a loaded key is missing"))?;
                    let count = u64::from_le_bytes(value[..8].try_into()?);
                    let mut next = value.to_vec();
                    next[..8].copy_from_slice(&(count + events).to_le_bytes());
                    writes.push(StateWrite {
                        key,
                        value: Some(Bytes::from(next)),
                        expires_at_ms: None,
                    });
                }
                tree.apply(writes).await?;
            }
            anyhow::Ok(events.len() as u64)
        })
    });
    let mut run = 0;
    for done in futures::future::join_all(tasks).await {
        run += done??;
    }
    Ok(run)
}

/// The report as a Markdown table, with each cache's events/s against all state cached.
pub fn table(r: &BigStateReport) -> String {
    let mut out = format!(
        "{} keys over {} shards; store: {} ms per request + {} ms per MiB; state: {}\n\n",
        r.keys,
        r.partitions,
        r.latency_ms,
        r.ms_per_mib,
        r.state_bytes
            .iter()
            .map(|(v, b)| format!("{v}-byte values {:.0} MiB", *b as f64 / f64::from(1 << 20)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out.push_str("| value bytes | keys | cache | events/s | of all cached | GETs/event | GET bytes/event | PUTs/event | PUT bytes/event | disk writes skipped/event |\n");
    out.push_str("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in &r.rows {
        let cached = r
            .rows
            .iter()
            .find(|o| {
                o.value_bytes == row.value_bytes && o.keys == row.keys && o.cache_mib.is_none()
            })
            .map_or(f64::NAN, |o| row.events_per_s / o.events_per_s);
        let keys = match row.keys {
            Keys::Uniform => "uniform".to_owned(),
            Keys::Zipf(s) => format!("Zipf s={s}"),
        };
        let cache = row
            .cache_mib
            .map_or_else(|| "all cached".to_owned(), |m| format!("{m} MiB"));
        out.push_str(&format!(
            "| {} | {keys} | {cache} | {:.0} | {:.0} % | {:.3} | {:.0} | {:.6} | {:.0} | {:.3} |\n",
            row.value_bytes,
            row.events_per_s,
            cached * 100.0,
            row.gets_per_event,
            row.get_bytes_per_event,
            row.puts_per_event,
            row.put_bytes_per_event,
            row.disk_writes_skipped_per_event,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hottest_ranks_are_distinct_keys_scattered_over_the_key_space() {
        let ranks = rank_order(1_000_000, 45);
        let mut sorted = ranks.clone();
        sorted.sort_unstable();
        assert!(sorted.iter().copied().eq(0..1_000_000), "a permutation");
        // The 1,000 hottest keys fall in every tenth of the key space.
        let mut tenths = [0; 10];
        for &n in &ranks[..1_000] {
            tenths[(n / 100_000) as usize] += 1;
        }
        assert!(tenths.iter().all(|&t| t > 50), "{tenths:?}");
    }

    #[test]
    fn zipf_events_concentrate_on_few_keys_and_spread_over_the_shards() {
        let opts = BigStateBenchOptions {
            dir: "unused".into(),
            keys: 100_000,
            partitions: 4,
            value_bytes: vec![8],
            cache_mib: 100,
            latency_ms: 30,
            ms_per_mib: 10,
            events: 100_000,
            batch: 512,
            zipf_s: 0.99,
            seed: 45,
        };
        let count = |keys| {
            let shards = events(&opts, keys);
            let mut all: Vec<u64> = shards.iter().flatten().copied().collect();
            all.sort_unstable();
            all.dedup();
            (shards.iter().map(Vec::len).collect::<Vec<_>>(), all.len())
        };
        let (uniform_shards, uniform_distinct) = count(Keys::Uniform);
        let (zipf_shards, zipf_distinct) = count(Keys::Zipf(0.99));
        // 100,000 uniform draws over 100,000 keys hit ~63 % of them; Zipf's far fewer.
        assert!(uniform_distinct > 60_000, "{uniform_distinct}");
        assert!(zipf_distinct < uniform_distinct / 2, "{zipf_distinct}");
        for shards in [uniform_shards, zipf_shards] {
            assert_eq!(shards.iter().sum::<usize>(), 100_000);
            assert!(shards.iter().all(|&n| n > 15_000), "{shards:?}");
        }
    }
}
