//! `GET /v1/pipelines/{name}/verify`: which of a pipeline's stored checkpoints could be
//! restored ([`crate::checkpoints::verify`]), for its tenant.

use super::existing;
use crate::api::problem::{ApiError, Problem};
use crate::api::{ApiState, AuthProblems, Principal};
use crate::checkpoints::savepoint;
use crate::checkpoints::verify::{ShardCheck, verify_pipeline, verify_shard};
use crate::ids::Partition;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, State};
use object_store::ObjectStoreExt as _;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Held by the verify this host runs; the next waits.
static VERIFYING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Query of `GET /v1/pipelines/{name}/verify`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct VerifyQuery {
    /// Read every referenced object and check its checksums (default `true`); `false` checks
    /// only that each is present at the size its checkpoint recorded (one listing a shard).
    pub checksums: Option<bool>,
}

/// What `GET /v1/pipelines/{name}/verify` found.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PipelineVerify {
    /// The pipeline.
    pub name: String,
    /// Whether every object's checksums were read and checked.
    pub checksums: bool,
    /// Whether there are shards and every one has a restorable checkpoint (a shard with none
    /// would start empty or stay paused, as docs/checkpoints.md says).
    pub restorable: bool,
    /// Per shard (input partition), every stored version, newest first.
    pub shards: Vec<ShardCheck>,
    /// The pipeline's savepoints, oldest first, each checked as its shards are.
    #[serde(default)]
    pub savepoints: Vec<SavepointCheck>,
}

/// What verification found for one savepoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SavepointCheck {
    /// The savepoint's name.
    pub name: String,
    /// Whether every partition's checkpoint in it is restorable.
    pub restorable: bool,
    /// Per partition (of each stage, in a pipeline of stages), its one checkpoint.
    pub shards: Vec<ShardCheck>,
    /// A pipeline of stages: the records in flight on its edges it lost, each a problem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// A shard as the table names it: its partition, or `{stage}/{partition}` in a pipeline of
/// stages.
fn label(shard: &ShardCheck) -> String {
    match &shard.stage {
        Some(stage) => format!("{stage}/{}", shard.partition),
        None => shard.partition.to_string(),
    }
}

/// 503 for a store that failed while the pipeline's state was read.
fn unavailable(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ApiError {
    ApiError::unavailable("the pipeline's state could not be read").with_source(e)
}

/// Checks each stored checkpoint of the pipeline's shards against the store: manifest,
/// objects present and whole, checksums. Read-only; safe while the pipeline runs (a version GC
/// deletes meanwhile is left out).
#[utoipa::path(get, path = "/v1/pipelines/{name}/verify", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$"),
           VerifyQuery),
    responses(
        (status = 200, description = "What each stored checkpoint is", body = PipelineVerify),
        (status = 400, description = "A bad query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store failed", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn verify_pipeline_state(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    query: Result<Query<VerifyQuery>, QueryRejection>,
) -> Result<Json<PipelineVerify>, ApiError> {
    let tenant = principal.tenant()?.to_owned();
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    tracing::Span::current().record("pipeline", name.as_str());
    let record = existing(&state, &tenant, &name).await?;
    let checksums = query.checksums.unwrap_or(true);
    // One verify at a time per host: each reads every object of a pipeline's state.
    let _one_at_a_time = VERIFYING.lock().await;
    let prefix = state.catalog.pipeline_state_prefix(&tenant, &record.uid);
    let mut shards = Vec::new();
    for run in super::runs::ShardRun::all(&tenant, &record) {
        let found = verify_pipeline(state.catalog.store(), &prefix, &run.shards, checksums)
            .await
            .map_err(unavailable)?;
        shards.extend(found.into_iter().map(|shard| ShardCheck {
            stage: run.stage.clone(),
            ..shard
        }));
    }
    let store = state.catalog.store();
    let mut savepoints = Vec::new();
    let root = object_store::path::Path::from(format!("{prefix}/savepoints"));
    for saved in savepoint::list(store, &root).await.map_err(unavailable)? {
        let at = savepoint::SavepointDir::new(
            &savepoint::savepoint_root(&root, &saved.name),
            &saved.data,
        );
        // Its shards: the pipeline's, or each stage's.
        let mut held: Vec<(Option<String>, Partition, object_store::path::Path)> = saved
            .shards
            .iter()
            .map(|s| (None, s.partition, at.shard(s.partition)))
            .collect();
        for stage in &saved.stages {
            let dir = at.stage(&stage.name);
            held.extend(stage.shards.iter().map(|s| {
                (
                    Some(stage.name.clone()),
                    s.partition,
                    dir.shard(s.partition),
                )
            }));
        }
        let mut shards = Vec::with_capacity(held.len());
        for (stage, partition, root) in held {
            let versions = verify_shard(store, &root, checksums)
                .await
                .map_err(unavailable)?;
            shards.push(ShardCheck {
                stage,
                partition,
                versions,
            });
        }
        let problems = lost_in_flight(store, &at, &saved).await?;
        savepoints.push(SavepointCheck {
            name: saved.name,
            restorable: !shards.is_empty()
                && problems.is_empty()
                && shards.iter().all(|s| s.newest_restorable().is_some()),
            shards,
            problems,
        });
    }
    Ok(Json(PipelineVerify {
        name,
        savepoints,
        checksums,
        // No shard stored: nothing to restore from (a pipeline that never checkpointed).
        restorable: !shards.is_empty() && shards.iter().all(|s| s.newest_restorable().is_some()),
        shards,
    }))
}

/// The chunks of in-flight records a pipeline of stages' savepoint `saved` (at `at`) names
/// and does not hold, each a problem.
async fn lost_in_flight(
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
    at: &savepoint::SavepointDir,
    saved: &savepoint::SavepointDescriptor,
) -> Result<Vec<String>, ApiError> {
    let mut problems = Vec::new();
    for edge in &saved.edges {
        for part in &edge.partitions {
            for chunk in 0..part.chunks {
                let path = savepoint::in_flight::chunk_path(
                    &at.data,
                    (&edge.stage, &edge.output),
                    part.partition,
                    chunk,
                );
                match store.head(&path).await {
                    Ok(_) => {}
                    Err(object_store::Error::NotFound { .. }) => problems.push(format!(
                        "chunk {chunk} of the records in flight on partition {} of stage `{}`'s output `{}` is missing",
                        part.partition, edge.stage, edge.output
                    )),
                    Err(e) => return Err(unavailable(e)),
                }
            }
        }
    }
    Ok(problems)
}

/// One line of [`verify_text`]: version `c` of `shard`, of kind `kind`.
fn version_line(
    shard: &ShardCheck,
    c: &crate::checkpoints::verify::VersionCheck,
    kind: &str,
) -> String {
    let verdict = match (&c.problem, c.restorable) {
        (_, true) => "yes".to_owned(),
        (Some(problem), false) => format!("no: {problem}"),
        (None, false) => "-".to_owned(),
    };
    format!(
        "{:>9} {:>8} {:<10} {:<11} {:>7} {:>12}  {verdict}\n",
        label(shard),
        c.version,
        kind,
        c.decided_by.as_deref().unwrap_or("-"),
        c.objects,
        c.bytes,
    )
}

/// `weir pipeline verify`'s text: one line per stored version, then the verdict.
pub fn verify_text(v: &PipelineVerify) -> String {
    let mut out = format!(
        "{:>9} {:>8} {:<10} {:<11} {:>7} {:>12}  {}\n",
        "PARTITION", "VERSION", "KIND", "DECIDED BY", "OBJECTS", "BYTES", "RESTORABLE"
    );
    for shard in &v.shards {
        for c in &shard.versions {
            out.push_str(&version_line(shard, c, &c.kind));
        }
    }
    for saved in &v.savepoints {
        for shard in &saved.shards {
            for c in &shard.versions {
                out.push_str(&version_line(shard, c, &format!("sp:{}", saved.name)));
            }
        }
    }
    for saved in &v.savepoints {
        for problem in &saved.problems {
            out.push_str(&format!("sp:{}: {problem}\n", saved.name));
        }
    }
    let missing: Vec<String> = v
        .shards
        .iter()
        .filter(|s| s.newest_restorable().is_none())
        .map(|s| s.partition.to_string())
        .collect();
    let how = if v.checksums {
        "objects present, whole, checksums verified"
    } else {
        "objects present at their recorded sizes; checksums not read"
    };
    let broken: Vec<&str> = v
        .savepoints
        .iter()
        .filter(|s| !s.restorable)
        .map(|s| s.name.as_str())
        .collect();
    if !broken.is_empty() {
        out.push_str(&format!(
            "savepoints that cannot be restored: {}\n",
            broken.join(", ")
        ));
    }
    if v.shards.is_empty() {
        out.push_str("nothing is stored: no partition has checkpointed yet\n");
    } else if missing.is_empty() {
        out.push_str(&format!(
            "every partition has a restorable checkpoint ({how})\n"
        ));
    } else {
        out.push_str(&format!(
            "partitions without a restorable checkpoint: {} ({how})\n",
            missing.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoints::verify::VersionCheck;
    use crate::ids::ManifestVersion;

    fn version(version: u64, restorable: bool, problem: Option<&str>) -> VersionCheck {
        VersionCheck {
            version: ManifestVersion(version),
            kind: "checkpoint".into(),
            decided_by: Some("manifest".into()),
            offsets: Default::default(),
            objects: 2,
            bytes: 300,
            restorable,
            problem: problem.map(str::to_owned),
        }
    }

    #[test]
    fn the_text_shows_each_version_and_names_the_partitions_left_without_a_checkpoint() {
        let v = PipelineVerify {
            name: "p".into(),
            checksums: true,
            restorable: false,
            shards: vec![
                ShardCheck {
                    stage: None,
                    partition: crate::ids::Partition(0),
                    versions: vec![
                        version(7, false, Some("sst/x.sst is missing")),
                        version(6, true, None),
                    ],
                },
                ShardCheck {
                    stage: None,
                    partition: crate::ids::Partition(1),
                    versions: vec![version(3, false, Some("manifest is corrupt"))],
                },
            ],
            savepoints: vec![SavepointCheck {
                name: "before-v2".into(),
                restorable: false,
                shards: vec![ShardCheck {
                    stage: None,
                    partition: crate::ids::Partition(0),
                    versions: vec![version(5, false, Some("sst/y.sst is missing"))],
                }],
                problems: vec!["chunk 0 of the records in flight on partition 1 of stage `rekey`'s output `default` is missing".into()],
            }],
        };
        let text = verify_text(&v);
        assert!(text.contains("no: sst/x.sst is missing"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.contains(" 6 ") && l.ends_with("yes")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains("sp:before-v2") && l.ends_with("no: sst/y.sst is missing")),
            "{text}"
        );
        assert!(
            text.contains("savepoints that cannot be restored: before-v2\n"),
            "{text}"
        );
        assert!(
            text.contains("sp:before-v2: chunk 0 of the records in flight on partition 1 of stage `rekey`'s output `default` is missing\n"),
            "{text}"
        );
        assert!(
            text.ends_with("partitions without a restorable checkpoint: 1 (objects present, whole, checksums verified)\n"),
            "{text}"
        );
    }
}
