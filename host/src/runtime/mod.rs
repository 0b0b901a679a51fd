//! The Wasm runtime: one wasmtime [`Engine`] per host, operators compiled and pre-instantiated
//! once, instances created from the pooling allocator, and a CPU deadline and memory cap on
//! every call.
//!
//! How imports are async, and why (numbers in `docs/wasm-runtime.md`): guests are ordinary
//! `wasm32-wasip2` components with synchronous WIT functions; the host serves each import as an
//! async Rust function on a wasmtime fiber, so a call waiting on object storage suspends only
//! its instance.
//!
//! Deadlines use epoch interruption driven by a dedicated OS thread (so a guest spinning on a
//! runtime worker cannot starve it): each tick a running call yields to the executor and spends
//! one tick of its budget; a call whose budget is spent traps with [`DeadlineExceeded`].
//! Invariant: a trapped instance is dropped, never called again.

pub mod batch;
pub mod bindings;
mod compiled_dir;
mod describe;
mod epoch;
pub mod guest_log;
mod host;
mod imports;
mod instance;
pub mod native;
mod operator;
pub mod record_size;
pub mod wasi;

pub use batch::{BatchCtx, CallSettings, GlobalTables, Parameters, StagedEmit};
pub use bindings::{
    Disposition, FiredTimer, Header, InputRecord, OperatorInfo, TimeDomain, WorldVersion,
};
use bindings::{ON_TIMERS, PROCESS_BATCH};
pub use host::{CallLimits, HostCtx, OperatorMeta};
pub use instance::Instance;
use operator::Logic;
pub use operator::Operator;

use crate::clock::SharedClock;
use crate::config::RuntimeSettings;
use crate::error::ErrorKind;
use crate::state::{Shard, StateError};
use bindings::{OperatorWorld, v0_1, v0_2};
pub use describe::OUTPUTS_MAX;
use describe::{check_description, describe, world_exports};
use epoch::EpochTicker;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Interval between epoch ticks: the granularity of CPU deadlines and of yielding.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Bytes of a returned instance's linear memory zeroed in place (kept resident) rather than
/// decommitted.
const LINEAR_MEMORY_KEEP_RESIDENT_BYTES: usize = 1 << 20;

/// Bytes of a returned instance's tables kept resident likewise.
const TABLE_KEEP_RESIDENT_BYTES: usize = 64 << 10;

/// Returned slots decommitted together.
const DECOMMIT_BATCH: usize = 16;

/// Instances the pooling allocator can hold at once per host.
const POOLED_INSTANCES_MAX: u32 = 256;

/// Why an operator could not be loaded or instantiated.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The engine could not be configured (a bug or an unsupported platform).
    #[error("cannot configure the wasm engine")]
    Engine(#[source] wasmtime::Error),
    /// The file could not be read.
    #[error("cannot read operator. path=`{path}`")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid component (a core module, or not Wasm at all).
    #[error("operator is not a valid WebAssembly component: {reason}")]
    InvalidComponent {
        /// What wasmtime reported.
        reason: String,
    },
    /// The component does not implement the `weir:operator` world (missing export, an import
    /// the host does not provide).
    #[error(
        "operator does not implement the weir:operator world (0.3.0, 0.2.0 or 0.1.0): {reason}"
    )]
    WrongWorld {
        /// What is missing or wrong.
        reason: String,
    },
    /// `describe` returned something the host refuses.
    #[error("operator description is invalid: {reason}")]
    InvalidDescription {
        /// Which rule it breaks.
        reason: String,
    },
    /// Instantiation or `describe` failed (trap, resource limits).
    #[error("cannot instantiate operator")]
    Instantiate(#[source] wasmtime::Error),
}

impl RuntimeError {
    /// What the caller should do: a file or component that is not a valid operator is
    /// [`ErrorKind::InvalidInput`], a trap or broken limit while instantiating or describing is
    /// [`ErrorKind::GuestFault`], an engine that cannot be configured is
    /// [`ErrorKind::Internal`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            RuntimeError::Engine(_) => ErrorKind::Internal,
            RuntimeError::Read { .. }
            | RuntimeError::InvalidComponent { .. }
            | RuntimeError::WrongWorld { .. }
            | RuntimeError::InvalidDescription { .. } => ErrorKind::InvalidInput,
            RuntimeError::Instantiate(_) => ErrorKind::GuestFault,
        }
    }
}

/// Why a guest call did not return dispositions.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The guest trapped (panic, out of memory, deadline): a guest fault. The instance is
    /// unusable; the records are the guest's fault only if the batch held a single record.
    #[error("operator trapped: {message}")]
    Trap {
        /// The trap and its wasm backtrace, at most 4 KiB.
        message: String,
        /// Whether the trap was the CPU deadline.
        deadline: bool,
        /// How far the guest got: one past the highest record (or timer) index a `state`,
        /// `emit` or `timers` import named during the call, 0 if none did — a hint of where the
        /// trapping record is, for isolation ([`crate::pipeline`]'s), never trusted for
        /// correctness.
        reached: u32,
    },
    /// The guest returned a disposition count other than its record count.
    #[error("operator returned {got} dispositions for {expected} records")]
    DispositionCount {
        /// Records in the batch.
        expected: usize,
        /// Dispositions returned.
        got: usize,
    },
    /// The host aborted the call (state backend unavailable): not the guest's fault; retry.
    #[error("call aborted by the host")]
    Aborted(#[source] HostAbort),
}

impl CallError {
    /// What the caller should do: a trap or a wrong disposition count is the guest's
    /// ([`ErrorKind::GuestFault`]: isolate and dead-letter), an abort is the state backend's
    /// (its own kind, usually [`ErrorKind::Unavailable`]: retry after backoff).
    pub fn kind(&self) -> ErrorKind {
        match self {
            CallError::Trap { .. } | CallError::DispositionCount { .. } => ErrorKind::GuestFault,
            CallError::Aborted(HostAbort::State(err)) => err.kind(),
        }
    }
}

/// A host-side reason to abort a guest call; travels through wasmtime as the trap's error.
#[derive(Debug, thiserror::Error)]
pub enum HostAbort {
    /// The state backend failed; retry after backoff.
    #[error("state backend failed")]
    State(#[source] StateError),
}

/// A call staged more writes and emits than `batch_staged_bytes_max`: a guest fault.
#[derive(Debug, thiserror::Error)]
#[error("operator staged more than {limit} bytes of state writes and emits in one call")]
pub struct StagedBytesExceeded {
    /// The limit, bytes.
    pub limit: u64,
}

/// An emit is not a row of the pipeline's table (docs/iceberg.md, "Schema"): a guest fault
/// that fails the record, as a `too-large` emit does, before anything is written.
#[derive(Debug, thiserror::Error)]
#[error("an emit does not fit the pipeline's Iceberg table: {0}")]
pub struct EmitDoesNotFit(#[source] pub crate::row::RowError);

/// An emit names Weir's watermark marker header (`weir.watermark`, docs/topologies.md): a
/// guest fault that fails the record, so that no operator can move a later stage's watermark.
#[derive(Debug, thiserror::Error)]
#[error(
    "an emit may not carry the header `{}`, `{}` or `{}`: Weir writes them on its internal topics",
    crate::time::watermark::MARKER_HEADER,
    crate::time::edge::ORIGIN_HEADER,
    crate::time::edge::FRONTIER_HEADER
)]
pub struct ReservedHeader;

/// The CPU deadline ran out.
#[derive(Debug, thiserror::Error)]
#[error("operator exceeded its CPU deadline")]
pub struct DeadlineExceeded;

/// The per-host Wasm runtime, generic over the shard type its instances use.
pub struct Runtime<S: Shard> {
    engine: Engine,
    linker: Linker<HostCtx<S>>,
    settings: RuntimeSettings,
    clock: SharedClock,
    ticker: Arc<EpochTicker>,
    compiled_dir: Option<PathBuf>,
}

impl<S: Shard> std::fmt::Debug for Runtime<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S: Shard> Runtime<S> {
    /// Configures the engine (async, component model, epoch interruption, pooling allocator
    /// with `instance_memory_bytes_max` per memory) and links WASI and the Weir imports;
    /// compiled components are kept in `settings.compiled_dir` when set
    /// ([`Self::with_compiled_dir`]).
    ///
    /// # Errors
    /// [`RuntimeError::Engine`] when wasmtime rejects the configuration.
    pub fn new(settings: &RuntimeSettings, clock: SharedClock) -> Result<Self, RuntimeError> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(POOLED_INSTANCES_MAX)
            .total_core_instances(POOLED_INSTANCES_MAX * 8)
            .total_memories(POOLED_INSTANCES_MAX * 2)
            .total_tables(POOLED_INSTANCES_MAX * 4)
            .total_stacks(POOLED_INSTANCES_MAX)
            .max_memory_size(settings.instance_memory_bytes_max)
            // An instance replaced after a trap (or given back at a checkpoint) returns its
            // slot: the first MiB of its memory, and its tables, are zeroed in place rather
            // than given back to the kernel (a page fault per page on reuse), and slots are
            // decommitted in batches, one `madvise` and TLB flush for several (SCENARIOS.md
            // S21, docs/bench.md "Trap storms").
            .linear_memory_keep_resident(LINEAR_MEMORY_KEEP_RESIDENT_BYTES)
            .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES)
            .decommit_batch_size(DECOMMIT_BATCH);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(RuntimeError::Engine)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(RuntimeError::Engine)?;
        // Every world version side by side: their interfaces have distinct names
        // (`weir:operator/state@0.1.0`, `…@0.2.0`, `…@0.3.0`), so a component links whichever
        // it imports.
        OperatorWorld::add_to_linker::<_, HasSelf<HostCtx<S>>>(&mut linker, |ctx| ctx)
            .map_err(RuntimeError::Engine)?;
        v0_2::OperatorWorld::add_to_linker::<_, HasSelf<HostCtx<S>>>(&mut linker, |ctx| ctx)
            .map_err(RuntimeError::Engine)?;
        v0_1::OperatorWorld::add_to_linker::<_, HasSelf<HostCtx<S>>>(&mut linker, |ctx| ctx)
            .map_err(RuntimeError::Engine)?;
        let ticker = EpochTicker::start(engine.clone());
        Ok(Self {
            engine,
            linker,
            settings: settings.clone(),
            clock,
            ticker: Arc::new(ticker),
            compiled_dir: settings.compiled_dir.clone(),
        })
    }

    /// Keeps compiled components in `dir` (wasmtime's `Component::serialize`), one file per
    /// component and engine configuration — `{dir}/{engine hash}/{component SHA-256}.cwasm` —
    /// so that a restarted host loads an operator in milliseconds instead of compiling it
    /// again (0.1 s for a Rust operator, 8 s for a Python one). As wasmtime's own compilation
    /// cache, it trusts the directory: only this host may write to it. An artifact that does
    /// not load (another wasmtime, a damaged file) is compiled again and replaced. Each write
    /// prunes the directory to `compiled_dir_bytes_max`, least recently used files first.
    #[must_use]
    pub fn with_compiled_dir(mut self, dir: PathBuf) -> Self {
        self.compiled_dir = Some(dir);
        self
    }

    /// Compiles an operator file, checks it implements the world, and reads its description.
    ///
    /// # Errors
    /// See [`Runtime::load_operator_bytes`]; also [`RuntimeError::Read`].
    pub async fn load_operator(&self, path: &Path) -> Result<Operator<S>, RuntimeError> {
        let bytes = std::fs::read(path).map_err(|source| RuntimeError::Read {
            path: path.display().to_string(),
            source,
        })?;
        self.load_operator_bytes(&bytes).await
    }

    /// Compiles operator bytes, checks they implement the world, and reads the description.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidComponent`] for bytes that are not a component,
    /// [`RuntimeError::WrongWorld`] for a component of another world,
    /// [`RuntimeError::InvalidDescription`] when `describe` breaks a rule,
    /// [`RuntimeError::Instantiate`] when `describe` traps.
    pub async fn load_operator_bytes(&self, bytes: &[u8]) -> Result<Operator<S>, RuntimeError> {
        let (component, from_compiled_dir) = self.compile(bytes).await?;
        let instance_pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| RuntimeError::WrongWorld {
                    reason: format!("{e:#}"),
                })?;
        let (world, process_batch, on_timers) = world_exports(&component, &instance_pre)?;
        let mut operator = Operator {
            logic: Logic::Wasm {
                engine: self.engine.clone(),
                ticker: self.ticker.clone(),
                pre: instance_pre,
                process_batch,
                on_timers,
                world,
            },
            meta: None,
            settings: self.settings.clone(),
            clock: self.clock.clone(),
            from_compiled_dir: false,
            log_limiters: Default::default(),
            log_budget: guest_log::Budgets::new(self.settings.log_lines_per_second_max).pipeline,
        };
        let info = describe(&operator, world).await?;
        operator.meta = Some(Arc::new(check_description(info, world, &self.settings)?));
        operator.from_compiled_dir = from_compiled_dir;
        Ok(operator)
    }

    /// The component of `bytes`, from the compiled directory when it has it (then `true`), else
    /// compiled (and stored there). Compiling takes from 0.1 s (a Rust operator) to 8 s (a
    /// Python one, CPython included) of CPU, so it runs on a blocking thread: the runtime's
    /// workers keep running every other pipeline and request meanwhile.
    async fn compile(&self, bytes: &[u8]) -> Result<(Component, bool), RuntimeError> {
        let engine = self.engine.clone();
        let owned = bytes.to_vec();
        let dir = self.compiled_dir.clone();
        let bytes_max = self.settings.compiled_dir_bytes_max;
        tokio::task::spawn_blocking(move || {
            let path = dir
                .as_deref()
                .map(|dir| compiled_dir::path(dir, &engine, &owned));
            // One compile of a component at a time across the host's threads and every other
            // host process sharing the directory: the others wait, then load its file.
            let _compiling = path.as_deref().and_then(compiled_dir::lock);
            if let Some(path) = path.as_deref().filter(|p| p.exists()) {
                // Read into memory rather than mapped: a file changed in place under a mapping
                // would take the host down (SIGBUS), whoever changed it.
                let loaded = std::fs::read(path)
                    .map_err(wasmtime::Error::from)
                    .and_then(|bytes| {
                        // SAFETY: files in the compiled directory are written only by
                        // `compiled_dir::store`, from `Component::serialize` of an engine with the
                        // same compatibility hash (part of the path), and appear whole (written
                        // aside, then renamed); wasmtime checks the version and configuration
                        // recorded in the file again.
                        #[allow(unsafe_code)]
                        unsafe {
                            Component::deserialize(&engine, bytes)
                        }
                    });
                match loaded {
                    Ok(component) => {
                        compiled_dir::touch(path);
                        return Ok((component, true));
                    }
                    Err(err) => tracing::warn!(
                        path = %path.display(),
                        error = %format!("{err:#}"),
                        "compiled operator does not load; compiling it again"
                    ),
                }
            }
            let component =
                Component::new(&engine, &owned).map_err(|e| RuntimeError::InvalidComponent {
                    reason: format!("{e:#}"),
                })?;
            if let (Some(dir), Some(path)) = (&dir, &path) {
                compiled_dir::store(&component, dir, path, bytes_max);
            }
            Ok((component, false))
        })
        .await
        .map_err(|e| RuntimeError::InvalidComponent {
            reason: format!("the compiler did not finish: {e}"),
        })?
    }

    /// An operator whose logic is compiled into the host ([`native::NativeOperator`]): no
    /// Wasm, no sandbox, no limits; the baseline `weir bench` compares guests with. Its
    /// description is checked as a guest's.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidDescription`].
    pub fn native_operator(
        &self,
        logic: Arc<dyn native::NativeOperator>,
    ) -> Result<Operator<S>, RuntimeError> {
        let meta = check_description(logic.describe(), WorldVersion::V0_3, &self.settings)?;
        Ok(Operator {
            logic: Logic::Native(logic),
            meta: Some(Arc::new(meta)),
            settings: self.settings.clone(),
            clock: self.clock.clone(),
            from_compiled_dir: false,
            log_limiters: Default::default(),
            log_budget: guest_log::Budgets::new(self.settings.log_lines_per_second_max).pipeline,
        })
    }
}

/// Epoch ticks in `d`, at least one.
pub fn ticks(d: Duration) -> u64 {
    (d.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64
}
