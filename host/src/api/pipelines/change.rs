//! `PATCH /v1/pipelines/{name}`'s change applied to a definition: to the pipeline, or with
//! `stage` to one stage of a pipeline of stages (its own overrides of the pipeline's settings,
//! as a Flink job's operators each keep their own settings).

use super::switch::stage_named;
use crate::api::problem::ApiError;
use crate::catalog::pipelines::{PipelineChange, PipelineSpec, PipelineStateBackend};

/// Sets the pipeline-wide settings `change` names in `spec`.
pub(super) fn apply(spec: &mut PipelineSpec, change: &PipelineChange) {
    if let Some(v) = change.checkpoint_interval_ms {
        spec.checkpoint_interval_ms = v;
    }
    if let Some(v) = change.in_flight_max {
        spec.in_flight_max = v;
    }
    if let Some(v) = &change.limits {
        spec.limits = v.clone();
    }
    if let Some(v) = change.failure_policy {
        spec.failure_policy = v;
    }
    if let Some(v) = change.max_out_of_orderness_ms {
        spec.max_out_of_orderness_ms = v;
    }
    if let Some(v) = change.idle_timeout_ms {
        spec.idle_timeout_ms = (v > 0).then_some(v);
    }
    if let Some(v) = change.idle_advance {
        spec.idle_advance = v;
    }
    if let Some(v) = change.late_records {
        spec.late_records = v;
    }
    if let Some(backend) = change.state_backend {
        if backend == PipelineStateBackend::Lsm && spec.state_backend != backend {
            // A quota is for state in a host's RAM.
            spec.state_bytes_max = None;
        }
        spec.state_backend = backend;
    }
    if let Some(v) = change.state_bytes_max {
        spec.state_bytes_max = Some(v);
    }
}

/// Sets the settings `change` names as stage `stage`'s own, over the pipeline's.
///
/// # Errors
/// 400 when the pipeline has no such stage (or no stages), or when `change` names a setting
/// only the whole pipeline has (checkpoint interval, backend, state quota).
pub(super) fn apply_to_stage(
    spec: &mut PipelineSpec,
    stage: &str,
    change: &PipelineChange,
) -> Result<(), ApiError> {
    let pipeline_wide = [
        (
            "checkpoint_interval_ms",
            change.checkpoint_interval_ms.is_some(),
        ),
        ("state_backend", change.state_backend.is_some()),
        ("state_bytes_max", change.state_bytes_max.is_some()),
    ];
    let named: Vec<&str> = pipeline_wide
        .iter()
        .filter(|(_, set)| *set)
        .map(|(field, _)| *field)
        .collect();
    if !named.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{} belong to the whole pipeline, not to a stage: change them without \"stage\"",
            named.join(", ")
        )));
    }
    let stage = stage_named(spec, stage)?;
    if let Some(v) = change.in_flight_max {
        stage.in_flight_max = Some(v);
    }
    if let Some(v) = &change.limits {
        stage.limits = Some(v.clone());
    }
    if let Some(v) = change.failure_policy {
        stage.failure_policy = Some(v);
    }
    if let Some(v) = change.max_out_of_orderness_ms {
        stage.max_out_of_orderness_ms = Some(v);
    }
    if let Some(v) = change.idle_timeout_ms {
        stage.idle_timeout_ms = Some(v);
    }
    if let Some(v) = change.idle_advance {
        stage.idle_advance = Some(v);
    }
    if let Some(v) = change.late_records {
        stage.late_records = Some(v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged() -> PipelineSpec {
        serde_json::from_value(serde_json::json!({
            "stages": [
                {"name": "rekey", "operator": "counter", "operator_version": 1,
                 "inputs": [{"topic": "clicks"}]},
                {"name": "count", "operator": "counter", "operator_version": 1,
                 "inputs": [{"stage": "rekey"}], "outputs": {"default": {"topic": "counts"}},
                 "in_flight_max": 1},
            ],
            "dead_letter_topic": "dlq",
        }))
        .expect("a spec")
    }

    fn change(json: serde_json::Value) -> PipelineChange {
        serde_json::from_value(json).expect("a change")
    }

    #[test]
    fn a_stage_change_sets_that_stages_own_settings_and_no_others() {
        let mut spec = staged();
        let before = spec.clone();
        apply_to_stage(
            &mut spec,
            "count",
            &change(serde_json::json!({"in_flight_max": 64, "idle_advance": true})),
        )
        .expect("applies");
        assert_eq!(spec.stages[1].in_flight_max, Some(64));
        assert_eq!(spec.stages[1].idle_advance, Some(true));
        assert_eq!(spec.stages[0], before.stages[0], "the other stage");
        assert_eq!(spec.in_flight_max, before.in_flight_max, "the pipeline's");
    }

    #[test]
    fn a_stage_change_names_a_missing_stage_a_pipeline_wide_field_or_a_pipeline_without_stages() {
        let mut spec = staged();
        let missing = apply_to_stage(&mut spec, "nope", &change(serde_json::json!({})))
            .expect_err("no such stage")
            .to_string();
        assert!(
            missing.contains("no stage `nope`") && missing.contains("count"),
            "{missing}"
        );
        let wide = change(serde_json::json!({"state_backend": "lsm", "checkpoint_interval_ms": 9}));
        let refused = apply_to_stage(&mut spec, "count", &wide)
            .expect_err("pipeline-wide")
            .to_string();
        assert!(
            refused.contains("checkpoint_interval_ms, state_backend belong to the whole pipeline"),
            "{refused}"
        );
        let mut single: PipelineSpec = serde_json::from_value(serde_json::json!({
            "operator": "counter", "operator_version": 1,
            "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
        }))
        .expect("a spec");
        let unstaged = apply_to_stage(&mut single, "count", &change(serde_json::json!({})))
            .expect_err("no stages")
            .to_string();
        assert!(unstaged.contains("no stages"), "{unstaged}");
    }
}
