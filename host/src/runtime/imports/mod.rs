//! The host side of each WIT interface the operator imports, one file per interface.

mod emit;
mod legacy;
mod log;
mod parameters;
mod state;
mod tables;
pub(crate) mod timers;

use super::bindings::weir::operator::types;
use super::host::HostCtx;
use crate::state::Shard;

impl<S: Shard> types::Host for HostCtx<S> {}

/// A store's data for import tests: bound to `shard`, one map state `map` and one named output
/// `late` declared, the current call one record of key `k`, at most `timers_per_key_max` timers per key.
#[cfg(test)]
pub(crate) fn test_host(
    shard: std::sync::Arc<crate::state::memory::MemoryShard>,
    clock: crate::clock::SharedClock,
    map: &str,
    timers_per_key_max: u32,
) -> HostCtx<crate::state::memory::MemoryShard> {
    use crate::runtime::batch::BatchCtx;
    use crate::runtime::bindings::{InputRecord, StateDescriptor, StateKind};
    use crate::runtime::guest_log::GuestLog;
    use crate::runtime::host::{CallLimits, OperatorMeta};
    use crate::runtime::wasi::deny_all_ctx;
    use std::collections::HashMap;
    use std::sync::Arc;
    let mut states = HashMap::new();
    states.insert(
        map.to_owned(),
        StateDescriptor {
            name: map.to_owned(),
            kind: StateKind::Map,
            ttl_ms: None,
            version: 0,
        },
    );
    let meta = OperatorMeta {
        name: "t".into(),
        version: "0".into(),
        world: crate::runtime::WorldVersion::V0_3,
        states,
        value_states: Vec::new(),
        outputs: vec!["late".to_owned()],
        limits: CallLimits {
            state_value_bytes_max: 1 << 20,
            state_map_key_bytes_max: 4 << 10,
            emit_bytes_per_record_max: 1 << 20,
            batch_staged_bytes_max: 1 << 30,
            timers_per_key_max,
        },
    };
    let log = GuestLog::new("t/0".into(), clock.clone(), 100);
    let mut ctx = HostCtx::new(
        deny_all_ctx(&log),
        wasmtime::StoreLimits::default(),
        Some(shard),
        Some(Arc::new(meta)),
        clock,
        log,
    );
    let record = InputRecord {
        key: b"k".to_vec(),
        value: Vec::new(),
        timestamp_ms: 0,
        headers: Vec::new(),
        topic: "t".into(),
        partition: 0,
        offset: 0,
        input: 0,
    };
    ctx.batch = BatchCtx::new(Arc::new(vec![record]));
    ctx
}
