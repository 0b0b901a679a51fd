//! Bad records against the real broker: a trap in the middle of a batch, a record the
//! operator rejects after writing, a runaway loop, and a malformed flight. Each bad record lands
//! in the dead-letter topic with its error; every other record is processed exactly once; the
//! host keeps running.

use rdkafka::Message;
use std::collections::BTreeMap;
use std::time::Duration;
use weir_host::config::{FailurePolicy, RuntimeSettings};
use weir_host::sink::kafka::{
    HEADER_ERROR, HEADER_ERROR_KIND, HEADER_SOURCE_OFFSET, HEADER_SOURCE_PARTITION,
};
use weir_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);
const SETTLE: Duration = Duration::from_secs(2);

/// New input, output and dead-letter topics (one partition each), the input holding 1000
/// records over 10 keys with `poison` at offset 500.
async fn poisoned_input(poison: &[u8]) -> anyhow::Result<(String, String, String)> {
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..1000)
        .map(|i| {
            let value = if i == 500 {
                poison.to_vec()
            } else {
                format!("v{i}").into_bytes()
            };
            (format!("k{}", i % 10).into_bytes(), value)
        })
        .collect();
    produce(&input, 0, &records).await?;
    Ok((input, output, dlq))
}

/// Produces 1000 records over 10 keys to one partition, with `poison` at offset 500, runs the
/// counter, and checks outputs and dead letters. Returns the dead-letter record's error kind
/// and error, and the number of trapped calls.
async fn run_counter_with_poison(
    poison: &[u8],
    runtime: RuntimeSettings,
) -> anyhow::Result<(String, String, u64)> {
    let (input, output, dlq) = poisoned_input(poison).await?;
    // Exported under the input's (unique) name, to read its dead-letter counter.
    let pipeline = RunningPipeline::start_labelled(
        settings(guest("weir_test_counter"), &input, &output, &dlq, runtime),
        "tests",
        &input,
    );
    pipeline.wait_done(1000, TIMEOUT).await?;
    let dead = read_exactly(&dlq, 1, TIMEOUT, SETTLE).await?;
    let out = read_exactly(&output, 999, TIMEOUT, SETTLE).await?;
    assert!(
        !pipeline.is_finished(),
        "the host must keep running after a bad record"
    );
    // Isolation halves a trapping batch (at most `batch_records_max` records, 1000 here at
    // most) until the record stands alone: one trap per level at most.
    assert!(
        pipeline
            .stats
            .traps
            .load(std::sync::atomic::Ordering::Relaxed)
            <= 11
    );

    assert_eq!(
        header(&dead[0], HEADER_SOURCE_OFFSET).as_deref(),
        Some("500")
    );
    assert_eq!(
        header(&dead[0], HEADER_SOURCE_PARTITION).as_deref(),
        Some("0")
    );
    assert_eq!(dead[0].payload(), Some(poison));
    assert_eq!(dead[0].key(), Some(&b"k0"[..]));

    // Exactly once, in order: per key the counts are 1, 2, 3, … and offsets increase.
    let mut per_key: BTreeMap<Vec<u8>, Vec<(u64, i64)>> = BTreeMap::new();
    for msg in &out {
        let v: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default())?;
        let count = v["count"].as_u64().expect("count is a number");
        let offset = v["offset"].as_i64().expect("offset is a number");
        per_key
            .entry(msg.key().unwrap_or_default().to_vec())
            .or_default()
            .push((count, offset));
    }
    assert_eq!(per_key.len(), 10);
    for (key, seen) in &per_key {
        let counts: Vec<u64> = seen.iter().map(|(c, _)| *c).collect();
        let expected_len = if key == b"k0" { 99 } else { 100 };
        assert_eq!(
            counts,
            (1..=expected_len).collect::<Vec<u64>>(),
            "key {}",
            String::from_utf8_lossy(key)
        );
        assert!(seen.windows(2).all(|w| w[0].1 < w[1].1), "offsets in order");
        assert!(
            seen.iter().all(|(_, o)| *o != 500),
            "the poison record produced no output"
        );
    }
    let error = header(&dead[0], HEADER_ERROR).unwrap_or_default();
    let kind = header(&dead[0], HEADER_ERROR_KIND).unwrap_or_default();
    // Counted under its kind, and logged once: kind, partition, offset and one line of cause.
    let counted = weir_host::telemetry::prometheus().render();
    let series = format!(
        r#"weir_records_dead_lettered_total{{tenant="tests",pipeline="{input}",kind="{kind}"}} "#
    );
    assert_eq!(
        counted
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .map(str::trim),
        Some("1"),
        "{series}"
    );
    let logged: Vec<String> = dead_letter_lines()
        .into_iter()
        .filter(|l| l.contains(&format!("topic={input}")))
        .collect();
    assert_eq!(logged.len(), 1, "{logged:?}");
    for field in [
        format!("kind=\"{kind}\""),
        "partition=0".to_owned(),
        "offset=500".to_owned(),
    ] {
        assert!(logged[0].contains(&field), "{field} in {}", logged[0]);
    }
    assert!(
        logged[0].contains("cause=") && !logged[0].contains("\\n"),
        "the cause's first line only: {}",
        logged[0]
    );
    let traps = pipeline
        .stats
        .traps
        .load(std::sync::atomic::Ordering::Relaxed);
    pipeline.stop().await?;
    Ok((kind, error, traps))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trap_in_the_middle_of_a_batch_dead_letters_only_that_record() -> anyhow::Result<()> {
    let runtime = RuntimeSettings {
        batch_records_max: 512,
        ..RuntimeSettings::default()
    };
    let (kind, error, traps) = run_counter_with_poison(b"poison:trap", runtime).await?;
    assert_eq!(kind, "trapped");
    // The batch holding it is halved until it stands alone: it traps once per level, at most
    // ⌈log₂ 512⌉ + 1 times, not once per record (the bound on calls is the isolation's unit
    // test).
    assert!(
        (2..=10).contains(&traps),
        "the poison record trapped inside a batch of many, then in its halves: {traps}"
    );
    assert!(
        error.contains("poison record at offset 500"),
        "error names the panic: {error}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_record_loses_the_writes_and_emits_it_made() -> anyhow::Result<()> {
    let runtime = RuntimeSettings {
        batch_records_max: 1000,
        ..RuntimeSettings::default()
    };
    let (kind, error, traps) =
        run_counter_with_poison(b"poison:write-then-reject", runtime).await?;
    assert_eq!(kind, "rejected");
    assert_eq!(traps, 0, "a rejection is not a trap");
    assert_eq!(error, "rejected after writing");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runaway_loop_is_stopped_by_the_cpu_deadline_and_dead_lettered() -> anyhow::Result<()> {
    let runtime = RuntimeSettings {
        batch_records_max: 100,
        record_deadline: Duration::from_millis(50),
        batch_deadline_max: Duration::from_millis(500),
        ..RuntimeSettings::default()
    };
    let (kind, error, _) = run_counter_with_poison(b"poison:loop", runtime).await?;
    assert_eq!(kind, "deadline");
    assert!(error.contains("deadline"), "{error}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_is_stopped_by_the_memory_cap_and_dead_lettered() -> anyhow::Result<()> {
    let runtime = RuntimeSettings {
        batch_records_max: 1000,
        instance_memory_bytes_max: 32 << 20,
        ..RuntimeSettings::default()
    };
    let (kind, _error, _) = run_counter_with_poison(b"poison:alloc", runtime).await?;
    assert_eq!(kind, "trapped");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_recursion_exhausts_the_wasm_stack_and_is_dead_lettered() -> anyhow::Result<()> {
    let (kind, error, _) =
        run_counter_with_poison(b"poison:recurse", RuntimeSettings::default()).await?;
    assert_eq!(kind, "trapped");
    // Rust's wasm32 frames live on a shadow stack in linear memory: running off its end is an
    // out-of-bounds access; small frames would exhaust wasmtime's call stack first. Either
    // way the error leads with the trap's cause, not the wasm backtrace after it.
    let cause = error.strip_prefix("operator trapped: ").unwrap_or_default();
    assert!(
        cause.starts_with("wasm trap: out of bounds memory access")
            || cause.starts_with("wasm trap: call stack exhausted"),
        "{error}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_emit_flood_is_stopped_by_the_emit_limit_and_dead_lettered() -> anyhow::Result<()>
{
    // 1 MiB pieces from one reused buffer: guest memory stays small, so the emit limit, not
    // the 64 MiB memory cap, must stop it — at the first piece, larger than the output topic
    // takes (the producer's default `message.max.bytes`, 1,000,000).
    let (kind, error, traps) =
        run_counter_with_poison(b"poison:emit-flood", RuntimeSettings::default()).await?;
    assert_eq!(kind, "rejected");
    assert!(
        error.contains("1000000"),
        "the error names the limit: {error}"
    );
    assert_eq!(traps, 0, "refused by the limit, not by a trap");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_blocked_in_a_wasi_timer_is_ended_by_the_wall_clock_cap() -> anyhow::Result<()> {
    let runtime = RuntimeSettings {
        batch_records_max: 100,
        record_deadline: Duration::from_millis(50),
        batch_deadline_max: Duration::from_millis(200),
        call_io_allowance: Duration::from_secs(2),
        ..RuntimeSettings::default()
    };
    let (kind, error, _) = run_counter_with_poison(b"poison:sleep", runtime).await?;
    assert_eq!(kind, "deadline");
    assert!(error.contains("wall-clock"), "{error}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_flight_is_rejected_by_the_operator_and_dead_lettered() -> anyhow::Result<()> {
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 1), (&output, 1), (&dlq, 1)]).await?;
    let flight = |delay: &str| {
        format!(r#"{{"origin":"JFK","dest":"LAX","arr_delay":{delay}}}"#).into_bytes()
    };
    let records = vec![
        (b"JFK-LAX".to_vec(), flight("10")),
        (b"JFK-LAX".to_vec(), b"this is not JSON".to_vec()),
        (b"JFK-LAX".to_vec(), flight("null")),
        (b"JFK-LAX".to_vec(), flight("-4")),
    ];
    produce(&input, 0, &records).await?;
    let pipeline = RunningPipeline::start(settings(
        guest("flight_delays"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    ));
    pipeline.wait_done(4, TIMEOUT).await?;
    let dead = read_exactly(&dlq, 1, TIMEOUT, SETTLE).await?;
    let out = read_exactly(&output, 3, TIMEOUT, SETTLE).await?;
    assert_eq!(
        header(&dead[0], HEADER_ERROR_KIND).as_deref(),
        Some("rejected")
    );
    assert_eq!(header(&dead[0], HEADER_SOURCE_OFFSET).as_deref(), Some("1"));
    let error = header(&dead[0], HEADER_ERROR).unwrap_or_default();
    assert!(error.starts_with("invalid JSON"), "{error}");
    let last: serde_json::Value = serde_json::from_slice(out[2].payload().unwrap_or_default())?;
    assert_eq!(last["flights"], 3);
    assert_eq!(last["delay_count"], 2);
    assert_eq!(last["delay_sum"], 6);
    assert_eq!(last["delay_max"], 10);
    assert_eq!(last["delay_mean"], 3.0);
    pipeline.stop().await?;
    Ok(())
}

/// 1000 records over 10 keys on one partition with a trapping record at offset 500, run
/// with `failure_policy`; returns the pipeline, the output and dead-letter topics.
async fn run_trap_with_policy(
    policy: FailurePolicy,
) -> anyhow::Result<(RunningPipeline, String, String)> {
    let (input, output, dlq) = poisoned_input(b"poison:trap").await?;
    let mut settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        RuntimeSettings::default(),
    );
    settings.pipeline.failure_policy = policy;
    Ok((RunningPipeline::start(settings), output, dlq))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_skip_drops_the_failed_record_without_a_dead_letter() -> anyhow::Result<()> {
    let (pipeline, output, dlq) = run_trap_with_policy(FailurePolicy::Skip).await?;
    pipeline.wait_done(1000, TIMEOUT).await?;
    let skipped = pipeline
        .stats
        .records_skipped_failed
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(skipped, 1, "the trapping record is skipped");
    read_exactly(&output, 999, TIMEOUT, SETTLE).await?;
    read_exactly(&dlq, 0, TIMEOUT, SETTLE).await?;
    assert!(!pipeline.is_finished(), "the pipeline goes on");
    pipeline.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_fail_stops_the_pipeline_naming_the_record() -> anyhow::Result<()> {
    let (pipeline, _output, dlq) = run_trap_with_policy(FailurePolicy::Fail).await?;
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !pipeline.is_finished() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the pipeline did not stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let error = format!(
        "{:#}",
        pipeline.stop().await.expect_err("the pipeline failed")
    );
    assert!(
        error.contains("the record at offset 500") && error.contains("poison record"),
        "the error names the record and the cause: {error}"
    );
    read_exactly(&dlq, 0, TIMEOUT, SETTLE).await?;
    Ok(())
}
