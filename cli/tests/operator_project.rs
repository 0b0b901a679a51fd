//! An operator written outside this repository, as a new user writes one: `weir init` in a
//! temporary directory, the project's own unit test with the SDK's harness, `weir build`,
//! `weir operator push` to an API host, and a pipeline running it on the local broker — in
//! Rust and in Python (cli/src/project.rs).

use reqwest::Method;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;
use weir_tests::api::*;
use weir_tests::*;

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// Runs `command` to success, failing with its output.
async fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run {command:?}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "{command:?} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

/// A command in `dir` with none of the test command's clippy settings (the project is not
/// this workspace) and its own build directory under the suite's, kept between runs.
fn in_project(program: &str, dir: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .current_dir(dir)
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env("CARGO_TARGET_DIR", target_dir().join("weir-tests/projects"));
    command
}

/// Pushes `component` as operator `name` through `weir operator push`, runs it over counter
/// records on the local broker and checks its counts.
async fn push_and_run(name: &str, component: &Path) -> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let tenant = tenant_id("project");
    let key = tenant_with_key(addr, &tenant).await?;
    run(Command::new(WEIR)
        .args(["operator", "push", name])
        .arg(component)
        .env("WEIR_API", format!("http://{addr}"))
        .env("WEIR_API_KEY", &key))
    .await?;
    let topic = |t: &str| kafka_topic_of(&tenant, t);
    create_topics(&[(&topic("in"), 1), (&topic("out"), 1), (&topic("dlq"), 1)]).await?;
    create_pipeline(
        addr,
        &key,
        "counts",
        &json!({
            "operator": name, "operator_version": 1,
            "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
        }),
    )
    .await?;
    let mut expected = BTreeMap::new();
    produce_counter(&topic("in"), 1, (0, 60), 6, &mut expected).await?;
    let counts = read_counts(&topic("out"), &expected, Duration::from_secs(120)).await?;
    assert_counts_exact(&expected, &counts);
    let (status, _, view) =
        call(addr, Method::GET, "/v1/pipelines/counts", Some(&key), None).await?;
    assert!(status.is_success(), "{view}");
    Ok(())
}

/// `weir init NAME --lang LANG` in `dir`; returns the project's directory.
async fn init(dir: &Path, name: &str, lang: &str) -> anyhow::Result<PathBuf> {
    run(Command::new(WEIR)
        .args(["init", name, "--lang", lang, "--dir"])
        .arg(dir))
    .await?;
    let project = dir.join(name);
    // Nothing of this checkout: the SDK is vendored.
    assert!(project.join("vendor").is_dir());
    Ok(project)
}

/// `weir build` in `project`: the component's path, as printed.
async fn build(project: &Path) -> anyhow::Result<PathBuf> {
    let out = run(in_project(WEIR, project).arg("build")).await?;
    let component = PathBuf::from(out.trim());
    anyhow::ensure!(component.is_file(), "weir build printed {out}");
    Ok(component)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_operator_project_outside_the_checkout_tests_builds_pushes_and_runs()
-> anyhow::Result<()> {
    init_tracing();
    let outside = tempfile::tempdir()?;
    let project = init(outside.path(), "demo", "rust").await?;
    let test = run(in_project("cargo", &project).args(["test", "--quiet"])).await?;
    assert!(test.contains("1 passed"), "{test}");
    let component = build(&project).await?;
    assert!(component.ends_with("demo.wasm"), "{}", component.display());
    push_and_run("demo", &component).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_operator_project_outside_the_checkout_tests_builds_pushes_and_runs()
-> anyhow::Result<()> {
    init_tracing();
    let outside = tempfile::tempdir()?;
    let project = init(outside.path(), "demo-py", "python").await?;
    let test =
        run(in_project("python3", &project).args(["-m", "pytest", "-q", "-p", "no:cacheprovider"]))
            .await?;
    assert!(test.contains("1 passed"), "{test}");
    let component = build(&project).await?;
    assert!(
        component.ends_with("build/demo-py.wasm"),
        "{}",
        component.display()
    );
    push_and_run("demo-py", &component).await
}
