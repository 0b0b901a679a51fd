//! How a partition's worker ends on its own ([`WorkerError`]), and what kind of failure each
//! way is: the consumer loop decides from it whether the partition reopens or the pipeline
//! stops.

use crate::error::ErrorKind;
use crate::ids::{ManifestVersion, Partition};
use crate::pipeline::ports::{Cause, SinkError};
use crate::state::StateError;

/// Why a worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Producing output or dead letters failed for good.
    #[error("partition {partition}: output failed")]
    Sink {
        /// The partition.
        partition: Partition,
        /// The failure.
        #[source]
        source: SinkError,
    },
    /// The shard's stored state is corrupt: retrying cannot help. The shard is reopened from
    /// a checkpoint that does not reference what was found corrupt (docs/checkpoints.md,
    /// "Corruption"); the other partitions go on.
    #[error("partition {partition}: state is corrupt")]
    Corrupt {
        /// The partition.
        partition: Partition,
        /// The checkpoint the shard was opened from (blamed when no object is named).
        opened_from: Option<ManifestVersion>,
        /// The failure.
        #[source]
        source: StateError,
    },
    /// Another owner claimed the shard (its checkpoint was refused): this host must stop
    /// writing it. Not a pipeline failure: the partition has moved.
    #[error("partition {partition}: fenced by a newer owner of the shard")]
    Fenced {
        /// The partition.
        partition: Partition,
    },
    /// A record's call failed for good and `failure_policy = "fail"`: the pipeline stops
    /// before committing anything after it.
    #[error("partition {partition}: the record at offset {offset} of `{topic}` failed: {reason}")]
    RecordFailed {
        /// The partition.
        partition: Partition,
        /// The record's topic.
        topic: String,
        /// The record's offset.
        offset: i64,
        /// Why its call failed.
        reason: String,
    },
    /// The checkpoint's transaction did not commit, or a delivery in it failed (exactly-once
    /// mode): the state holds effects whose outputs are not committed, so the shard must be
    /// reopened from its last decided checkpoint.
    #[error("partition {partition}: the checkpoint's transaction failed")]
    Transaction {
        /// The partition.
        partition: Partition,
        /// Why.
        #[source]
        source: Cause,
    },
}

impl WorkerError {
    /// What kind of failure this is: the loop reopens the shard of a fenced, corrupt or
    /// transaction-lost worker; the others stop the pipeline.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Sink { .. } | Self::Transaction { .. } => ErrorKind::Unavailable,
            Self::Corrupt { .. } => ErrorKind::Corrupt,
            Self::Fenced { .. } => ErrorKind::Fenced,
            Self::RecordFailed { .. } => ErrorKind::GuestFault,
        }
    }
}
