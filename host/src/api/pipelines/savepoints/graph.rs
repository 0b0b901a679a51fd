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
use super::{shards_of_run, unavailable};
use crate::api::ApiState;
use crate::api::pipelines::runs::ShardRun;
use crate::api::pipelines::{PipelineRecord, staged_run_name};
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
    if let Some(link) = link_through_a_topic(record) {
        return Err(ApiError::conflict(link));
    }
    // Held while it reads: a start or a reset meanwhile would make shards and edges disagree.
    state
        .catalog
        .update_pipeline(tenant, pipeline, |r| super::hold(r, record, "savepoint"))
        .await?;
    let taken = capture_held(state, tenant, record, (name, dir)).await;
    let released = state
        .catalog
        .update_pipeline(tenant, pipeline, |r| {
            r.resetting_since_ms = None;
            Ok::<(), ApiError>(())
        })
        .await;
    let taken = taken?;
    released?;
    Ok(taken)
}

/// Why a savepoint of `record` cannot hold what is in flight between two of its stages: one
/// reads another's output through a topic of the tenant's, which a reset would not replace.
fn link_through_a_topic(record: &PipelineRecord) -> Option<String> {
    let stages = &record.spec.stages;
    stages.iter().find_map(|reader| {
        reader.inputs.iter().find_map(|input| {
            let writer = input.stage.as_deref()?;
            let output = input.output.as_deref().unwrap_or(crate::topology::DEFAULT_OUTPUT);
            let topic = stages
                .iter()
                .find(|s| s.name == writer)?
                .outputs
                .get(output)?
                .topic
                .as_deref()?;
            Some(format!(
                "stage `{}` reads stage `{writer}`'s output `{output}` through topic `{topic}` of yours: a savepoint cannot hold what is in flight there (a reset would read it again); leave the output's topic out, so that Weir keeps it on an internal topic, to save this pipeline",
                reader.name
            ))
        })
    })
}

/// [`capture`] once the pipeline is held.
async fn capture_held(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    (name, dir): (&str, &SavepointDir),
) -> Result<SavepointDescriptor, ApiError> {
    let pipeline = &record.name;
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

mod reset;
#[cfg(test)]
use reset::incompatible;
pub(super) use reset::{reset_pipeline, restore_into_new};

#[cfg(test)]
mod tests;
