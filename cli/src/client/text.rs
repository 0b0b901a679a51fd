//! The client's text: the tables and lines `weir operator|pipeline|tenant …` print.

use weir_host::api::pipelines::PipelineView;
use weir_host::catalog::logs::LogEntry;
use weir_host::catalog::{OperatorSummary, OperatorVersion, Tenant};
use weir_host::clock::Clock as _;

/// How the API spells `value` (an enum variant): `exactly_once`, `dead_letter`, ….
fn wire_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

/// `entry` as one line of text: time (UTC, ms), host and partition, level, message; for
/// example `2026-12-03T17:20:01.123Z host-a/2 INFO  counted 10 keys`. Control characters in
/// the message are escaped (`\n`, `\u{1b}`), so that an operator cannot print a line that
/// looks like another, or drive the terminal.
pub fn log_line(entry: &LogEntry<'_>) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(entry.time_ms);
    let partition = entry.partition.map(|p| format!("/{p}")).unwrap_or_default();
    // A stage's line: `host/stage/partition`.
    let stage = entry
        .stage
        .as_deref()
        .map(|s| format!("/{}", escape_controls(s)))
        .unwrap_or_default();
    format!(
        "{} {}{stage}{partition} {:<5} {}",
        humantime::format_rfc3339_millis(time),
        escape_controls(&entry.host),
        escape_controls(&entry.level).to_uppercase(),
        escape_controls(&entry.message)
    )
}

/// `text` with its control characters escaped as Rust escapes them.
fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// `pipelines` as a table: name, state, operator and version, records/s, lag, hosts.
pub fn pipelines_table(pipelines: &[PipelineView]) -> String {
    let mut out = format!(
        "{:<24} {:<9} {:<24} {:>10} {:>8} {:>5}\n",
        "NAME", "STATE", "OPERATOR", "RECORDS/S", "LAG", "HOSTS"
    );
    for p in pipelines {
        let lag: i64 = p.status.partitions.iter().map(|p| p.lag).sum();
        out.push_str(&format!(
            "{:<24} {:<9} {:<24} {:>10.0} {:>8} {:>5}\n",
            p.definition.name,
            wire_name(&p.status.state),
            if p.definition.spec.is_staged() {
                format!("{} stages", p.definition.spec.stages.len())
            } else {
                format!(
                    "{}:{}",
                    p.definition.spec.operator, p.definition.spec.operator_version
                )
            },
            p.status.records_per_s,
            lag,
            p.status.hosts.len()
        ));
    }
    out
}

/// `weir pipeline savepoint ls`'s table: one savepoint a line, oldest first, with its time
/// (UTC), operator, partitions, bytes and offsets.
pub fn savepoints_table(
    savepoints: &[weir_host::checkpoints::savepoint::SavepointDescriptor],
) -> String {
    let mut out = format!(
        "{:<24} {:<24} {:<20} {:>10} {:>12}  {}\n",
        "NAME",
        "TAKEN (UTC)",
        "OPERATOR",
        "PARTITIONS",
        "BYTES",
        "OFFSETS (partition:next), or IN FLIGHT for stages"
    );
    for sp in savepoints {
        let taken = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(sp.created_ms),
        );
        if !sp.stages.is_empty() {
            // A pipeline of stages: each stage's operator and partitions, and what was in
            // flight on its edges.
            let operators: Vec<String> = sp
                .stages
                .iter()
                .map(|s| format!("{}={}:{}", s.name, s.operator, s.operator_version))
                .collect();
            let partitions: usize = sp.stages.iter().map(|s| s.shards.len()).sum();
            let in_flight: u64 = sp
                .edges
                .iter()
                .flat_map(|e| &e.partitions)
                .map(|p| p.records)
                .sum();
            out.push_str(&format!(
                "{:<24} {:<24} {:<20} {:>10} {:>12}  {in_flight} records in flight on {} edges\n",
                sp.name,
                taken.to_string(),
                operators.join(","),
                partitions,
                sp.bytes,
                sp.edges.len()
            ));
            continue;
        }
        let offsets: Vec<String> = sp
            .shards
            .iter()
            .map(|s| {
                let next: Vec<String> = s.offsets.values().map(ToString::to_string).collect();
                if next.is_empty() {
                    format!("{}:-", s.partition)
                } else {
                    format!("{}:{}", s.partition, next.join("/"))
                }
            })
            .collect();
        out.push_str(&format!(
            "{:<24} {:<24} {:<20} {:>10} {:>12}  {}\n",
            sp.name,
            taken.to_string(),
            format!("{}:{}", sp.operator, sp.operator_version),
            sp.shards.len(),
            sp.bytes,
            offsets.join(" ")
        ));
    }
    out
}

/// One pipeline's status, for a person: state and reason, counters, last checkpoint, then
/// one line per partition.
pub fn pipeline_status_text(p: &PipelineView) -> String {
    let (d, s) = (&p.definition, &p.status);
    // The operator, or each stage's of a pipeline of stages (`stage=operator:version`).
    let operators = if d.spec.is_staged() {
        let stages: Vec<String> = d
            .spec
            .stages
            .iter()
            .map(|st| format!("{}={}:{}", st.name, st.operator, st.operator_version))
            .collect();
        format!("stages {}", stages.join(", "))
    } else {
        format!("{}:{}", d.spec.operator, d.spec.operator_version)
    };
    let mut out = format!(
        "pipeline   {} ({operators}, {} delivery, failure policy {})\n",
        d.name,
        wire_name(&d.spec.delivery),
        wire_name(&d.spec.failure_policy)
    );
    out.push_str(&format!(
        "state      {}{}\n",
        wire_name(&s.state),
        s.reason
            .as_deref()
            .map(|r| match s.reason_kind {
                Some(kind) => format!(" ({}): {r}", wire_name(&kind)),
                None => format!(": {r}"),
            })
            .unwrap_or_default()
    ));
    out.push_str(&format!(
        "records    {} done, {:.0}/s, {} emitted, {} dead-lettered, {} skipped\n",
        s.records_done, s.records_per_s, s.emitted, s.dead_lettered, s.skipped_failed
    ));
    out.push_str(&format!(
        "state      {} bytes on {}{}, cache hit rate {}\n",
        s.state_bytes,
        wire_name(&d.spec.state_backend),
        d.spec
            .state_bytes_max
            .map(|max| format!(" (quota {max} bytes)"))
            .unwrap_or_default(),
        s.cache_hit_rate
            .map_or("-".to_owned(), |r| format!("{:.1} %", r * 100.0))
    ));
    if let Some(c) = &s.last_checkpoint {
        let age_s = weir_host::clock::SystemClock
            .now_ms()
            .saturating_sub(c.committed_ms) as f64
            / 1000.0;
        out.push_str(&format!(
            "checkpoint {}partition {} version {}, {age_s:.1} s ago, took {} ms, uploaded {} bytes\n",
            c.stage
                .as_deref()
                .map(|s| format!("stage {s} "))
                .unwrap_or_default(),
            c.partition,
            c.version,
            c.duration_ms,
            c.uploaded_bytes
        ));
    }
    let hosts: Vec<String> = s
        .hosts
        .iter()
        .map(|h| {
            format!(
                "{} ({}, partitions {:?})",
                h.host,
                wire_name(&h.phase),
                h.partitions
            )
        })
        .collect();
    out.push_str(&format!("hosts      {}\n", hosts.join(", ")));
    // A pipeline of stages: a column naming each partition's stage.
    let staged = s.partitions.iter().any(|p| p.stage.is_some());
    let stage = |name: Option<&str>| {
        if staged {
            format!("{:<16} ", name.unwrap_or("-"))
        } else {
            String::new()
        }
    };
    out.push_str(&format!(
        "{}{:>9} {:>12} {:>12} {:>8} {:>12} {:>10}\n",
        stage(Some("STAGE")),
        "PARTITION",
        "CHECKPOINTED",
        "HIGH",
        "LAG",
        "STATE BYTES",
        "CHECKPOINT"
    ));
    for part in &s.partitions {
        let checkpointed: i64 = part.checkpointed_offsets.values().map(|o| o.0).sum();
        let high: i64 = part.high_watermarks.values().filter(|h| **h >= 0).sum();
        out.push_str(&format!(
            "{}{:>9} {:>12} {:>12} {:>8} {:>12} {:>10}\n",
            stage(part.stage.as_deref()),
            part.partition,
            checkpointed,
            high,
            part.lag,
            part.state_bytes,
            part.checkpoint_version
                .map_or("-".to_owned(), |v| v.to_string())
        ));
        if let Some(problem) = &part.problem {
            out.push_str(&format!(
                "{:>9} {}: {}\n",
                "",
                wire_name(&problem.state),
                problem.reason
            ));
        }
    }
    out
}

/// `tenants` as a table: id, created (RFC 3339, UTC), name.
pub fn tenants_table(tenants: &[Tenant]) -> String {
    let mut out = format!("{:<32} {:<20} {}\n", "ID", "CREATED", "NAME");
    for t in tenants {
        let created = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.created_ms),
        );
        out.push_str(&format!("{:<32} {:<20} {}\n", t.id, created, t.name));
    }
    out
}

/// `operators` as a table: name, versions.
pub fn operators_table(operators: &[OperatorSummary]) -> String {
    let mut out = format!("{:<32} {}\n", "NAME", "VERSIONS");
    for op in operators {
        let versions: Vec<String> = op.versions.iter().map(u64::to_string).collect();
        out.push_str(&format!("{:<32} {}\n", op.name, versions.join(",")));
    }
    out
}

/// `versions` as a table: version, size, SHA-256 prefix, declared name and version, states.
pub fn versions_table(versions: &[OperatorVersion]) -> String {
    let mut out = format!(
        "{:>7} {:>10} {:<14} {:<24} {}\n",
        "VERSION", "BYTES", "SHA256", "DECLARED", "STATES"
    );
    for v in versions {
        let states: Vec<String> = v
            .states
            .iter()
            .map(|s| format!("{}:{}", s.name, s.kind))
            .collect();
        out.push_str(&format!(
            "{:>7} {:>10} {:<14} {:<24} {}\n",
            v.version,
            v.size_bytes,
            &v.sha256[..12.min(v.sha256.len())],
            format!("{} {}", v.declared_name, v.declared_version),
            states.join(",")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_escapes_control_characters_so_it_cannot_forge_another() {
        let entry = LogEntry {
            time_ms: 1_764_782_401_123,
            host: "host-a".into(),
            stage: None,
            partition: Some(weir_host::ids::Partition(2)),
            level: "info".into(),
            message: "first\n2026-12-03T00:00:00.000Z host-a/0 ERROR forged \u{1b}[31m".into(),
        };
        assert_eq!(
            log_line(&entry),
            "2025-12-03T17:20:01.123Z host-a/2 INFO  first\\n2026-12-03T00:00:00.000Z host-a/0 ERROR forged \\u{1b}[31m"
        );
    }

    #[test]
    fn a_savepoint_of_a_pipeline_of_stages_lists_each_stages_operator_and_what_was_in_flight() {
        use weir_host::checkpoints::savepoint::*;
        let shard = |p: i32| SavepointShard {
            partition: weir_host::ids::Partition(p),
            version: weir_host::ids::ManifestVersion(3),
            offsets: Default::default(),
            objects: 1,
            bytes: 10,
        };
        let stage = |name: &str| SavepointStage {
            name: name.into(),
            operator: "counter".into(),
            operator_version: 2,
            input_topics: Vec::new(),
            shards: vec![shard(0), shard(1)],
        };
        let edge = |p: i32, records: u64| SavepointEdgePartition {
            partition: p,
            from: weir_host::ids::Offset(0),
            end: weir_host::ids::Offset(0),
            records,
            chunks: 1,
            bytes: 0,
            starts: Default::default(),
        };
        let sp = SavepointDescriptor {
            format: FORMAT_VERSION,
            name: "mid".into(),
            data: String::new(),
            pipeline: "graph".into(),
            pipeline_uid: "u".into(),
            state_backend: "memory".into(),
            input_topics: vec!["clicks".into()],
            operator: String::new(),
            operator_version: 0,
            created_ms: 0,
            shards: Vec::new(),
            bytes: 40,
            stages: vec![stage("rekey"), stage("count")],
            edges: vec![SavepointEdge {
                stage: "rekey".into(),
                output: "default".into(),
                topic: "graph.u.rekey.default.internal".into(),
                partitions: vec![edge(0, 5), edge(1, 7)],
            }],
        };
        let table = savepoints_table(&[sp]);
        let line = table.lines().nth(1).unwrap_or_default();
        assert!(line.starts_with("mid "), "{table}");
        assert!(line.contains("rekey=counter:2,count=counter:2"), "{table}");
        assert!(line.ends_with("12 records in flight on 1 edges"), "{table}");
    }
}
