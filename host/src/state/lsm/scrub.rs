//! The scrub: after a shard opens from a checkpoint, every block of the SSTs that checkpoint
//! handed on is read once, in the background, at a bounded pace and bypassing the caches
//! (docs/checkpoints.md, "Corruption"). Opening verifies only what is flat in state size (the
//! manifest, the SSTs' presence and sizes); reads verify the blocks they touch; the scrub
//! covers the rest, so that corruption in a cold key is found while older checkpoints to fall
//! back to are still kept.
//!
//! A block that fails verification is read once more from the store before it is called
//! corrupt; then the tree records the corruption (it never checkpoints again) and the shard
//! falls back at its next open. An outage is waited out (the scrub retries with backoff); an
//! SST that compaction has replaced meanwhile is skipped (compaction read all of it).

use super::shard::ScrubSettings;
use super::sst::format::BlockHandle;
use super::sst::reader::verify_block;
use super::tree::{Scrubber, SstId};
use crate::state::lsm::cache::{FetchError, SstFiles};
use crate::state::manifest::SstRef;
use std::time::Duration;

/// Longest wait between attempts after an outage.
const BACKOFF_MAX: Duration = Duration::from_secs(30);

impl Scrubber {
    /// Reads every block of `ssts` (those still in the tree) at `settings`' pace. Returns
    /// `true` when all were read and verified, `false` when corruption was found (and
    /// recorded in the tree) or the tree is gone.
    pub async fn scrub(&self, ssts: Vec<SstRef>, settings: &ScrubSettings) -> bool {
        let started = crate::clock::monotonic_now();
        let mut bytes = 0u64;
        for sst in &ssts {
            let id = sst.id();
            if !self.is_live(id) {
                continue;
            }
            match self.scrub_sst(sst, settings).await {
                Some(read) => bytes += read,
                // Replaced by compaction meanwhile (which read all of it): on to the next.
                None if self.files().is_some() && !self.is_live(id) => continue,
                None => return false,
            }
        }
        tracing::info!(shard = %self.label(), ssts = ssts.len(), bytes, ms = started.elapsed().as_millis() as u64, "scrub read every block of the recovered SSTs");
        true
    }

    /// Reads and verifies one SST; its bytes read, or `None` when it is corrupt (reported)
    /// or the tree is gone.
    async fn scrub_sst(&self, sst: &SstRef, settings: &ScrubSettings) -> Option<u64> {
        let id = sst.id();
        let files = self.files()?;
        let path = self.sst_path(id)?;
        let mut backoff = Duration::from_millis(100);
        let index = loop {
            match files.open_index(&path, sst.size_bytes).await {
                Ok(index) => break index,
                Err(error) => self.after_failure(id, error, &mut backoff).await?,
            }
        };
        let mut read = 0u64;
        for run in runs(index.blocks(), settings.read_bytes_max) {
            let last = run[run.len() - 1];
            let (start, end) = (run[0].offset, last.offset + u64::from(last.len));
            let bytes = self.read_range(&files, &path, id, start..end).await?;
            for handle in run {
                let at = (handle.offset - start) as usize;
                if verify_block(&bytes.slice(at..at + handle.len as usize)).is_ok() {
                    continue;
                }
                // Once more, this block alone, before calling it corrupt.
                let range = handle.offset..handle.offset + u64::from(handle.len);
                let again = self.read_range(&files, &path, id, range).await?;
                if let Err(error) = verify_block(&again) {
                    tracing::error!(shard = %self.label(), sst = %id.object_name(), offset = handle.offset, %error, "scrub found a corrupt block; the shard falls back");
                    self.report(id, error);
                    return None;
                }
            }
            read += end - start;
            if settings.bytes_per_second > 0 {
                let pause = (end - start) as f64 / settings.bytes_per_second as f64;
                tokio::time::sleep(Duration::from_secs_f64(pause)).await;
            }
        }
        Some(read)
    }

    /// Reads `range` of the SST `id` at `path` from the store, waiting out outages.
    async fn read_range(
        &self,
        files: &SstFiles,
        path: &str,
        id: SstId,
        range: std::ops::Range<u64>,
    ) -> Option<bytes::Bytes> {
        let mut backoff = Duration::from_millis(100);
        loop {
            match files.read_range_uncached(path, range.clone()).await {
                Ok(bytes) => return Some(bytes),
                Err(error) => self.after_failure(id, error, &mut backoff).await?,
            }
        }
    }

    /// After a failed read of SST `id`: an outage is waited out (`Some`: try again); a
    /// missing or corrupt SST is reported as corruption (`None`) — unless compaction replaced
    /// it meanwhile.
    async fn after_failure(
        &self,
        id: SstId,
        error: FetchError,
        backoff: &mut Duration,
    ) -> Option<()> {
        if let FetchError::Store { source, .. } = &error {
            tracing::debug!(shard = %self.label(), sst = %id.object_name(), error = %source, retry_in = ?*backoff, "scrub read failed; retrying");
            tokio::time::sleep(*backoff).await;
            *backoff = (*backoff * 2).min(BACKOFF_MAX);
            return Some(());
        }
        if self.is_live(id) {
            tracing::error!(shard = %self.label(), sst = %id.object_name(), %error, "scrub found a corrupt SST; the shard falls back");
            self.report(id, error);
        }
        None
    }
}

/// The blocks in runs of consecutive blocks of at most `bytes_max` bytes each (a block larger
/// than that is a run of its own).
fn runs(blocks: &[(bytes::Bytes, BlockHandle)], bytes_max: u64) -> Vec<Vec<BlockHandle>> {
    let mut runs: Vec<Vec<BlockHandle>> = Vec::new();
    for (_, handle) in blocks {
        match runs.last_mut() {
            Some(run)
                if run
                    .last()
                    .is_some_and(|last| last.offset + u64::from(last.len) == handle.offset)
                    && handle.offset + u64::from(handle.len) - run[0].offset <= bytes_max =>
            {
                run.push(*handle);
            }
            _ => runs.push(vec![*handle]),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_blocks_are_read_together_up_to_the_limit() {
        let block = |offset, len| (bytes::Bytes::new(), BlockHandle { offset, len });
        let blocks = [
            block(0, 10),
            block(10, 10),
            block(20, 10),
            block(35, 5),
            block(40, 50),
        ];
        let runs = runs(&blocks, 25);
        let offsets: Vec<Vec<u64>> = runs
            .iter()
            .map(|r| r.iter().map(|h| h.offset).collect())
            .collect();
        assert_eq!(offsets, vec![vec![0, 10], vec![20], vec![35], vec![40]]);
    }
}
