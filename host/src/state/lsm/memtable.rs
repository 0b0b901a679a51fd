//! The memtable: the newest writes of a shard, sorted, in RAM, bounded in bytes.

use super::sst::Entry;
use std::collections::BTreeMap;
use std::ops::Bound;

/// Bytes charged per memtable entry on top of its key and value (tree node and bookkeeping).
pub const ENTRY_OVERHEAD_BYTES: usize = 64;

/// Sorted, mutable, in-memory entries; frozen into an immutable memtable and flushed to an SST
/// once it holds `memtable_bytes_max`.
#[derive(Debug, Default, Clone)]
pub struct Memtable {
    entries: BTreeMap<Vec<u8>, Entry>,
    bytes: usize,
}

fn size(key: &[u8], entry: &Entry) -> usize {
    ENTRY_OVERHEAD_BYTES
        + key.len()
        + match entry {
            Entry::Put { value, .. } => value.len(),
            Entry::Tombstone => 0,
        }
}

impl Memtable {
    /// Inserts or replaces the entry of `key`.
    pub fn insert(&mut self, key: Vec<u8>, entry: Entry) {
        self.bytes += size(&key, &entry);
        if let Some(old) = self.entries.get(&key) {
            self.bytes -= size(&key, old);
        }
        self.entries.insert(key, entry);
    }

    /// The entry of `key`, a tombstone included.
    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Entries with keys `>= start`, in order.
    pub fn range_from<'a>(
        &'a self,
        start: &'a [u8],
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a Entry)> + 'a {
        self.entries
            .range::<[u8], _>((Bound::Included(start), Bound::Unbounded))
    }

    /// Approximate bytes held (keys, values and per-entry overhead).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Vec<u8>, &Entry)> {
        self.entries.iter()
    }
}
