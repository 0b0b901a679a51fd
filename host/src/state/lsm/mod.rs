//! The disaggregated LSM tree (ForSt-style): memtable → immutable memtables → SST files written
//! through to object storage, organised by a manifest.
//!
//! Built in steps (issue 3). Present so far:
//! - [`sst`]      the on-disk table format (v1) with its builder and reader;
//! - [`memtable`] the sorted, byte-bounded in-memory write buffer;
//! - [`tree`]     one shard's tree: write path with write-through flushes, read path merging
//!   memtables and L0 SSTs newest first.
//!
//! The manifest (create-only versions, read-back commits, fencing) is in
//! [`crate::state::manifest`]. Next: opening a tree at a manifest version, block and disk caches
//! with range reads, compaction with backpressure, TTL dropping, GC.

pub mod memtable;
pub mod sst;
pub mod tree;

#[cfg(test)]
mod tests;
