//! Resetting a pipeline of stages to a savepoint, or creating one from it (module docs of
//! `graph`): checked against the savepoint, the next generation of internal topics made and
//! seeded with what was in flight, every stage's shards restored with their edge offsets moved
//! onto the new topics.

use super::super::{
    Restored, RestoredShard, input_partitions, restore_one, shards_of_run, unavailable,
};
use crate::api::ApiState;
use crate::api::pipelines::PipelineSpec;
use crate::api::pipelines::runs::ShardRun;
use crate::api::pipelines::{PipelineRecord, kafka_topic, staged_run_name};
use crate::api::problem::ApiError;
use crate::checkpoints::savepoint::in_flight;
use crate::checkpoints::savepoint::{self, SavepointDescriptor, SavepointDir};
use crate::config::KafkaSettings;
use crate::config::stages::internal_topic;
use crate::ids::{Offset, Partition};
use crate::sink::kafka::{in_flight as kafka_in_flight, internal_topics};
use axum::Json;
use object_store::ObjectStoreExt as _;
use std::collections::BTreeMap;

use super::{kafka, kafka_failed, user_topics};

/// `reset_pipeline` of a pipeline of stages ([`reset`]): checked against the savepoint,
/// marked as resetting with the next generation of internal topics made, reset, and then
/// running over those topics, each stage with the operator version that took the savepoint
/// (when it is the same operator, still uploaded). The generation before is deleted.
pub(in crate::api::pipelines::savepoints) async fn reset_pipeline(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    (dir, saved): (&SavepointDir, &SavepointDescriptor),
) -> Result<Json<Restored>, ApiError> {
    let name = &record.name;
    check_reset(state, tenant, record, saved).await?;
    let generation = record.edge_generation.max(record.edge_generations_made) + 1;
    let run = staged_run_name(tenant, name, &record.uid);
    let too_long = record.spec.internal_topic_length_problems(&run, generation);
    if !too_long.is_empty() {
        return Err(ApiError::bad_request(too_long.join("; ")));
    }
    let marked = state
        .catalog
        .update_pipeline(tenant, name, |r| {
            super::super::mark_resetting(r, record)?;
            r.edge_generations_made = generation;
            Ok::<(), ApiError>(())
        })
        .await?;
    let restored = reset(state, tenant, &marked, (dir, saved), generation).await;
    // Each stage's operator version that took the savepoint, as for a one-operator pipeline.
    let mut back_to = BTreeMap::new();
    if restored.is_ok() {
        for stage in &saved.stages {
            let same = marked
                .spec
                .stages
                .iter()
                .any(|s| s.name == stage.name && s.operator == stage.operator);
            if same
                && state
                    .catalog
                    .version(tenant, &stage.operator, stage.operator_version)
                    .await?
                    .is_some()
            {
                back_to.insert(stage.name.clone(), stage.operator_version);
            }
        }
    }
    let done = restored.is_ok();
    let failed = restored.as_ref().err().map(ToString::to_string);
    let updated = state
        .catalog
        .update_pipeline(tenant, name, |r| {
            r.resetting_since_ms = None;
            r.reset_failed = failed.clone();
            if done {
                r.edge_generation = generation;
                for stage in &mut r.spec.stages {
                    if let Some(version) = back_to.get(&stage.name) {
                        stage.operator_version = *version;
                    }
                }
            }
            Ok::<(), ApiError>(())
        })
        .await?;
    if restored.is_err() {
        // Its half-seeded topics: nothing reads them (the pipeline stays on its generation).
        delete_generation(state, tenant, &marked, generation).await;
    }
    let mut restored = restored?;
    restored.operator_versions = stage_versions(&updated.spec);
    delete_generation(state, tenant, &marked, marked.edge_generation).await;
    tracing::info!(audit = true, %tenant, pipeline = %name, savepoint = %saved.name, from = %saved.pipeline, generation, shards = restored.shards.len(), "pipeline of stages reset to a savepoint");
    Ok(Json(restored))
}

/// `restore_into_new` of a pipeline of stages: the new pipeline `name` (uid `uid`, `spec`)
/// checked against `saved` as a reset is, then reset to it over its first internal topics
/// (made and seeded here; deleted again when the restore fails), before it is stored.
pub(in crate::api::pipelines::savepoints) async fn restore_into_new(
    state: &ApiState,
    tenant: &str,
    (name, uid, spec): (&str, &str, &PipelineSpec),
    (dir, saved): (&SavepointDir, &SavepointDescriptor),
) -> Result<Restored, ApiError> {
    let record = PipelineRecord::new(name.to_owned(), uid.to_owned(), spec.clone(), 0);
    if let Some(reason) = incompatible(&record, saved) {
        return Err(ApiError::bad_request(reason));
    }
    check_reset(state, tenant, &record, saved).await?;
    let restored = reset(state, tenant, &record, (dir, saved), 0).await;
    if restored.is_err() {
        delete_generation(state, tenant, &record, 0).await;
    }
    let mut restored = restored?;
    restored.operator_versions = stage_versions(spec);
    Ok(restored)
}

/// Each stage's operator version in `spec`.
fn stage_versions(spec: &PipelineSpec) -> BTreeMap<String, u64> {
    spec.stages
        .iter()
        .map(|s| (s.name.clone(), s.operator_version))
        .collect()
}

/// Whether `record` can be reset to `saved` ([`incompatible`]): no stage with state for a
/// partition the savepoint lacks, and each stage's topics with the partitions it saved.
async fn check_reset(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    saved: &SavepointDescriptor,
) -> Result<(), ApiError> {
    let name = &record.name;
    for edge in &saved.edges {
        let wants = record
            .spec
            .stages
            .iter()
            .find(|s| s.name == edge.stage)
            .and_then(|s| s.outputs.get(&edge.output))
            .and_then(|o| o.partitions);
        if let Some(n) = wants.filter(|n| *n as usize != edge.partitions.len()) {
            return Err(ApiError::bad_request(format!(
                "stage `{}`'s output `{}` has {} partitions in savepoint `{}`; this pipeline sets {n}: set them to {} or leave them out",
                edge.stage,
                edge.output,
                edge.partitions.len(),
                saved.name,
                edge.partitions.len()
            )));
        }
    }
    if let Some(reason) = incompatible(record, saved) {
        return Err(ApiError::bad_request(reason));
    }
    for stage in &saved.stages {
        let run = ShardRun::of(tenant, record, Some(&stage.name))?;
        let saved_partitions: Vec<Partition> = stage.shards.iter().map(|s| s.partition).collect();
        if let Some((extra, _)) = shards_of_run(state, tenant, record, &run)
            .await?
            .into_iter()
            .find(|(p, _)| !saved_partitions.contains(p))
        {
            return Err(ApiError::bad_request(format!(
                "stage `{}` of pipeline `{name}` has state for partition {extra}, which savepoint `{}` does not hold",
                stage.name, saved.name
            )));
        }
        if !stage.input_topics.is_empty() {
            let partitions = input_partitions(state, tenant, &stage.input_topics).await?;
            if let Some(n) = partitions.filter(|n| *n != stage.shards.len()) {
                return Err(ApiError::bad_request(format!(
                    "stage `{}` of savepoint `{}` holds {} partitions; its input topics have {n} now (state is partitioned by the input's partitions)",
                    stage.name,
                    saved.name,
                    stage.shards.len()
                )));
            }
        }
    }
    Ok(())
}

/// Why `record`, a pipeline of stages, cannot be reset to `saved`, if it cannot: another kind
/// of savepoint, other stages, other topics, other edges.
pub(super) fn incompatible(record: &PipelineRecord, saved: &SavepointDescriptor) -> Option<String> {
    let sp = &saved.name;
    if saved.stages.is_empty() {
        return Some(format!(
            "savepoint `{sp}` is of a one-operator pipeline; pipeline `{}` has stages",
            record.name
        ));
    }
    let ours: Vec<&str> = record.spec.stages.iter().map(|s| s.name.as_str()).collect();
    let theirs: Vec<&str> = saved.stages.iter().map(|s| s.name.as_str()).collect();
    let (mut a, mut b) = (ours.clone(), theirs.clone());
    a.sort_unstable();
    b.sort_unstable();
    if a != b {
        return Some(format!(
            "savepoint `{sp}` holds stages {theirs:?}; this pipeline has {ours:?}"
        ));
    }
    for stage in &saved.stages {
        let mut want = user_topics(record, &stage.name);
        let mut have = stage.input_topics.clone();
        want.sort();
        have.sort();
        if want != have {
            return Some(format!(
                "stage `{}` of savepoint `{sp}` read topics {have:?}; here it reads {want:?}",
                stage.name
            ));
        }
    }
    let mut ours: Vec<(String, String)> = record.spec.edges();
    let mut theirs: Vec<(String, String)> = saved
        .edges
        .iter()
        .map(|e| (e.stage.clone(), e.output.clone()))
        .collect();
    ours.sort();
    theirs.sort();
    if ours != theirs {
        return Some(format!(
            "savepoint `{sp}` holds edges {theirs:?} (stage, output); this pipeline's are {ours:?}"
        ));
    }
    None
}

/// Resets `record`, a stopped pipeline of stages marked as resetting, to `saved` (in `dir`)
/// over internal topics of generation `generation`, new: seeds them, then restores every
/// stage's shards with their edge offsets moved onto them. What was restored.
///
/// # Errors
/// 503 when the brokers or the store fail (the new topics are then left for a retry to pass
/// over, and deleted with the pipeline); 409 when the generation's topics exist already.
pub(super) async fn reset(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    (dir, saved): (&SavepointDir, &SavepointDescriptor),
    generation: u64,
) -> Result<Restored, ApiError> {
    let kafka = kafka(state)?;
    let store = state.catalog.store();
    let run_name = staged_run_name(tenant, &record.name, &record.uid);
    let mut moves = seed(state, tenant, (&kafka, &run_name), (dir, saved), generation).await?;
    let mut shards = Vec::new();
    for stage in &saved.stages {
        let stage_dir = dir.stage(&stage.name);
        let stage_saved = SavepointDescriptor {
            shards: stage.shards.clone(),
            ..saved.clone()
        };
        for shard in &stage.shards {
            let target = crate::state::ShardId {
                pipeline: crate::config::stages::run_name(&run_name, &stage.name),
                partition: shard.partition,
            }
            .root_under(&state.catalog.pipeline_state_prefix(tenant, &record.uid));
            let (mut version, bytes_copied) = restore_one(
                state,
                &record.spec,
                (&stage_dir, &stage_saved),
                shard.partition,
                &target,
            )
            .await?;
            // The offsets written: the saved ones, each edge's moved onto its new topic.
            let mut offsets = shard.offsets.clone();
            let moved = moves.remove(&(stage.name.clone(), shard.partition.0));
            if let Some(moved) = moved.filter(|m| !m.is_empty()) {
                let tenants = |topic: &str| {
                    let prefix = format!("{tenant}.");
                    topic.strip_prefix(&prefix).unwrap_or(topic).to_owned()
                };
                for edge in &moved {
                    offsets.remove(&tenants(&edge.old));
                    offsets.insert(tenants(&edge.new), Offset(edge.start as i64));
                }
                version = savepoint::with_offsets(store, &target, version, |offsets| {
                    for edge in moved {
                        offsets.remove(&edge.old);
                        offsets.insert(edge.new, Offset(edge.start as i64));
                    }
                })
                .await
                .map_err(unavailable)?;
            }
            shards.push(RestoredShard {
                stage: Some(stage.name.clone()),
                partition: shard.partition,
                version,
                offsets,
                bytes_copied,
            });
        }
    }
    Ok(Restored {
        savepoint: saved.name.clone(),
        from_pipeline: saved.pipeline.clone(),
        shards,
        operator_version: 0,
        operator_versions: BTreeMap::new(),
    })
}

/// Per reading stage and partition, its offsets to move onto the new internal topics.
type Moves = BTreeMap<(String, i32), Vec<EdgeMove>>;

/// One offset a reset moves: from the old internal topic to the new one, where it starts.
struct EdgeMove {
    old: String,
    new: String,
    start: u64,
}

/// Creates the internal topics of generation `generation` of the pipeline run as `run_name`
/// and seeds each partition with what `saved` holds in flight for it; the offsets to move.
async fn seed(
    state: &ApiState,
    tenant: &str,
    (kafka, run_name): (&KafkaSettings, &str),
    (dir, saved): (&SavepointDir, &SavepointDescriptor),
    generation: u64,
) -> Result<Moves, ApiError> {
    let store = state.catalog.store();
    let mut moves = Moves::new();
    for edge in &saved.edges {
        let topic = internal_topic(run_name, &edge.stage, &edge.output, generation);
        internal_topics::create_new(kafka, &topic, edge.partitions.len())
            .await
            .map_err(|e| match e {
                internal_topics::InternalTopicError::Refused {
                    code: rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists,
                    ..
                } => ApiError::conflict(format!(
                    "internal topic `{topic}` exists already: another reset made it; reset again"
                )),
                e => kafka_failed(e),
            })?;
        let producer = kafka_in_flight::seed_producer(kafka, &topic).map_err(kafka_failed)?;
        for part in &edge.partitions {
            for chunk in 0..part.chunks {
                let path = in_flight::chunk_path(
                    &dir.data,
                    (&edge.stage, &edge.output),
                    part.partition,
                    chunk,
                );
                let bytes = match store.get(&path).await {
                    Ok(found) => found.bytes().await?,
                    Err(object_store::Error::NotFound { .. }) => {
                        return Err(ApiError::conflict(format!(
                            "savepoint `{}` lost the records in flight on partition {} of stage `{}`'s output `{}` (chunk {chunk} is missing): it cannot be restored",
                            saved.name, part.partition, edge.stage, edge.output
                        )));
                    }
                    Err(e) => return Err(e.into()),
                };
                let records = in_flight::decode(&bytes)
                    .map_err(|e| ApiError::conflict(format!("savepoint `{}`: {e}", saved.name)))?;
                kafka_in_flight::seed(&producer, &topic, part.partition, &records)
                    .await
                    .map_err(kafka_failed)?;
            }
            kafka_in_flight::check_seeded(&producer, &topic, part.partition, part.records)
                .await
                .map_err(kafka_failed)?;
            for (reader, start) in &part.starts {
                moves
                    .entry((reader.clone(), part.partition))
                    .or_default()
                    .push(EdgeMove {
                        old: kafka_topic(tenant, &edge.topic),
                        new: topic.clone(),
                        start: *start,
                    });
            }
        }
    }
    Ok(moves)
}

/// Deletes the internal topics of generation `generation` of `record` once a reset moved past
/// them; a failure is logged (a delete of the pipeline deletes them too).
pub(super) async fn delete_generation(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    generation: u64,
) {
    let Ok(kafka) = kafka(state) else { return };
    let run_name = staged_run_name(tenant, &record.name, &record.uid);
    let topics = record.spec.internal_topics(&run_name, generation);
    if let Err(error) = internal_topics::delete_topics(&kafka, &topics).await {
        tracing::warn!(%tenant, pipeline = %record.name, ?topics, error = %crate::error::Chain(&error), "cannot delete the internal topics a reset left behind; a delete of the pipeline deletes them");
    }
}
