//! Tests of a pipeline spec's stages.

use super::*;
use crate::config::RuntimeSettings;

fn two_stages() -> PipelineSpec {
    serde_json::from_value(serde_json::json!({
        "stages": [
            {"name": "rekey", "operator": "counter", "operator_version": 1,
             "inputs": [{"topic": "clicks"}], "parameters": {"rekey_modulo": "7"}},
            {"name": "count", "operator": "counter", "operator_version": 2,
             "inputs": [{"stage": "rekey"}], "outputs": {"default": {"topic": "counts"}}},
        ],
        "dead_letter_topic": "dlq",
    }))
    .expect("a spec of stages")
}

fn problems(spec: &PipelineSpec) -> Vec<String> {
    spec.validate(&RuntimeSettings::default(), 1 << 30)
        .err()
        .map(|e| e.problems)
        .unwrap_or_default()
}

#[test]
fn a_stored_one_operator_spec_reads_as_before_and_writes_back_unchanged() {
    let stored = serde_json::json!({
        "operator": "counter", "operator_version": 3, "input_topics": ["clicks"],
        "output_topic": "counts", "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 10000, "in_flight_max": 4096, "limits": {},
        "failure_policy": "dead_letter", "delivery": "at_least_once",
        "max_out_of_orderness_ms": 0, "idle_timeout_ms": null, "idle_advance": false,
        "late_records": "process", "state_backend": "lsm",
    });
    let spec: PipelineSpec = serde_json::from_value(stored.clone()).expect("reads");
    assert!(!spec.is_staged());
    assert_eq!(spec.operator_versions(), vec![("counter", 3)]);
    assert_eq!(serde_json::to_value(&spec).expect("writes"), stored);
    assert_eq!(problems(&spec), Vec::<String>::new());
}

#[test]
fn a_spec_of_stages_is_valid_and_runs_each_stages_operator() {
    let spec = two_stages();
    assert_eq!(problems(&spec), Vec::<String>::new());
    assert_eq!(
        spec.operator_versions(),
        vec![("counter", 1), ("counter", 2)]
    );
    let json = serde_json::to_value(&spec).expect("writes");
    assert!(json.get("operator").is_none() && json.get("input_topics").is_none());
    assert_eq!(
        serde_json::from_value::<PipelineSpec>(json).expect("reads back"),
        spec
    );
}

#[test]
fn an_empty_list_of_stages_is_refused_not_read_as_one_operator() {
    let empty = serde_json::json!({"stages": [], "dead_letter_topic": "dlq"});
    let err = serde_json::from_value::<PipelineSpec>(empty).expect_err("refused");
    assert!(
        err.to_string().contains("stages must list 1..=32 stages"),
        "{err}"
    );
}

#[test]
fn a_spec_of_stages_names_every_problem_at_once() {
    let mut spec = two_stages();
    spec.operator = "counter".into();
    spec.input_topics = vec!["clicks".into()];
    spec.idle_timeout_ms = Some(100);
    spec.checkpoint_interval_ms = 1000;
    spec.stages[0].operator_version = 0;
    spec.stages[0].inputs.push(StageInput {
        stage: Some("count".into()),
        ..StageInput::default()
    });
    spec.stages[1].outputs.insert(
        "late".into(),
        StageOutput {
            partitions: Some(0),
            ..StageOutput::default()
        },
    );
    let found = problems(&spec);
    for expected in [
        "operator is for a one-operator pipeline",
        "input_topics is for a one-operator pipeline",
        "stage `rekey`: operator must name one of your operators",
        "stage `count`: outputs.late.partitions must be 1..=10000",
        "stage `count`: output `late` goes nowhere",
        "stage `count`: idle_timeout_ms must be at least twice checkpoint_interval_ms",
        "stages: the stages form a cycle",
    ] {
        assert!(
            found.iter().any(|p| p.starts_with(expected)),
            "`{expected}` in {found:#?}"
        );
    }
    assert_eq!(found.len(), 8, "{found:#?}");
}

#[test]
fn a_stages_own_limits_replace_the_pipelines_and_stay_within_the_hosts() {
    let host = RuntimeSettings::default();
    let mut spec = two_stages();
    spec.limits.record_deadline_ms = Some(40);
    spec.stages[1].limits = Some(PipelineLimits {
        record_deadline_ms: Some(20),
        ..PipelineLimits::default()
    });
    let deadline = |stage: &str| {
        spec.stage_runtime(stage, &host)
            .expect("within the host's")
            .record_deadline
    };
    assert_eq!(
        deadline("rekey"),
        Duration::from_millis(40),
        "the pipeline's"
    );
    assert_eq!(deadline("count"), Duration::from_millis(20), "its own");
    assert_eq!(
        spec.stage_runtime("count", &host)
            .expect("within")
            .instance_memory_bytes_max,
        host.instance_memory_bytes_max,
        "a field it leaves out is the host's"
    );
    spec.stages[1].limits = Some(PipelineLimits {
        record_deadline_ms: Some(u64::MAX),
        ..PipelineLimits::default()
    });
    let found = problems(&spec);
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("stage `count`: limits.record_deadline_ms")),
        "{found:#?}"
    );
}

#[test]
fn internal_topics_are_the_tenants_and_named_after_the_pipelines_uid() {
    let spec = two_stages();
    let run = staged_run_name("acme", "rekeyed", "0123456789abcdef");
    assert_eq!(run, "acme.rekeyed.0123456789abcdef");
    assert_eq!(
        spec.internal_topics(&run, 0),
        vec!["acme.rekeyed.0123456789abcdef.rekey.default.internal"]
    );
    // A reset to a savepoint starts the next generation of them.
    assert_eq!(
        spec.internal_topics(&run, 2),
        vec!["acme.rekeyed.0123456789abcdef.rekey.default.g2.internal"]
    );
    // 32 + 64 + 16 bytes of run name, 64 of stage, 64 of output: 253 bytes in all.
    let mut long = spec.clone();
    long.stages[0].name = "r".repeat(64);
    long.stages[0].outputs.insert(
        DEFAULT_OUTPUT.into(),
        StageOutput {
            topic: Some("other".into()),
            ..StageOutput::default()
        },
    );
    long.stages[1].inputs[0] = StageInput {
        stage: Some("r".repeat(64)),
        output: Some("o".repeat(64)),
        ..StageInput::default()
    };
    let run = staged_run_name(&"t".repeat(32), &"p".repeat(64), "0123456789abcdef");
    assert_eq!(long.internal_topic_length_problems(&run, 0).len(), 1);
    assert!(spec.internal_topic_length_problems(&run, 0).is_empty());
}

#[test]
fn a_hosts_stage_settings_name_the_tenants_topics() {
    let spec = two_stages();
    let stages = spec.stage_settings("acme", &[PathBuf::from("a.wasm"), PathBuf::from("b.wasm")]);
    assert_eq!(stages[0].inputs[0].topic.as_deref(), Some("acme.clicks"));
    assert_eq!(stages[0].parameters["rekey_modulo"], "7");
    assert_eq!(stages[1].inputs[0].stage.as_deref(), Some("rekey"));
    assert_eq!(
        stages[1].outputs["default"].topic.as_deref(),
        Some("acme.counts")
    );
    assert_eq!(stages[1].operator, PathBuf::from("b.wasm"));
}

#[test]
fn an_output_a_stage_uses_must_be_one_its_operator_version_declares_when_that_is_known() {
    let mut spec = two_stages();
    // `rekey` binds `late` to a topic; `count` reads `rekey`'s `audit` output.
    spec.stages[0].outputs.insert(
        "late".into(),
        StageOutput {
            topic: Some("late-clicks".into()),
            partitions: None,
        },
    );
    spec.stages[1].inputs.push(StageInput {
        topic: None,
        stage: Some("rekey".into()),
        output: Some("audit".into()),
        ..Default::default()
    });
    assert_eq!(spec.used_outputs("rekey"), ["audit", "late"]);
    assert!(spec.used_outputs("count").is_empty());
    // Unknown declarations (a version uploaded before they were kept): nothing to say.
    assert!(spec.undeclared_output_problems(|_| None).is_empty());
    let problems =
        spec.undeclared_output_problems(|s| (s.name == "rekey").then(|| vec!["late".to_owned()]));
    assert_eq!(
        problems,
        [
            r#"stage `rekey` uses output `audit`, which version 1 of operator `counter` does not declare (it declares ["late"] besides `default`)"#
        ]
    );
}

#[test]
fn a_stages_table_names_are_distinct_and_within_bounds() {
    let mut spec = two_stages();
    let table = |topic: &str, table: Option<&str>, global: Option<&str>| StageInput {
        topic: Some(topic.into()),
        table: table.map(Into::into),
        global_table: global.map(Into::into),
        ..StageInput::default()
    };
    spec.stages[0].inputs.extend([
        table("planes", None, Some("planes")),
        table("fleet", Some("planes"), None),
        table("timers", None, Some("!timers")),
        table("long", None, Some(&"t".repeat(65))),
    ]);
    let found = problems(&spec);
    for expected in [
        "stage `rekey`: two inputs are read as table `planes`",
        "stage `rekey`: table `!timers`: a table's name is 1..=64 bytes",
        "stage `rekey`: table `ttttt",
    ] {
        assert!(
            found.iter().any(|p| p.starts_with(expected)),
            "`{expected}` in {found:#?}"
        );
    }
    assert_eq!(found.len(), 3, "{found:#?}");
    spec.stages[0].inputs.truncate(2);
    assert_eq!(problems(&spec), Vec::<String>::new(), "one global table");
}
