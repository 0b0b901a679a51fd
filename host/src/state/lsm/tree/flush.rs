//! Flushes (module docs of `lsm`): immutable memtables written as level-0 SSTs, in the
//! background; the SSTs a flush or a compaction writes held unpublished until installed; and
//! the writers' backpressure while level 0 or the immutables are full.

use super::*;

impl Inner {
    /// A guard for the SSTs a flush or compaction writes until it installs them.
    pub(super) fn unpublished(&self) -> Unpublished<'_> {
        Unpublished {
            inner: self,
            seqs: Vec::new(),
        }
    }

    /// Writes `file` as a new SST (create-only, fresh name, held in `pending` until its
    /// caller installs it) and returns it opened.
    pub(super) async fn upload(
        &self,
        pending: &mut Unpublished<'_>,
        file: Bytes,
        first_key: Vec<u8>,
        last_key: Vec<u8>,
    ) -> Result<Arc<OpenSst>, StateError> {
        let index = SstIndex::open(file.clone(), 0).map_err(|e| self.corrupt(e))?;
        // A fresh name per attempt: an attempt whose acknowledgement was lost leaves an orphan
        // for GC instead of a name collision.
        let id = pending.fresh_id();
        let sst = self.lazy(SstRef {
            writer_epoch: id.writer_epoch,
            seq: id.seq,
            size_bytes: file.len() as u64,
            first_key,
            last_key,
        });
        self.files
            .store()
            .put_opts(
                &Path::from(&*sst.path),
                PutPayload::from(file.clone()),
                PutOptions::from(PutMode::Create),
            )
            .await
            .map_err(|e| self.unavailable(e))?;
        sst.index
            .set(Arc::new(index))
            .expect("a fresh OpenSst has no index yet");
        Ok(Arc::new(sst))
    }

    /// Flushes the immutable memtables oldest first; stops at the first failure.
    pub(super) async fn flush_immutables(&self) -> Result<(), StateError> {
        let _one_flush_at_a_time = self.flushing.lock().await;
        loop {
            let Some(oldest) = self.read().immutables.first().cloned() else {
                return Ok(());
            };
            let (block_size, compress) = (self.settings.block_size_bytes, self.settings.compress);
            let memtable = oldest.clone();
            // Encoding and compressing up to `memtable_bytes_max` is CPU work: keep it off the
            // runtime's worker threads.
            let built = tokio::task::spawn_blocking(move || {
                let mut builder = SstBuilder::new(block_size, compress);
                for (key, entry) in memtable.iter() {
                    builder
                        .add(key, entry)
                        .expect("memtable iteration is in strictly increasing key order");
                }
                let (first, last) = builder
                    .key_range()
                    .map(|(f, l)| (f.to_vec(), l.to_vec()))
                    .expect("only non-empty memtables are frozen");
                (builder.finish(), first, last)
            })
            .await;
            let (file, first, last) =
                built.map_err(|e| self.corrupt_msg(&format!("building an SST failed: {e}")))?;
            let mut pending = self.unpublished();
            let sst = self.upload(&mut pending, file.clone(), first, last).await?;
            if self.settings.prepopulate_block_cache && self.files.has_memory_cache() {
                let index = sst.index.get().expect("uploaded SSTs carry their index");
                for (_, handle) in index.blocks() {
                    if let Ok(block) = open_block(&file.slice(handle.range())) {
                        // An uncompressed block is a slice of the whole file: copy it, so that
                        // the cache holds (and weighs) only the block.
                        let block = Bytes::copy_from_slice(&block);
                        self.files.prepopulate(&sst.path, *handle, block).await;
                    }
                }
            }
            let l0_files = {
                let mut levels = self.write();
                levels.immutables.retain(|m| !Arc::ptr_eq(m, &oldest));
                let mut version = (*levels.version).clone();
                version.levels[0].push(sst);
                levels.version = Arc::new(version);
                levels.version.levels[0].len()
            };
            metrics::counter!("weir_lsm_flushes_total").increment(1);
            metrics::gauge!("weir_lsm_l0_files", "shard" => self.label.clone())
                .set(l0_files as f64);
            self.compaction_wanted.notify_one();
        }
    }

    /// Delays or stalls a write while L0 is over its limits.
    pub(super) async fn backpressure(&self) -> Result<(), StateError> {
        let s = &self.settings;
        let l0 = self.read().version.levels[0].len();
        if l0 < s.l0_slowdown_trigger {
            return Ok(());
        }
        let started = crate::clock::monotonic_now();
        if l0 < s.l0_stop_trigger {
            let over = (l0 - s.l0_slowdown_trigger + 1) as u32;
            tokio::time::sleep(s.slowdown_delay * over).await;
        } else {
            self.compaction_wanted.notify_one();
            let deadline = started + s.stall_timeout;
            loop {
                let shrank = self.l0_shrank.notified();
                tokio::pin!(shrank);
                shrank.as_mut().enable();
                if self.read().version.levels[0].len() < s.l0_stop_trigger {
                    break;
                }
                if let Some(found) = self.found_corruption() {
                    return Err(found);
                }
                if tokio::time::timeout_at(deadline.into(), shrank)
                    .await
                    .is_err()
                {
                    record_stall(started);
                    return Err(StateError::Unavailable {
                        shard: self.label.clone(),
                        source: "writes stalled: L0 stayed at its stop trigger while compaction caught up".into(),
                    });
                }
            }
        }
        record_stall(started);
        Ok(())
    }
}

/// The SSTs a flush or compaction has given sequence numbers to and not installed yet; they
/// are released (installed, or orphans for GC) when it is dropped.
pub(super) struct Unpublished<'a> {
    inner: &'a Inner,
    seqs: Vec<u64>,
}

impl Unpublished<'_> {
    /// A fresh SST id of this writer, held until the guard is dropped.
    fn fresh_id(&mut self) -> SstId {
        let mut unpublished = self
            .inner
            .unpublished
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let seq = self.inner.next_seq.fetch_add(1, Ordering::SeqCst);
        unpublished.insert(seq);
        self.seqs.push(seq);
        SstId {
            writer_epoch: self.inner.writer_epoch,
            seq,
        }
    }
}

impl Drop for Unpublished<'_> {
    fn drop(&mut self) {
        let mut unpublished = self
            .inner
            .unpublished
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for seq in &self.seqs {
            unpublished.remove(seq);
        }
    }
}

/// Adds the time since `started` to `weir_lsm_write_stall_micros_total`.
pub(super) fn record_stall(started: Instant) {
    metrics::counter!("weir_lsm_write_stall_micros_total")
        .increment(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
}

/// The background flush loop: writes frozen memtables to SSTs as they appear; after a failure
/// it retries with backoff (100 ms doubling to 2 s) while the data stays readable in memory.
pub(super) async fn flush_in_background(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        inner.flush_wanted.notified().await;
        while let Err(error) = inner.flush_immutables().await {
            tracing::warn!(shard = %inner.label, %error, "memtable flush failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        backoff = Duration::from_millis(100);
    }
}
