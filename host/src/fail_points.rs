//! Named fail points for crash tests (the `fail` crate, as TiKV uses it). They are compiled in
//! and inert: only a `FAILPOINTS` environment variable set when the `weir` binary starts arms
//! them, e.g. `FAILPOINTS='checkpoint-before-manifest=20%return'` crashes the process at one
//! checkpoint in five just before its manifest write.
//!
//! Points (docs/checkpoints.md names the steps):
//! - `checkpoint-before-manifest`: the memtable's SSTs are uploaded, the manifest is not written.
//! - `checkpoint-after-manifest`: the manifest is written, the offsets are not yet committed to
//!   Kafka (nor, in exactly-once mode, the transaction).
//! - `timers-before-apply`: a timer round's `on-timers` call returned; its effects (the timers'
//!   removal, their state writes and emits) are not applied yet.
//! - `timers-after-emit`: a timer round's effects are applied to the shard and its emits handed
//!   to the producer; no checkpoint holds them yet.
//! - `table-mid-load`: a shard's open applied a chunk of a table input's rows to the shard
//!   (docs/topologies.md, "Tables"); the load has not ended, no checkpoint holds them.
//! - `global-table-mid-load`: a global table's load applied a chunk of its rows; it has not
//!   reached the topic's end, nor saved a snapshot.
//! - `iceberg-after-files`: a shard's Iceberg data files for the coming checkpoint are written
//!   and closed; no pending list names them yet (docs/iceberg.md).
//! - `iceberg-before-commit`: the committer has decided which checkpoints to append; the
//!   catalog's swap has not happened.
//! - `iceberg-after-commit`: the table's new snapshot is committed; the shards still list its
//!   files as pending.

use std::io::Write as _;

/// Ends the process at once, as SIGKILL would: no destructor, no flush, no goodbye to the
/// broker. Prints `weir fail point hit: {name}` to stderr first so that a test can count hits.
pub fn crash(name: &str) -> ! {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "weir fail point hit: {name}");
    let _ = stderr.flush();
    std::process::abort()
}
