//! The disaggregated LSM tree (ForSt-style): memtable → immutable memtables → SST files written
//! through to object storage, organised by a manifest, read through memory and disk caches.
//!
//! - [`backend`]    the `lsm` state backend: a tree per shard, claimed at open;
//! - [`sst`]        the on-disk table format (v1) with its builder and reader;
//! - [`memtable`]   the sorted, byte-bounded in-memory write buffer;
//! - [`cache`]      where SST bytes come from: memory block cache → disk cache → range GET
//!   (the disk cache's directory, and those of killed processes: `cache_dir`);
//! - [`tree`]       one shard's tree: write path, read path, background compaction and write
//!   backpressure;
//! - [`compaction`] leveled compaction: the choice (with its justification) and the merge;
//! - [`shard`]      a shard as its owner holds it: recovery from the newest valid checkpoint,
//!   and checkpoints (flush, create-only manifest with the input offsets, GC);
//! - [`scrub`]      reading every block a recovered checkpoint handed on, in the background;
//! - [`gc`]         deleting SSTs and manifests no retained checkpoint references.
//!
//! The manifest (create-only versions, read-back commits, fencing) is in
//! [`crate::state::manifest`].

pub mod backend;
pub mod cache;
mod cache_dir;
pub mod compaction;
pub mod gc;
pub mod memtable;
pub mod scrub;
pub mod shard;
pub mod sst;
pub mod tree;

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
pub(crate) mod tests;
