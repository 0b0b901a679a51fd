//! Running compactions on the tree: choosing the next one ([`crate::state::lsm::compaction`]'s
//! leveled policy), merging its inputs off the runtime's threads, uploading the outputs and
//! installing them in one version swap; and the background loop that runs them.

use super::{Inner, OpenSst, Unpublished};
use crate::state::StateError;
use crate::state::lsm::compaction::{MergeSettings, merge};
use crate::state::lsm::sst::SstReader;
use crate::state::lsm::tree::SstId;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One compaction: merge `inputs` (newest first) into `output_level`.
#[derive(Debug)]
struct Job {
    input_level: usize,
    output_level: usize,
    inputs: Vec<Arc<OpenSst>>,
    bottom: bool,
    trivial_move: bool,
}

impl Inner {
    /// Chooses the next compaction, if one is due.
    fn pick(&self) -> Option<Job> {
        let s = &self.settings;
        let levels = self.read();
        let version = &levels.version;
        let bottom_below = |output: usize| version.levels[output + 1..].iter().all(Vec::is_empty);
        if version.levels[0].len() >= s.l0_compaction_trigger.max(1) {
            let inputs: Vec<Arc<OpenSst>> = version.levels[0].iter().rev().cloned().collect();
            let first = inputs.iter().map(|s| &s.meta.first_key).min()?;
            let last = inputs.iter().map(|s| &s.meta.last_key).max()?;
            let overlapping = overlapping(&version.levels[1], first, last);
            return Some(Job {
                input_level: 0,
                output_level: 1,
                inputs: inputs.into_iter().chain(overlapping).collect(),
                bottom: bottom_below(1),
                trivial_move: false,
            });
        }
        let mut target = s.level_base_bytes;
        for n in 1..s.levels_max - 1 {
            if version.level_bytes(n) > target {
                let pointer = &levels.compact_pointer[n];
                let level = &version.levels[n];
                let chosen = level
                    .iter()
                    .find(|sst| sst.meta.first_key > *pointer)
                    .or_else(|| level.first())?
                    .clone();
                let overlapping = overlapping(
                    &version.levels[n + 1],
                    &chosen.meta.first_key,
                    &chosen.meta.last_key,
                );
                let bottom = bottom_below(n + 1);
                return Some(Job {
                    input_level: n,
                    output_level: n + 1,
                    trivial_move: overlapping.is_empty() && !bottom,
                    inputs: std::iter::once(chosen).chain(overlapping).collect(),
                    bottom,
                });
            }
            target = target.saturating_mul(s.level_size_ratio.max(2));
        }
        None
    }

    /// Runs one compaction if one is due; returns whether one ran.
    pub(super) async fn compact_once(&self) -> Result<bool, StateError> {
        let _one_at_a_time = self.compacting.lock().await;
        let Some(job) = self.pick() else {
            return Ok(false);
        };
        // Held until the outputs are installed (or the compaction fails).
        let mut pending = self.unpublished();
        let outputs = if job.trivial_move {
            job.inputs.clone()
        } else {
            self.merge_inputs(&job, &mut pending).await?
        };
        let l0_files = self.install(&job, outputs)?;
        self.compactions.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("weir_lsm_compactions_total").increment(1);
        metrics::gauge!("weir_lsm_l0_files", "shard" => self.label.clone()).set(l0_files as f64);
        self.l0_shrank.notify_waiters();
        Ok(true)
    }

    /// Merges the inputs of `job` into new SSTs, uploaded (held in `pending` until installed).
    /// A merge that fails names the input that does not verify as corrupt.
    async fn merge_inputs(
        &self,
        job: &Job,
        pending: &mut Unpublished<'_>,
    ) -> Result<Vec<Arc<OpenSst>>, StateError> {
        let mut readers = Vec::with_capacity(job.inputs.len());
        let mut read_bytes = 0;
        for sst in &job.inputs {
            let file = self
                .files
                .get_whole(&sst.path)
                .await
                .map_err(|e| self.fetch_error(sst.meta.id(), Arc::new(e)))?;
            read_bytes += file.len() as u64;
            let reader = match SstReader::open(file) {
                Ok(reader) => reader,
                Err(_) => return Err(self.confirm_corrupt(sst).await),
            };
            readers.push(reader);
        }
        let settings = MergeSettings {
            bottom: job.bottom,
            now_ms: self.clock.now_ms(),
            target_file_bytes: self.settings.target_file_bytes,
            block_size_bytes: self.settings.block_size_bytes,
            compress: self.settings.compress,
        };
        // Kept (cheap clones of the files) to name the corrupt input if the merge fails.
        let copies = readers.clone();
        let merged = tokio::task::spawn_blocking(move || merge(readers, settings))
            .await
            .map_err(|e| StateError::Unavailable {
                shard: self.label.clone(),
                source: format!("the compaction merge did not finish: {e}").into(),
            })?;
        let merged = match merged {
            Ok(merged) => merged,
            Err(error) => {
                // The input that fails verification, read again before it is blamed.
                let culprit = job
                    .inputs
                    .iter()
                    .zip(&copies)
                    .find(|(_, r)| r.verify_blocks().is_err());
                return Err(match culprit {
                    Some((sst, _)) => self.confirm_corrupt(sst).await,
                    None => StateError::Unavailable {
                        shard: self.label.clone(),
                        source: format!(
                            "the compaction merge failed on inputs that verify: {error}"
                        )
                        .into(),
                    },
                });
            }
        };
        let mut outputs = Vec::with_capacity(merged.files.len());
        let mut written_bytes = 0;
        for (file, first, last) in merged.files {
            written_bytes += file.len() as u64;
            outputs.push(self.upload(pending, file, first, last).await?);
        }
        metrics::counter!("weir_lsm_compaction_bytes_total", "direction" => "read")
            .increment(read_bytes);
        metrics::counter!("weir_lsm_compaction_bytes_total", "direction" => "written")
            .increment(written_bytes);
        Ok(outputs)
    }

    /// Installs the `outputs` of `job` in place of its inputs, as a new version of the levels;
    /// the inputs retire (unless they only moved). Returns the files left in level 0. Refuses a
    /// version whose level would overlap key ranges.
    fn install(&self, job: &Job, outputs: Vec<Arc<OpenSst>>) -> Result<usize, StateError> {
        let mut levels = self.write();
        let mut version = (*levels.version).clone();
        let gone: Vec<SstId> = job.inputs.iter().map(|s| s.meta.id()).collect();
        for n in [job.input_level, job.output_level] {
            version.levels[n].retain(|s| !gone.contains(&s.meta.id()));
        }
        let out = &mut version.levels[job.output_level];
        out.extend(outputs);
        out.sort_by(|a, b| a.meta.first_key.cmp(&b.meta.first_key));
        if !out
            .windows(2)
            .all(|w| w[0].meta.last_key < w[1].meta.first_key)
        {
            // Never install a version that would route keys wrongly; the outputs become
            // orphans for GC and the caller logs the error.
            return Err(self.corrupt_msg(&format!(
                "compaction into level {} would overlap key ranges; not installed",
                job.output_level
            )));
        }
        if job.input_level > 0 {
            levels.compact_pointer[job.input_level] = job.inputs[0].meta.last_key.clone();
        }
        if !job.trivial_move {
            let now = self.clock.now_ms();
            self.retired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(gone.iter().map(|id| (*id, now)));
        }
        levels.version = Arc::new(version);
        Ok(levels.version.levels[0].len())
    }
}

/// The SSTs of a sorted level whose key ranges meet `[first, last]`.
fn overlapping(level: &[Arc<OpenSst>], first: &[u8], last: &[u8]) -> Vec<Arc<OpenSst>> {
    level
        .iter()
        .filter(|s| s.meta.last_key.as_slice() >= first && s.meta.first_key.as_slice() <= last)
        .cloned()
        .collect()
}

/// The background compaction loop: runs due compactions whenever a flush asks; backs off after
/// a failure (100 ms doubling to 2 s; an outage is retried, corruption is logged and reads
/// report it).
pub(super) async fn compact_in_background(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        inner.compaction_wanted.notified().await;
        loop {
            match inner.compact_once().await {
                Ok(true) => backoff = Duration::from_millis(100),
                Ok(false) => break,
                Err(error @ StateError::Corrupt { .. }) => {
                    // Retrying cannot help: stop compacting; writes that stall on L0 and the
                    // next checkpoint report it.
                    tracing::error!(shard = %inner.label, %error, "compaction hit corrupt state; compaction stopped");
                    inner.report_corruption(&error);
                    inner.l0_shrank.notify_waiters();
                    return;
                }
                Err(error) => {
                    tracing::warn!(shard = %inner.label, %error, "compaction failed; retrying later");
                    // A writer stalled on L0 asks again at once rather than waiting out the
                    // backoff.
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = inner.compaction_wanted.notified() => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}
