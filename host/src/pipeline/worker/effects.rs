//! What a partition worker does with a call's results: applies its state writes, sends its
//! emits and dead letters, and turns a failed delivery into the worker's error.

use super::ended::first_line;
use super::*;

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// Applies a successful call: state writes, emits, dead letters for rejections. Returns
    /// `Ok(Err(_))` when the shard is unavailable (nothing applied, nothing produced).
    pub(super) async fn commit(
        &mut self,
        records: &[InputRecord],
        dispositions: &[Disposition],
        batch: BatchCtx,
        apply_effects: bool,
    ) -> Result<Result<(), StateError>, WorkerError> {
        let mut batch = batch;
        let added = batch.timers_added();
        // What the call reserved in the shard's quota is released once its writes are applied
        // (and so counted as held), or dropped.
        let quota = batch.take_quota();
        let (writes, emits) = batch.into_effects();
        if apply_effects {
            if !writes.is_empty() {
                // Timers set, moved or cleared: the worker's head follows them once applied.
                let timer_writes: Vec<_> = writes
                    .iter()
                    .filter(|w| w.key.starts_with(&crate::time::keys::TIME_INDEX))
                    .cloned()
                    .collect();
                let started = Instant::now();
                let applied = self.shard.apply(writes).await;
                drop(quota);
                self.stats
                    .metrics
                    .state_put
                    .record(started.elapsed().as_secs_f64());
                if let Err(err) = applied {
                    return Ok(Err(err));
                }
                self.timers.applied(&timer_writes, added);
            }
            if !emits.is_empty() {
                self.mark_active().await?;
            }
            for emit in &emits {
                let source = &records[emit.record as usize];
                if let Err(source) = self.sink.emit(emit, source).await {
                    return Err(self.sink_failed(source));
                }
            }
            self.stats
                .emitted
                .fetch_add(emits.len() as u64, Ordering::Relaxed);
            self.stats.metrics.records_out.increment(emits.len() as u64);
        }
        let mut ok = 0u64;
        for (record, disposition) in records.iter().zip(dispositions) {
            match disposition {
                Disposition::Ok => ok += 1,
                Disposition::Reject(reason) => {
                    self.dead_letter(record, DeadLetterKind::Rejected, reason)
                        .await?;
                }
            }
        }
        self.stats.records_ok.fetch_add(ok, Ordering::Relaxed);
        Ok(Ok(()))
    }

    pub(in crate::pipeline) async fn dead_letter(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> Result<(), WorkerError> {
        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        self.stats.metrics.dead_lettered(kind).increment(1);
        // One line per dead letter, rate-limited per run (a trap storm must not flood the
        // log); the whole error (a trap's wasm backtrace) only at debug level.
        if let Some(suppressed) = self.stats.failure_log.admit() {
            tracing::warn!(partition = self.partition.0, topic = %record.topic, offset = record.offset, kind = kind.as_str(), cause = first_line(error), suppressed, "record dead-lettered");
        }
        tracing::debug!(
            partition = self.partition.0,
            offset = record.offset,
            error,
            "dead-lettered record's error"
        );
        match self.sink.dead_letter(record, kind, error).await {
            Ok(()) => Ok(()),
            Err(source) => Err(self.sink_failed(source)),
        }
    }

    /// The worker's error for a failed delivery. Exactly-once: the transactional producer is
    /// unusable (fenced, or a fatal error) and the open transaction lost, so the shard is
    /// reopened from its decided checkpoint, as after a failed commit — not a pipeline failure.
    pub(in crate::pipeline) fn sink_failed(&self, source: SinkError) -> WorkerError {
        let partition = self.partition;
        if self.sink.transactional() {
            tracing::warn!(partition = partition.0, error = %source, "output failed in the open transaction; reopening the shard from its last decided checkpoint");
            WorkerError::Transaction {
                partition,
                source: Box::new(source),
            }
        } else {
            WorkerError::Sink { partition, source }
        }
    }
}
