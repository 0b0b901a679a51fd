//! The pipeline's sources, each a [`Source`](crate::pipeline::ports::Source) adapter:
//!
//! - [`kafka`]   a member of the pipeline's consumer group (rebalances, pause, seek, committed
//!   offsets, a queue per assigned partition), and the broker lookups the tools share;
//! - [`memory`]  an in-memory source for tests of the pipeline without a broker.

pub mod kafka;
pub mod memory;
