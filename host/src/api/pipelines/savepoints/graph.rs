//! Savepoints and resets of a pipeline of stages (docs/topologies.md, "Savepoints and resets").
//!
//! A savepoint is taken with the pipeline stopped, as Flink's stop-with-savepoint: every stage
//! has drained and checkpointed, nothing new enters an edge, and what is in flight on each
//! partition of an internal topic is exactly its records from the offset the reading stage's
//! checkpoint names to the partition's end, whichever upstream shard wrote them. The savepoint
//! holds every stage's shards and those records ([`capture`]). A reset ([`reset`]) creates the
//! next generation of the internal topics, seeds each partition with its saved records (they
//! take the offsets `0..n`), restores every stage's shards with their edge offsets moved to
//! the new topics, and then runs over them: no record in flight is skipped or read twice.

use super::take::{committed_versions_of, tenants_names};
use super::{Restored, RestoredShard, input_partitions, restore_one, shards_of_run, unavailable};
use crate::api::ApiState;
use crate::api::pipelines::runs::ShardRun;
use crate::api::pipelines::{DesiredState, PipelineSpec};
use crate::api::pipelines::{PipelineRecord, kafka_topic, staged_run_name};
use crate::api::problem::ApiError;
use crate::checkpoints::savepoint::in_flight::{self, InFlightRecord};
use crate::checkpoints::savepoint::{
    self, SavepointDescriptor, SavepointDir, SavepointEdge, SavepointEdgePartition, SavepointStage,
};
use crate::clock::wall_now_ms;
use crate::config::KafkaSettings;
use crate::config::stages::internal_topic;
use crate::ids::{Offset, Partition};
use crate::sink::kafka::{in_flight as kafka_in_flight, internal_topics};
use axum::Json;
use object_store::{ObjectStoreExt as _, PutPayload};
use std::collections::BTreeMap;

/// The brokers' settings, which a savepoint or reset of a pipeline of stages needs.
fn kafka(state: &ApiState) -> Result<KafkaSettings, ApiError> {
    state.kafka_settings().cloned().ok_or_else(|| {
        ApiError::unavailable(
            "this host has no Kafka settings: a savepoint or reset of a pipeline of stages reads and writes its internal topics; ask a host that runs pipelines",
        )
    })
}

fn kafka_failed(e: impl std::error::Error + Send + Sync + 'static) -> ApiError {
    let text = crate::error::Chain(&e).to_string();
    ApiError::unavailable(text).with_source(e)
}

/// Takes savepoint `name` of `record`, a pipeline of stages, into `dir`: every stage's newest
/// decided checkpoints, and what is in flight on each edge. Its descriptor (not written yet).
///
/// # Errors
/// 409 while it runs (a pipeline of stages is saved stopped) or when a stage never
/// checkpointed; 503 when the store or the brokers fail, or a transaction is still open on an
/// edge.
pub(super) async fn capture(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    running: bool,
    (name, dir): (&str, &SavepointDir),
) -> Result<SavepointDescriptor, ApiError> {
    let pipeline = &record.name;
    if running {
        return Err(ApiError::conflict(format!(
            "pipeline `{pipeline}` is a pipeline of stages, which is saved stopped (as Flink's stop-with-savepoint): stop it (POST /v1/pipelines/{pipeline}/stop), take the savepoint, start it again"
        )));
    }
    let kafka = kafka(state)?;
    let runs = ShardRun::all(tenant, record);
    let mut stages = Vec::with_capacity(runs.len());
    for run in &runs {
        stages.push(capture_stage(state, tenant, record, run, dir).await?);
    }
    let mut edges = Vec::new();
    let run_name = staged_run_name(tenant, pipeline, &record.uid);
    for (stage, output) in record.spec.edges() {
        let topic = internal_topic(&run_name, &stage, &output, record.edge_generation);
        let readers: Vec<&SavepointStage> = runs
            .iter()
            .zip(&stages)
            .filter(|(run, _)| run.input_topics.contains(&topic))
            .map(|(_, saved)| saved)
            .collect();
        let count = internal_topics::partitions(&kafka, &topic)
            .await
            .map_err(kafka_failed)?;
        let mut partitions = Vec::with_capacity(count);
        for partition in 0..count as i32 {
            let edge = (stage.as_str(), output.as_str());
            let saved =
                save_partition(state, &kafka, dir, (edge, &topic, partition), &readers).await?;
            partitions.push(saved);
        }
        edges.push(SavepointEdge {
            topic: topic
                .strip_prefix(&format!("{tenant}."))
                .unwrap_or(&topic)
                .to_owned(),
            stage,
            output,
            partitions,
        });
    }
    let stages: Vec<SavepointStage> = stages
        .into_iter()
        .map(|s| SavepointStage {
            shards: tenants_names(tenant, s.shards),
            ..s
        })
        .collect();
    let bytes = stages
        .iter()
        .flat_map(|s| &s.shards)
        .map(|s| s.bytes)
        .chain(edges.iter().flat_map(|e| &e.partitions).map(|p| p.bytes))
        .sum();
    let mut input_topics: Vec<String> =
        stages.iter().flat_map(|s| s.input_topics.clone()).collect();
    input_topics.sort();
    input_topics.dedup();
    Ok(SavepointDescriptor {
        format: savepoint::FORMAT_VERSION,
        name: name.to_owned(),
        data: dir.data.filename().map(str::to_owned).unwrap_or_default(),
        pipeline: pipeline.clone(),
        pipeline_uid: record.uid.clone(),
        state_backend: super::backend_name(&record.spec).to_owned(),
        input_topics,
        operator: String::new(),
        operator_version: 0,
        created_ms: wall_now_ms(),
        shards: Vec::new(),
        bytes,
        stages,
        edges,
    })
}

/// The newest decided checkpoint of every shard of `run` (a stage's) of the stopped `record`,
/// copied into `dir`.
async fn capture_stage(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    run: &ShardRun,
    dir: &SavepointDir,
) -> Result<SavepointStage, ApiError> {
    let pipeline = &record.name;
    let stage = run.stage.clone().unwrap_or_default();
    let shards = shards_of_run(state, tenant, record, run).await?;
    if shards.is_empty() {
        return Err(ApiError::conflict(format!(
            "stage `{stage}` of pipeline `{pipeline}` never checkpointed: there is nothing to save"
        )));
    }
    let partitions: Vec<Partition> = shards.iter().map(|(p, _)| *p).collect();
    let committed = committed_versions_of(state, record, run, &partitions).await;
    let mut saved = Vec::with_capacity(shards.len());
    for (partition, shard) in &shards {
        let copied = savepoint::capture_shard(
            state.catalog.store(),
            shard,
            &dir.stage(&stage).shard(*partition),
            *partition,
            None,
            committed.get(partition).copied(),
        )
        .await
        .map_err(unavailable)?;
        saved.push(copied.ok_or_else(|| {
            ApiError::conflict(format!(
                "pipeline `{pipeline}` is stopped and partition {partition} of stage `{stage}` has no decided checkpoint to save"
            ))
        })?);
    }
    Ok(SavepointStage {
        operator: run.operator.0.clone(),
        operator_version: run.operator.1,
        input_topics: user_topics(record, &stage),
        name: stage,
        shards: saved,
    })
}

/// The topics of the tenant's that `stage` of `record` reads (its edges left out).
fn user_topics(record: &PipelineRecord, stage: &str) -> Vec<String> {
    record
        .spec
        .stages
        .iter()
        .filter(|s| s.name == stage)
        .flat_map(|s| s.inputs.iter().filter_map(|i| i.topic.clone()))
        .collect()
}

/// Saves what is in flight on `partition` of the edge `(stage, output)`'s `topic`: its records
/// from the lowest offset a reader's saved checkpoint names (the log start when one names
/// none) to the end, in chunks under `dir`, and where each reader starts among them.
async fn save_partition(
    state: &ApiState,
    kafka: &KafkaSettings,
    dir: &SavepointDir,
    ((stage, output), topic, partition): ((&str, &str), &str, i32),
    readers: &[&SavepointStage],
) -> Result<SavepointEdgePartition, ApiError> {
    // Each reader's next offset, `None` when its checkpoint read nothing of the topic.
    let reads: Vec<(&str, Option<Offset>)> = readers
        .iter()
        .map(|r| {
            let next = r
                .shards
                .iter()
                .find(|s| s.partition.0 == partition)
                .and_then(|s| s.offsets.get(topic).copied());
            (r.name.as_str(), next)
        })
        .collect();
    let from = if reads.iter().any(|(_, next)| next.is_none()) {
        None
    } else {
        reads.iter().filter_map(|(_, next)| next.map(|o| o.0)).min()
    };
    let (sender, mut chunks) = tokio::sync::mpsc::channel::<Vec<InFlightRecord>>(2);
    let (reader_kafka, reader_topic) = (kafka.clone(), topic.to_owned());
    let read = tokio::task::spawn_blocking(move || {
        kafka_in_flight::read_to_end(&reader_kafka, &reader_topic, partition, from, &sender)
    });
    let mut starts: BTreeMap<String, u64> = reads.iter().map(|(r, _)| (r.to_string(), 0)).collect();
    let (mut chunk_count, mut bytes) = (0u32, 0u64);
    let store = state.catalog.store();
    while let Some(records) = chunks.recv().await {
        for (reader, next) in &reads {
            if let Some(next) = next {
                let before = records.iter().filter(|r| r.offset < next.0).count() as u64;
                *starts.entry(reader.to_string()).or_default() += before;
            }
        }
        let encoded = in_flight::encode(&records);
        bytes += encoded.len() as u64;
        let path = in_flight::chunk_path(&dir.data, (stage, output), partition, chunk_count);
        store.put(&path, PutPayload::from(encoded)).await?;
        chunk_count += 1;
    }
    let range = read
        .await
        .map_err(|e| ApiError::internal("the read of an internal topic failed").with_source(e))?
        .map_err(kafka_failed)?;
    Ok(SavepointEdgePartition {
        partition,
        from: Offset(range.from),
        end: Offset(range.end),
        records: range.records,
        chunks: chunk_count,
        bytes,
        starts,
    })
}

/// `reset_pipeline` of a pipeline of stages ([`reset`]): checked against the savepoint,
/// marked as resetting with the next generation of internal topics made, reset, and then
/// running over those topics, each stage with the operator version that took the savepoint
/// (when it is the same operator, still uploaded). The generation before is deleted.
pub(super) async fn reset_pipeline(
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
            if r.desired != DesiredState::Stopped || r.uid != record.uid {
                return Err(ApiError::conflict(format!(
                    "pipeline `{name}` was started or replaced while the reset began; stop it and reset again"
                )));
            }
            if super::under_way(r) {
                return Err(ApiError::conflict(format!(
                    "pipeline `{name}` is being reset already; wait for that reset's answer"
                )));
            }
            r.resetting_since_ms = Some(wall_now_ms());
            r.edge_generations_made = generation;
            Ok(())
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
    let mut restored = restored?;
    restored.operator_versions = stage_versions(&updated.spec);
    delete_generation(state, tenant, &marked, marked.edge_generation).await;
    tracing::info!(audit = true, %tenant, pipeline = %name, savepoint = %saved.name, from = %saved.pipeline, generation, shards = restored.shards.len(), "pipeline of stages reset to a savepoint");
    Ok(Json(restored))
}

/// `restore_into_new` of a pipeline of stages: the new pipeline `name` (uid `uid`, `spec`)
/// checked against `saved` as a reset is, then reset to it over its first internal topics
/// (made and seeded here; deleted again when the restore fails), before it is stored.
pub(super) async fn restore_into_new(
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

#[cfg(test)]
mod tests;
