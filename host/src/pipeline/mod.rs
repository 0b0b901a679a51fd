//! Runs one pipeline: the consumer loop ([`consumer_loop`]) that batches records per
//! partition, opens and closes shards (`consumer_loop::open`), and the per-partition workers ([`worker`])
//! that call the operator.
//!
//! Records of a partition go to that partition's worker in offset order; its execution
//! controller runs batches of different keys at once, each key's records in offset order;
//! partitions run concurrently. Co-partitioned input topics share the worker (and shard)
//! of their partition number. A shard is recovered from its newest usable decided checkpoint
//! when its partition is assigned, and the source is seeked to that checkpoint's offsets;
//! workers checkpoint every `pipeline.checkpoint_interval`; on revoke a worker drops its queued
//! records, checkpoints and closes the shard. docs/checkpoints.md is the protocol.
//!
//! The pipeline sees the world through [`ports`]: a [`Source`] and an [`Output`], which
//! `source/` and `sink/` implement for Kafka and in memory (for tests with no broker); it names
//! no adapter. `crate::runner::run` sets the Kafka ones up from the settings.
//!
//! - [`ports`]          the traits the pipeline runs over;
//! - [`consumer_loop`]  the loop: records and rebalances in, batches out, offsets committed;
//!   its `open` (a partition's shard opened, recovered and claimed), `outcome` (a worker that
//!   ended: reopen later, or stop the pipeline) and `shutdown` (the drain);
//! - [`events`]         what the loop and a worker tell each other, one channel each way;
//! - [`policy`]         every wait and retry bound of the pipeline, in one place;
//! - [`worker`]         one partition's worker: its `start`, its loop (`run`), admission,
//!   attempts' outcomes (`ended`), their `effects`, its `checkpoint`, how it ends (`error`);
//! - [`attempt`]        one attempt of a batch, and a partition's execution state;
//! - [`isolation`]      which records of a failed batch to call next;
//! - [`controller`]     the execution controller (FLIP-425);
//! - [`stats`]          the figures of a run.

mod attempt;
mod consumer_loop;
pub mod controller;
mod events;
pub(crate) mod global_tables;
mod isolation;
mod policy;
pub mod ports;
mod stats;
mod tables;
mod timers;
mod worker;

pub use attempt::prefetch;
pub use ports::{Output, Source};
pub use stats::{
    CHECKPOINT_HISTORY_MAX, CheckpointRecord, PartitionProblem, PartitionProgress, PartitionState,
    PipelineStats,
};
pub use worker::WorkerError;

use crate::config::Settings;
use crate::ids::Partition;
use crate::runtime::{Operator, RuntimeError};
use crate::state::{StateBackend, StateError};
use consumer_loop::Running;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch;

/// Why a pipeline stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The operator could not be loaded.
    #[error("cannot load operator")]
    Operator(#[source] RuntimeError),
    /// The source or the output could not be set up (a Kafka client's configuration).
    #[error("cannot set up the pipeline's source or output")]
    Setup(#[source] ports::Cause),
    /// A shard could not be opened.
    #[error("cannot open shard")]
    State(#[source] StateError),
    /// A partition worker failed.
    #[error("partition worker failed")]
    Worker(#[source] WorkerError),
    /// Shutdown stopped these partitions' workers without finishing their queued records,
    /// after `shutdown_drain_max` (they were stuck, for example in a state outage).
    #[error("shutdown gave up draining partitions {0:?}")]
    DrainTimedOut(Vec<Partition>),
    /// A partition worker panicked (a bug).
    #[error("partition worker panicked. partition={0}")]
    WorkerPanicked(Partition),
    /// `pipeline.outputs` does not bind the operator's declared outputs exactly.
    #[error("the pipeline's outputs do not fit its operator")]
    Outputs(#[source] crate::topology::OutputBindingError),
    /// A global table's topic could not be read to its end.
    #[error(transparent)]
    GlobalTable(#[from] global_tables::GlobalTableError),
    /// A table of `pipeline.tables` fills a state the operator does not declare as a value
    /// state: the problems, one per table.
    #[error("the pipeline's tables do not fit its operator: {}", .0.join("; "))]
    Tables(Vec<String>),
}

impl PipelineError {
    /// What kind of failure ended the run: the runner reports it with the reason, and retries
    /// every kind with backoff (a topic may be created, a broker come back).
    pub fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            Self::Operator(err) => err.kind(),
            // A client that cannot be configured or reach the cluster.
            Self::Setup(_) | Self::DrainTimedOut(_) | Self::GlobalTable(_) => {
                ErrorKind::Unavailable
            }
            Self::State(err) => err.kind(),
            Self::Worker(err) => err.kind(),
            Self::WorkerPanicked(_) => ErrorKind::Internal,
            Self::Outputs(_) | Self::Tables(_) => ErrorKind::InvalidInput,
        }
    }
}

/// What a running pipeline can be asked to do besides stopping, and where its operator logs.
#[derive(Debug, Clone)]
pub struct PipelineControl {
    /// Each change of the value asks every partition for a checkpoint now, besides the
    /// interval's (as Flink's `POST /jobs/{id}/checkpoints`). A partition with nothing new
    /// since its last checkpoint has nothing to write.
    pub checkpoint_requests: watch::Receiver<u64>,
    /// Where the operator's log lines go besides the host's log (none by default): `weir
    /// serve` gives each run the pipeline's log segments.
    pub log_sink: Option<Arc<dyn crate::runtime::guest_log::LogSink>>,
}

impl PipelineControl {
    /// A control and the sender that drives it.
    pub fn new() -> (watch::Sender<u64>, Self) {
        let (tx, rx) = watch::channel(0);
        (
            tx,
            Self {
                checkpoint_requests: rx,
                log_sink: None,
            },
        )
    }
}

/// Runs the pipeline over `source` and `output` until `shutdown` completes or a fatal error
/// occurs, then drains the workers (every queued batch processed and delivered, a last
/// checkpoint) and returns. [`crate::runner::run`] and its kin run it over Kafka (and an
/// Iceberg table); tests over the in-memory `source::memory` and `sink::memory`.
///
/// # Errors
/// [`PipelineError`] for a shard that cannot be opened or a failed worker.
#[allow(clippy::too_many_arguments)]
pub async fn run_with<B: StateBackend, Src: Source, Out: Output>(
    settings: Settings,
    backend: Arc<B>,
    operator: Arc<Operator<B::Shard>>,
    stats: Arc<PipelineStats>,
    control: PipelineControl,
    source: Arc<Src>,
    output: Arc<Out>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let meta = operator.meta();
    tracing::info!(pipeline = %settings.pipeline.name, operator = %meta.name, version = %meta.version, states = meta.states.len(), "operator loaded");
    output_topics(&settings, &operator)?;
    table_states(&settings, &operator)?;
    if !settings.pipeline.parameters.is_empty() && meta.world != crate::runtime::WorldVersion::V0_3
    {
        tracing::warn!(pipeline = %settings.pipeline.name, world = meta.world.as_str(), "the operator's world has no parameters import: its parameters are not read");
    }
    // Global tables first, as Kafka Streams restores global state before its stream threads
    // start: no record runs before the tables hold what their topics had. A stop while they
    // load ends the run at once (nothing was consumed).
    let mut shutdown = std::pin::pin!(shutdown);
    let snapshots = backend
        .stored(&crate::state::ShardId {
            pipeline: settings.pipeline.name.clone(),
            partition: Partition(0),
        })
        .map(|stored| global_tables::Snapshots::beside_shards(stored.store, &stored.root));
    let load = global_tables::GlobalTablesRun::start(
        &settings.pipeline.global_tables,
        &source,
        snapshots,
        global_tables::save_interval(settings.pipeline.checkpoint_interval),
    );
    let globals = tokio::select! {
        loaded = load => loaded?,
        () = &mut shutdown => {
            tracing::info!(pipeline = %settings.pipeline.name, "stopped while its global tables loaded");
            return Ok(());
        }
    };
    // Only now a member of the group: no partition waits on this host's table loads.
    source
        .subscribe()
        .map_err(|e| PipelineError::Setup(Box::new(e)))?;
    let mut running = Running::new(settings, backend, operator, stats, control, source, output);
    running.global_tables = globals.tables.clone();
    let result = running.consume(shutdown).await;
    // A run that failed opens nothing more on its way out.
    let drained = running.drain(result.is_ok()).await;
    result.and(drained)
}

/// The topic of each of `operator`'s outputs, by output index, as `settings` bind them
/// ([`crate::topology::bind_outputs`]).
///
/// # Errors
/// [`PipelineError::Outputs`] when `pipeline.outputs` leaves out a declared output or binds
/// an undeclared one.
pub fn output_topics<S: crate::state::Shard>(
    settings: &Settings,
    operator: &Operator<S>,
) -> Result<Vec<Option<String>>, PipelineError> {
    let p = &settings.pipeline;
    crate::topology::bind_outputs(
        &operator.meta().outputs,
        p.output_topic.as_deref(),
        &p.outputs,
    )
    .map_err(PipelineError::Outputs)
}

/// Checks that every table of `settings` fills a value state `operator` declares (the state
/// its lookups read: docs/topologies.md, "Tables").
///
/// # Errors
/// [`PipelineError::Tables`] naming each table whose state is not a declared value state.
pub fn table_states<S: crate::state::Shard>(
    settings: &Settings,
    operator: &Operator<S>,
) -> Result<(), PipelineError> {
    let declared = &operator.meta().value_states;
    let problems: Vec<String> = settings
        .pipeline
        .tables
        .iter()
        .filter(|(_, state)| !declared.contains(state))
        .map(|(topic, state)| {
            format!(
                "table `{topic}` fills state `{state}`, which the operator does not declare as a value state (it declares {declared:?})"
            )
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(PipelineError::Tables(problems))
    }
}

#[cfg(test)]
mod tests;
