//! `PUT /v1/pipelines/{name}/operator`: a pipeline's (or one stage's) operator switched to
//! another version, checked first against the state the running version wrote and the outputs
//! the pipeline uses.

use super::{OperatorSwitch, PipelineSpec, PipelineView, check_operator_version, existing, view};
use crate::api::problem::{ApiError, Problem};
use crate::api::{ApiState, AuthProblems, Principal, read_json};
use crate::catalog::pipelines::StageSpec;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};

/// Switches a pipeline to another version of its operator, keeping its state: every host
/// drains its run and checkpoints, then resumes from that checkpoint with the new version.
#[utoipa::path(put, path = "/v1/pipelines/{name}/operator", tag = "pipelines",
    params(("name" = String, Path, description = "Pipeline name", pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")),
    request_body = OperatorSwitch,
    responses(
        (status = 200, description = "Switched; hosts restart it with the version", body = PipelineView),
        (status = 400, description = "No such operator version", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Changed concurrently, or the version's declared states cannot read the state (a kind changed, a schema version went down)", body = Problem, content_type = "application/problem+json"),
        AuthProblems,
    ),
    security(("bearer" = [])))]
pub(crate) async fn switch_operator(
    State(state): State<ApiState>,
    principal: Principal,
    UrlPath(name): UrlPath<String>,
    body: Body,
) -> Result<Json<PipelineView>, ApiError> {
    let tenant = principal.tenant()?;
    tracing::Span::current().record("pipeline", name.as_str());
    let current = existing(&state, tenant, &name).await?;
    let switch: OperatorSwitch = read_json(body).await?;
    let (operator, from) = switched(&current.spec, switch.stage.as_deref())?;
    check_operator_version(&state, tenant, &operator, switch.operator_version).await?;
    if let Some(stage) = &switch.stage {
        let declared = state
            .catalog
            .version(tenant, &operator, switch.operator_version)
            .await?
            .and_then(|v| v.outputs);
        let mut after = current.spec.clone();
        after
            .stages
            .iter_mut()
            .filter(|s| s.name == *stage)
            .for_each(|s| s.operator_version = switch.operator_version);
        let problems = after
            .undeclared_output_problems(|s| (s.name == *stage).then(|| declared.clone()).flatten());
        if !problems.is_empty() {
            return Err(ApiError::bad_request(problems.join("; ")));
        }
    }
    // Refused before anything stops: the running version keeps running.
    check_states_compatible(&state, tenant, &operator, (from, switch.operator_version)).await?;
    let record = state
        .catalog
        .update_pipeline(tenant, &name, |record| {
            let version = match &switch.stage {
                None => &mut record.spec.operator_version,
                Some(stage) => match record.spec.stages.iter_mut().find(|s| s.name == *stage) {
                    Some(s) => &mut s.operator_version,
                    None => return Err(ApiError::conflict(format!("stage `{stage}` is gone"))),
                },
            };
            if *version != switch.operator_version {
                *version = switch.operator_version;
                record.run_generation += 1;
            }
            Ok::<(), ApiError>(())
        })
        .await?;
    tracing::info!(%tenant, pipeline = %name, stage = ?switch.stage, version = switch.operator_version, "pipeline operator switched");
    Ok(Json(view(&state, tenant, record).await?))
}

/// The operator a switch of `spec` changes and the version it runs now: the pipeline's, or
/// `stage`'s (which a pipeline of stages must name, and a one-operator one must not).
/// Stage `stage` of `spec`, to change.
///
/// # Errors
/// 400 naming the stages there are, or saying the pipeline has none.
pub(super) fn stage_named<'a>(
    spec: &'a mut PipelineSpec,
    stage: &str,
) -> Result<&'a mut StageSpec, ApiError> {
    if !spec.is_staged() {
        return Err(ApiError::bad_request(
            "this pipeline has one operator and no stages: leave \"stage\" out",
        ));
    }
    let names: Vec<String> = spec.stages.iter().map(|s| s.name.clone()).collect();
    spec.stages
        .iter_mut()
        .find(|s| s.name == stage)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "the pipeline has no stage `{stage}`; its stages: {names:?}"
            ))
        })
}

fn switched(spec: &PipelineSpec, stage: Option<&str>) -> Result<(String, u64), ApiError> {
    match (stage, spec.is_staged()) {
        (None, false) => Ok((spec.operator.clone(), spec.operator_version)),
        (Some(stage), true) => spec
            .stages
            .iter()
            .find(|s| s.name == stage)
            .map(|s| (s.operator.clone(), s.operator_version))
            .ok_or_else(|| {
                let names: Vec<&str> = spec.stages.iter().map(|s| s.name.as_str()).collect();
                ApiError::bad_request(format!(
                    "the pipeline has no stage `{stage}`; its stages: {names:?}"
                ))
            }),
        (None, true) => Err(ApiError::bad_request(
            "this pipeline has stages: name the stage whose operator switches (\"stage\")",
        )),
        (Some(_), false) => Err(ApiError::bad_request(
            "this pipeline has one operator and no stages: leave \"stage\" out",
        )),
    }
}

/// Refuses a switch from version `from` of `operator` to version `to` whose declared states
/// cannot read the state the running version wrote ([`incompatible_states`]).
async fn check_states_compatible(
    state: &ApiState,
    tenant: &str,
    operator: &str,
    (from, to): (u64, u64),
) -> Result<(), ApiError> {
    let (Some(running), Some(next)) = (
        state.catalog.version(tenant, operator, from).await?,
        state.catalog.version(tenant, operator, to).await?,
    ) else {
        return Ok(()); // the running version was deleted: nothing to compare with
    };
    match crate::catalog::incompatible_states(&running.states, &next.states) {
        Some(why) => Err(ApiError::conflict(format!(
            "version {to} of operator `{operator}` cannot take over this pipeline's state from version {from}: {why}"
        ))),
        None => Ok(()),
    }
}
