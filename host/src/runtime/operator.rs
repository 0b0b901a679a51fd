//! A loaded operator ([`Operator`]): what runs its calls (a component, or logic compiled into
//! the host), what it declared, its log budgets; and its instances, each a store of its own
//! with the operator's limits ([`Operator::instantiate`]).

use super::bindings::{ON_TIMERS, PROCESS_BATCH};
use super::host::HostCtx;
use super::instance::{Instance, InstanceKind, OnTimers, ProcessBatch};
use super::{DeadlineExceeded, OperatorMeta, RuntimeError};
use super::{epoch::EpochTicker, guest_log, native, ticks, wasi};
use crate::clock::SharedClock;
use crate::config::RuntimeSettings;
use crate::state::Shard;
use guest_log::GuestLog;
use std::collections::HashMap;
use std::sync::Arc;
use wasmtime::component::{ComponentExportIndex, InstancePre};
use wasmtime::{Engine, Store, StoreLimitsBuilder, UpdateDeadline};

/// A compiled, pre-instantiated operator; cheap to instantiate many times.
pub struct Operator<S: Shard> {
    pub(super) logic: Logic<S>,
    pub(super) meta: Option<Arc<OperatorMeta>>,
    pub(super) settings: RuntimeSettings,
    pub(super) clock: SharedClock,
    pub(super) from_compiled_dir: bool,
    /// The log budget of each source (partition) its instances log as.
    pub(super) log_limiters:
        std::sync::Mutex<HashMap<Arc<str>, Arc<std::sync::Mutex<guest_log::Limiter>>>>,
    /// The log budget of all of them together: the pipeline's (one operator per pipeline run).
    pub(super) log_budget: Arc<std::sync::Mutex<guest_log::Limiter>>,
}

/// What runs an operator's calls.
pub(super) enum Logic<S: Shard> {
    /// A component.
    Wasm {
        engine: Engine,
        /// Keeps the engine's epoch ticking (CPU deadlines) while the operator lives, even
        /// after the runtime that compiled it is dropped.
        ticker: Arc<EpochTicker>,
        pre: InstancePre<HostCtx<S>>,
        /// `process-batch`, called with [`InputRecord`]s rather than the generated type.
        process_batch: ComponentExportIndex,
        /// `on-timers` (0.2 and later).
        on_timers: Option<ComponentExportIndex>,
        /// The world it was built against: how `process-batch` takes its records.
        world: super::WorldVersion,
    },
    /// Logic compiled into the host (benchmark baseline).
    Native(Arc<dyn native::NativeOperator>),
}

impl<S: Shard> std::fmt::Debug for Operator<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl<S: Shard> Operator<S> {
    /// Whether the component was loaded already compiled from the runtime's compiled directory
    /// ([`super::Runtime::with_compiled_dir`]) rather than compiled.
    pub fn from_compiled_dir(&self) -> bool {
        self.from_compiled_dir
    }

    /// The clock the operator's instances read processing time from.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// What the operator declared.
    pub fn meta(&self) -> &OperatorMeta {
        self.meta
            .as_deref()
            .expect("load_operator_bytes sets meta before returning the operator")
    }

    /// The operator's log for `source` (a partition): its partition's budget, however often
    /// its instances are replaced, and the pipeline's ([`guest_log`]).
    pub fn log(&self, source: guest_log::LogSource) -> GuestLog {
        let partition = {
            let mut limiters = self.log_limiters.lock().unwrap_or_else(|e| e.into_inner());
            limiters
                .entry(source.label.clone())
                .or_insert_with(|| {
                    guest_log::Limiter::shared(self.settings.log_lines_per_second_max)
                })
                .clone()
        };
        let budgets = guest_log::Budgets {
            partition,
            pipeline: self.log_budget.clone(),
        };
        GuestLog::with_budgets(source, self.clock.clone(), budgets)
    }

    /// Creates an instance bound to `shard`, logging as `source` (for example `flights/3`, or a
    /// [`guest_log::LogSource`] with the pipeline's sink).
    ///
    /// # Errors
    /// [`RuntimeError::Instantiate`] when the pool is exhausted or the component's start
    /// traps.
    pub async fn instantiate(
        &self,
        shard: Option<Arc<S>>,
        source: guest_log::LogSource,
    ) -> Result<Instance<S>, RuntimeError> {
        let (engine, pre, ticker, process_batch, on_timers, world) = match &self.logic {
            Logic::Wasm {
                engine,
                pre,
                ticker,
                process_batch,
                on_timers,
                world,
            } => (engine, pre, ticker, process_batch, on_timers, *world),
            Logic::Native(logic) => {
                return Ok(Instance {
                    kind: InstanceKind::Native {
                        logic: logic.clone(),
                        meta: self
                            .meta
                            .clone()
                            .expect("native_operator sets meta before returning the operator"),
                    },
                });
            }
        };
        let mut store = self.store(engine, shard, source);
        let ticking = ticker.ticking();
        let instance = pre
            .instantiate_async(&mut store)
            .await
            .map_err(RuntimeError::Instantiate)?;
        drop(ticking);
        let (process_batch, on_timers) =
            typed_exports(&instance, &mut store, (*process_batch, *on_timers), world)?;
        Ok(Instance {
            kind: InstanceKind::Wasm {
                store,
                instance,
                process_batch,
                on_timers,
                io_allowance: self.settings.call_io_allowance,
                ticker: ticker.clone(),
            },
        })
    }

    /// A store for an instance bound to `shard`, logging as `source`: the operator's memory
    /// limit, and one record's deadline for the component's start functions.
    fn store(
        &self,
        engine: &Engine,
        shard: Option<Arc<S>>,
        source: guest_log::LogSource,
    ) -> Store<HostCtx<S>> {
        let log = self.log(source);
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.settings.instance_memory_bytes_max)
            .trap_on_grow_failure(true)
            .build();
        let ctx = HostCtx::new(
            wasi::deny_all_ctx(&log),
            limits,
            shard,
            self.meta.clone(),
            self.clock.clone(),
            log,
        );
        let mut store = Store::new(engine, ctx);
        store.limiter(|ctx| &mut ctx.limits);
        // Instantiation runs the component's start functions: give it one record's deadline.
        store.data_mut().deadline_ticks_left = ticks(self.settings.record_deadline);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let data = ctx.data_mut();
            if data.deadline_ticks_left == 0 {
                return Err(wasmtime::Error::new(DeadlineExceeded));
            }
            data.deadline_ticks_left -= 1;
            Ok(UpdateDeadline::Yield(1))
        });
        store
    }
}

/// The typed `process-batch` and `on-timers` (0.2 and later) of `instance` (of `world`) in
/// `store`.
fn typed_exports<S: Shard>(
    instance: &wasmtime::component::Instance,
    store: &mut Store<HostCtx<S>>,
    (process_batch, on_timers): (ComponentExportIndex, Option<ComponentExportIndex>),
    world: super::WorldVersion,
) -> Result<(ProcessBatch, Option<OnTimers>), RuntimeError> {
    let on_timers = match on_timers {
        Some(index) => Some(
            instance
                .get_func(&mut *store, index)
                .ok_or_else(|| {
                    RuntimeError::Instantiate(wasmtime::format_err!("no `{ON_TIMERS}` export"))
                })?
                .typed(&*store)
                .map_err(RuntimeError::Instantiate)?,
        ),
        None => None,
    };
    let func = instance
        .get_func(&mut *store, process_batch)
        .ok_or_else(|| {
            RuntimeError::Instantiate(wasmtime::format_err!("no `{PROCESS_BATCH}` export"))
        })?;
    let process_batch = if world.has_input_index() {
        ProcessBatch::Current(func.typed(&*store).map_err(RuntimeError::Instantiate)?)
    } else {
        ProcessBatch::Legacy(func)
    };
    Ok((process_batch, on_timers))
}
