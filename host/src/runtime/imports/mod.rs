//! The host side of each WIT interface the operator imports, one file per interface.

mod emit;
mod log;
mod state;

use super::bindings::weir::operator::types;
use super::host::HostCtx;
use crate::state::Shard;

impl<S: Shard> types::Host for HostCtx<S> {}
