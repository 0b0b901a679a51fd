//! The `bindgen!` sites: host-side bindings of the `weir:operator@0.3.0` world in `wit/` (this
//! module's root) and of the frozen `weir:operator@0.2.0` and `@0.1.0` in `wit/legacy/`
//! ([`v0_2`], [`v0_1`]), linked side by side so that components of any of them load
//! (docs/wasm-runtime.md, "World versions").
//!
//! Every import is an async Rust function (a guest waiting on a state read suspends its fiber
//! while the host runs other work) and trappable (a host-side failure such as an unavailable
//! state backend aborts the call instead of reaching the guest as a record error).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "weir:operator/operator-world@0.3.0",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
});

pub use exports::weir::operator::operator::{Disposition, OperatorInfo};
pub use weir::operator::types::{FiredTimer, Header, StateDescriptor, StateKind, TimeDomain};

/// `weir:operator@0.2.0`, frozen: one output, no parameters, records without their input
/// index. Its imports are served by the 0.3 implementations (`imports/legacy.rs`); its
/// `process-batch` takes [`LegacyInputRecord`]s, its `on-timers` the same timers.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../wit/legacy/weir-operator-0.2.0",
        world: "weir:operator/operator-world@0.2.0",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

/// `weir:operator@0.1.0`, frozen: 0.2 without timers. Served as 0.2 is.
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
    /// `weir:operator@0.3.0`: named outputs, emit timestamps, parameters, input indexes.
    V0_3,
}

impl WorldVersion {
    /// Every version the host runs, newest first.
    pub const ALL: [WorldVersion; 3] = [WorldVersion::V0_3, WorldVersion::V0_2, WorldVersion::V0_1];

    /// The interface that exports `process-batch` (and, from 0.2, `on-timers`).
    pub(crate) fn operator_interface(self) -> &'static str {
        match self {
            WorldVersion::V0_1 => "weir:operator/operator@0.1.0",
            WorldVersion::V0_2 => "weir:operator/operator@0.2.0",
            WorldVersion::V0_3 => "weir:operator/operator@0.3.0",
        }
    }

    /// As `weir:operator@0.1.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorldVersion::V0_1 => "0.1.0",
            WorldVersion::V0_2 => "0.2.0",
            WorldVersion::V0_3 => "0.3.0",
        }
    }

    /// Whether its `input-record` has the `input` field (0.3 and later); older worlds' records
    /// are lowered as [`LegacyInputRecord`]s.
    pub(crate) fn has_input_index(self) -> bool {
        self == WorldVersion::V0_3
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
    /// The index of its topic among the run's inputs (`pipeline.input_topics`), from 0.
    #[component(name = "input")]
    pub input: u32,
}

/// One input record as `weir:operator@0.2.0` and `@0.1.0` receive it: [`InputRecord`] without
/// its input index, borrowed from it (lowering copies the bytes into guest memory once, as
/// for a 0.3 component).
#[derive(ComponentType, Lower, Clone, Copy, Debug)]
#[component(record)]
pub struct LegacyInputRecord<'a> {
    #[component(name = "key")]
    key: &'a [u8],
    #[component(name = "value")]
    value: &'a [u8],
    #[component(name = "timestamp-ms")]
    timestamp_ms: i64,
    #[component(name = "headers")]
    headers: &'a [Header],
    #[component(name = "topic")]
    topic: &'a str,
    #[component(name = "partition")]
    partition: i32,
    #[component(name = "offset")]
    offset: i64,
}

impl<'a> From<&'a InputRecord> for LegacyInputRecord<'a> {
    fn from(r: &'a InputRecord) -> Self {
        Self {
            key: &r.key,
            value: &r.value,
            timestamp_ms: r.timestamp_ms,
            headers: &r.headers,
            topic: &r.topic,
            partition: r.partition,
            offset: r.offset,
        }
    }
}
