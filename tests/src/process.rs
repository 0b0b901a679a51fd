//! Running the `weir` binary as a separate process, as an operator would: a TOML config for a
//! `counter` pipeline with `lsm` state on the S3 server, signals (SIGKILL, SIGSTOP, SIGCONT,
//! SIGINT) and its log. The binary's path comes from the caller (`env!("CARGO_BIN_EXE_weir")`
//! in the host package's tests, the only ones cargo builds it for).

use crate::{create_s3_bucket, guest, kafka_bootstrap, s3_options, unique};
use anyhow::{Context as _, bail};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// A pipeline's topics and settings (the `counter` test guest's, unless changed), written as a
/// `weir run` config.
#[derive(Debug, Clone)]
pub struct CounterConfig {
    /// Pipeline name (names the state prefix).
    pub name: String,
    /// Input topic.
    pub input: String,
    /// Output topic; none for a pipeline that writes only to an Iceberg table.
    pub output: Option<String>,
    /// Dead-letter topic.
    pub dlq: String,
    /// Consumer group.
    pub group: String,
    /// `pipeline.checkpoint_interval`, humantime (e.g. `"300ms"`).
    pub checkpoint_interval: String,
    /// `group.instance.id` (static membership), if any.
    pub instance_id: Option<String>,
    /// `session.timeout.ms`.
    pub session_timeout_ms: u32,
    /// The `s3://` URL of the state.
    pub state_url: String,
    /// `pipeline.delivery = "exactly_once"` (else at-least-once).
    pub exactly_once: bool,
    /// The component (the `counter` test guest unless changed).
    pub operator: PathBuf,
    /// More `[pipeline]` settings, as TOML lines (e.g. `idle_advance = true`).
    pub pipeline_extra: String,
    /// `[kafka.producer]` settings, as TOML lines (e.g. `"transaction.timeout.ms" = "3000"`).
    pub producer_extra: String,
    /// `[[pipeline.stages]]` tables, as TOML (docs/topologies.md): when set, the pipeline is one
    /// of stages, and `operator`, `input` and `output` are not written.
    pub stages: String,
}

impl CounterConfig {
    /// A config over the given topics with state on a new bucket: checkpoints every 300 ms,
    /// 6 s session timeout (the broker's minimum), no static membership.
    ///
    /// # Errors
    /// When the bucket cannot be created.
    pub async fn new(input: &str, output: &str, dlq: &str) -> anyhow::Result<Self> {
        let bucket = create_s3_bucket().await?;
        Ok(Self {
            name: unique("counter"),
            input: input.to_owned(),
            output: Some(output.to_owned()),
            dlq: dlq.to_owned(),
            group: unique("counter-group"),
            checkpoint_interval: "300ms".to_owned(),
            instance_id: None,
            session_timeout_ms: 6000,
            state_url: format!("s3://{bucket}/weir"),
            exactly_once: false,
            operator: guest("weir_test_counter"),
            pipeline_extra: String::new(),
            producer_extra: String::new(),
            stages: String::new(),
        })
    }

    /// Writes the config to `path`: the component (compiled once for every test, in
    /// [`crate::compiled_dir`]), `lsm` state with a 16 KiB memtable (so checkpoints upload SSTs)
    /// and small caches.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let options: String = s3_options()
            .iter()
            .map(|(k, v)| format!("{k} = \"{v}\"\n"))
            .collect();
        let instance = self
            .instance_id
            .as_ref()
            .map(|id| format!("\"group.instance.id\" = \"{id}\"\n"))
            .unwrap_or_default();
        let one_operator = if self.stages.is_empty() {
            format!(
                "operator = \"{}\"\ninput_topics = [\"{}\"]\n{}",
                self.operator.display(),
                self.input,
                self.output
                    .as_ref()
                    .map(|t| format!("output_topic = \"{t}\"\n"))
                    .unwrap_or_default()
            )
        } else {
            String::new()
        };
        let config = format!(
            r#"[pipeline]
name = "{name}"
{one_operator}dead_letter_topic = "{dlq}"
group_id = "{group}"
checkpoint_interval = "{interval}"
delivery = "{delivery}"
{extra}
{stages}
[kafka]
bootstrap_servers = "{bootstrap}"
[kafka.consumer]
"session.timeout.ms" = "{session}"
{instance}
[kafka.producer]
{producer}
[runtime]
compiled_dir = "{compiled}"
[state]
backend = "lsm"
[state.lsm]
url = "{url}"
memtable_bytes_max = 16384
block_size_bytes = 4096
block_cache_bytes = 8388608
disk_cache_bytes = 16777216
[state.lsm.options]
{options}"#,
            name = self.name,
            extra = self.pipeline_extra,
            stages = self.stages,
            producer = self.producer_extra,
            dlq = self.dlq,
            group = self.group,
            interval = self.checkpoint_interval,
            bootstrap = kafka_bootstrap(),
            session = self.session_timeout_ms,
            url = self.state_url,
            compiled = crate::compiled_dir().display(),
            delivery = if self.exactly_once {
                "exactly_once"
            } else {
                "at_least_once"
            },
        );
        std::fs::write(path, config).with_context(|| format!("writing {}", path.display()))
    }
}

/// A running `weir run` process; killed when dropped.
#[derive(Debug)]
pub struct WeirProcess {
    child: Child,
    pid: u32,
    /// Its stderr (the log).
    pub log: PathBuf,
}

impl WeirProcess {
    /// Starts `bin run --config config` with stderr to `log` and `env` added (RUST_LOG is
    /// `info,rdkafka=warn` unless `env` sets it; FAILPOINTS only if `env` sets it).
    ///
    /// # Errors
    /// When the process cannot start.
    pub fn spawn(
        bin: &Path,
        config: &Path,
        log: PathBuf,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::spawn_command(bin, "run", config, log, env)
    }

    /// Starts `bin {subcommand} --config config` (e.g. `serve`), as [`WeirProcess::spawn`].
    ///
    /// # Errors
    /// When the process cannot start.
    pub fn spawn_command(
        bin: &Path,
        subcommand: &str,
        config: &Path,
        log: PathBuf,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut command = Command::new(bin);
        command
            .arg(subcommand)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info,rdkafka=warn")
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn()?;
        let pid = child.id().context("a just-spawned child has a pid")?;
        Ok(Self { child, pid, log })
    }

    /// Sends `signal` (a `kill -s` name: `STOP`, `CONT`, `INT`, …).
    ///
    /// # Errors
    /// When `kill` fails.
    pub async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid.to_string()])
            .status()
            .await?;
        if !status.success() {
            bail!("kill -s {signal} {} failed: {status}", self.pid);
        }
        Ok(())
    }

    /// Kills the process with SIGKILL and reaps it.
    ///
    /// # Errors
    /// When it cannot be killed.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// Whether it has exited (and how), without waiting.
    ///
    /// # Errors
    /// When its status cannot be read.
    pub fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits up to `timeout` for it to exit; `None` when it is still running.
    ///
    /// # Errors
    /// When its status cannot be read.
    pub async fn wait(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => Ok(Some(status?)),
            Err(_) => Ok(None),
        }
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last 40 lines of the log, for failure messages.
    pub fn tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Waits until the log holds `count` lines containing `needle` (the log is a file: it is
    /// read again every 50 ms), failing after `timeout` with the log's tail.
    ///
    /// # Errors
    /// When the lines do not appear in time, or the process exits first.
    pub async fn wait_for_log(
        &mut self,
        needle: &str,
        count: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if log_lines(&self.log_text(), needle).len() >= count {
                return Ok(());
            }
            if let Some(status) = self.try_wait()? {
                bail!(
                    "weir exited ({status}) before logging `{needle}` ×{count}:\n{}",
                    self.tail()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "no `{needle}` ×{count} in the log after {timeout:?}:\n{}",
                    self.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The lines of `log` that contain `needle`.
pub fn log_lines<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

/// The value of the `name=value` field of a tracing log line, as a number.
pub fn log_field(line: &str, name: &str) -> Option<u64> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    line[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
