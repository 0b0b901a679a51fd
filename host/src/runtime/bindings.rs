//! The single `bindgen!` site: host-side bindings of the `weir:operator` world in `wit/`.
//!
//! Every import is an async Rust function (a guest waiting on a state read suspends its fiber
//! while the host runs other work) and trappable (a host-side failure such as an unavailable
//! state backend aborts the call instead of reaching the guest as a record error).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "weir:operator/operator-world",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
});

pub use exports::weir::operator::operator::{Disposition, OperatorInfo};
pub use weir::operator::types::{Header, StateDescriptor, StateKind};

use std::sync::Arc;
use wasmtime::component::{ComponentType, Lower};

/// The interface that exports `process-batch`, and the export's name.
pub(crate) const OPERATOR_INTERFACE: &str = "weir:operator/operator@0.1.0";
pub(crate) const PROCESS_BATCH: &str = "process-batch";

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
