use super::*;
use crate::catalog::pipelines::PipelineSpec;
use serde_json::json;

fn record(stages: serde_json::Value) -> PipelineRecord {
    let spec: PipelineSpec = serde_json::from_value(json!({
        "stages": stages,
        "dead_letter_topic": "dlq",
    }))
    .expect("a spec");
    PipelineRecord::new("graph".into(), "u1".into(), spec, 0)
}

fn two_stages(input: &str) -> serde_json::Value {
    json!([
        {"name": "rekey", "operator": "counter", "operator_version": 1,
         "inputs": [{"topic": input}]},
        {"name": "count", "operator": "counter", "operator_version": 1,
         "inputs": [{"stage": "rekey"}], "outputs": {"default": {"topic": "counts"}}},
    ])
}

fn saved(record: &PipelineRecord) -> SavepointDescriptor {
    let stage = |name: &str, topics: &[&str]| SavepointStage {
        name: name.into(),
        operator: "counter".into(),
        operator_version: 1,
        input_topics: topics.iter().map(|t| t.to_string()).collect(),
        shards: Vec::new(),
    };
    SavepointDescriptor {
        format: savepoint::FORMAT_VERSION,
        name: "sp".into(),
        data: String::new(),
        pipeline: record.name.clone(),
        pipeline_uid: record.uid.clone(),
        state_backend: "memory".into(),
        input_topics: vec!["clicks".into()],
        operator: String::new(),
        operator_version: 0,
        created_ms: 0,
        shards: Vec::new(),
        bytes: 0,
        stages: vec![stage("rekey", &["clicks"]), stage("count", &[])],
        edges: vec![SavepointEdge {
            stage: "rekey".into(),
            output: "default".into(),
            topic: "graph.u1.rekey.default.internal".into(),
            partitions: Vec::new(),
        }],
    }
}

#[test]
fn a_pipeline_of_stages_is_reset_only_to_a_savepoint_of_the_same_graph_over_the_same_topics() {
    let ours = record(two_stages("clicks"));
    let sp = saved(&ours);
    assert_eq!(incompatible(&ours, &sp), None);

    let one_operator = SavepointDescriptor {
        stages: Vec::new(),
        edges: Vec::new(),
        ..sp.clone()
    };
    let why = incompatible(&ours, &one_operator).expect("refused");
    assert!(why.contains("of a one-operator pipeline"), "{why}");

    let other_topics = record(two_stages("views"));
    let why = incompatible(&other_topics, &sp).expect("refused");
    assert!(
        why.contains(r#"stage `rekey` of savepoint `sp` read topics ["clicks"]"#),
        "{why}"
    );

    let mut renamed = two_stages("clicks");
    renamed[1]["name"] = json!("total");
    let why = incompatible(&record(renamed), &sp).expect("refused");
    assert!(why.contains(r#"holds stages ["rekey", "count"]"#), "{why}");

    // The count stage writes an edge of its own now, to a third stage.
    let mut longer = two_stages("clicks");
    longer[1]["outputs"] = json!({});
    longer.as_array_mut().expect("stages").push(json!(
        {"name": "sink", "operator": "counter", "operator_version": 1,
         "inputs": [{"stage": "count"}], "outputs": {"default": {"topic": "counts"}}}
    ));
    let mut sp3 = sp.clone();
    sp3.stages.push(SavepointStage {
        name: "sink".into(),
        ..sp.stages[1].clone()
    });
    let why = incompatible(&record(longer), &sp3).expect("refused");
    assert!(why.contains("holds edges"), "{why}");
}

#[test]
fn a_pipeline_whose_stages_link_through_a_topic_of_the_tenants_is_not_saved() {
    assert_eq!(link_through_a_topic(&record(two_stages("clicks"))), None);
    let mut linked = two_stages("clicks");
    linked[0]["outputs"] = json!({"default": {"topic": "rekeyed"}});
    let why = link_through_a_topic(&record(linked)).expect("refused");
    assert!(
        why.starts_with(
            "stage `count` reads stage `rekey`'s output `default` through topic `rekeyed` of yours"
        ),
        "{why}"
    );
}

#[test]
fn a_reset_counts_as_failed_until_its_last_update_says_it_succeeded() {
    let mut stopped = record(two_stages("clicks"));
    stopped.desired = crate::api::pipelines::DesiredState::Stopped;
    let mut stored = stopped.clone();
    super::super::mark_resetting(&mut stored, &stopped).expect("marked");
    // A host that dies now leaves the pipeline refusing starts, whenever the mark lapses.
    assert!(
        stored
            .reset_failed
            .as_deref()
            .is_some_and(|why| why.contains("did not finish")),
        "{:?}",
        stored.reset_failed
    );
    // A second reset, or a savepoint, meanwhile: refused.
    let again = super::super::mark_resetting(&mut stored.clone(), &stopped).expect_err("held");
    assert!(again.to_string().contains("already"), "{again}");
    assert!(super::super::hold(&mut stored, &stopped, "savepoint").is_err());
}
