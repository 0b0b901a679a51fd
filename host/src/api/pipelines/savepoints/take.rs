//! Taking a savepoint (`POST /v1/pipelines/{name}/savepoints`): with the pipeline running, the
//! first decided checkpoint of every partition after the request; with it stopped, the newest
//! decided one. The copy ([`crate::checkpoints::savepoint::capture_shard`]) is the state module's;
//! here, the waiting for the hosts' checkpoints and the descriptor.

use super::{
    NewSavepoint, backend_name, check_savepoint_name, input_partitions, savepoints_of, shards_of,
    unavailable,
};
use crate::api::pipelines::{DesiredState, PipelineRecord, PipelineState, existing};
use crate::api::problem::{ApiError, Problem};
use crate::api::{ApiState, AuthProblems, Principal, read_json_or_default};
use crate::checkpoints::savepoint::{
    self, SavepointDescriptor, SavepointDir, SavepointShard, savepoint_root,
};
use crate::clock::wall_now_ms;
use crate::ids::{ManifestVersion, Partition};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a savepoint of a running pipeline waits for every partition's checkpoint, beyond
/// two checkpoint intervals.
const CHECKPOINT_WAIT: Duration = Duration::from_secs(60);
/// How often it asks the hosts for a checkpoint again while it waits (an exactly-once
/// checkpoint is decided, for a savepoint, once the next one names it as parent).
const REQUEST_AGAIN: Duration = Duration::from_secs(3);
/// How often it looks again at the shards while it waits.
const LOOK_AGAIN: Duration = Duration::from_millis(200);

/// Takes a savepoint: with the pipeline running, asks every host for a checkpoint and copies,
/// per partition, the first decided checkpoint after the request; with it stopped, the newest
/// decided one. Answers once every partition's is copied. A pipeline of stages is saved
/// stopped, with what is in flight on its internal topics (docs/topologies.md).
#[utoipa::path(post, path = "/v1/pipelines/{name}/savepoints", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = NewSavepoint,
    responses(
        (status = 201, description = "Taken", body = SavepointDescriptor),
        (status = 400, description = "A bad name or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The name is taken, or the pipeline has no checkpoint", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store failed, or a partition did not checkpoint in time", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn create_savepoint(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    body: Body,
) -> Result<(StatusCode, Json<SavepointDescriptor>), ApiError> {
    let tenant = principal.tenant()?.to_owned();
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, &tenant, &name).await?;
    let request: NewSavepoint = read_json_or_default(body).await?;
    let savepoint = request
        .name
        .unwrap_or_else(|| format!("sp-{}", wall_now_ms()));
    check_savepoint_name(&savepoint)?;
    let store = state.catalog.store().clone();
    let root = savepoint_root(&savepoints_of(&state, &tenant, &record), &savepoint);
    if savepoint::descriptor(&store, &root)
        .await
        .map_err(unavailable)?
        .is_some()
    {
        return Err(ApiError::conflict(format!(
            "pipeline `{name}` has a savepoint `{savepoint}` already"
        )));
    }
    let running = running(&state, &tenant, &record).await?;
    let dir = SavepointDir::new(&root, &format!("a{:08x}", savepoint::nonce()));
    let taken = if record.spec.is_staged() {
        super::graph::capture(&state, &tenant, &record, running, (&savepoint, &dir)).await
    } else {
        match Capture::start(&state, &tenant, &record, running, &dir).await {
            Ok(capture) => capture
                .wait()
                .await
                .map(|taken| descriptor(&tenant, &record, &savepoint, &dir, taken)),
            Err(e) => Err(e),
        }
    };
    let descriptor = match taken {
        Ok(descriptor) => descriptor,
        Err(e) => {
            // Only this attempt's copies: another may have taken the name meanwhile.
            let _ = savepoint::delete(&store, &dir.data).await;
            return Err(e);
        }
    };
    if !savepoint::put_descriptor(&store, &root, &descriptor)
        .await
        .map_err(unavailable)?
    {
        let _ = savepoint::delete(&store, &dir.data).await;
        return Err(ApiError::conflict(format!(
            "pipeline `{name}` has a savepoint `{savepoint}` already (taken at the same time)"
        )));
    }
    tracing::info!(%tenant, pipeline = %name, savepoint = %savepoint, bytes = descriptor.bytes, "savepoint taken");
    Ok((StatusCode::CREATED, Json(descriptor)))
}

/// Whether the pipeline runs (a savepoint then takes the first decided checkpoints after the
/// request) or has stopped (its last ones); a conflict while it is stopping.
pub(super) async fn running(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
) -> Result<bool, ApiError> {
    let status = crate::api::pipelines::view(state, tenant, record.clone())
        .await?
        .status
        .state;
    match (record.desired, status) {
        (DesiredState::Running, _) => Ok(true),
        (DesiredState::Stopped, PipelineState::Stopped) => Ok(false),
        (DesiredState::Stopped, _) => Err(ApiError::conflict(format!(
            "pipeline `{}` is stopping: take the savepoint once it has stopped (its last checkpoints are then the ones saved)",
            record.name
        ))),
    }
}

/// `shards` with their offsets by the tenant's topic names (`{tenant}.` left out), as the
/// pipeline's definition names them.
pub(super) fn tenants_names(
    tenant: &str,
    shards: impl IntoIterator<Item = SavepointShard>,
) -> Vec<SavepointShard> {
    let prefix = format!("{tenant}.");
    shards
        .into_iter()
        .map(|mut shard| {
            shard.offsets = shard
                .offsets
                .into_iter()
                .map(|(t, n)| (t.strip_prefix(&prefix).unwrap_or(&t).to_owned(), n))
                .collect();
            shard
        })
        .collect()
}

/// The descriptor of savepoint `name` of the pipeline, whose shards (`taken`) are in `dir`:
/// offsets by the tenant's topic names, as the pipeline's definition names them.
fn descriptor(
    tenant: &str,
    record: &PipelineRecord,
    name: &str,
    dir: &SavepointDir,
    taken: BTreeMap<Partition, SavepointShard>,
) -> SavepointDescriptor {
    let shards = tenants_names(tenant, taken.into_values());
    SavepointDescriptor {
        stages: Vec::new(),
        edges: Vec::new(),
        format: savepoint::FORMAT_VERSION,
        name: name.to_owned(),
        data: dir.data.filename().map(str::to_owned).unwrap_or_default(),
        pipeline: record.name.clone(),
        pipeline_uid: record.uid.clone(),
        state_backend: backend_name(&record.spec).to_owned(),
        input_topics: record.spec.input_topics.clone(),
        operator: record.spec.operator.clone(),
        operator_version: record.spec.operator_version,
        created_ms: wall_now_ms(),
        bytes: shards.iter().map(|s| s.bytes).sum(),
        shards,
    }
}

/// A savepoint being taken: the shards it copies into `dir`, and what it waits for.
struct Capture<'a> {
    state: &'a ApiState,
    tenant: &'a str,
    record: &'a PipelineRecord,
    store: Arc<dyn ObjectStore>,
    dir: &'a SavepointDir,
    /// The pipeline runs: take the first decided checkpoints after the request.
    running: bool,
    /// The shards, by partition (a new pipeline's appear as hosts open them).
    shards: Vec<(Partition, Path)>,
    /// Every partition of the input, when the brokers tell.
    partitions_wanted: Option<usize>,
    /// The checkpoint versions the group's committed offsets name, read at `read_at`.
    committed: BTreeMap<Partition, ManifestVersion>,
    read_at: Instant,
    /// Per partition, the newest decided version at the request: what is taken comes after.
    after: BTreeMap<Partition, Option<ManifestVersion>>,
    /// When the hosts were last asked for a checkpoint.
    asked: Option<Instant>,
    /// The shards copied so far.
    taken: BTreeMap<Partition, SavepointShard>,
    deadline: Instant,
}

impl<'a> Capture<'a> {
    /// Starts taking a savepoint of the pipeline into `dir`; a conflict when a stopped one
    /// never checkpointed.
    async fn start(
        state: &'a ApiState,
        tenant: &'a str,
        record: &'a PipelineRecord,
        running: bool,
        dir: &'a SavepointDir,
    ) -> Result<Self, ApiError> {
        let store = state.catalog.store().clone();
        let shards = shards_of(state, tenant, record).await?;
        if !running && shards.is_empty() {
            return Err(ApiError::conflict(format!(
                "pipeline `{}` never checkpointed: there is nothing to save",
                record.name
            )));
        }
        // Every partition: a new pipeline's shards appear as hosts open them.
        let partitions_wanted = if running {
            input_partitions(state, tenant, &record.spec.input_topics)
                .await
                .ok()
                .flatten()
        } else {
            None
        };
        let committed = committed_versions(state, tenant, record, &partitions(&shards)).await;
        let read_at = crate::clock::monotonic_now();
        let mut after = BTreeMap::new();
        if running {
            for (partition, shard) in &shards {
                let newest = savepoint::newest_decided(
                    &crate::state::manifest::ManifestStore::new(store.clone(), shard.clone()),
                    committed.get(partition).copied(),
                )
                .await
                .map_err(unavailable)?;
                after.insert(*partition, newest.map(|m| m.version));
            }
        }
        let interval = Duration::from_millis(record.spec.checkpoint_interval_ms);
        Ok(Capture {
            state,
            tenant,
            record,
            store,
            dir,
            running,
            shards,
            partitions_wanted,
            committed,
            read_at,
            after,
            asked: None,
            taken: BTreeMap::new(),
            deadline: crate::clock::monotonic_now() + 2 * interval + CHECKPOINT_WAIT,
        })
    }

    /// Copies each partition's checkpoint as it is decided, until every partition's is, or
    /// the deadline; returns the copies.
    async fn wait(mut self) -> Result<BTreeMap<Partition, SavepointShard>, ApiError> {
        loop {
            if self.running {
                self.keep_asking().await?;
            }
            self.copy_decided().await?;
            let complete = !self.shards.is_empty()
                && self.taken.len() == self.shards.len()
                && self.partitions_wanted.is_none_or(|n| self.taken.len() >= n);
            if complete {
                return Ok(self.taken);
            }
            if crate::clock::monotonic_now() >= self.deadline {
                return Err(self.timed_out());
            }
            tokio::time::sleep(LOOK_AGAIN).await;
        }
    }

    /// With the pipeline running: asks its hosts for a checkpoint (again after
    /// [`REQUEST_AGAIN`]), reads the committed versions again, and looks for new shards. A
    /// conflict once it was stopped.
    async fn keep_asking(&mut self) -> Result<(), ApiError> {
        let (state, tenant, name) = (self.state, self.tenant, self.record.name.as_str());
        if existing(state, tenant, name).await?.desired != DesiredState::Running {
            return Err(ApiError::conflict(format!(
                "pipeline `{name}` was stopped while the savepoint waited for its checkpoints; take it again once it has stopped"
            )));
        }
        if self.asked.is_none_or(|at| at.elapsed() >= REQUEST_AGAIN) {
            request_checkpoint(state, tenant, name).await?;
            self.asked = Some(crate::clock::monotonic_now());
        } else if self.read_at.elapsed() >= Duration::from_secs(1) {
            self.committed =
                committed_versions(state, tenant, self.record, &partitions(&self.shards)).await;
            self.read_at = crate::clock::monotonic_now();
        }
        if self.shards.is_empty()
            || self
                .partitions_wanted
                .is_some_and(|n| self.shards.len() < n)
        {
            // Shards opened since the request hold only checkpoints taken after it.
            self.shards = shards_of(state, tenant, self.record).await?;
        }
        Ok(())
    }

    /// Copies the decided checkpoint of every shard not copied yet that has one; a conflict
    /// when a stopped pipeline's partition has none.
    async fn copy_decided(&mut self) -> Result<(), ApiError> {
        for (partition, shard) in &self.shards {
            if self.taken.contains_key(partition) {
                continue;
            }
            let captured = savepoint::capture_shard(
                &self.store,
                shard,
                &self.dir.shard(*partition),
                *partition,
                self.after.get(partition).copied().flatten(),
                self.committed.get(partition).copied(),
            )
            .await
            .map_err(unavailable)?;
            match captured {
                Some(saved) => {
                    self.taken.insert(*partition, saved);
                }
                None if !self.running => {
                    return Err(ApiError::conflict(format!(
                        "pipeline `{}` is stopped and partition {partition} has no decided checkpoint to save",
                        self.record.name
                    )));
                }
                None => {}
            }
        }
        Ok(())
    }

    /// The partitions that did not checkpoint in time.
    fn timed_out(&self) -> ApiError {
        let missing: Vec<Partition> = match self.partitions_wanted {
            Some(n) => (0..n as i32)
                .map(Partition)
                .filter(|p| !self.taken.contains_key(p))
                .collect(),
            None => partitions(&self.shards)
                .into_iter()
                .filter(|p| !self.taken.contains_key(p))
                .collect(),
        };
        let name = &self.record.name;
        let interval = Duration::from_millis(self.record.spec.checkpoint_interval_ms);
        ApiError::unavailable(format!(
            "partitions {missing:?} of pipeline `{name}` did not checkpoint within {:?} of the request: is a host running them? (GET /v1/pipelines/{name})",
            2 * interval + CHECKPOINT_WAIT
        ))
    }
}

fn partitions(shards: &[(Partition, Path)]) -> Vec<Partition> {
    shards.iter().map(|(p, _)| *p).collect()
}

/// The checkpoint versions the consumer group's committed offsets name, per partition, for an
/// exactly-once pipeline on a host that has the brokers' settings (empty otherwise, or when
/// they cannot be read: a savepoint then waits for a later version to name the checkpoint as
/// its parent).
pub(in crate::api::pipelines) async fn committed_versions(
    state: &ApiState,
    tenant: &str,
    record: &PipelineRecord,
    partitions: &[Partition],
) -> BTreeMap<Partition, ManifestVersion> {
    let run = crate::api::pipelines::runs::ShardRun::pipeline(tenant, record);
    committed_versions_of(state, record, &run, partitions).await
}

/// [`committed_versions`] of one run of `record` (a stage's, in a pipeline of stages).
pub(in crate::api::pipelines) async fn committed_versions_of(
    state: &ApiState,
    record: &PipelineRecord,
    run: &crate::api::pipelines::runs::ShardRun,
    partitions: &[Partition],
) -> BTreeMap<Partition, ManifestVersion> {
    let (Some(kafka), crate::config::Delivery::ExactlyOnce) =
        (state.kafka_settings().cloned(), record.spec.delivery)
    else {
        return BTreeMap::new();
    };
    let (group, topics) = (run.group.clone(), run.input_topics.clone());
    let partitions = partitions.to_vec();
    let read = tokio::task::spawn_blocking(move || {
        crate::source::kafka::broker::committed_checkpoint_versions(
            &kafka,
            &group,
            &topics,
            &partitions,
        )
    })
    .await;
    match read {
        Ok(Ok(versions)) => versions,
        Ok(Err(error)) => {
            tracing::warn!(%error, pipeline = %record.name, "cannot read the committed offsets for a savepoint; waiting for later checkpoints instead");
            BTreeMap::new()
        }
        Err(_) => BTreeMap::new(),
    }
}

/// Bumps the pipeline's checkpoint requests, if it still runs.
async fn request_checkpoint(state: &ApiState, tenant: &str, name: &str) -> Result<(), ApiError> {
    state
        .catalog
        .update_pipeline(tenant, name, |record| {
            if record.desired == DesiredState::Running {
                record.checkpoint_requests += 1;
            }
            Ok::<(), ApiError>(())
        })
        .await?;
    Ok(())
}
