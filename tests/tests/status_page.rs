//! The status page at `/`, looked at in headless Chromium (Debian's, driven by Playwright;
//! `deploy/local/browser.sh` installs both) as a person would: sign in with a key, then read
//! the pipelines table, the charts and the recent errors. One tenant runs a counter over the
//! real broker and S3 server, another has a pipeline that fails on a missing topic; the admin
//! sees both, each tenant only its own. Set `WEIR_SCREENSHOT_DIR` to keep a screenshot of each
//! page (none is committed).

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

/// The path of the `playwright-core` package (`WEIR_PLAYWRIGHT`, else where
/// `deploy/local/browser.sh` installs it).
fn playwright() -> PathBuf {
    let path = std::env::var_os("WEIR_PLAYWRIGHT").map_or_else(
        || {
            std::env::var_os("WEIR_SERVICES_DIR")
                .map_or_else(
                    || {
                        PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                            .join(".cache/weir/services")
                    },
                    PathBuf::from,
                )
                .join("browser/node_modules/playwright-core")
        },
        PathBuf::from,
    );
    assert!(
        path.join("package.json").exists(),
        "{} is missing: run `bash deploy/local/browser.sh` (deploy/test.sh does)",
        path.display()
    );
    path
}

/// Signs in at `http://{addr}/` with `key` in Chromium and returns what the page shows
/// (tests/browser/status_page.cjs), with a screenshot named `shot` in `WEIR_SCREENSHOT_DIR`.
async fn look(addr: SocketAddr, key: &str, shot: &str) -> anyhow::Result<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("browser/status_page.cjs");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&script)
        .arg(format!("http://{addr}/"))
        .arg(key)
        .env("WEIR_PLAYWRIGHT", playwright());
    if let Some(dir) = std::env::var_os("WEIR_SCREENSHOT_DIR") {
        command.arg(PathBuf::from(dir).join(format!("{shot}.png")));
    }
    let out = tokio::time::timeout(Duration::from_secs(120), command.output()).await??;
    anyhow::ensure!(
        out.status.success(),
        "the browser script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn rows(seen: &Value) -> Vec<String> {
    seen["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["pipeline"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn row<'a>(seen: &'a Value, pipeline: &str) -> &'a Value {
    seen["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["pipeline"] == pipeline))
        .unwrap_or(&Value::Null)
}

fn chart<'a>(seen: &'a Value, pipeline: &str, name: &str) -> &'a Value {
    seen["charts"]
        .as_array()
        .and_then(|charts| {
            charts
                .iter()
                .find(|c| c["pipeline"] == pipeline && c["chart"] == name)
        })
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_each_signed_in_viewer_its_pipelines_charts_and_errors()
-> anyhow::Result<()> {
    let (addr, _) = start_server_with(Some(runner_config(&unique("host")))).await?;
    let acme_id = tenant_id("acme");
    let acme = tenant_with_key(addr, &acme_id).await?;
    let globex_id = tenant_id("globex");
    let globex = tenant_with_key(addr, &globex_id).await?;
    upload_counter(addr, &acme, 1).await?;
    upload_counter(addr, &globex, 1).await?;
    let input = kafka_topic_of(&acme_id, "clicks");
    let output = kafka_topic_of(&acme_id, "counts");
    create_topics(&[
        (&input, 2),
        (&output, 2),
        (&kafka_topic_of(&acme_id, "dlq"), 1),
    ])
    .await?;
    let spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["clicks"], "output_topic": "counts", "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 300,
    });
    create_pipeline(addr, &acme, "counts", &spec).await?;
    // globex's input topic does not exist: its pipeline fails, naming it.
    create_pipeline(addr, &globex, "orders", &spec).await?;
    let mut expected = BTreeMap::new();
    produce_counter(&input, 2, (0, 3_000), 40, &mut expected).await?;
    let counts = read_counts(&output, &expected, Duration::from_secs(60)).await?;
    assert_counts_exact(&expected, &counts);
    wait_for_pipeline(addr, &acme, "counts", Duration::from_secs(30), |v| {
        v["status"]["records_done"] == 3_000
            && v["status"]["last_checkpoint"].is_object()
            && v["status"]["partitions"]
                .as_array()
                .is_some_and(|ps| ps.len() == 2 && ps.iter().all(|p| p["lag"] == 0))
    })
    .await?;
    let (_, reason) = failure_of(addr, &globex, "orders").await?;
    assert!(reason.contains("clicks"), "{reason}");
    // The page samples every 500 ms here: give it a few samples after the run settled.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let counts_row = format!("{acme_id}/counts");
    let orders_row = format!("{globex_id}/orders");

    // The admin sees every tenant's pipelines, with charts and globex's failure.
    let admin = look(addr, ADMIN_KEY, "status-admin").await?;
    assert_eq!(admin["title"], "Weir status", "{admin:#}");
    assert_eq!(admin["signInError"], Value::Null);
    assert_eq!(admin["who"], "the admin (every tenant)");
    let shown = rows(&admin);
    assert!(
        shown.contains(&counts_row) && shown.contains(&orders_row),
        "{admin:#}"
    );
    let counts = row(&admin, &counts_row)["cells"].clone();
    assert_eq!(counts[0], json!(acme_id), "{counts}");
    assert_eq!(counts[1], "counts");
    assert_eq!(counts[2], "running", "{counts}");
    assert_eq!(counts[4], "0", "lag: {counts}");
    assert!(
        counts[5].as_str().is_some_and(|c| c.contains(" ms, ")),
        "last checkpoint: {counts}"
    );
    assert_eq!(counts[8], "0", "dead-lettered: {counts}");
    assert_eq!(row(&admin, &orders_row)["cells"][2], "failed");
    for name in ["throughput", "lag", "checkpoints"] {
        let c = chart(&admin, &counts_row, name);
        assert!(c["points"].as_u64() >= Some(2), "{name}: {c}");
        assert!(
            c["width"].as_f64() > Some(100.0) && c["height"].as_f64() > Some(50.0),
            "{c}"
        );
        assert!(
            c["caption"].as_str().is_some_and(|t| t.contains("last ")),
            "{c}"
        );
    }
    // The burst of 3,000 records shows as a peak; checkpoints took some time.
    assert!(
        chart(&admin, &counts_row, "throughput")["max"].as_f64() > Some(0.0),
        "{admin:#}"
    );
    assert!(
        chart(&admin, &counts_row, "checkpoints")["max"].as_f64() > Some(0.0),
        "{admin:#}"
    );
    let errors = admin["errors"].as_array().cloned().unwrap_or_default();
    assert!(
        errors
            .iter()
            .any(|e| e[1] == json!(orders_row)
                && e[2].as_str().is_some_and(|m| m.contains("clicks"))),
        "globex's failure is among the recent errors: {errors:?}"
    );

    // A tenant sees its own pipeline, none of another's, and none of its errors.
    let seen = look(addr, &acme, "status-acme").await?;
    assert_eq!(seen["who"], json!(format!("tenant {acme_id}")));
    assert_eq!(rows(&seen), vec![counts_row.clone()], "{seen:#}");
    assert!(!seen.to_string().contains(&globex_id), "{seen:#}");
    assert_eq!(
        chart(&seen, &counts_row, "throughput")["pipeline"],
        json!(counts_row)
    );
    let seen = look(addr, &globex, "status-globex").await?;
    assert_eq!(rows(&seen), vec![orders_row.clone()], "{seen:#}");
    assert!(!seen.to_string().contains(&acme_id), "{seen:#}");
    assert!(
        seen["errors"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e[1] == json!(orders_row))),
        "{seen:#}"
    );

    // An unknown key stays at the form, told so; the page without a key is the form.
    let refused = look(addr, "weir_not-a-key", "status-refused").await?;
    assert_eq!(refused["signInError"], "That key is not known here.");
    assert_eq!(rows(&refused), Vec::<String>::new());
    let page = reqwest::get(format!("http://{addr}/")).await?;
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await?.contains(r#"name="key""#));
    Ok(())
}
