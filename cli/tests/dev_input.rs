//! `weir dev --operator … --input FILE.jsonl` (cli/src/dev_input.rs): any operator over a file
//! of records on librdkafka's embedded mock cluster, its outputs and dead letters printed as
//! JSON lines — for the counter (with a rejected record) and for word-count.

use serde_json::{Value, json};
use std::path::Path;
use weir_tests::*;

/// Runs `weir dev` on `lines` with `operator`; returns the printed JSON lines.
async fn dev(operator: &Path, lines: &[Value]) -> anyhow::Result<Vec<Value>> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("records.jsonl");
    let mut text = String::from("# one record a line\n");
    for line in lines {
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&input, text)?;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["dev", "--partitions", "1", "--operator"])
        .arg(operator)
        .arg("--input")
        .arg(&input)
        .env("RUST_LOG", "warn")
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    anyhow::ensure!(output.status.success(), "weir dev failed: {stderr}");
    let stdout = String::from_utf8(output.stdout)?;
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{e}: {line}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_over_a_jsonl_file_prints_its_counts_and_its_dead_letter() -> anyhow::Result<()>
{
    let printed = dev(
        &guest("weir_test_counter"),
        &[
            json!({"key": "a", "value": "x"}),
            json!({"key": "b", "value": {"any": "json"}, "timestamp_ms": 1_700_000_000_000_i64}),
            json!({"key": "a", "value": "poison:reject"}),
            json!({"key": "a", "value": "y", "headers": {"source": "test"}}),
        ],
    )
    .await?;
    // Per key in input order; keys run side by side, so their outputs interleave freely.
    let mut counts: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for o in printed.iter().filter_map(|line| line.get("output")) {
        counts
            .entry(o["key"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push(o["value"]["count"].as_u64().unwrap_or(0));
    }
    assert_eq!(counts["a"], [1, 2], "{printed:?}");
    assert_eq!(counts["b"], [1], "{printed:?}");
    let dead: Vec<&Value> = printed
        .iter()
        .filter_map(|line| line.get("dead_letter"))
        .collect();
    assert_eq!(dead.len(), 1, "{printed:?}");
    assert_eq!(dead[0]["key"], "a");
    assert_eq!(dead[0]["value"], "poison:reject");
    assert_eq!(dead[0]["kind"], "rejected");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn word_count_over_a_jsonl_file_prints_each_words_running_count() -> anyhow::Result<()> {
    let printed = dev(
        &guest("word_count"),
        &[
            json!({"key": "doc", "value": "the cat and the hat"}),
            json!({"key": "doc", "value": "The end"}),
        ],
    )
    .await?;
    let outputs: Vec<(String, u64)> = printed
        .iter()
        .filter_map(|line| line.get("output"))
        .map(|o| {
            (
                o["value"]["word"].as_str().unwrap_or_default().to_owned(),
                o["value"]["count"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let expected: Vec<(String, u64)> = [
        ("the", 1),
        ("cat", 1),
        ("and", 1),
        ("the", 2),
        ("hat", 1),
        ("the", 3),
        ("end", 1),
    ]
    .into_iter()
    .map(|(w, n)| (w.to_owned(), n))
    .collect();
    assert_eq!(outputs, expected, "{printed:?}");
    Ok(())
}
