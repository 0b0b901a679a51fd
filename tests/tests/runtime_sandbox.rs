//! The Wasm runtime without Kafka: loading refuses what is not an operator, batches see their
//! own staged writes, map state pages merge staged and stored entries, and the sandbox grants
//! nothing (no environment, clock, filesystem or network).

use std::sync::Arc;
use std::time::Duration;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::RuntimeSettings;
use weir_host::pipeline::worker::prefetch;
use weir_host::runtime::{
    CallError, Disposition, InputRecord, Instance, Operator, Runtime, RuntimeError,
};
use weir_host::state::memory::{MemoryBackend, MemoryShard};
use weir_host::state::{Shard, ShardId, StateBackend};
use weir_tests::guest;

fn runtime() -> Runtime<MemoryShard> {
    let clock: SharedClock = Arc::new(SystemClock);
    Runtime::new(&RuntimeSettings::default(), clock).expect("engine configures")
}

async fn shard() -> Arc<MemoryShard> {
    let backend = MemoryBackend::new(Arc::new(SystemClock));
    let id = ShardId {
        pipeline: "t".into(),
        partition: 0,
    };
    Arc::new(backend.open_shard(&id).await.expect("memory shard opens"))
}

fn record(key: &str, value: &str, offset: i64) -> InputRecord {
    InputRecord {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        timestamp_ms: 0,
        headers: Vec::new(),
        topic: "t".into(),
        partition: 0,
        offset,
    }
}

/// Runs one batch and applies its effects; returns dispositions and emitted values.
async fn run_batch(
    operator: &Operator<MemoryShard>,
    instance: &mut Instance<MemoryShard>,
    shard: &Arc<MemoryShard>,
    records: Vec<InputRecord>,
) -> (Vec<Disposition>, Vec<serde_json::Value>) {
    let batch = prefetch(&**shard, &operator.meta().value_states, Arc::new(records))
        .await
        .expect("memory prefetch");
    let (dispositions, batch) = instance
        .call_batch(batch, Duration::from_secs(5))
        .await
        .expect("call succeeds");
    let (writes, emits) = batch.into_effects();
    shard.apply(writes).await.expect("memory apply");
    let values = emits
        .iter()
        .map(|e| serde_json::from_slice(&e.value).expect("emits are JSON"))
        .collect();
    (dispositions, values)
}

#[tokio::test]
async fn describe_is_read_when_the_operator_loads() {
    let op = runtime()
        .load_operator(&guest("weir_test_counter"))
        .await
        .expect("loads");
    assert_eq!(op.meta().name, "counter");
    assert_eq!(op.meta().value_states, vec!["count".to_owned()]);
}

#[tokio::test]
async fn bytes_that_are_not_wasm_are_refused_as_not_a_component() {
    let err = runtime()
        .load_operator_bytes(b"hello")
        .await
        .expect_err("refused");
    assert!(
        matches!(err, RuntimeError::InvalidComponent { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_core_module_is_refused_as_not_a_component() {
    // The smallest valid core module: magic and version 1.
    let err = runtime()
        .load_operator_bytes(b"\0asm\x01\0\0\0")
        .await
        .expect_err("refused");
    assert!(
        matches!(err, RuntimeError::InvalidComponent { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_component_of_another_world_is_refused_naming_what_is_missing() {
    // An empty component (layer 1): valid, but exports nothing.
    let err = runtime()
        .load_operator_bytes(b"\0asm\x0d\0\x01\0")
        .await
        .expect_err("refused");
    assert!(matches!(err, RuntimeError::WrongWorld { .. }), "{err}");
    assert!(err.to_string().contains("weir:operator"), "{err}");
}

#[tokio::test]
async fn records_of_one_key_in_one_batch_see_each_others_writes() {
    let rt = runtime();
    let op = rt
        .load_operator(&guest("weir_test_counter"))
        .await
        .expect("loads");
    let shard = shard().await;
    let mut inst = op
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    let (d, out) = run_batch(
        &op,
        &mut inst,
        &shard,
        vec![
            record("a", "x", 0),
            record("b", "x", 1),
            record("a", "x", 2),
        ],
    )
    .await;
    assert_eq!(d, vec![Disposition::Ok, Disposition::Ok, Disposition::Ok]);
    let counts: Vec<u64> = out
        .iter()
        .map(|v| v["count"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(counts, vec![1, 1, 2]);
    let (_, out) = run_batch(&op, &mut inst, &shard, vec![record("a", "x", 3)]).await;
    assert_eq!(out[0]["count"], 3, "state persisted across batches");
}

#[tokio::test]
async fn map_state_pages_merge_stored_and_staged_entries() {
    let rt = runtime();
    let op = rt.load_operator(&guest("word_count")).await.expect("loads");
    let shard = shard().await;
    let mut inst = op
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    let (_, out) = run_batch(&op, &mut inst, &shard, vec![record("doc", "a b a", 0)]).await;
    let counts: Vec<(String, u64)> = out
        .iter()
        .map(|v| {
            (
                v["word"].as_str().unwrap_or("").to_owned(),
                v["count"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        counts,
        vec![("a".into(), 1), ("b".into(), 1), ("a".into(), 2)]
    );
    let (_, out) = run_batch(
        &op,
        &mut inst,
        &shard,
        vec![record("doc", "B c", 1), record("other", "a", 2)],
    )
    .await;
    let counts: Vec<u64> = out
        .iter()
        .map(|v| v["count"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(
        counts,
        vec![2, 1, 1],
        "b continues from stored state; other key is separate"
    );
}

#[tokio::test]
async fn the_sandbox_grants_no_environment_clock_filesystem_or_network() {
    let rt = runtime();
    let op = rt
        .load_operator(&guest("weir_test_counter"))
        .await
        .expect("loads");
    let shard = shard().await;
    let mut inst = op
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    let (d, out) = run_batch(
        &op,
        &mut inst,
        &shard,
        vec![record("k", "probe:sandbox", 0)],
    )
    .await;
    assert_eq!(d, vec![Disposition::Ok]);
    let probe = &out[0];
    assert_eq!(probe["env_vars"], 0);
    assert_eq!(probe["args"], 0);
    assert_eq!(probe["now_ms"], 0, "wall clock frozen at the epoch");
    assert_eq!(probe["root_readable"], false);
    assert_eq!(probe["cwd_readable"], false);
    assert_eq!(probe["tcp_connect"], false);
}

#[tokio::test]
async fn a_trapped_call_applies_nothing_and_reports_the_trap() {
    let rt = runtime();
    let op = rt
        .load_operator(&guest("weir_test_counter"))
        .await
        .expect("loads");
    let shard = shard().await;
    let mut inst = op
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    let records = vec![record("a", "x", 0), record("a", "poison:trap", 1)];
    let batch = prefetch(&*shard, &op.meta().value_states, Arc::new(records))
        .await
        .expect("prefetch");
    let err = inst
        .call_batch(batch, Duration::from_secs(5))
        .await
        .expect_err("traps");
    assert!(
        err.to_string().contains("poison record at offset 1"),
        "{err}"
    );
    assert!(
        shard.is_empty(),
        "nothing of the trapped batch reached the shard"
    );
}

#[tokio::test]
async fn a_call_staging_more_than_its_byte_budget_traps() {
    let settings = RuntimeSettings {
        batch_staged_bytes_max: 300,
        ..RuntimeSettings::default()
    };
    let clock: SharedClock = Arc::new(SystemClock);
    let rt = Runtime::<MemoryShard>::new(&settings, clock).expect("engine configures");
    let op = rt.load_operator(&guest("word_count")).await.expect("loads");
    let shard = shard().await;
    let mut inst = op
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    let line = "one two three four five six seven eight nine ten";
    let batch = prefetch(
        &*shard,
        &op.meta().value_states,
        Arc::new(vec![record("doc", line, 0)]),
    )
    .await
    .expect("prefetch");
    let err = inst
        .call_batch(batch, Duration::from_secs(5))
        .await
        .expect_err("the budget stops it");
    assert!(
        matches!(&err, CallError::Trap { deadline: false, message } if message.contains("staged more than 300 bytes")),
        "a guest fault, not an outage: {err:?}"
    );
    assert!(shard.is_empty(), "nothing of the call reached the shard");
}
