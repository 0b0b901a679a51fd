//! An in-memory [`Output`] for tests of the pipeline without a broker: outputs and dead
//! letters kept in order per partition, acknowledged at once (at-least-once) or held in an
//! open transaction until the checkpoint commits it (exactly-once), and deliveries that can be
//! made to fail for a while.

use crate::ids::{ManifestVersion, Partition};
use crate::pipeline::ports::{
    CommitError, DeadLetterKind, DeliveryGuard, Output, ShardSink, SinkError,
};
use crate::runtime::{InputRecord, StagedEmit};
use crate::source::memory::MemorySourceHandle;
use crate::state::checkpoint::InputOffsets;
use crate::time::edge::Frontier;
use crate::time::watermark::Marker;
use std::sync::{Arc, Mutex};

/// One record written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The partition whose worker wrote it.
    pub partition: Partition,
    /// Key (empty: none).
    pub key: Vec<u8>,
    /// Value.
    pub value: Vec<u8>,
    /// The input record it answers: (topic, offset).
    pub source: (String, i64),
    /// The operator's output it went to ([`StagedEmit::output`]: 0 is `default`); 0 for a
    /// dead letter.
    pub output: u16,
    /// Its timestamp: the one the operator gave, else its input record's (ms).
    pub timestamp_ms: i64,
    /// Dead letters: the kind and the error.
    pub dead_letter: Option<(DeadLetterKind, String)>,
    /// A watermark marker ([`ShardSink::watermark`]), in order among the outputs, of an
    /// output made with [`MemoryOutput::with_markers`]; `None` for a record.
    pub marker: Option<Marker>,
    /// The frontier a marker carried (`time::edge`), if any.
    pub frontier: Option<Frontier>,
}

/// What the sinks of a [`MemoryOutput`] wrote and committed.
#[derive(Debug, Default)]
pub struct Log {
    /// Outputs acknowledged (at-least-once) or committed (exactly-once), in order.
    pub outputs: Vec<Written>,
    /// Dead letters, likewise.
    pub dead_letters: Vec<Written>,
    /// Exactly-once commits: (partition, offsets, checkpoint version), in order.
    pub commits: Vec<(i32, InputOffsets, u64)>,
    /// Per commit, in the same order: how many outputs were published once it was made.
    pub committed_outputs: Vec<usize>,
    /// Partitions whose deliveries are refused (their sinks stall in `drain`, retrying, until
    /// the partition is taken out of the set).
    pub refusing: std::collections::BTreeSet<i32>,
}

/// An [`Output`] in memory.
#[derive(Debug, Clone, Default)]
pub struct MemoryOutput {
    log: Arc<Mutex<Log>>,
    /// The source whose committed offsets an exactly-once commit sets (as Kafka's
    /// transactions do).
    source: Option<MemorySourceHandle>,
    output_bytes_max: u64,
    /// Its sinks write watermark markers, as a stage's to an internal topic.
    markers: bool,
}

impl MemoryOutput {
    /// An output whose records may be up to `output_bytes_max` bytes, whose exactly-once
    /// commits also commit offsets to `source`.
    pub fn new(output_bytes_max: u64, source: Option<MemorySourceHandle>) -> Self {
        Self {
            log: Arc::default(),
            source,
            output_bytes_max,
            markers: false,
        }
    }

    /// This output, whose sinks write the shard's watermark markers among the outputs (as a
    /// stage's sink does to an internal output, docs/topologies.md).
    #[must_use]
    pub fn with_markers(mut self) -> Self {
        self.markers = true;
        self
    }

    /// Refuses (`true`) or accepts again (`false`) the deliveries of `partition`'s sink.
    pub fn refuse(&self, partition: impl Into<Partition>, refuse: bool) {
        let partition: Partition = partition.into();
        let mut log = self.log();
        if refuse {
            log.refusing.insert(partition.0);
        } else {
            log.refusing.remove(&partition.0);
        }
    }

    /// What was written so far.
    pub fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One partition's sink of a [`MemoryOutput`].
#[derive(Debug)]
pub struct MemorySink {
    partition: Partition,
    output: MemoryOutput,
    transactional: bool,
    guard: DeliveryGuard,
    /// Written since the last acknowledgement (at-least-once: until `drain`) or in the open
    /// transaction (exactly-once: until `commit`): (is a dead letter, record).
    open: Vec<Written>,
}

impl Output for MemoryOutput {
    type Sink = MemorySink;

    async fn open(
        &self,
        partition: Partition,
        transactional: bool,
        guard: DeliveryGuard,
    ) -> Result<MemorySink, SinkError> {
        Ok(MemorySink {
            partition,
            output: self.clone(),
            transactional,
            guard,
            open: Vec::new(),
        })
    }
}

impl MemorySink {
    fn publish(&mut self) {
        let mut log = self.output.log();
        for written in self.open.drain(..) {
            if written.dead_letter.is_some() {
                log.dead_letters.push(written);
            } else {
                log.outputs.push(written);
            }
        }
    }
}

impl ShardSink for MemorySink {
    fn output_bytes_max(&self) -> u64 {
        self.output.output_bytes_max
    }

    fn transactional(&self) -> bool {
        self.transactional
    }

    fn writes_watermarks(&self) -> bool {
        self.output.markers
    }

    async fn watermark(
        &mut self,
        marker: Marker,
        frontier: Option<&Frontier>,
    ) -> Result<(), SinkError> {
        if self.output.markers {
            self.open.push(Written {
                partition: self.partition,
                key: Vec::new(),
                value: Vec::new(),
                source: (String::new(), -1),
                output: 0,
                timestamp_ms: marker.watermark_ms,
                dead_letter: None,
                marker: Some(marker),
                frontier: frontier.cloned(),
            });
        }
        Ok(())
    }

    async fn emit(&mut self, emit: &StagedEmit, source: &InputRecord) -> Result<(), SinkError> {
        self.open.push(Written {
            partition: self.partition,
            key: emit.key.clone(),
            value: emit.value.clone(),
            source: (source.topic.to_string(), source.offset),
            output: emit.output,
            timestamp_ms: emit.timestamp_ms.unwrap_or(source.timestamp_ms),
            dead_letter: None,
            marker: None,
            frontier: None,
        });
        Ok(())
    }

    async fn dead_letter(
        &mut self,
        record: &InputRecord,
        kind: DeadLetterKind,
        error: &str,
    ) -> Result<(), SinkError> {
        self.open.push(Written {
            partition: self.partition,
            key: record.key.clone(),
            value: record.value.clone(),
            source: (record.topic.to_string(), record.offset),
            output: 0,
            timestamp_ms: record.timestamp_ms,
            dead_letter: Some((kind, error.to_owned())),
            marker: None,
            frontier: None,
        });
        Ok(())
    }

    async fn drain(&mut self) -> Result<(), SinkError> {
        if self.transactional {
            return Ok(()); // the commit publishes them
        }
        // A refused delivery is retried until it goes through, the partition stalled.
        let mut stalled = false;
        while !self.open.is_empty() && self.output.log().refusing.contains(&self.partition.0) {
            stalled = true;
            self.guard
                .stalled(Some("delivery refused (in-memory output)".to_owned()))
                .await;
            self.guard.wait(std::time::Duration::from_millis(100)).await;
            if self.guard.given_up() {
                return Err(SinkError {
                    topic: "memory".to_owned(),
                    source: "refused, and the partition was revoked or the pipeline stopped".into(),
                });
            }
        }
        if stalled {
            self.guard.stalled(None).await;
        }
        self.publish();
        Ok(())
    }

    async fn commit(
        &mut self,
        partition: Partition,
        offsets: &InputOffsets,
        version: ManifestVersion,
    ) -> Result<(), CommitError> {
        if !self.transactional {
            return Ok(());
        }
        self.publish();
        {
            let mut log = self.output.log();
            log.commits.push((partition.0, offsets.clone(), version.0));
            let published = log.outputs.len();
            log.committed_outputs.push(published);
        }
        if let Some(source) = &self.output.source {
            source.commit_transaction(partition, offsets, version);
        }
        Ok(())
    }
}
