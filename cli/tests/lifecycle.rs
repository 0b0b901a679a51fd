//! `weir run`'s lifecycle as an orchestrator drives it: SIGTERM drains and checkpoints (a
//! restart repeats no output and re-processes nothing, and the group's committed offsets are
//! the final checkpoint's), and `/readyz` on the admin listener follows the brokers — cut off
//! by a TCP proxy this test owns (the broker's proxied listener, deploy/local/kafka.sh), never
//! by stopping the shared broker.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use weir_tests::process::{CounterConfig, WeirProcess};
use weir_tests::proxy::TcpProxy;
use weir_tests::*;

const KEYS: u64 = 20;
const RESUMED: &str = "shard opened; partition resumes";

/// The offset a `shard opened; partition resumes` line gives for `topic` (its checkpoint's).
fn resumed_offset(line: &str, topic: &str) -> Option<i64> {
    let after = line.split(&format!("\"{topic}\": ")).nth(1)?;
    after
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_checkpoints_so_a_restart_repeats_and_reprocesses_nothing()
-> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("term-in"), unique("term-out"), unique("term-dlq"));
    create_topics(&[(&input, 2), (&output, 2), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let mut config = CounterConfig::new(&input, &output, &dlq).await?;
    // No periodic checkpoint while the test runs: what the restart resumes from is the one
    // SIGTERM takes.
    config.checkpoint_interval = "10min".to_owned();
    let path = dir.path().join("weir.toml");
    config.write(&path)?;

    let mut expected = BTreeMap::new();
    produce_counter(&input, 2, (0, 400), KEYS, &mut expected).await?;
    let mut first = WeirProcess::spawn(bin, &path, dir.path().join("first.log"), &[])?;
    let counts = read_counts(&output, &expected, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", first.tail()))?;
    assert_counts_exact(&expected, &counts);
    first.signal("TERM").await?;
    let status = first
        .wait(Duration::from_secs(60))
        .await?
        .ok_or_else(|| anyhow::anyhow!("weir run did not stop on SIGTERM: {}", first.tail()))?;
    assert!(status.success(), "a drained stop exits 0: {}", first.tail());
    assert!(
        first
            .log_text()
            .contains("draining partitions and checkpointing"),
        "{}",
        first.tail()
    );

    // The group's committed offsets are the end of the input: everything was processed and
    // checkpointed.
    let ends = high_watermarks(&input, 2)?;
    let committed = committed_offsets(&config.group, &input, 2)?;
    assert_eq!(
        committed,
        ends.iter().map(|e| Some(*e)).collect::<Vec<_>>(),
        "committed offsets at SIGTERM"
    );

    // Restarted, each shard resumes from the checkpoint SIGTERM took — the committed offsets —
    // and the output goes on with no repeat: exactly one output per input record.
    produce_counter(&input, 2, (400, 500), KEYS, &mut expected).await?;
    let mut second = WeirProcess::spawn(bin, &path, dir.path().join("second.log"), &[])?;
    let outputs = read_exactly(
        &output,
        500,
        Duration::from_secs(120),
        Duration::from_secs(2),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", second.tail()));
    let log = second.log_text();
    second.kill().await?;
    let outputs = outputs?;
    let resumed: Vec<i64> = log
        .lines()
        .filter(|l| l.contains(RESUMED))
        .filter_map(|l| resumed_offset(l, &input))
        .collect();
    let mut resumed_sorted = resumed.clone();
    resumed_sorted.sort_unstable();
    let mut ends_sorted = ends.clone();
    ends_sorted.sort_unstable();
    assert_eq!(
        resumed_sorted, ends_sorted,
        "the restart resumes from the final checkpoint, which holds the committed offsets: {log}"
    );
    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for msg in &outputs {
        use rdkafka::Message as _;
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
        let value: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        per_key
            .entry(key)
            .or_default()
            .push(value["count"].as_u64().unwrap_or_default());
    }
    for (key, n) in &expected {
        let once: Vec<u64> = (1..=*n).collect();
        assert_eq!(per_key[key], once, "key {key}: every count once, in order");
    }
    Ok(())
}

/// The status of `GET http://{admin}/readyz` and its body.
/// `weir run` over a pipeline of two stages (docs/topologies.md): the `counter` counts the input
/// per key, a second `counter` counts its emits per key through the internal topic `weir run`
/// creates, and SIGTERM drains both. Exactly-once, the second stage's counts of a key are
/// 1..=n, each once. Each stage's metrics carry its `stage` label, and its log lines its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_run_runs_a_pipeline_of_stages_and_sigterm_drains_every_stage() -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (
        unique("staged-in"),
        unique("staged-out"),
        unique("staged-dlq"),
    );
    create_topics(&[(&input, 2), (&output, 2), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let mut config = CounterConfig::new(&input, &output, &dlq).await?;
    config.exactly_once = true;
    let operator = config.operator.display().to_string();
    config.pipeline_extra = format!(
        r#"
[[pipeline.stages]]
name = "first"
operator = "{operator}"
inputs = [{{ topic = "{input}" }}]

[[pipeline.stages]]
name = "second"
operator = "{operator}"
inputs = [{{ stage = "first" }}]
outputs = {{ default = {{ topic = "{output}" }} }}
"#
    );
    let path = dir.path().join("weir.toml");
    config.write(&path)?;
    // The one-operator lines go: each stage names its own.
    let text = std::fs::read_to_string(&path)?;
    let (head, stages) = text.split_once("[[pipeline.stages]]").expect("stages");
    let head: String = head
        .lines()
        .filter(|l| {
            !["operator =", "input_topics =", "output_topic ="]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, format!("{head}[[pipeline.stages]]{stages}"))?;

    let mut expected = BTreeMap::new();
    produce_counter(&input, 2, (0, 200), KEYS, &mut expected).await?;
    let admin: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let admin_text = admin.to_string();
    let env = [("WEIR_ADMIN_LISTEN", admin_text.as_str())];
    let mut run = WeirProcess::spawn(bin, &path, dir.path().join("weir.log"), &env)?;
    let counts = read_counts(&output, &expected, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", run.tail()))?;
    let metrics = reqwest::Client::new()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let records_in = |stage: &str| -> Option<u64> {
        let labels = format!(r#"pipeline="{}",stage="{stage}""#, config.name);
        metrics
            .lines()
            .find(|l| l.starts_with("weir_records_in_total{") && l.contains(&labels))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    };
    // The first stage admitted the 200 input records; the second as many emits of it (and
    // its markers, which are not records of it).
    assert_eq!(records_in("first"), Some(200), "{metrics}");
    assert_eq!(records_in("second"), Some(200), "{metrics}");
    run.signal("TERM").await?;
    let status = run
        .wait(Duration::from_secs(60))
        .await?
        .ok_or_else(|| anyhow::anyhow!("weir run did not stop on SIGTERM: {}", run.tail()))?;
    assert!(status.success(), "a drained stop exits 0: {}", run.tail());
    let log = run.log_text();
    assert!(log.contains("internal topic created"), "{}", run.tail());
    assert!(log.contains("stopping every stage"), "{}", run.tail());
    assert!(
        log.lines()
            .any(|l| l.contains("stage{stage=second}") && l.contains("claimed shard")),
        "a shard's lines name its stage too: {}",
        run.tail()
    );
    for (key, n) in &expected {
        assert_eq!(
            counts[key],
            (1..=*n).collect::<Vec<_>>(),
            "key {key}: every record crossed the edge once"
        );
    }
    Ok(())
}

/// A SIGTERM that comes while `weir run` starts (before its pipeline runs: the broker and store
/// checks, the backend) ends it with 0 and a line saying so; it ended with 143 and said
/// nothing before the signals were listened for first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_weir_run_starts_stops_it_cleanly() -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("early-in"), unique("early-out"), unique("early-dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let config = CounterConfig::new(&input, &output, &dlq).await?;
    let path = dir.path().join("weir.toml");
    config.write(&path)?;
    let mut run = WeirProcess::spawn(bin, &path, dir.path().join("run.log"), &[])?;
    // Its first line: the signals are listened for from there on.
    run.wait_for_log("weir run starting", 1, Duration::from_secs(30))
        .await?;
    run.signal("TERM").await?;
    let status = run
        .wait(Duration::from_secs(60))
        .await?
        .ok_or_else(|| anyhow::anyhow!("weir run did not stop on SIGTERM: {}", run.tail()))?;
    assert!(
        status.success(),
        "exits 0, not 143: {status}\n{}",
        run.tail()
    );
    let log = run.log_text();
    assert!(
        log.contains("stopped before the pipeline started")
            || log.contains("draining partitions and checkpointing"),
        "the stop is logged: {}",
        run.tail()
    );
    Ok(())
}

async fn readyz(client: &reqwest::Client, admin: SocketAddr) -> (u16, String) {
    match client
        .get(format!("http://{admin}/readyz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
    {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// The status `GET http://{admin}{path}` answers.
async fn status_of(client: &reqwest::Client, admin: SocketAddr, path: &str) -> anyhow::Result<u16> {
    Ok(client
        .get(format!("http://{admin}{path}"))
        .send()
        .await?
        .status()
        .as_u16())
}

/// Polls `/readyz` until it answers `status`, failing after `timeout` with the last answer.
async fn wait_ready(
    client: &reqwest::Client,
    admin: SocketAddr,
    status: u16,
    timeout: Duration,
    weir: &WeirProcess,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let (got, body) = readyz(client, admin).await;
        if got == status {
            return Ok(body);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "/readyz did not answer {status} within {timeout:?}; last {got} {body}\n{}",
            weir.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_while_the_brokers_are_cut_off_and_200_once_they_are_back()
-> anyhow::Result<()> {
    init_tracing();
    // The broker's proxied listener is advertised at 9096, where this proxy listens.
    let mut proxy = TcpProxy::start("127.0.0.1:9096".parse()?, "127.0.0.1:9095".parse()?).await?;
    let (input, output, dlq) = (unique("ready-in"), unique("ready-out"), unique("ready-dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let dir = tempfile::tempdir()?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let config = CounterConfig::new(&input, &output, &dlq).await?;
    let path = dir.path().join("weir.toml");
    config.write(&path)?;
    let admin: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let admin_text = admin.to_string();
    let weir = WeirProcess::spawn(
        bin,
        &path,
        dir.path().join("weir.log"),
        &[
            ("WEIR_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9096"),
            ("WEIR_ADMIN_LISTEN", &admin_text),
            // librdkafka's debug lines about its connections: a consumer cut off queues
            // hundreds of them, and one that served a line per wake-up (a second) fetched
            // nothing for minutes after the brokers came back — every run failed with them,
            // one in nine without.
            ("RUST_LOG", "info,librdkafka=debug"),
            ("WEIR_KAFKA__CONSUMER__DEBUG", "broker"),
        ],
    )?;
    let client = reqwest::Client::new();
    let body = wait_ready(&client, admin, 200, Duration::from_secs(60), &weir).await?;
    assert!(body.contains("\"reachable\":true"), "{body}");
    assert_eq!(status_of(&client, admin, "/healthz").await?, 200);

    proxy.cut().await;
    let body = wait_ready(&client, admin, 503, Duration::from_secs(60), &weir).await?;
    assert!(body.contains("\"reachable\":false"), "{body}");
    // Alive all along: only readiness follows the brokers.
    assert_eq!(status_of(&client, admin, "/healthz").await?, 200);
    let metrics = client
        .get(format!("http://{admin}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    assert!(metrics.contains("weir_kafka_reachable 0"), "{metrics}");

    proxy.restore().await?;
    wait_ready(&client, admin, 200, Duration::from_secs(90), &weir).await?;

    // And the pipeline works through the proxy again.
    let mut expected = BTreeMap::new();
    produce_counter(&input, 1, (0, 50), 5, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", weir.tail()))?;
    assert_counts_exact(&expected, &counts);
    Ok(())
}
