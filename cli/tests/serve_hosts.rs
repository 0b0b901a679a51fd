//! Two `weir serve` processes on one store (the S3 server) and one broker share a pipeline
//! created through the API: Kafka's consumer group divides its partitions between them, both
//! report on it, and when one is stopped (SIGTERM: it drains and checkpoints) the other runs
//! every partition. Every key's count is exact throughout. The operator's log lines from both
//! hosts are read through either host, by the API and by `weir pipeline logs [--follow]`, and
//! never by another tenant. Then the `weir pipeline` CLI shows, checkpoints, stops and deletes
//! it.

use anyhow::Context as _;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};
use weir_tests::api::{ADMIN_KEY, call, counter_component, json_body, tenant_id, tenant_with_key};
use weir_tests::process::WeirProcess;
use weir_tests::*;

const PARTITIONS: i32 = 4;
const KEYS: u64 = 40;

/// A free local port (bound, then released for the server to take).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Writes serve.toml for host `host` listening on `port`, over `store_url`.
fn write_serve_config(path: &Path, host: &str, port: u16, store_url: &str) -> anyhow::Result<()> {
    let options: String = s3_options()
        .iter()
        .map(|(k, v)| format!("{k} = \"{v}\"\n"))
        .collect();
    let config = format!(
        r#"listen = "127.0.0.1:{port}"
store_url = "{store_url}"
[store_options]
{options}
[pipelines]
host_id = "{host}"
bootstrap_servers = "{bootstrap}"
reconcile_interval = "1s"
memtable_bytes_max = 16384
block_cache_bytes = 8388608
disk_cache_bytes = 16777216
[pipelines.consumer]
"session.timeout.ms" = "6000"
"#,
        bootstrap = kafka_bootstrap(),
    );
    std::fs::write(path, config)?;
    Ok(())
}

/// Polls the pipeline until `done` holds, failing after `timeout` with the last answer.
async fn wait_for(
    addr: SocketAddr,
    key: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, _, view) =
            call(addr, Method::GET, "/v1/pipelines/counts", Some(key), None).await?;
        if status == StatusCode::OK && done(&view) {
            return Ok(view);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: not after {timeout:?}: {status} {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The partitions each running host reports, by host.
fn partitions_by_host(view: &Value) -> BTreeMap<String, BTreeSet<i64>> {
    view["status"]["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["phase"] == "running")
        .map(|h| {
            let parts = h["partitions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_i64)
                .collect();
            (h["host"].as_str().unwrap_or_default().to_owned(), parts)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_hosts_share_a_pipelines_partitions_and_one_takes_all_when_the_other_stops()
-> anyhow::Result<()> {
    init_tracing();
    let bucket = create_s3_bucket().await?;
    let store_url = format!("s3://{bucket}/weir");
    let dir = tempfile::tempdir()?;
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let env = [("WEIR_ADMIN_KEY", ADMIN_KEY)];
    let mut hosts = Vec::new();
    for name in ["host-a", "host-b"] {
        let port = free_port()?;
        let config = dir.path().join(format!("{name}.toml"));
        write_serve_config(&config, name, port, &store_url)?;
        let mut process = WeirProcess::spawn_command(
            bin,
            "serve",
            &config,
            dir.path().join(format!("{name}.log")),
            &env,
        )?;
        process
            .wait_for_log("weir serve listening", 1, Duration::from_secs(30))
            .await?;
        hosts.push((process, SocketAddr::from(([127, 0, 0, 1], port))));
    }
    let (a, b) = (hosts[0].1, hosts[1].1);

    // Through host a: a tenant, its counter, its topics and a pipeline.
    let tenant = tenant_id("shared");
    let key = tenant_with_key(a, &tenant).await?;
    let (status, _, version) = call(
        a,
        Method::POST,
        "/v1/operators/counter",
        Some(&key),
        Some(("application/wasm", counter_component())),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{version}");
    let input = format!("{tenant}.in");
    let output = format!("{tenant}.out");
    create_topics(&[
        (&input, PARTITIONS),
        (&output, PARTITIONS),
        (&format!("{tenant}.dlq"), 1),
    ])
    .await?;
    let spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 500, "delivery": "exactly_once",
    });
    let (status, _, created) = call(
        a,
        Method::POST,
        "/v1/pipelines/counts",
        Some(&key),
        json_body(&spec),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");

    // Both hosts run it, each some of the partitions and none the same (a report from before
    // the rebalance still names all four: its partitions would be logged by the other host);
    // host b answers about it too.
    let shared = wait_for(b, &key, Duration::from_secs(60), "both hosts run it", |v| {
        let by_host = partitions_by_host(v);
        by_host.len() == 2
            && by_host.values().all(|p| !p.is_empty())
            && by_host.values().flatten().collect::<BTreeSet<_>>().len() == PARTITIONS as usize
            && by_host.values().map(BTreeSet::len).sum::<usize>() == PARTITIONS as usize
    })
    .await?;
    let mut expected = BTreeMap::new();
    produce_counter(&input, PARTITIONS, (0, 2_000), KEYS, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);

    // A `weir pipeline logs --follow` through host b stays open while b stops.
    let (mut follower, mut followed) =
        operator_logs_from_both_hosts(a, b, &key, &tenant, &input, &shared).await?;

    // Host b stops (SIGTERM): it drains, checkpoints and leaves; host a takes every partition.
    let (mut b_process, _) = hosts.remove(1);
    b_process.signal("TERM").await?;
    let exit = b_process.wait(Duration::from_secs(60)).await?;
    assert!(
        exit.is_some_and(|s| s.success()),
        "host b exits cleanly on SIGTERM: {exit:?}\n{}",
        b_process.tail()
    );
    // Its open log stream ended with the shutdown, and the CLI with it.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while followed.next_line().await?.is_some() {}
        follower.wait().await
    })
    .await;
    assert!(
        matches!(ended, Ok(Ok(status)) if status.success()),
        "weir pipeline logs --follow ends when its host shuts down: {ended:?}"
    );
    let alone = wait_for(
        a,
        &key,
        Duration::from_secs(60),
        "host a runs every partition",
        |v| {
            let by_host = partitions_by_host(v);
            by_host.len() == 1
                && by_host
                    .get("host-a")
                    .is_some_and(|p| p.len() == PARTITIONS as usize)
        },
    )
    .await?;
    produce_counter(&input, PARTITIONS, (2_000, 4_000), KEYS, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);

    // The CLI over the same API: status as text, the list as JSON, a checkpoint on request.
    let cli = |args: &[&str]| {
        let output = std::process::Command::new(bin)
            .args(args)
            .env("WEIR_API", format!("http://{a}"))
            .env("WEIR_API_KEY", &key)
            .output()
            .expect("weir runs");
        assert!(
            output.status.success(),
            "weir {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let status = cli(&["pipeline", "status", "counts"]);
    assert!(status.contains("state      running"), "{status}");
    assert!(
        status.contains("host-a (running, partitions [0, 1, 2, 3])"),
        "{status}"
    );
    let listed: Value = serde_json::from_str(&cli(&["pipeline", "ls", "--json"]))?;
    assert_eq!(listed[0]["definition"]["name"], "counts", "{listed:#}");
    let requested = cli(&["pipeline", "checkpoint", "counts"]);
    assert!(
        requested.contains("checkpoint 1 of counts requested"),
        "{requested}"
    );
    let set = cli(&["pipeline", "set", "counts", "--failure-policy", "skip"]);
    assert!(set.contains("failure policy skip"), "{set}");
    let stopped = cli(&["pipeline", "stop", "counts"]);
    assert!(stopped.contains("state      stopp"), "{stopped}");
    wait_for(a, &key, Duration::from_secs(60), "stopped", |v| {
        v["status"]["state"] == "stopped"
    })
    .await?;
    let deleted = cli(&["pipeline", "rm", "counts"]);
    assert!(deleted.contains("deleted pipeline counts"), "{deleted}");
    println!(
        "shared: {:?}\nafter host b stopped: {:?}",
        partitions_by_host(&shared),
        partitions_by_host(&alone)
    );
    Ok(())
}

/// The pipeline's log lines (`GET /v1/pipelines/counts/logs` through `addr`), polled until
/// `done` holds for them.
async fn wait_for_logs(
    addr: SocketAddr,
    key: &str,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> anyhow::Result<Vec<Value>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = reqwest::Client::new()
            .get(format!("http://{addr}/v1/pipelines/counts/logs"))
            .bearer_auth(key)
            .send()
            .await?;
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await?;
        anyhow::ensure!(status == StatusCode::OK, "{status}: {text}");
        assert_eq!(content_type, "application/x-ndjson");
        let lines = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<Vec<Value>, _>>()?;
        if done(&lines) {
            return Ok(lines);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: not after 30 s: {lines:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `lines` hold `{tag} p{p}` for every partition, each from the host running `p`.
fn logged_by_their_hosts(
    lines: &[Value],
    tag: &str,
    hosts: &BTreeMap<String, BTreeSet<i64>>,
) -> bool {
    hosts.iter().all(|(host, partitions)| {
        partitions.iter().all(|p| {
            lines.iter().any(|l| {
                l["message"] == format!("{tag} p{p}")
                    && l["host"] == host.as_str()
                    && l["partition"] == *p
                    && l["level"] == "info"
            })
        })
    })
}

/// One `log:{tag} p{p}` record into each partition `p` of `input`: the counter logs it.
async fn log_in_each_partition(input: &str, tag: &str) -> anyhow::Result<()> {
    for p in 0..PARTITIONS {
        produce(
            input,
            p,
            &[(b"logger".to_vec(), format!("log:{tag} p{p}").into_bytes())],
        )
        .await?;
    }
    Ok(())
}

/// Both hosts' operator log lines, through either host: the API (and never for another
/// tenant), `weir pipeline logs` and `--follow`; returns the `--follow` process, still running.
async fn operator_logs_from_both_hosts(
    a: SocketAddr,
    b: SocketAddr,
    key: &str,
    tenant: &str,
    input: &str,
    shared: &Value,
) -> anyhow::Result<(Child, Lines<BufReader<ChildStdout>>)> {
    let hosts = partitions_by_host(shared);
    log_in_each_partition(input, "first").await?;
    for addr in [a, b] {
        wait_for_logs(addr, key, "both hosts' lines", |lines| {
            logged_by_their_hosts(lines, "first", &hosts)
        })
        .await?;
    }

    // Another tenant has no pipeline of that name: 404 through either host, its lines unseen.
    let other = tenant_with_key(a, &tenant_id("other")).await?;
    for addr in [a, b] {
        let (status, _, problem) = call(
            addr,
            Method::GET,
            "/v1/pipelines/counts/logs",
            Some(&other),
            None,
        )
        .await?;
        assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");
    }
    assert!(tenant != "other");

    // The CLI through host b: every host's lines as text; then --follow prints new ones.
    let bin = Path::new(env!("CARGO_BIN_EXE_weir"));
    let weir = |args: &[&str]| {
        let mut command = std::process::Command::new(bin);
        command
            .args(args)
            .env("WEIR_API", format!("http://{b}"))
            .env("WEIR_API_KEY", key);
        command
    };
    let printed = weir(&["pipeline", "logs", "counts"]).output()?;
    let text = String::from_utf8(printed.stdout)?;
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    for (host, partitions) in &hosts {
        for p in partitions {
            let shown = format!(" {host}/{p} INFO  first p{p}");
            assert!(
                text.lines().any(|l| l.ends_with(&shown)),
                "{shown:?} in:\n{text}"
            );
        }
    }
    let mut follow = tokio::process::Command::from(weir(&[
        "pipeline", "logs", "counts", "--follow", "--tail", "0",
    ]))
    .stdout(std::process::Stdio::piped())
    .kill_on_drop(true)
    .spawn()?;
    let mut followed = BufReader::new(follow.stdout.take().expect("piped")).lines();
    // `--tail 0` prints what hosts write once its request is in, which the process just spawned
    // makes when it gets to it: a line logged before would be old to it (a run lost `second
    // p0` so). Probe lines are logged until the stream prints one; then the lines to follow.
    let mut probes = 0;
    loop {
        log_in_each_partition(input, &format!("probe{probes}")).await?;
        match tokio::time::timeout(Duration::from_secs(3), followed.next_line()).await {
            Ok(line) => {
                let line = line?.context("weir pipeline logs --follow ended")?;
                assert!(line.contains(" INFO  probe"), "a probe line first: {line}");
                break;
            }
            Err(_) => {
                probes += 1;
                anyhow::ensure!(probes < 10, "--follow printed no probe line in 30 s");
            }
        }
    }
    log_in_each_partition(input, "second").await?;
    let mut seen = Vec::new();
    let all_seen = tokio::time::timeout(Duration::from_secs(30), async {
        while seen.len() < PARTITIONS as usize {
            let Some(line) = followed.next_line().await? else {
                anyhow::bail!("weir pipeline logs --follow ended");
            };
            assert!(
                !line.contains("first p"),
                "--tail 0 prints no old line: {line}"
            );
            // (The other probe lines may come too.)
            if line.contains(" INFO  second p") {
                seen.push(line);
            }
        }
        Ok(())
    })
    .await;
    anyhow::ensure!(
        matches!(all_seen, Ok(Ok(()))),
        "{all_seen:?}: followed {seen:#?}"
    );
    for (host, partitions) in &hosts {
        for p in partitions {
            let shown = format!(" {host}/{p} INFO  second p{p}");
            assert!(
                seen.iter().any(|l| l.ends_with(&shown)),
                "{shown:?} in {seen:#?}"
            );
        }
    }
    Ok((follow, followed))
}
