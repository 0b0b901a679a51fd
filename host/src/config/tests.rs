//! The settings tree: parsing, defaults, validation, the shipped configs, the environment.
use super::*;

mod tables;

const GOOD: &str = r#"
    [pipeline]
    name = "flights"
    operator = "op.wasm"
    input_topics = ["flights"]
    output_topic = "route-stats"
    dead_letter_topic = "flights-dlq"

    [kafka]
    bootstrap_servers = "127.0.0.1:9092"

    [runtime]
    record_deadline = "250ms"
"#;

#[test]
fn valid_settings_parse_with_defaults() {
    let s = Settings::from_toml(GOOD).expect("valid settings");
    assert_eq!(s.pipeline.group_id(), "weir-flights");
    assert_eq!(s.runtime.record_deadline, Duration::from_millis(250));
    assert_eq!(s.runtime.batch_records_max, 512);
    assert_eq!(s.state.backend, StateBackendKind::Memory);
    assert_eq!(s.pipeline.in_flight_max, 4096);
    assert_eq!(s.runtime.partition_instances_max, 4);
}

#[test]
fn execution_limits_must_allow_one_record_and_one_instance() {
    let bad = GOOD
        .replace(
            r#"dead_letter_topic = "flights-dlq""#,
            "dead_letter_topic = \"flights-dlq\"\nin_flight_max = 0",
        )
        .replace(
            r#"record_deadline = "250ms""#,
            "partition_instances_max = 65",
        );
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("pipeline.in_flight_max"));
    assert!(problems[1].contains("runtime.partition_instances_max"));
}

#[test]
fn validation_reports_every_problem_at_once() {
    let bad = GOOD
        .replace(r#"name = "flights""#, r#"name = "bad name!""#)
        .replace(
            r#"output_topic = "route-stats""#,
            r#"output_topic = "flights""#,
        )
        .replace(r#"record_deadline = "250ms""#, "batch_records_max = 0");
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].contains("pipeline.name"));
    assert!(problems[1].contains("also an output"));
    assert!(problems[2].contains("batch_records_max"));
}

/// An output (the default one or a named one) to the dead-letter topic would mix results and
/// dead letters: refused, as is a named output called `default`.
#[test]
fn an_output_to_the_dead_letter_topic_is_refused() {
    assert!(GOOD.contains(r#"dead_letter_topic = "flights-dlq""#));
    let outputs = "[pipeline.outputs]\nlate = \"flights-dlq\"\ndefault = \"other\"\n";
    let bad = format!("{GOOD}\n{outputs}");
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("not `default`"), "{problems:?}");
    assert!(
        problems[1].starts_with("an output goes to the dead-letter topic"),
        "{problems:?}"
    );
}

#[test]
fn the_lsm_backend_needs_a_url_and_sane_sizes() {
    let bad = format!("{GOOD}\n[state]\nbackend = \"lsm\"\n[state.lsm]\nmemtable_bytes_max = 10\n");
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("state.lsm.url is required"));
    assert!(problems[1].contains("memtable_bytes_max"));
    let good = format!(
        "{GOOD}\n[state]\nbackend = \"lsm\"\n[state.lsm]\nurl = \"s3://bucket/weir\"\noptions = {{ aws_endpoint = \"http://127.0.0.1:9000\" }}\n"
    );
    let s = Settings::from_toml(&good).expect("valid");
    assert_eq!(s.state.backend, StateBackendKind::Lsm);
    assert_eq!(s.state.lsm.block_cache_bytes, 256 << 20);
}

#[test]
fn settings_that_would_break_checkpoints_are_refused() {
    let bad = GOOD
        .replace(
            r#"dead_letter_topic = "flights-dlq""#,
            "dead_letter_topic = \"flights-dlq\"\ndelivery = \"exactly_once\"\ncheckpoint_interval = \"10s\"",
        )
        .replace(
            r#"bootstrap_servers = "127.0.0.1:9092""#,
            "bootstrap_servers = \"127.0.0.1:9092\"\nconsumer = { \"enable.auto.commit\" = \"true\", \"isolation.level\" = \"read_uncommitted\" }\nproducer = { \"transaction.timeout.ms\" = \"15000\" }",
        );
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(problems[0].contains("needs checkpoints"), "{problems:?}");
    assert!(problems[1].contains("enable.auto.commit"));
    assert!(problems[2].contains("isolation.level"));
    assert!(problems[3].contains("transaction.timeout.ms"));
    let good = format!("{bad}\n[state.memory]\nurl = \"file:///tmp/weir\"\n")
        .replace(
            r#""enable.auto.commit" = "true", "isolation.level" = "read_uncommitted""#,
            "",
        )
        .replace(
            r#""transaction.timeout.ms" = "15000""#,
            r#""transaction.timeout.ms" = "20000""#,
        );
    Settings::from_toml(&good).expect("exactly-once on the memory backend with snapshots");
}

#[test]
fn unknown_fields_are_refused() {
    let bad = GOOD.replace("[runtime]", "[runtime]\nbatch_size = 3");
    assert!(matches!(
        Settings::from_toml(&bad),
        Err(ConfigError::Parse { .. })
    ));
}

#[test]
fn shipped_example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/flight-delays.toml");
    let s = Settings::load(&path, &EnvVars::default())
        .expect("deploy/config/flight-delays.toml is valid");
    assert_eq!(s.pipeline.input_topics, vec!["flights".to_owned()]);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/airport-hours.toml");
    let s = Settings::load(&path, &EnvVars::default())
        .expect("deploy/config/airport-hours.toml is valid");
    assert_eq!(s.pipeline.idle_timeout, Some(Duration::from_secs(5)));
    assert!(s.pipeline.idle_advance);
    assert_eq!(s.pipeline.late_records, LateRecords::Process);
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/flight-delays-iceberg.toml");
    let s = Settings::load(&path, &EnvVars::default())
        .expect("deploy/config/flight-delays-iceberg.toml is valid");
    assert_eq!(s.pipeline.output_topic, None, "rows only, to the table");
    assert_eq!(s.pipeline.iceberg.map(|t| t.columns.len()), Some(6));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/busiest-origin.toml");
    let s = Settings::load(&path, &EnvVars::default())
        .expect("deploy/config/busiest-origin.toml is valid");
    let plan = s.stage_plan().expect("stages").expect("a valid graph");
    let (departures, top) = (
        &plan.runs[0].settings.pipeline,
        &plan.runs[1].settings.pipeline,
    );
    assert_eq!(
        departures.outputs,
        BTreeMap::from([("late-departures".to_owned(), "late-departures".to_owned())])
    );
    assert_eq!(departures.parameters["late_after_minutes"], "60");
    assert_eq!(
        top.input_topics,
        ["busiest-origin.departures.default.internal"]
    );
    assert!(!top.idle_advance && departures.idle_advance);
}

#[test]
fn aws_variables_fill_in_what_the_file_leaves_out_for_s3_only() {
    let file: BTreeMap<String, String> = [("aws_endpoint", "http://file:9000")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let env = EnvVars::new([
        ("AWS_ACCESS_KEY_ID", "AKID"),
        ("AWS_SECRET_ACCESS_KEY", "secret"),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/weir"),
        // The same option as the file's aws_endpoint: the file wins.
        ("AWS_ENDPOINT_URL", "http://env:9000"),
        ("AWS_PROFILE", "not-an-object-store-option"),
        ("HOME", "/root"),
    ]);
    let options = store_options_with_env("s3://bucket/prefix", &file, &env);
    let expected: BTreeMap<String, String> = [
        ("aws_access_key_id", "AKID"),
        ("aws_endpoint", "http://file:9000"),
        ("aws_role_arn", "arn:aws:iam::1:role/weir"),
        ("aws_secret_access_key", "secret"),
        ("aws_web_identity_token_file", "/var/run/token"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(options, expected);
    assert_eq!(store_options_with_env("file:///tmp/x", &file, &env), file);
}

#[test]
fn a_pipeline_table_parses_and_needs_a_catalog_and_a_state_store() {
    let table = r#"
    [pipeline.iceberg]
    table = "route_stats"
    columns = [
      { name = "route", type = "string", required = true },
      { name = "flights", type = "long" },
    ]
"#;
    let with_table = GOOD.replace("[kafka]", &format!("{table}\n[kafka]"));
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&with_table) else {
        panic!("a table without a catalog or a state store is refused");
    };
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("iceberg.catalog_uri"), "{problems:?}");
    assert!(problems[1].contains("state.memory.url"), "{problems:?}");

    let complete = format!(
        "{with_table}\n[state]\nbackend = \"memory\"\nmemory.url = \"memory:///\"\n[iceberg]\ncatalog_uri = \"sqlite::memory:\"\nwarehouse = \"file:///tmp/lake\"\norphan_file_age = \"10m\"\n"
    );
    let s = Settings::from_toml(&complete).expect("valid settings");
    let t = s.pipeline.iceberg.as_ref().expect("a table");
    assert_eq!(
        (t.namespace.as_str(), t.table.as_str()),
        ("weir", "route_stats")
    );
    assert_eq!(t.columns.len(), 2);
    assert!(t.columns[0].required && !t.columns[1].required);
    assert_eq!(s.iceberg.orphan_file_age, Duration::from_secs(600));
    assert_eq!(s.iceberg.commit_interval, Duration::from_secs(60));

    let bad = complete
        .replace("route_stats", "Route-Stats")
        .replace("\"long\"", "\"long\", extra = 1")
        .replace("\"10m\"", "\"10ms\"");
    assert!(
        matches!(Settings::from_toml(&bad), Err(ConfigError::Parse { .. })),
        "an unknown column field is refused"
    );
    let bad = complete
        .replace("route_stats", "Route-Stats")
        .replace("\"10m\"", "\"10ms\"");
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("iceberg.orphan_file_age"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("pipeline.iceberg.table"),
        "{problems:?}"
    );
}

#[test]
fn the_output_topic_may_be_left_out_only_with_a_table() {
    let no_output = GOOD.replace("output_topic = \"route-stats\"\n", "");
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&no_output) else {
        panic!("a pipeline with no output is refused");
    };
    assert_eq!(
        problems,
        vec!["pipeline.output_topic is required unless pipeline.iceberg is set".to_owned()]
    );
    let table_only = no_output.replace(
        "[kafka]",
        "[pipeline.iceberg]\ntable = \"t\"\ncolumns = [{ name = \"n\", type = \"long\" }]\n[state]\nbackend = \"memory\"\nmemory.url = \"memory:///\"\n[iceberg]\ncatalog_uri = \"sqlite::memory:\"\nwarehouse = \"file:///tmp/lake\"\n[kafka]",
    );
    let s = Settings::from_toml(&table_only).expect("rows only, to the table");
    assert_eq!(s.pipeline.output_topic, None);
}

const STAGED: &str = r#"
    [pipeline]
    name = "rekeyed"
    dead_letter_topic = "dlq"
    max_out_of_orderness = "5s"

    [[pipeline.stages]]
    name = "count"
    operator = "count.wasm"
    inputs = [{ stage = "rekey" }]
    outputs = { default = { topic = "counts" } }
    max_out_of_orderness = "0s"

    [[pipeline.stages]]
    name = "rekey"
    operator = "rekey.wasm"
    inputs = [{ topic = "clicks" }]
    outputs = { default = { partitions = 8 } }

    [kafka]
    bootstrap_servers = "127.0.0.1:9092"

    [state]
    memory.url = "memory:///"
"#;

#[test]
fn a_pipeline_of_stages_runs_each_stage_after_what_it_reads_over_internal_topics() {
    let s = Settings::from_toml(STAGED).expect("valid settings");
    let plan = s.stage_plan().expect("stages").expect("a valid graph");
    assert_eq!(
        plan.internal,
        vec![stages::InternalTopic {
            name: "rekeyed.rekey.default.internal".into(),
            partitions: Some(8),
            like: "clicks".into(),
        }]
    );
    let runs: Vec<_> = plan
        .runs
        .iter()
        .map(|r| {
            let p = &r.settings.pipeline;
            (
                r.stage.as_str(),
                p.name.as_str(),
                p.group_id(),
                p.operator.to_str().expect("utf-8"),
                p.input_topics.clone(),
                p.output_topic.clone().expect("an output"),
                p.max_out_of_orderness,
            )
        })
        .collect();
    assert_eq!(
        runs,
        vec![
            (
                "rekey",
                "rekeyed@rekey",
                "weir-rekeyed@rekey".to_owned(),
                "rekey.wasm",
                vec!["clicks".to_owned()],
                "rekeyed.rekey.default.internal".to_owned(),
                Duration::from_secs(5),
            ),
            (
                "count",
                "rekeyed@count",
                "weir-rekeyed@count".to_owned(),
                "count.wasm",
                vec!["rekeyed.rekey.default.internal".to_owned()],
                "counts".to_owned(),
                Duration::ZERO,
            ),
        ]
    );
    assert!(
        plan.runs
            .iter()
            .all(|r| r.settings.pipeline.stages.is_empty()
                && r.settings.pipeline.dead_letter_topic == "dlq"),
        "each run is a one-operator run with the pipeline's dead-letter topic"
    );
}

/// A stage's run is named with an `@`, which no pipeline name holds: a one-operator pipeline
/// named `rekeyed.count` (valid) is not the `count` stage of `rekeyed`, and one named
/// `rekeyed@count` is refused.
#[test]
fn no_one_operator_pipeline_shares_a_stages_run_name() {
    let dotted =
        Settings::from_toml(&GOOD.replace("name = \"flights\"", "name = \"rekeyed.count\""))
            .expect("a dotted name is valid");
    assert_eq!(dotted.pipeline.name, "rekeyed.count");
    assert_ne!(
        dotted.pipeline.name,
        crate::config::stages::run_name("rekeyed", "count")
    );
    assert_ne!(
        dotted.pipeline.group_id(),
        crate::config::stages::run_name("weir-rekeyed", "count")
    );
    let at = Settings::from_toml(&GOOD.replace("name = \"flights\"", "name = \"rekeyed@count\""));
    assert!(
        at.is_err_and(|e| e.to_string().contains("pipeline.name must be")),
        "an `@` in a pipeline's name is refused"
    );
}

#[test]
fn a_one_operator_pipeline_has_no_stage_plan() {
    let s = Settings::from_toml(GOOD).expect("valid settings");
    assert!(s.stage_plan().is_none());
}

#[test]
fn a_pipeline_of_stages_names_every_problem_at_once() {
    let bad = STAGED
        .replace(
            r#"dead_letter_topic = "dlq""#,
            "dead_letter_topic = \"dlq\"\noperator = \"op.wasm\"\ninput_topics = [\"x\"]",
        )
        .replace(
            r#"inputs = [{ stage = "rekey" }]"#,
            r#"inputs = [{ stage = "rekey" }, { topic = "a", stage = "b" }, { topic = "dlq" }]"#,
        )
        .replace(
            r#"outputs = { default = { partitions = 8 } }"#,
            r#"outputs = { default = { partitions = 0 } }
    in_flight_max = 0"#,
        );
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    let want = [
        "pipeline.operator is for a one-operator pipeline",
        "pipeline.input_topics is for a one-operator pipeline",
        "stage `count`: inputs[1] must be { topic = \"…\" }, { stage = \"…\" }, a table",
        "stage `rekey`: outputs.default.partitions must be 1..=10000",
        "stage `rekey`: pipeline.in_flight_max must be 1..=1000000",
        "stage `count`: an input topic is also an output or the dead-letter topic",
    ];
    for (problem, want) in problems.iter().zip(want) {
        assert!(problem.starts_with(want), "{problem:?} should say {want:?}");
    }
    assert_eq!(problems.len(), want.len(), "{problems:#?}");
}

#[test]
fn a_cycle_of_stages_is_refused_with_its_stages_named() {
    let bad = STAGED.replace(
        r#"inputs = [{ topic = "clicks" }]"#,
        r#"inputs = [{ stage = "count" }]"#,
    );
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].starts_with("pipeline.stages: the stages form a cycle")
            && problems[0].contains(r#"["count", "rekey"]"#),
        "{problems:?}"
    );
}

#[test]
fn a_pipeline_of_stages_refuses_what_would_break_its_edges() {
    let bad = STAGED
        .replace(r#"memory.url = "memory:///""#, "")
        .replace(
            r#"outputs = { default = { partitions = 8 } }"#,
            r#"outputs = { default = { partitions = 8 }, late = { partitions = 2 } }"#,
        )
        .replace(
            r#"outputs = { default = { topic = "counts" } }"#,
            r#"outputs = { default = { topic = "rekeyed.x.default.internal" } }
    idle_timeout = "15s""#,
        )
        .replace(
            r#"max_out_of_orderness = "5s""#,
            "max_out_of_orderness = \"5s\"\ncheckpoint_interval = \"10s\"",
        );
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    let want = [
        "topic `rekeyed.x.default.internal` is named as the pipeline's internal topics are",
        "stage `rekey`: output `late` goes nowhere",
        "pipeline.stages needs checkpoints",
        "stage `count`: idle_timeout must be at least twice pipeline.checkpoint_interval",
    ];
    for (problem, want) in problems.iter().zip(want) {
        assert!(problem.starts_with(want), "{problem:?} should say {want:?}");
    }
    assert_eq!(problems.len(), want.len(), "{problems:#?}");
}

/// A table is an input read into a named state, with a stream input beside it; in stages it is
/// a topic input's `table`, which the plan turns into the stage run's `tables`.
#[test]
fn tables_are_inputs_into_named_states_beside_a_stream() {
    let bad = GOOD.replace(
        r#"dead_letter_topic = "flights-dlq""#,
        "dead_letter_topic = \"flights-dlq\"\ntables = { planes = \"plane\", flights = \"\" }",
    );
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(&bad) else {
        panic!("expected invalid settings");
    };
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].contains("the state of table `flights` must be 1..=64 bytes"));
    assert!(problems[1].contains("`planes` is not one of pipeline.input_topics"));
    assert!(problems[2].contains("a topic besides the tables"));
    let staged = r#"
        [pipeline]
        name = "enriched"
        dead_letter_topic = "dlq"
        [[pipeline.stages]]
        name = "enrich"
        operator = "enrich.wasm"
        inputs = [{ topic = "flights" }, { topic = "planes", table = "plane" }]
        outputs = { default = { topic = "enriched" } }
        [[pipeline.stages]]
        name = "wrong"
        operator = "enrich.wasm"
        inputs = [{ stage = "enrich", table = "plane" }]
        [kafka]
        bootstrap_servers = "localhost:9092"
        [state]
        backend = "lsm"
        lsm.url = "file:///tmp/weir"
    "#;
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(staged) else {
        panic!("expected invalid settings");
    };
    assert!(
        problems
            .iter()
            .any(|p| p.contains("stage `wrong`: inputs[0] must be")),
        "{problems:?}"
    );
    let good = staged.replace(
        r#"inputs = [{ stage = "enrich", table = "plane" }]"#,
        r#"inputs = [{ stage = "enrich" }]
        outputs = { default = { topic = "out" } }"#,
    );
    let settings = Settings::from_toml(&good).expect("valid");
    let plan = settings
        .stage_plan()
        .expect("stages")
        .expect("a valid graph");
    let enrich = &plan.runs[0].settings.pipeline;
    assert_eq!(enrich.input_topics, ["flights", "planes"]);
    assert_eq!(
        enrich.tables,
        BTreeMap::from([("planes".to_owned(), "plane".to_owned())])
    );
    assert!(plan.runs[1].settings.pipeline.tables.is_empty());
}
