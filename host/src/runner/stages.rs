//! A pipeline of stages over Kafka (docs/topologies.md), as `weir run` runs it: its internal
//! topics made to exist (`sink::kafka::internal_topics`), then every stage's run
//! ([`super::run`], each a one-operator run with its own consumer group, shards and
//! checkpoints) at once. They stop together: when `shutdown` completes every stage drains and
//! takes its last checkpoint; when one ends or fails, the others are stopped the same way and
//! the first failure is returned, named after its stage.
//!
//! Exactly-once crosses an edge as Kafka Streams' does: the upstream stage's emits to the
//! internal topic commit in the transaction of its checkpoint, and the downstream stage reads
//! `read_committed`. Event time crosses it in watermark markers (`time::watermark`): each run
//! is told which of its inputs are edges and how many shards write them, and whether its
//! output is one. Every ten checkpoint intervals the internal topics are purged below what
//! their readers' stored checkpoints name.

use crate::clock::SharedClock;
use crate::config::KafkaSettings;
use crate::config::stages::StagePlan;
use crate::ids::Partition;
use crate::pipeline::{PipelineError, PipelineStats};
use crate::sink::kafka::internal_topics::{self, InternalTopicError};
use crate::state::checkpoint::InputOffsets;
use crate::state::manifest::{ManifestKind, ManifestStore};
use crate::state::{ShardId, StateBackend};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Why a pipeline of stages stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StagesError {
    /// Its internal topics could not be made ready.
    #[error("cannot set up the internal topics")]
    Topics(#[source] InternalTopicError),
    /// A stage's run failed.
    #[error("stage `{stage}` failed")]
    Stage {
        /// The stage.
        stage: String,
        /// Its run's error.
        #[source]
        source: PipelineError,
    },
    /// A stage's run panicked (a bug).
    #[error("stage `{0}` panicked")]
    Panicked(String),
    /// A stage's operator could not be loaded, before anything started.
    #[error("stage `{stage}`: cannot load its operator")]
    Operator {
        /// The stage.
        stage: String,
        /// Why.
        #[source]
        source: crate::runtime::RuntimeError,
    },
    /// The stages' outputs do not fit their operators' declarations: every problem, each
    /// naming its stage, found before anything started.
    #[error("the stages' outputs do not fit their operators: {}", .0.join("; "))]
    Outputs(Vec<String>),
}

impl StagesError {
    /// What kind of failure it is (as [`PipelineError::kind`]).
    pub fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            Self::Topics(InternalTopicError::Partitions { .. }) => ErrorKind::InvalidInput,
            Self::Topics(_) => ErrorKind::Unavailable,
            Self::Stage { source, .. } => source.kind(),
            Self::Panicked(_) => ErrorKind::Internal,
            Self::Operator { source, .. } => source.kind(),
            Self::Outputs(_) => ErrorKind::InvalidInput,
        }
    }
}

/// Every stage's operator, compiled once, in the plan's order.
///
/// # Errors
/// [`StagesError::Operator`] for one that does not load.
async fn load_operators<S: crate::state::Shard>(
    plan: &StagePlan,
    clock: SharedClock,
) -> Result<Vec<Arc<crate::runtime::Operator<S>>>, StagesError> {
    let mut operators = Vec::with_capacity(plan.runs.len());
    for run in &plan.runs {
        let failed = |source| StagesError::Operator {
            stage: run.stage.clone(),
            source,
        };
        let runtime = crate::runtime::Runtime::<S>::new(&run.settings.runtime, clock.clone())
            .map_err(failed)?;
        let operator = runtime
            .load_operator(&run.settings.pipeline.operator)
            .await
            .map_err(failed)?;
        operators.push(Arc::new(operator));
    }
    Ok(operators)
}

/// Checks each stage's outputs against what its operator (`operators`, in the plan's order)
/// declares.
///
/// # Errors
/// [`StagesError::Outputs`] naming, per stage, every output its operator declares that the
/// pipeline leaves unbound and every binding of a name it does not declare (with the stages
/// that read it).
fn check_outputs<S: crate::state::Shard>(
    plan: &StagePlan,
    operators: &[Arc<crate::runtime::Operator<S>>],
) -> Result<(), StagesError> {
    let mut problems = Vec::new();
    for (run, operator) in plan.runs.iter().zip(operators) {
        if let Err(PipelineError::Outputs(err)) =
            crate::pipeline::output_topics(&run.settings, operator)
        {
            problems.extend(
                err.problems
                    .iter()
                    .map(|p| format!("stage `{}`: {p}", run.stage)),
            );
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(StagesError::Outputs(problems))
    }
}

/// A stage run's edges as its internal topics are (`ready`): the markers it writes to each
/// internal output's partitions, the upstream shards each internal input waits for.
fn edges(
    stage: &str,
    run: &crate::config::PipelineSettings,
    ready: &std::collections::BTreeMap<String, internal_topics::Ready>,
) -> crate::config::stages::Edges {
    crate::config::stages::Edges {
        stage: Some(stage.to_owned()),
        output_partitions: run
            .output_topic
            .iter()
            .chain(run.outputs.values())
            .filter_map(|t| {
                let partitions = ready.get(t)?.partitions;
                Some((t.clone(), i32::try_from(partitions).unwrap_or(i32::MAX)))
            })
            .collect(),
        inputs: run
            .input_topics
            .iter()
            .filter_map(|t| Some((t.clone(), ready.get(t)?.upstream_shards)))
            .collect(),
        generation: run.edges.generation,
    }
}

/// Runs `plan`'s stages, each with its `stats` (in the plan's order), over one `backend` (their
/// shards are named after their stages), until `shutdown` completes or a stage ends; then
/// drains them all.
///
/// # Errors
/// [`StagesError`]: the internal topics not ready, or the first stage that failed.
pub async fn run_stages<B: StateBackend>(
    kafka: &KafkaSettings,
    plan: StagePlan,
    stats: Vec<Arc<PipelineStats>>,
    backend: Arc<B>,
    clock: SharedClock,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StagesError> {
    let operators = load_operators(&plan, clock).await?;
    let (_requests, control) = crate::pipeline::PipelineControl::new();
    let stages = LoadedStages {
        plan,
        operators,
        stats,
    };
    run_loaded_stages(kafka, stages, backend, control, shutdown).await
}

/// A plan's stages with their operators, compiled, and their stats, both in the plan's order.
pub struct LoadedStages<S: crate::state::Shard> {
    /// The plan.
    pub plan: StagePlan,
    /// Each run's operator, compiled with its `settings.runtime`.
    pub operators: Vec<Arc<crate::runtime::Operator<S>>>,
    /// Each run's stats.
    pub stats: Vec<Arc<PipelineStats>>,
}

impl<S: crate::state::Shard> std::fmt::Debug for LoadedStages<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedStages")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

/// [`run_stages`] with the operators compiled (a host running many pipelines compiles each
/// component once) and `control` shared by every stage (checkpoint requests, the operator log
/// sink).
///
/// # Errors
/// As [`run_stages`].
pub async fn run_loaded_stages<B: StateBackend>(
    kafka: &KafkaSettings,
    stages: LoadedStages<B::Shard>,
    backend: Arc<B>,
    control: crate::pipeline::PipelineControl,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StagesError> {
    let LoadedStages {
        plan,
        operators,
        stats,
    } = stages;
    // Every stage's outputs checked against what its operator declares first: a binding that
    // does not fit refuses the whole pipeline before any topic is made.
    check_outputs(&plan, &operators)?;
    let ready = internal_topics::ensure(kafka, &plan.internal)
        .await
        .map_err(StagesError::Topics)?;
    let (stop, stopped) = watch::channel(false);
    let mut stages = JoinSet::new();
    let mut names = HashMap::new();
    let mut readers = Vec::new();
    let interval = plan.runs.first().map_or(Duration::from_secs(10), |r| {
        r.settings.pipeline.checkpoint_interval
    });
    for ((mut run, stats), operator) in plan.runs.into_iter().zip(stats).zip(operators) {
        let p = &mut run.settings.pipeline;
        p.edges = edges(&run.stage, p, &ready);
        for topic in p.edges.inputs.keys() {
            let partitions = ready[topic].partitions;
            readers.push((p.name.clone(), topic.clone(), partitions));
        }
        let mut stopped = stopped.clone();
        let until_stopped = async move {
            // A closed channel stops the run too.
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let run_stage = super::run_operator(
            run.settings,
            backend.clone(),
            operator,
            stats,
            stage_control(&control, &run.stage),
            until_stopped,
        );
        // Every line the stage's run logs names it.
        let span = tracing::info_span!("stage", stage = %run.stage);
        let handle = stages.spawn(tracing::Instrument::instrument(run_stage, span));
        names.insert(handle.id(), run.stage);
    }
    let purge = tokio::spawn(purge(
        kafka.clone(),
        readers,
        backend,
        (interval * PURGE_EVERY_CHECKPOINTS).max(PURGE_INTERVAL_MIN),
        stopped,
    ));
    tokio::pin!(shutdown);
    let mut failure = None;
    loop {
        let ended = tokio::select! {
            () = &mut shutdown, if !*stop.borrow() => {
                tracing::info!("stopping every stage");
                stop.send_replace(true);
                continue;
            }
            ended = stages.join_next_with_id() => ended,
        };
        let Some(ended) = ended else { break };
        // One stage that ends, for whatever reason, ends them all.
        stop.send_replace(true);
        let error = match ended {
            Ok((_, Ok(()))) => None,
            Ok((id, Err(source))) => Some(StagesError::Stage {
                stage: names[&id].clone(),
                source,
            }),
            Err(join) => Some(StagesError::Panicked(names[&join.id()].clone())),
        };
        if let Some(error) = error {
            tracing::error!(error = %crate::error::Chain(&error), "a stage failed: stopping the others");
            failure.get_or_insert(error);
        }
    }
    purge.abort();
    failure.map_or(Ok(()), Err)
}

/// `control` as stage `stage`'s run has it: the operator's log lines name the stage.
fn stage_control(
    control: &crate::pipeline::PipelineControl,
    stage: &str,
) -> crate::pipeline::PipelineControl {
    use crate::runtime::guest_log::{LogSink, StageLogSink};
    crate::pipeline::PipelineControl {
        log_sink: control
            .log_sink
            .clone()
            .map(|inner| Arc::new(StageLogSink::new(stage, inner)) as Arc<dyn LogSink>),
        ..control.clone()
    }
}

/// How often the internal topics are purged, in checkpoint intervals.
const PURGE_EVERY_CHECKPOINTS: u32 = 10;

/// The shortest time between purges.
const PURGE_INTERVAL_MIN: Duration = Duration::from_secs(1);

/// Every `every` until `stopped`: deletes the records of each internal topic below what every
/// stored checkpoint of each of its readers' shards names (`readers`: a reading stage's run
/// name, the topic, its partitions; two stages may read one output), so that a recovery
/// falling back to its oldest checkpoint still finds its input (docs/topologies.md). A purge
/// that fails is logged and tried at the next.
async fn purge<B: StateBackend>(
    kafka: KafkaSettings,
    readers: Vec<(String, String, usize)>,
    backend: Arc<B>,
    every: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let mut by_topic: std::collections::BTreeMap<String, (usize, Vec<String>)> =
        std::collections::BTreeMap::new();
    for (reader, topic, partitions) in readers {
        let entry = by_topic.entry(topic).or_insert((partitions, Vec::new()));
        entry.1.push(reader);
    }
    if by_topic.is_empty() {
        return;
    }
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => return,
            _ = ticks.tick() => {}
        }
        for (topic, (partitions, topic_readers)) in &by_topic {
            let mut below = Vec::new();
            for partition in 0..i32::try_from(*partitions).unwrap_or(i32::MAX) {
                let needed = needed_by_all(backend.as_ref(), topic_readers, topic, partition);
                if let Some(next) = needed.await {
                    below.push((partition, next));
                }
            }
            match internal_topics::delete_below(&kafka, topic, &below).await {
                Ok(failed) if failed.is_empty() => {
                    tracing::debug!(topic, partitions = below.len(), "internal topic purged");
                }
                Ok(failed) => tracing::warn!(topic, ?failed, "some partitions were not purged"),
                Err(err) => {
                    tracing::warn!(topic, error = %crate::error::Chain(&err), "internal topic not purged");
                }
            }
        }
    }
}

/// The lowest offset of `topic` that any of `readers` (run names: the stages that read it) may
/// still read in `partition` ([`oldest_needed`]); `None` — purge nothing — when one cannot say.
async fn needed_by_all<B: StateBackend>(
    backend: &B,
    readers: &[String],
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let mut lowest = i64::MAX;
    for reader in readers {
        lowest = lowest.min(oldest_needed(backend, reader, topic, partition).await?);
    }
    (lowest < i64::MAX).then_some(lowest)
}

/// The lowest offset of `topic` that a stored checkpoint of shard `partition` of run `reader`
/// resumes from: what its recovery may still read. `None` — purge nothing — when a checkpoint
/// has no offset of the topic yet, when there is none, or when the store cannot say now.
async fn oldest_needed<B: StateBackend>(
    backend: &B,
    reader: &str,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let id = ShardId {
        pipeline: reader.to_owned(),
        partition: Partition(partition),
    };
    let stored = backend.stored(&id)?;
    let manifests = ManifestStore::new(stored.store, stored.root);
    let mut lowest: Option<i64> = None;
    for version in manifests.versions().await.ok()? {
        // One collected meanwhile: the next purge reads the listing again.
        let manifest = manifests.read(version).await.ok()?;
        if manifest.kind != ManifestKind::Checkpoint {
            continue;
        }
        let next = InputOffsets::from_metadata(&manifest.metadata)
            .ok()?
            .next(topic)?
            .0;
        lowest = Some(lowest.map_or(next, |l| l.min(next)));
    }
    lowest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::ids::Offset;
    use crate::state::checkpoint::DecidedBy;
    use crate::state::memory::MemoryBackend;
    use crate::state::{Shard, StateWrite};
    use object_store::memory::InMemory;
    use object_store::path::Path;

    /// Shard 0 of run `reader` with checkpoints at each of `nexts` (the next offset of
    /// `topic`).
    async fn checkpointed(backend: &MemoryBackend, reader: &str, topic: &str, nexts: &[i64]) {
        let id = ShardId {
            pipeline: reader.to_owned(),
            partition: Partition(0),
        };
        let shard = backend.open_shard(&id).await.expect("opens");
        for next in nexts {
            let write = StateWrite {
                key: b"k".to_vec(),
                value: Some(next.to_string().into_bytes().into()),
                expires_at_ms: None,
            };
            shard.apply(vec![write]).await.expect("writes");
            let mut offsets = InputOffsets::new();
            offsets.advance(topic, Offset(next - 1));
            shard
                .checkpoint(&offsets, DecidedBy::Manifest)
                .await
                .expect("checkpoints");
        }
    }

    #[tokio::test]
    async fn a_stages_shards_are_listed_where_their_checkpoints_are_written() {
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let store: Arc<dyn object_store::ObjectStore> = Arc::new(InMemory::new());
        let backend = MemoryBackend::durable(store.clone(), Path::from("state"), clock);
        let run = crate::config::stages::run_name("acme.rekeyed.0123456789abcdef", "count");
        checkpointed(&backend, &run, "edge", &[5]).await;
        let roots = crate::checkpoints::verify::shard_roots(&store, &Path::from("state"), &run)
            .await
            .expect("lists");
        assert_eq!(
            roots.iter().map(|(p, _)| p.0).collect::<Vec<_>>(),
            vec![0],
            "the stage's one shard is found: {roots:?}"
        );
    }

    #[tokio::test]
    async fn an_internal_topic_is_purged_below_its_slowest_reader_and_not_past_one_that_cannot_say()
    {
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let backend = MemoryBackend::durable(Arc::new(InMemory::new()), Path::from("state"), clock);
        checkpointed(&backend, "p.fast", "p.first.default.internal", &[500, 900]).await;
        checkpointed(&backend, "p.slow", "p.first.default.internal", &[40, 70]).await;
        let readers = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let topic = "p.first.default.internal";
        assert_eq!(
            needed_by_all(&backend, &readers(&["p.fast"]), topic, 0).await,
            Some(500),
            "one reader: its oldest stored checkpoint"
        );
        assert_eq!(
            needed_by_all(&backend, &readers(&["p.fast", "p.slow"]), topic, 0).await,
            Some(40),
            "two readers of one output: the slower one's"
        );
        assert_eq!(
            needed_by_all(&backend, &readers(&["p.fast", "p.new"]), topic, 0).await,
            None,
            "a reader with no checkpoint may read it all"
        );
    }
}
