//! [`HostCtx`]: the data of one instance's `Store` — WASI context, limits, the bound shard and
//! the staging area of the current call.

use super::batch::BatchCtx;
use super::bindings::{StateDescriptor, StateKind, WorldVersion};
use super::guest_log::GuestLog;
use crate::clock::SharedClock;
use crate::state::Shard;
use std::collections::HashMap;
use std::sync::Arc;
use wasmtime::StoreLimits;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// What the operator declared in `describe`, checked, plus the host's per-call limits.
#[derive(Debug)]
pub struct OperatorMeta {
    /// Declared name.
    pub name: String,
    /// Declared version.
    pub version: String,
    /// The `weir:operator` world the component was built against (a native operator: the
    /// newest).
    pub world: WorldVersion,
    /// Declared states by name.
    pub states: HashMap<String, StateDescriptor>,
    /// Names of the value states, prefetched for every key of a batch.
    pub value_states: Vec<String>,
    /// The named outputs it declared, besides `default`: [`crate::runtime::StagedEmit::output`]
    /// `i + 1` is `outputs[i]`.
    pub outputs: Vec<String>,
    /// Limits applied inside imports.
    pub limits: CallLimits,
}

/// Limits enforced by the imports, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct CallLimits {
    /// Largest state value.
    pub state_value_bytes_max: u64,
    /// Largest map key.
    pub state_map_key_bytes_max: u64,
    /// Bytes one input record may emit.
    pub emit_bytes_per_record_max: u64,
    /// Bytes of writes and emits one call may stage.
    pub batch_staged_bytes_max: u64,
    /// Timers one key may have at once.
    pub timers_per_key_max: u32,
}

impl OperatorMeta {
    /// The index of output `name` as [`crate::runtime::StagedEmit::output`] counts it: 0 for
    /// `default`, `i + 1` for the declared `outputs[i]`; `None` for any other name.
    pub fn output_index(&self, name: &str) -> Option<u16> {
        if name == crate::topology::DEFAULT_OUTPUT {
            return Some(0);
        }
        let i = self.outputs.iter().position(|o| o == name)?;
        u16::try_from(i + 1).ok()
    }

    /// The declaration of state `name` if it is of `kind`.
    pub(crate) fn state(
        &self,
        name: &str,
        kind: StateKind,
    ) -> Result<&StateDescriptor, StateLookupError> {
        match self.states.get(name) {
            None => Err(StateLookupError::Unknown),
            Some(d) if d.kind != kind => Err(StateLookupError::WrongKind),
            Some(d) => Ok(d),
        }
    }
}

/// Why a state name cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateLookupError {
    Unknown,
    WrongKind,
}

/// The data of one instance's store.
pub struct HostCtx<S> {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: StoreLimits,
    /// The shard the instance reads and writes; `None` while describing the operator.
    pub(crate) shard: Option<Arc<S>>,
    /// Declared states and limits; `None` until `describe` has been checked.
    pub(crate) meta: Option<Arc<OperatorMeta>>,
    /// The current call's staging area.
    pub(crate) batch: BatchCtx,
    pub(crate) clock: SharedClock,
    pub(crate) log: GuestLog,
    /// Epoch ticks the current call may still run for.
    pub(crate) deadline_ticks_left: u64,
    /// Whether the call is waiting on the shard right now (so that a call ended by the
    /// wall-clock cap while waiting is reported as an outage, not as the guest's fault).
    pub(crate) waiting_on_state: bool,
}

impl<S> std::fmt::Debug for HostCtx<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCtx")
            .field("meta", &self.meta)
            .field("deadline_ticks_left", &self.deadline_ticks_left)
            .finish_non_exhaustive()
    }
}

impl<S: Shard> HostCtx<S> {
    pub(crate) fn new(
        wasi: WasiCtx,
        limits: StoreLimits,
        shard: Option<Arc<S>>,
        meta: Option<Arc<OperatorMeta>>,
        clock: SharedClock,
        log: GuestLog,
    ) -> Self {
        Self {
            wasi,
            table: ResourceTable::new(),
            limits,
            shard,
            meta,
            batch: BatchCtx::default(),
            clock,
            log,
            deadline_ticks_left: 0,
            waiting_on_state: false,
        }
    }
}

impl<S: Shard> WasiView for HostCtx<S> {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
