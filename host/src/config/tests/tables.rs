//! Global table inputs of `weir run`'s stages.

use super::*;

/// Two stages, the first reading two global tables of one name, the second inputs that are
/// neither a table nor a global table.
const STAGED: &str = r#"
        [pipeline]
        name = "enrich"
        dead_letter_topic = "dlq"
        [[pipeline.stages]]
        name = "enrich"
        operator = "enrich.wasm"
        inputs = [{ topic = "flights" }, { topic = "planes", global_table = "planes" }, { topic = "weather", global_table = "planes" }]
        outputs = { default = { topic = "enriched" } }
        [[pipeline.stages]]
        name = "wrong"
        operator = "enrich.wasm"
        inputs = [{ stage = "enrich", global_table = "x" }, { topic = "p", table = "s", global_table = "y" }]
        outputs = { default = { topic = "out" } }
        [kafka]
        bootstrap_servers = "localhost:9092"
        [state]
        backend = "lsm"
        lsm.url = "file:///tmp/weir"
    "#;

/// STAGED with its `wrong` stage reading the first stage, and its global tables' names apart.
fn good() -> String {
    STAGED
        .replace(
            r#"inputs = [{ stage = "enrich", global_table = "x" }, { topic = "p", table = "s", global_table = "y" }]"#,
            r#"inputs = [{ stage = "enrich" }]"#,
        )
        .replace(
            r#"{ topic = "weather", global_table = "planes" }"#,
            r#"{ topic = "weather", global_table = "weather" }"#,
        )
}

/// The problems `config` has; panics when it is valid.
fn problems_of(config: &str) -> Vec<String> {
    let Err(ConfigError::Invalid { problems }) = Settings::from_toml(config) else {
        panic!("expected invalid settings");
    };
    problems
}

#[test]
fn a_global_table_input_names_one_topic_and_one_table_once() {
    let problems = problems_of(STAGED);
    for want in [
        "stage `wrong`: inputs[0] must be",
        "stage `wrong`: inputs[1] must be",
    ] {
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{want}: {problems:#?}"
        );
    }
    let good = good();
    let two_names = good.replace(
        r#"{ topic = "weather", global_table = "weather" }"#,
        r#"{ topic = "weather", global_table = "planes" }"#,
    );
    let twice = good.replace(
        r#"inputs = [{ topic = "flights" }"#,
        r#"inputs = [{ topic = "flights" }, { topic = "planes", global_table = "other" }"#,
    );
    let bad_topic = good.replace(r#"topic = "weather""#, r#"topic = "no weather!""#);
    for (config, want) in [
        (&two_names, "two topics are read as table `planes`"),
        (&twice, "reads topic `planes` as a global table again"),
        (
            &bad_topic,
            "pipeline.global_tables is not a valid Kafka topic name",
        ),
    ] {
        let problems = problems_of(config);
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{want}: {problems:#?}"
        );
    }
}

#[test]
fn a_global_table_input_is_read_outside_the_group() {
    let settings = Settings::from_toml(&good()).expect("valid");
    let plan = settings
        .stage_plan()
        .expect("stages")
        .expect("a valid graph");
    let enrich = &plan.runs[0].settings.pipeline;
    assert_eq!(
        enrich.input_topics,
        ["flights"],
        "not consumed by the group"
    );
    assert_eq!(
        enrich.global_tables,
        BTreeMap::from([
            ("planes".to_owned(), "planes".to_owned()),
            ("weather".to_owned(), "weather".to_owned())
        ])
    );
    assert!(enrich.tables.is_empty());
    assert!(plan.runs[1].settings.pipeline.global_tables.is_empty());
}

#[test]
fn the_flight_weather_config_reads_a_table_and_a_global_table_in_its_enrich_stage() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/flight-weather.toml");
    let settings = Settings::load(&path, &crate::config::env::EnvVars::default())
        .expect("deploy/config/flight-weather.toml is valid");
    let plan = settings
        .stage_plan()
        .expect("stages")
        .expect("a valid graph");
    let names: Vec<&str> = plan.runs.iter().map(|r| r.stage.as_str()).collect();
    assert_eq!(names, ["by-hour", "enrich", "stats"]);
    let enrich = &plan.runs[1].settings.pipeline;
    assert_eq!(
        enrich.input_topics,
        ["flight-weather.by-hour.default.internal", "weather"]
    );
    assert_eq!(
        enrich.tables,
        BTreeMap::from([("weather".to_owned(), "weather".to_owned())])
    );
    assert_eq!(
        enrich.global_tables,
        BTreeMap::from([("planes".to_owned(), "planes".to_owned())])
    );
}
