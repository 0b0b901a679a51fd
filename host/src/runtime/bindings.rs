//! The `bindgen!` sites: host-side bindings of the `weir:operator@0.2.0` world in `wit/` (this
//! module's root) and of the frozen `weir:operator@0.1.0` in `wit/legacy/` ([`v0_1`]), linked
//! side by side so that components of either version load (docs/wasm-runtime.md, "World
//! versions").
//!
//! Every import is an async Rust function (a guest waiting on a state read suspends its fiber
//! while the host runs other work) and trappable (a host-side failure such as an unavailable
//! state backend aborts the call instead of reaching the guest as a record error).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "weir:operator/operator-world@0.2.0",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
});

pub use exports::weir::operator::operator::{Disposition, OperatorInfo};
pub use weir::operator::types::{FiredTimer, Header, StateDescriptor, StateKind, TimeDomain};

/// `weir:operator@0.1.0`, frozen: the world without timers. Its imports are served by the
/// 0.2 implementations (`imports/legacy.rs`); its `process-batch` takes the same records and
/// returns the same dispositions, so one typed call serves both versions.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../wit/legacy/weir-operator-0.1.0",
        world: "weir:operator/operator-world@0.1.0",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

/// The `weir:operator` world a component was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorldVersion {
    /// `weir:operator@0.1.0`: records only.
    V0_1,
    /// `weir:operator@0.2.0`: records and timers.
    V0_2,
}

impl WorldVersion {
    /// The interface that exports `process-batch` (and, from 0.2, `on-timers`).
    pub(crate) fn operator_interface(self) -> &'static str {
        match self {
            WorldVersion::V0_1 => "weir:operator/operator@0.1.0",
            WorldVersion::V0_2 => "weir:operator/operator@0.2.0",
        }
    }

    /// As `weir:operator@0.1.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorldVersion::V0_1 => "0.1.0",
            WorldVersion::V0_2 => "0.2.0",
        }
    }
}

use std::sync::Arc;
use wasmtime::component::{ComponentType, Lower};

/// The exports' names in the `operator` interface.
pub(crate) const PROCESS_BATCH: &str = "process-batch";
pub(crate) const ON_TIMERS: &str = "on-timers";

/// One input record, as `process-batch` receives it: the WIT `weir:operator/types.input-record`
/// (field for field, in its order), lowered from this type rather than from the one `bindgen!`
/// generates so that every record of a topic shares its name (`Arc<str>`, a reference count per
/// record instead of a `String`). The key and value are the one copy of the consumer's bytes
/// before the call lowers them into guest memory.
#[derive(ComponentType, Lower, Clone, Debug, PartialEq)]
#[component(record)]
pub struct InputRecord {
    /// The record key; a null key is empty.
    #[component(name = "key")]
    pub key: Vec<u8>,
    /// The record value; a null value (a tombstone) is empty.
    #[component(name = "value")]
    pub value: Vec<u8>,
    /// Milliseconds since the Unix epoch; -1 when the broker gave none.
    #[component(name = "timestamp-ms")]
    pub timestamp_ms: i64,
    /// The record headers, in order.
    #[component(name = "headers")]
    pub headers: Vec<Header>,
    /// The topic the record was read from.
    #[component(name = "topic")]
    pub topic: Arc<str>,
    /// Its partition.
    #[component(name = "partition")]
    pub partition: i32,
    /// Its offset.
    #[component(name = "offset")]
    pub offset: i64,
}
