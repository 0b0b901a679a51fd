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

pub use exports::weir::operator::operator::{Disposition, InputRecord, OperatorInfo};
pub use weir::operator::types::{Header, StateDescriptor, StateKind};
