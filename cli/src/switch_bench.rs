//! `weir bench-switch`: what a live switch of a pipeline's state backend costs one partition
//! (issue 20, item 3), by state size, on a local-filesystem object store.
//!
//! For each size:
//! 1. **State**: about `size` MiB (keys and values) written into a `memory` shard through the
//!    real backend, as `value_bytes` values of a counter-like state (`key{i}` / `count`), then
//!    its checkpoint — the old run's last one — timed.
//! 2. **To `lsm`**: the shard opened on the `lsm` backend: its open finds the `memory`
//!    checkpoint, exports it in the portable format, imports it as SSTs and claims the shard
//!    (`checkpoints::convert`), timed from the start of the open to a first read.
//! 3. **Back to `memory`**: the `lsm` shard's checkpoint, then the shard opened on `memory`
//!    again (export, one snapshot, the open reading it), timed the same way.
//!
//! A partition's downtime in a switch is the old run's drain and last checkpoint, the consumer
//! group's rebalance (state-size independent, measured end to end by the
//! `api_backend_switch` test) and this open.

use anyhow::Context as _;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;
use weir_host::checkpoints::convert::open_converted;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::ids::{Offset, Partition};
use weir_host::state::checkpoint::{DecidedBy, InputOffsets};
use weir_host::state::lsm::backend::LsmBackend;
use weir_host::state::lsm::cache::BlockCaches;
use weir_host::state::lsm::tree::LsmSettings;
use weir_host::state::memory::MemoryBackend;
use weir_host::state::{Recovery, Shard, ShardId, StateBackend, StateWrite, key};

/// Entries per write batch.
const BATCH: u64 = 10_000;

/// What to run (`weir bench-switch`'s options).
#[derive(Debug, Clone, clap::Args)]
pub struct SwitchBenchOptions {
    /// Scratch directory for the store: must be new, empty or a previous run's; emptied first,
    /// removed after.
    #[arg(long, default_value = "target/bench-switch")]
    pub dir: std::path::PathBuf,
    /// State sizes, MiB (keys and values).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1024")]
    pub sizes_mb: Vec<u64>,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
}

/// Results for one state size.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchResult {
    /// Requested size, MiB.
    pub size_mb: u64,
    /// Keys in the state.
    pub keys: u64,
    /// The `memory` checkpoint before the switch (one snapshot), ms.
    pub memory_checkpoint_ms: f64,
    /// Its snapshot's bytes.
    pub snapshot_bytes: u64,
    /// The open on `lsm` with the conversion, to a first read, ms.
    pub to_lsm_ms: f64,
    /// Bytes of the SSTs it wrote.
    pub sst_bytes: u64,
    /// The `lsm` checkpoint before switching back, ms.
    pub lsm_checkpoint_ms: f64,
    /// The open on `memory` with the conversion, to a first read, ms.
    pub to_memory_ms: f64,
}

/// Runs the benchmark.
///
/// # Errors
/// When the options are out of range, or the scratch directory or the store fails.
pub async fn run(opts: &SwitchBenchOptions) -> anyhow::Result<Vec<SwitchResult>> {
    anyhow::ensure!(!opts.sizes_mb.is_empty(), "--sizes-mb needs a size");
    anyhow::ensure!(
        opts.sizes_mb.iter().all(|s| *s > 0),
        "--sizes-mb takes sizes of at least 1 MiB"
    );
    anyhow::ensure!(opts.value_bytes > 0, "--value-bytes must be at least 1");
    crate::lsm_bench::prepare_scratch(&opts.dir)?;
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&opts.dir)?);
    let mut out = Vec::new();
    for &size_mb in &opts.sizes_mb {
        let result = one_size(opts, &store, size_mb).await;
        let _ = std::fs::remove_dir_all(opts.dir.join(format!("size-{size_mb}")));
        out.push(result?);
    }
    let _ = std::fs::remove_dir_all(&opts.dir);
    Ok(out)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

async fn one_size(
    opts: &SwitchBenchOptions,
    store: &Arc<dyn ObjectStore>,
    size_mb: u64,
) -> anyhow::Result<SwitchResult> {
    let clock: SharedClock = Arc::new(SystemClock);
    let prefix = Path::from(format!("size-{size_mb}"));
    let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock.clone());
    let lsm = LsmBackend::new(
        store.clone(),
        prefix.clone(),
        Arc::new(BlockCaches::none()),
        LsmSettings::default(),
        clock,
    );
    let id = ShardId {
        pipeline: "bench".into(),
        partition: Partition(0),
    };
    let entry_bytes = key::value_key(b"key0000000000", "count").len() + opts.value_bytes;
    let keys = ((size_mb << 20) / entry_bytes as u64).max(1);
    let mut offsets = InputOffsets::new();
    offsets.advance("bench.in", Offset(keys as i64 - 1));

    let shard = memory.open_shard(&id).await?;
    let mut next = 0;
    while next < keys {
        let end = (next + BATCH).min(keys);
        let writes = (next..end)
            .map(|i| StateWrite {
                key: key::value_key(format!("key{i:010}").as_bytes(), "count"),
                value: Some(crate::lsm_bench::value(i, opts.value_bytes)),
                expires_at_ms: None,
            })
            .collect();
        shard.apply(writes).await?;
        next = end;
    }
    let started = Instant::now();
    shard
        .checkpoint(&offsets, DecidedBy::Manifest)
        .await?
        .context("a durable checkpoint")?;
    let memory_checkpoint_ms = ms(started);
    drop(shard);
    let snapshot_bytes = bytes_under(store, &prefix, "snapshot/").await?;

    let probe = key::value_key(format!("key{:010}", keys / 2).as_bytes(), "count");
    let started = Instant::now();
    let on_lsm = open_converted(&lsm, &id, &Recovery::default()).await?;
    anyhow::ensure!(on_lsm.get(&probe).await?.is_some(), "lsm lost a key");
    let to_lsm_ms = ms(started);
    let sst_bytes = bytes_under(store, &prefix, "sst/").await?;
    let started = Instant::now();
    on_lsm
        .checkpoint(&offsets, DecidedBy::Manifest)
        .await?
        .context("a durable checkpoint")?;
    let lsm_checkpoint_ms = ms(started);
    drop(on_lsm);

    let started = Instant::now();
    let back = open_converted(&memory, &id, &Recovery::default()).await?;
    anyhow::ensure!(back.get(&probe).await?.is_some(), "memory lost a key");
    let to_memory_ms = ms(started);
    drop(back);
    Ok(SwitchResult {
        size_mb,
        keys,
        memory_checkpoint_ms,
        snapshot_bytes,
        to_lsm_ms,
        sst_bytes,
        lsm_checkpoint_ms,
        to_memory_ms,
    })
}

/// Bytes of the objects whose path under `prefix` contains `part`.
async fn bytes_under(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    part: &str,
) -> anyhow::Result<u64> {
    use futures::TryStreamExt as _;
    let metas: Vec<_> = store.list(Some(prefix)).try_collect().await?;
    Ok(metas
        .iter()
        .filter(|m| m.location.as_ref().contains(part))
        .map(|m| m.size)
        .sum())
}

/// The report as a table.
pub fn table(results: &Vec<SwitchResult>) -> String {
    let mut out = format!(
        "{:>8} {:>10} {:>14} {:>12} {:>10} {:>12} {:>10} {:>12}\n",
        "size MiB", "keys", "mem ckpt ms", "snapshot B", "→lsm ms", "SST B", "lsm ckpt", "→mem ms"
    );
    for r in results {
        out.push_str(&format!(
            "{:>8} {:>10} {:>14.0} {:>12} {:>10.0} {:>12} {:>10.0} {:>12.0}\n",
            r.size_mb,
            r.keys,
            r.memory_checkpoint_ms,
            r.snapshot_bytes,
            r.to_lsm_ms,
            r.sst_bytes,
            r.lsm_checkpoint_ms,
            r.to_memory_ms
        ));
    }
    out
}
