//! Tools over a shard's stored checkpoints, beside the backends (`crate::state`): they read and
//! write the store rather than a running shard, as Flink's State Processor API reads and
//! writes savepoints.
//!
//! - [`savepoint`]     named copies of a pipeline's checkpoints, and resets to them;
//! - [`export`]        the portable format, one checkpoint as JSON lines, and its import;
//! - [`convert`]       a shard moved to the other backend when it opens (a live switch);
//! - [`verify`]        which stored checkpoints could be restored;
//! - [`query`]         reads of a pipeline's state as of its committed checkpoints, under the
//!   backends' read leases (`crate::state::lease`).

pub mod convert;
pub mod export;
pub mod query;
pub mod savepoint;
pub mod verify;
