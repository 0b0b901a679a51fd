//! `weir run` configured only through the environment (docs/configuration.md): an empty config
//! file, every setting a `WEIR_…` variable and the S3 credentials the standard `AWS_…` ones. The
//! state lives on an S3 server that accepts one key pair only (deploy/local/s3_server.py
//! `--access-key/--secret-key`), so the pipeline's counts prove the credentials from the
//! environment reached every request; a wrong secret stops `weir run` at start, with S3's
//! answer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use weir_tests::process::WeirProcess;
use weir_tests::*;

const ACCESS_KEY: &str = "AKIDWEIRENVTEST";
const SECRET_KEY: &str = "weir-env-secret";
const BUCKET: &str = "weir-env";

/// The S3 server of deploy/local/s3.sh (its virtualenv) on its own port, accepting only
/// [`ACCESS_KEY`] and [`SECRET_KEY`], with [`BUCKET`] created; killed when dropped.
struct OneKeyS3 {
    child: tokio::process::Child,
    endpoint: String,
}

impl OneKeyS3 {
    async fn start() -> anyhow::Result<Self> {
        let services = std::env::var("WEIR_SERVICES_DIR").map_or_else(
            |_| {
                PathBuf::from(std::env::var("HOME").unwrap_or_default())
                    .join(".cache/weir/services")
            },
            PathBuf::from,
        );
        let python = services.join("s3/venv/bin/python");
        anyhow::ensure!(
            python.exists(),
            "{} is missing: run deploy/local/s3.sh start",
            python.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = tokio::process::Command::new(python)
            .arg(workspace_root().join("deploy/local/s3_server.py"))
            .args(["-p", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .args(["--create-bucket", BUCKET])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        // Up once it answers (an unsigned request: 403).
        let address = format!("127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&address).await.is_err() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the one-key S3 server did not start on {address}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self {
            child,
            endpoint: format!("http://{address}"),
        })
    }
}

impl Drop for OneKeyS3 {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Every setting of a counter pipeline as an environment variable, with the given secret.
fn environment(
    s3: &OneKeyS3,
    (input, output, dlq): (&str, &str, &str),
    secret: &str,
) -> Vec<(String, String)> {
    let name = unique("env");
    [
        ("WEIR_PIPELINE__NAME", name.clone()),
        (
            "WEIR_PIPELINE__OPERATOR",
            guest("weir_test_counter").display().to_string(),
        ),
        ("WEIR_PIPELINE__INPUT_TOPICS", format!("[{input}]")),
        ("WEIR_PIPELINE__OUTPUT_TOPIC", output.to_owned()),
        ("WEIR_PIPELINE__DEAD_LETTER_TOPIC", dlq.to_owned()),
        ("WEIR_PIPELINE__CHECKPOINT_INTERVAL", "300ms".to_owned()),
        ("WEIR_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap()),
        (
            "WEIR_RUNTIME__COMPILED_DIR",
            compiled_dir().display().to_string(),
        ),
        ("WEIR_STATE__BACKEND", "lsm".to_owned()),
        ("WEIR_STATE__LSM__URL", format!("s3://{BUCKET}/{name}")),
        ("WEIR_STATE__LSM__MEMTABLE_BYTES_MAX", "16384".to_owned()),
        ("WEIR_STATE__LSM__DISK_CACHE_BYTES", "16777216".to_owned()),
        ("AWS_ENDPOINT_URL", s3.endpoint.clone()),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", secret.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_and_s3_credentials_from_the_environment_alone_run_a_pipeline()
-> anyhow::Result<()> {
    init_tracing();
    let s3 = OneKeyS3::start().await?;
    let (input, output, dlq) = (unique("env-in"), unique("env-out"), unique("env-dlq"));
    create_topics(&[(&input, 2), (&output, 2), (&dlq, 1)]).await?;
    let mut expected = BTreeMap::new();
    produce_counter(&input, 2, (0, 400), 20, &mut expected).await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("empty.toml");
    std::fs::write(&config, "# every setting comes from the environment\n")?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));

    let mut vars = environment(&s3, (&input, &output, &dlq), SECRET_KEY);
    // Checkpoints are logged at debug.
    vars.push((
        "RUST_LOG".to_owned(),
        "info,rdkafka=warn,weir_host::pipeline=debug".to_owned(),
    ));
    let env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut weir = WeirProcess::spawn(bin, &config, dir.path().join("weir.log"), &env)?;
    let counts = read_counts(&output, &expected, Duration::from_secs(120)).await;
    // State reached the one-key store: a checkpoint was committed there.
    let committed = weir
        .wait_for_log("checkpoint committed", 1, Duration::from_secs(60))
        .await;
    weir.kill().await?;
    let counts = counts.map_err(|e| anyhow::anyhow!("{e}\n{}", weir.tail()))?;
    assert_counts_exact(&expected, &counts);
    committed.map_err(|e| anyhow::anyhow!("{e}\n{}", weir.tail()))?;

    // The same settings with a wrong secret: `weir run` stops at start, with S3's answer.
    let vars = environment(&s3, (&input, &output, &dlq), "not-the-secret");
    let env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut wrong = WeirProcess::spawn(bin, &config, dir.path().join("wrong.log"), &env)?;
    let status = wrong
        .wait(Duration::from_secs(60))
        .await?
        .ok_or_else(|| anyhow::anyhow!("weir run kept running: {}", wrong.tail()))?;
    assert!(!status.success(), "{}", wrong.tail());
    let log = wrong.log_text();
    assert!(
        log.contains(&format!("cannot read the state store s3://{BUCKET}/"))
            && log.contains("SignatureDoesNotMatch"),
        "the error names the store and S3's reason: {log}"
    );
    Ok(())
}
