//! The seam between the SDK and the host's imports: in a component (`wasm32`) the WIT imports
//! themselves; in a native build the in-memory host of [`crate::testing`], with the very same
//! signatures, so that [`Context`](crate::Context) and the window helpers run unchanged under
//! `cargo test`.

#[cfg(target_arch = "wasm32")]
pub(crate) use crate::wit::weir::operator::{emit, log, parameters, state, tables, timers};

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use crate::testing::imports::{emit, log, parameters, state, tables, timers};
