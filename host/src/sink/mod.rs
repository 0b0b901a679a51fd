//! The pipeline's outputs, each an [`Output`](crate::pipeline::ports::Output) adapter:
//!
//! - [`kafka`]    the output and dead-letter topics through Kafka producers (at-least-once, or
//!   exactly-once transactions committed with the checkpoints);
//! - [`iceberg`]  the Apache Iceberg table sink around another output (docs/iceberg.md);
//! - [`memory`]   an in-memory output for tests of the pipeline without a broker.

pub mod iceberg;
pub mod kafka;
pub mod memory;
