//! Tests of pipeline definitions and their merged status.

use super::*;
use crate::config::{Delivery, FailurePolicy, RuntimeSettings};
use crate::error::ErrorKind;
use crate::ids::Partition;
use crate::pipeline::PartitionProgress;

fn record(desired: DesiredState) -> PipelineRecord {
    PipelineRecord {
        name: "p".into(),
        uid: "u1".into(),
        spec: PipelineSpec {
            operator: "op".into(),
            operator_version: 1,
            input_topics: vec!["in".into()],
            parameters: Default::default(),
            stages: Vec::new(),
            output_topic: Some("out".into()),
            dead_letter_topic: "dlq".into(),
            checkpoint_interval_ms: 1000,
            in_flight_max: 16,
            limits: PipelineLimits::default(),
            failure_policy: FailurePolicy::DeadLetter,
            delivery: Delivery::AtLeastOnce,
            max_out_of_orderness_ms: 0,
            idle_timeout_ms: None,
            idle_advance: false,
            late_records: Default::default(),
            state_backend: PipelineStateBackend::Lsm,
            state_bytes_max: None,
            from_savepoint: None,
            iceberg: None,
        },
        desired,
        run_generation: 2,
        checkpoint_requests: 0,
        revision: 3,
        created_ms: 0,
        updated_ms: 0,
        deleted: false,
        resetting_since_ms: None,
        reset_failed: None,
        edge_generation: 0,
        edge_generations_made: 0,
    }
}

fn report(host: &str, phase: HostPhase, partitions: &[i32]) -> HostStatus {
    HostStatus {
        host: host.into(),
        uid: "u1".into(),
        run_generation: 2,
        phase,
        reason: (phase == HostPhase::Failed).then(|| "topic `in` does not exist".into()),
        reason_kind: (phase == HostPhase::Failed).then_some(ErrorKind::InvalidInput),
        updated_ms: 0,
        stale_after_ms: 15_000,
        restarts: 0,
        records_done: 10,
        records_per_s: 5.0,
        dead_lettered: 1,
        skipped_failed: 0,
        emitted: 9,
        checkpoints: 1,
        cache_hits: 3,
        cache_misses: 1,
        partitions: partitions
            .iter()
            .map(|&p| PartitionProgress {
                partition: Partition(p),
                state_bytes: 100,
                ..PartitionProgress::default()
            })
            .collect(),
        recent_checkpoints: Vec::new(),
    }
}

#[test]
fn status_merges_fresh_reports_and_ignores_stale_ones_and_other_uids() {
    let mut other_uid = report("c", HostPhase::Running, &[5]);
    other_uid.uid = "u0".into();
    let reports = vec![
        (report("a", HostPhase::Running, &[0, 1]), 1_000),
        (report("b", HostPhase::Running, &[2, 3]), 2_000),
        (report("gone", HostPhase::Failed, &[4]), 16_000),
        (other_uid, 0),
    ];
    let status = merge_status(&record(DesiredState::Running), &reports);
    assert_eq!(status.state, PipelineState::Running);
    assert_eq!(status.reason, None);
    let hosts: Vec<&str> = status.hosts.iter().map(|h| h.host.as_str()).collect();
    assert_eq!(hosts, ["a", "b"]);
    let partitions: Vec<i32> = status.partitions.iter().map(|p| p.partition.0).collect();
    assert_eq!(partitions, [0, 1, 2, 3]);
    assert_eq!(status.records_done, 20);
    assert_eq!(status.dead_lettered, 2);
    assert_eq!(status.state_bytes, 400);
    assert_eq!(status.records_per_s, 10.0);
    assert_eq!(status.cache_hit_rate, Some(0.75));
}

#[test]
fn a_failed_host_makes_the_pipeline_failed_with_its_reason() {
    let reports = vec![
        (report("a", HostPhase::Running, &[0]), 0),
        (report("b", HostPhase::Failed, &[]), 0),
    ];
    let status = merge_status(&record(DesiredState::Running), &reports);
    assert_eq!(status.state, PipelineState::Failed);
    assert_eq!(status.reason.as_deref(), Some("topic `in` does not exist"));
    assert_eq!(status.reason_kind, Some(ErrorKind::InvalidInput));
    let host = status.hosts.iter().find(|h| h.host == "b").expect("host b");
    assert_eq!(host.reason_kind, Some(ErrorKind::InvalidInput));
    let json = serde_json::to_value(&status).expect("serializes");
    assert_eq!(json["reason_kind"], "invalid_input");
}

#[test]
fn a_stopped_pipeline_is_stopping_while_a_host_still_runs_it() {
    let record = record(DesiredState::Stopped);
    let draining = vec![(report("a", HostPhase::Stopping, &[0]), 0)];
    assert_eq!(
        merge_status(&record, &draining).state,
        PipelineState::Stopping
    );
    let done = vec![(report("a", HostPhase::Stopped, &[]), 0)];
    assert_eq!(merge_status(&record, &done).state, PipelineState::Stopped);
    // A killed host's report goes stale: it does not hold the pipeline in `stopping`.
    let killed = vec![(report("a", HostPhase::Running, &[0]), 60_000)];
    assert_eq!(merge_status(&record, &killed).state, PipelineState::Stopped);
}

#[test]
fn a_running_pipeline_is_starting_until_a_host_runs_its_current_generation() {
    let mut old = report("a", HostPhase::Running, &[0]);
    old.run_generation = 1;
    let status = merge_status(&record(DesiredState::Running), &[(old, 0)]);
    assert_eq!(status.state, PipelineState::Starting);
    assert_eq!(
        merge_status(&record(DesiredState::Running), &[]).state,
        PipelineState::Starting
    );
}

#[test]
fn limits_above_the_hosts_are_refused_naming_the_limit() {
    let host = RuntimeSettings::default();
    let limits = PipelineLimits {
        record_deadline_ms: Some(host.record_deadline.as_millis() as u64 + 1),
        ..PipelineLimits::default()
    };
    let err = limits
        .apply(&host)
        .expect_err("above the host's deadline")
        .to_string();
    assert!(err.contains("limits.record_deadline_ms"), "{err}");
    let limits = PipelineLimits {
        instance_memory_bytes_max: Some(1 << 20),
        ..PipelineLimits::default()
    };
    assert_eq!(
        limits
            .apply(&host)
            .expect("within")
            .instance_memory_bytes_max,
        1 << 20
    );
}

#[test]
fn a_state_quota_is_for_memory_pipelines_within_the_services_cap_and_split_over_partitions() {
    let host = RuntimeSettings::default();
    let mut spec = record(DesiredState::Running).spec;
    spec.validate(&host, 1000).expect("lsm, no quota");
    assert_eq!(spec.shard_state_bytes_max(1000, 4), None, "lsm has none");
    spec.state_bytes_max = Some(100);
    let err = spec
        .validate(&host, 1000)
        .expect_err("lsm with a quota")
        .to_string();
    assert!(err.contains("state_backend = \"memory\""), "{err}");

    spec.state_backend = PipelineStateBackend::Memory;
    spec.validate(&host, 1000).expect("within the cap");
    assert_eq!(
        spec.shard_state_bytes_max(1000, 3),
        Some(34),
        "100 over 3, up"
    );
    for (asked, names) in [(0, "above 0"), (1001, "maximum of 1000")] {
        spec.state_bytes_max = Some(asked);
        let err = spec.validate(&host, 1000).expect_err("refused").to_string();
        assert!(err.contains(names), "{err}");
    }
    spec.state_bytes_max = None;
    assert_eq!(
        spec.shard_state_bytes_max(1000, 4),
        Some(250),
        "the service's cap by default"
    );
    spec.state_bytes_max = Some(1000);
    assert_eq!(
        spec.shard_state_bytes_max(400, 4),
        Some(100),
        "a cap lowered since the definition wins"
    );
    spec.state_bytes_max = None;
    // A stored definition from before the field is an `lsm` pipeline.
    let mut old = serde_json::to_value(&spec).expect("serializes");
    old.as_object_mut()
        .expect("an object")
        .remove("state_backend");
    let old: PipelineSpec = serde_json::from_value(old).expect("reads");
    assert_eq!(old.state_backend, PipelineStateBackend::Lsm);
}

#[test]
fn tenant_topics_cannot_name_another_tenants_topic() {
    assert_eq!(kafka_topic("acme", "orders"), "acme.orders");
    assert!(!valid_topic("../globex.orders"));
    assert!(!valid_topic("a/b"));
    assert!(!valid_topic(".."));
    assert!(valid_topic("globex.orders"), "stays under acme's prefix");
    // Another pipeline's internal topic, read as a topic of the tenant's.
    assert!(!valid_topic(
        "rekeyed.0123456789abcdef.rekey.default.internal"
    ));
    assert!(valid_topic("internal"));
    assert_eq!(kafka_topic("acme", "globex.orders"), "acme.globex.orders");
}

#[test]
fn a_spec_may_leave_the_output_topic_out_only_when_it_names_a_table() {
    let host = RuntimeSettings::default();
    let mut spec = record(DesiredState::Running).spec;
    spec.output_topic = None;
    let err = spec
        .validate(&host, 1000)
        .expect_err("no output at all")
        .to_string();
    assert!(err.contains("output_topic is required"), "{err}");
    spec.iceberg = Some(TableSpec {
        table: "counts".into(),
        columns: vec![crate::sink::iceberg::ColumnSpec {
            name: "count".into(),
            kind: crate::sink::iceberg::ColumnType::Long,
            required: true,
        }],
    });
    spec.validate(&host, 1000).expect("rows only, to the table");
    let json = serde_json::to_value(&spec).expect("a spec encodes");
    assert!(json.get("output_topic").is_none(), "{json}");
    let back: PipelineSpec = serde_json::from_value(json).expect("and decodes");
    assert_eq!(back, spec);
}

#[test]
fn a_spec_with_several_problems_names_each_of_them_at_once() {
    let host = RuntimeSettings::default();
    let mut spec = record(DesiredState::Running).spec;
    spec.input_topics = vec!["in".into(), "in".into()];
    spec.checkpoint_interval_ms = 10;
    spec.limits.record_deadline_ms = Some(0);
    let err = spec.validate(&host, 1000).expect_err("three problems");
    assert_eq!(
        err.problems,
        [
            "input topic `in` is listed twice",
            "checkpoint_interval_ms must be 100..=3600000. value=10",
            "limits.record_deadline_ms must be above 0",
        ],
    );
    assert_eq!(
        err.to_string(),
        "input topic `in` is listed twice; checkpoint_interval_ms must be 100..=3600000. value=10; limits.record_deadline_ms must be above 0"
    );
}
