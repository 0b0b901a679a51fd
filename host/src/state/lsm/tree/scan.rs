//! A prefix scan over the tree, in passes ([`LsmTree`]'s `scan_pass`), and its pieces: one
//! source per memtable and per SST that may hold keys of the prefix, each yielding entries in
//! key order (an SST's blocks fetched as the scan reaches them), merged newest first.

use super::{Inner, LsmTree, OpenSst, Version};
use crate::state::StateError;
use crate::state::lsm::sst::block::BlockIter;
use crate::state::lsm::sst::{Entry, SstIndex};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;

/// Entries a memtable gives to one pass of a scan (a scan wanting more makes more passes).
const MEMTABLE_SCAN_CHUNK: usize = if cfg!(test) { 3 } else { 4096 };

impl LsmTree {
    /// One pass of [`Shard::scan`]: appends to `out` (up to `limit` in all) the live entries of
    /// `prefix` after `start_after`, merging the memtables and the SSTs. A memtable gives at
    /// most [`MEMTABLE_SCAN_CHUNK`] entries to a pass (one had copied its whole range, every
    /// entry and tombstone after the start, for a scan that wanted a few: a timer head's refill
    /// copied every pending timer); past the last key of one cut short, the merge cannot tell
    /// what is live, so the pass stops there and returns that key for the next pass to start
    /// after. `None`: the scan is complete. A scan of several passes is not one point in time:
    /// a write applied between two shows only above the fence. Its callers scan what nothing
    /// writes meanwhile (a record key's map entries; the timer head, with nothing in flight).
    pub(super) async fn scan_pass(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
        now_ms: u64,
        out: &mut impl ScanOut,
    ) -> Result<Option<Bytes>, StateError> {
        let inner = &*self.inner;
        let start = match start_after {
            Some(after) if after >= prefix => after,
            _ => prefix,
        };
        let end = prefix_end(prefix);
        let (mut sources, version, fence) = memtable_sources(inner, start, end.as_deref());
        add_sst_sources(inner, &version, start, end.as_deref(), &mut sources).await?;
        while out.len() < limit {
            // Cached blocks never suspend; let other tasks (and call deadlines) run.
            tokio::task::consume_budget().await;
            fill_all(&mut sources, inner, start, end.as_deref()).await?;
            let Some(key) = sources
                .iter()
                .filter_map(|s| s.head().map(|(k, _)| k))
                .min()
                .cloned()
            else {
                break;
            };
            if !key.starts_with(prefix) {
                break;
            }
            if fence.as_ref().is_some_and(|fence| key > *fence) {
                return Ok(fence);
            }
            let newest = take_newest(&mut sources, &key);
            if start_after.is_some_and(|after| key.as_ref() <= after) {
                continue;
            }
            if let Some(Entry::Put {
                value,
                expires_at_ms,
            }) = newest.filter(|e| inner.live_entry(e, now_ms))
            {
                out.push_entry(key.to_vec(), value, expires_at_ms);
            }
        }
        // Sources exhausted (or the prefix passed): complete, unless a memtable was cut short.
        Ok(fence)
    }
}

/// A source per memtable (newest first) of the keys from `start` below `end` (none: to the
/// end), each at most [`MEMTABLE_SCAN_CHUNK`] entries; the levels' version read with them; and
/// the fence: the lowest last key of a memtable cut short, past which the merge cannot tell
/// what is live.
fn memtable_sources(
    inner: &Inner,
    start: &[u8],
    end: Option<&[u8]>,
) -> (Vec<ScanSource>, Arc<Version>, Option<Bytes>) {
    let in_range = |k: &[u8]| k >= start && end.is_none_or(|end| k < end);
    let mut fence: Option<Bytes> = None;
    let levels = inner.read();
    let mut sources = Vec::new();
    let mems =
        std::iter::once(&levels.memtable).chain(levels.immutables.iter().rev().map(|m| &**m));
    for m in mems {
        let mut entries: VecDeque<(Bytes, Entry)> = VecDeque::new();
        for (k, e) in m.range_from(start).take_while(|(k, _)| in_range(k)) {
            if entries.len() == MEMTABLE_SCAN_CHUNK {
                // Cut short: merged keys are complete only up to its last copied one.
                if let Some((last, _)) = entries.back() {
                    fence = Some(fence.map_or_else(|| last.clone(), |f| f.min(last.clone())));
                }
                break;
            }
            entries.push_back((Bytes::copy_from_slice(k), e.clone()));
        }
        sources.push(ScanSource::Memory(entries));
    }
    (sources, levels.version.clone(), fence)
}

/// Adds a source per SST of `version` whose key range meets `[start, end)`, newest first
/// (level 0 newest to oldest, then the sorted levels), each positioned at `start`.
async fn add_sst_sources(
    inner: &Inner,
    version: &Version,
    start: &[u8],
    end: Option<&[u8]>,
    sources: &mut Vec<ScanSource>,
) -> Result<(), StateError> {
    let overlaps = |s: &OpenSst| {
        s.meta.last_key.as_slice() >= start
            && end.is_none_or(|end| s.meta.first_key.as_slice() < end)
    };
    let ssts = version.levels[0]
        .iter()
        .rev()
        .chain(version.levels[1..].iter().flatten())
        .filter(|s| overlaps(s));
    for sst in ssts {
        let index = inner.index_of(sst).await?;
        sources.push(ScanSource::Sst {
            cursor: SstCursor {
                next_block: index.first_block_from(start),
                sst: sst.clone(),
                index,
                block: None,
                ready: VecDeque::new(),
                readahead: 1,
            },
            head: None,
            done: false,
        });
    }
    Ok(())
}

/// Takes `key` from every source whose head it is; returns the newest source's entry.
fn take_newest(sources: &mut [ScanSource], key: &Bytes) -> Option<Entry> {
    let mut newest: Option<Entry> = None;
    for source in sources.iter_mut() {
        if source.head().is_some_and(|(k, _)| k == key)
            && let Some((_, entry)) = source.take()
            && newest.is_none()
        {
            newest = Some(entry);
        }
    }
    newest
}

/// Where a scan puts the live entries it finds.
pub(crate) trait ScanOut {
    /// Entries put so far.
    fn len(&self) -> usize;
    /// Puts one live entry.
    fn push_entry(&mut self, key: Vec<u8>, value: Bytes, expires_at_ms: Option<u64>);
}

impl ScanOut for Vec<(Vec<u8>, Bytes)> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn push_entry(&mut self, key: Vec<u8>, value: Bytes, _: Option<u64>) {
        self.push((key, value));
    }
}

impl ScanOut for Vec<(Vec<u8>, Bytes, Option<u64>)> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn push_entry(&mut self, key: Vec<u8>, value: Bytes, expires_at_ms: Option<u64>) {
        self.push((key, value, expires_at_ms));
    }
}

/// The smallest key greater than every key starting with `prefix`, or `None` when there is
/// none (the prefix is empty or all `0xff`).
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A cursor over the entries of one SST from a start key, fetching blocks as it goes.
#[derive(Debug)]
pub(super) struct SstCursor {
    pub(super) sst: Arc<OpenSst>,
    pub(super) index: Arc<SstIndex>,
    pub(super) next_block: usize,
    pub(super) block: Option<BlockIter>,
    /// Blocks fetched ahead, in order.
    pub(super) ready: VecDeque<Bytes>,
    /// Blocks the next fetch asks for at once: 1, doubling per fetch up to
    /// [`SCAN_READAHEAD_BLOCKS_MAX`] (as RocksDB's automatic readahead), so that a short scan
    /// reads one block and a long one keeps several requests in flight.
    pub(super) readahead: usize,
}

/// Most blocks one scan cursor fetches concurrently.
pub const SCAN_READAHEAD_BLOCKS_MAX: usize = 8;

/// One input of a scan, newest first.
#[derive(Debug)]
pub(super) enum ScanSource {
    Memory(VecDeque<(Bytes, Entry)>),
    Sst {
        cursor: SstCursor,
        head: Option<(Bytes, Entry)>,
        done: bool,
    },
}

impl ScanSource {
    pub(super) fn head(&self) -> Option<&(Bytes, Entry)> {
        match self {
            ScanSource::Memory(entries) => entries.front(),
            ScanSource::Sst { head, .. } => head.as_ref(),
        }
    }

    pub(super) fn take(&mut self) -> Option<(Bytes, Entry)> {
        match self {
            ScanSource::Memory(entries) => entries.pop_front(),
            ScanSource::Sst { head, .. } => head.take(),
        }
    }

    /// Moves the next entry `>= start` into `head` from what is already in memory; returns
    /// whether the source needs a fetch to go on.
    pub(super) fn fill_buffered(&mut self, tree: &Inner, start: &[u8]) -> Result<bool, StateError> {
        let ScanSource::Sst { cursor, head, done } = self else {
            return Ok(false);
        };
        while head.is_none() && !*done {
            if let Some(item) = cursor.block.as_mut().and_then(Iterator::next) {
                let (key, entry) = item.map_err(|e| tree.corrupt_in(cursor.sst.meta.id(), e))?;
                if key.as_ref() >= start {
                    *head = Some((key, entry));
                }
                continue;
            }
            match cursor.ready.pop_front() {
                Some(raw) => cursor.block = Some(BlockIter::new(raw)),
                None => return Ok(true),
            }
        }
        Ok(false)
    }

    /// Fetches the next blocks (as many as the cursor's readahead) that can hold keys before
    /// `end`, concurrently; marks the source done when there are none.
    pub(super) async fn fetch(
        &mut self,
        tree: &Inner,
        end: Option<&[u8]>,
    ) -> Result<(), StateError> {
        let ScanSource::Sst { cursor, done, .. } = self else {
            return Ok(());
        };
        let blocks = cursor.index.blocks();
        // Block j can hold keys of the range unless the block before it already ends at or
        // past the range's end.
        let wanted = |j: usize| {
            j < blocks.len() && (j == 0 || end.is_none_or(|end| blocks[j - 1].0.as_ref() < end))
        };
        let first = cursor.next_block;
        let mut last = first;
        while last < first + cursor.readahead && wanted(last) {
            last += 1;
        }
        if last == first {
            *done = true;
            return Ok(());
        }
        let fetched = futures::future::try_join_all(
            blocks[first..last]
                .iter()
                .map(|(_, handle)| tree.files.read_block(&cursor.sst.path, *handle)),
        )
        .await
        .map_err(|e| tree.fetch_error(cursor.sst.meta.id(), e))?;
        cursor.next_block = last;
        cursor.ready.extend(fetched);
        cursor.readahead = (cursor.readahead * 2).min(SCAN_READAHEAD_BLOCKS_MAX);
        Ok(())
    }
}

/// Makes every source's `head` hold its next entry `>= start` (or exhausts it); sources that
/// need blocks fetch them concurrently.
pub(super) async fn fill_all(
    sources: &mut [ScanSource],
    tree: &Inner,
    start: &[u8],
    end: Option<&[u8]>,
) -> Result<(), StateError> {
    loop {
        let mut waiting = Vec::new();
        for source in sources.iter_mut() {
            if source.fill_buffered(tree, start)? {
                waiting.push(source);
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        futures::future::try_join_all(waiting.into_iter().map(|s| s.fetch(tree, end))).await?;
    }
}
