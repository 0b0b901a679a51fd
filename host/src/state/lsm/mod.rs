//! The disaggregated LSM tree (ForSt-style): memtable → immutable memtables → SST files written
//! through to object storage, organised by a manifest.
//!
//! Built in steps (issue 3). Present so far: [`sst`], the on-disk table format with its
//! builder and reader. Memtable, flush, manifest, caches, compaction and GC come next and use
//! the reader's range-addressable blocks so that data blocks can be fetched one range GET at a
//! time.

pub mod sst;
