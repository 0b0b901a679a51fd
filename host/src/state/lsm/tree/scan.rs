//! The pieces of a prefix scan over the tree: one source per memtable and per SST that
//! may hold keys of the prefix, each yielding entries in key order (an SST's blocks fetched
//! as the scan reaches them), merged newest first by [`super::LsmTree`]'s `scan`.

use super::{Inner, OpenSst};
use crate::state::StateError;
use crate::state::lsm::sst::block::BlockIter;
use crate::state::lsm::sst::{Entry, SstIndex};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;

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
