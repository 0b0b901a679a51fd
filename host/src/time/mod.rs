//! Time: keyed timers and event-time watermarks (docs/time.md).
//!
//! Timers are keyed state in a reserved key space of the shard ([`keys`]), so both backends
//! store and checkpoint them with everything else; [`head::TimerHead`] keeps the next due ones in
//! memory; [`watermark::Watermarks`] tracks a shard's event time. The partition worker fires due
//! timers ([`crate::pipeline`]'s `timers` module).

pub mod edge;
pub mod head;
pub mod keys;
pub mod marker;
pub mod watermark;
