//! One pipeline run over its real adapters: the Kafka source (a member of the pipeline's
//! consumer group) and producer set up from the settings, the Iceberg table sink around the
//! producer when the run writes a table (docs/iceberg.md), then [`pipeline::run_with`] over
//! them. `weir run`, the reconcile loop's jobs, the benchmarks and the end-to-end tests start
//! pipelines here; the pipeline itself names no adapter.

use crate::clock::SharedClock;
use crate::config::Settings;
use crate::pipeline::{self, PipelineControl, PipelineError, PipelineStats};
use crate::runtime::{Operator, Runtime};
use crate::sink::iceberg::{TableOutput, TableTarget};
use crate::sink::kafka::KafkaOutput;
use crate::source::kafka::KafkaSource;
use crate::state::StateBackend;
use std::future::Future;
use std::sync::Arc;

/// What a run is given besides its settings: the pipeline's control (checkpoint requests, the
/// operator's log sink) and the Iceberg table the operator's emits go to besides the output
/// topic, if any. A bare [`PipelineControl`] converts into one with no table.
#[derive(Debug, Clone)]
pub struct RunControl {
    /// The pipeline's control.
    pub pipeline: PipelineControl,
    /// The table the emits go to, if any (docs/iceberg.md).
    pub table: Option<TableTarget>,
}

impl From<PipelineControl> for RunControl {
    fn from(pipeline: PipelineControl) -> Self {
        Self {
            pipeline,
            table: None,
        }
    }
}

/// Runs the pipeline until `shutdown` completes or a fatal error occurs, then drains the
/// workers (every queued batch processed and delivered, a last checkpoint) and returns.
///
/// # Errors
/// [`PipelineError`] for an unloadable operator, a Kafka setup failure or a failed worker.
pub async fn run<B: StateBackend>(
    settings: Settings,
    backend: Arc<B>,
    clock: SharedClock,
    stats: Arc<PipelineStats>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let (_requests, control) = PipelineControl::new();
    run_controlled(settings, backend, clock, stats, control, shutdown).await
}

/// [`run`], with `control` to ask the running pipeline for checkpoints, take its operator's
/// log lines, or write a table.
///
/// # Errors
/// As [`run`].
pub async fn run_controlled<B: StateBackend>(
    settings: Settings,
    backend: Arc<B>,
    clock: SharedClock,
    stats: Arc<PipelineStats>,
    control: impl Into<RunControl>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let runtime =
        Runtime::<B::Shard>::new(&settings.runtime, clock).map_err(PipelineError::Operator)?;
    let operator = Arc::new(
        runtime
            .load_operator(&settings.pipeline.operator)
            .await
            .map_err(PipelineError::Operator)?,
    );
    run_operator(settings, backend, operator, stats, control, shutdown).await
}

/// [`run_controlled`] with an operator already compiled (with `settings.runtime`'s limits;
/// `settings.pipeline.operator` is not read): a host running many pipelines compiles each
/// component once.
///
/// # Errors
/// As [`run`].
pub async fn run_operator<B: StateBackend>(
    settings: Settings,
    backend: Arc<B>,
    operator: Arc<Operator<B::Shard>>,
    stats: Arc<PipelineStats>,
    control: impl Into<RunControl>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let RunControl {
        pipeline: control,
        table,
    } = control.into();
    let outputs = pipeline::output_topics(&settings, &operator)?;
    let source = KafkaSource::new(&settings).map_err(|e| PipelineError::Setup(Box::new(e)))?;
    let output = KafkaOutput::new(&settings, outputs, source.consumer())
        .await
        .map_err(|e| PipelineError::Setup(Box::new(e)))?;
    let output = TableOutput::new(output, table);
    pipeline::run_with(
        settings,
        backend,
        operator,
        stats,
        control,
        Arc::new(source),
        Arc::new(output),
        shutdown,
    )
    .await
}
