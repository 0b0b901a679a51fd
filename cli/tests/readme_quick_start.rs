//! The README's quick start (serve, tenant, push, pipeline, status), run top to bottom exactly
//! as written: the block between `<!-- quick start: begin -->` and `<!-- quick start: end -->`
//! goes to `bash -euo pipefail` unchanged, from the root of the repository, with this build's
//! `weir` first on the `PATH`. Only the catalog's store is the test's own
//! (`WEIR_STORE_URL`, a fresh directory), so that tenant `demo` is new.

use std::path::Path;
use std::time::Duration;
use weir_tests::*;

/// The quick start's commands.
fn quick_start() -> String {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let block = readme
        .split_once("<!-- quick start: begin -->\n```sh\n")
        .expect("README.md marks its quick start")
        .1;
    block
        .split_once("```\n<!-- quick start: end -->")
        .expect("the quick start's block ends")
        .0
        .to_owned()
}

/// Stops everything the script started (it leaves `weir serve` running in the background).
struct ProcessGroup(u32);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.0)])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_runs_top_to_bottom_as_written() -> anyhow::Result<()> {
    let commands = quick_start();
    assert!(commands.contains("weir serve") && commands.contains("weir pipeline create"));
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let bin_dir = bin.parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let store = tempfile::tempdir()?;
    // After the quick start: wait until the pipeline it created has processed flights.
    let check = r#"
for _ in $(seq 1 300); do
  status=$(weir pipeline status delays --json)
  if grep -Eq '"records_done": [1-9]' <<<"$status"; then exit 0; fi
  sleep 0.2
done
echo "the pipeline processed nothing in 60 s" >&2; weir pipeline status delays >&2; exit 1
"#;
    let script = format!("set -euo pipefail\n{commands}\n{check}");
    // Files, not pipes: `weir serve`, left running in the background, holds them open.
    let out_path = store.path().join("stdout");
    let err_path = store.path().join("stderr");
    let mut child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(workspace_root())
        .env("PATH", path)
        .env(
            "WEIR_STORE_URL",
            format!("file://{}", store.path().display()),
        )
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .kill_on_drop(true)
        .spawn()?;
    let _group = ProcessGroup(child.id().expect("a running child has a pid"));
    let status = tokio::time::timeout(Duration::from_secs(300), child.wait()).await;
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let status = status.map_err(|_| {
        anyhow::anyhow!("the quick start did not finish in 5 minutes:\n{stdout}\n{stderr}")
    })??;
    let serve_log = std::fs::read_to_string("/tmp/weir-serve.log").unwrap_or_default();
    assert!(
        status.success(),
        "the quick start failed ({status}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- weir serve\n{serve_log}"
    );
    assert!(stdout.contains("created tenant demo"), "{stdout}");
    assert!(
        stdout.contains("flights"),
        "the operator is listed: {stdout}"
    );
    Ok(())
}
