//! The Wasm runtime without Kafka: loading refuses what is not an operator, batches see their
//! own staged writes, map state pages merge staged and stored entries, and the sandbox grants
//! nothing (no environment, clock, filesystem or network).

use std::sync::Arc;
use std::time::Duration;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::RuntimeSettings;
use weir_host::ids::Partition;
use weir_host::pipeline::prefetch;
use weir_host::runtime::{
    BatchCtx, CallError, Disposition, FiredTimer, InputRecord, Instance, Operator, Runtime,
    RuntimeError, TimeDomain,
};
use weir_host::state::memory::{MemoryBackend, MemoryShard};
use weir_host::state::{Shard, ShardId, StateBackend};
use weir_tests::{guest, runtime_settings};

fn runtime() -> Runtime<MemoryShard> {
    let clock: SharedClock = Arc::new(SystemClock);
    Runtime::new(&RuntimeSettings::default(), clock).expect("engine configures")
}

/// [`runtime`], with compiled components kept in the tests' shared directory.
fn cached_runtime() -> Runtime<MemoryShard> {
    let clock: SharedClock = Arc::new(SystemClock);
    Runtime::new(&runtime_settings(), clock).expect("engine configures")
}

async fn shard() -> Arc<MemoryShard> {
    let backend = MemoryBackend::new(Arc::new(SystemClock));
    let id = ShardId {
        pipeline: "t".into(),
        partition: Partition(0),
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
        input: 0,
    }
}

/// Runs one batch and applies its effects; returns dispositions and emitted values.
async fn run_batch(
    operator: &Operator<MemoryShard>,
    instance: &mut Instance<MemoryShard>,
    shard: &Arc<MemoryShard>,
    records: Vec<InputRecord>,
) -> (Vec<Disposition>, Vec<serde_json::Value>) {
    let (dispositions, emits) = run_batch_emits(operator, instance, shard, records).await;
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
        matches!(&err, CallError::Trap { deadline: false, message, .. } if message.contains("staged more than 300 bytes")),
        "a guest fault, not an outage: {err:?}"
    );
    assert!(shard.is_empty(), "nothing of the call reached the shard");
}

/// Compiling a component is seconds of CPU for a large one (a Python operator carries CPython):
/// it must not hold the async runtime's thread, or every other pipeline and API request on the
/// host stalls meanwhile. On a single-threaded runtime, a task that only yields must keep
/// running while an operator loads.
#[test]
fn compiling_an_operator_leaves_the_async_runtime_free_for_other_tasks() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime builds");
    rt.block_on(async {
        let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        });
        let operator = runtime().load_operator(&guest("flight_delays")).await;
        let during = ticks.load(std::sync::atomic::Ordering::Relaxed);
        ticker.abort();
        assert_eq!(operator.expect("loads").meta().name, "flight-delays");
        // Blocking the thread would leave the ticker a handful of polls (one per yield of the
        // load itself); compiling elsewhere leaves it the whole compile time.
        assert!(
            during >= 1_000,
            "the ticker ran {during} times while the operator loaded"
        );
    });
}

/// The Python operator (componentize-py, CPython inside) through the real component: its
/// description, processed records, and records refused by a Python exception, which dead-letter
/// only themselves with the exception's type and message and leave the state untouched.
#[tokio::test]
async fn a_python_operator_processes_records_and_refuses_those_that_raise() {
    // The component compiled once for every test that loads it.
    let rt = cached_runtime();
    let op = rt
        .load_operator(&guest("flight_delays_py"))
        .await
        .expect("loads");
    assert_eq!(op.meta().name, "flight-delays");
    assert_eq!(op.meta().version, "0.1.0");
    assert_eq!(op.meta().value_states, vec!["route-stats".to_owned()]);
    let shard = shard().await;
    let mut inst = op
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    let flight = r#"{"origin":"JFK","dest":"LAX","arr_delay":7}"#;
    let (d, out) = run_batch(
        &op,
        &mut inst,
        &shard,
        vec![
            record("JFK-LAX", flight, 0),
            record("JFK-LAX", "not json", 1),
            record("JFK-LAX", r#"{"origin":"JFK"}"#, 2),
            record("JFK-LAX", flight, 3),
        ],
    )
    .await;
    assert_eq!(d[0], Disposition::Ok);
    assert_eq!(d[3], Disposition::Ok);
    let reason = |d: &Disposition| match d {
        Disposition::Reject(reason) => reason.clone(),
        Disposition::Ok => panic!("processed, not refused"),
    };
    assert!(
        reason(&d[1]).starts_with("JSONDecodeError: Expecting value"),
        "{d:?}"
    );
    assert!(reason(&d[2]).starts_with("KeyError: 'dest' (at "), "{d:?}");
    assert_eq!(
        out,
        vec![
            serde_json::json!({"route": "JFK-LAX", "flights": 1, "delay_count": 1,
                "delay_sum": 7, "delay_max": 7, "delay_mean": 7.0}),
            serde_json::json!({"route": "JFK-LAX", "flights": 2, "delay_count": 2,
                "delay_sum": 14, "delay_max": 7, "delay_mean": 7.0}),
        ]
    );
}

/// A host keeps compiled components in its compiled directory: a restarted host (a new
/// runtime on the same directory) loads the operator without compiling it, and an artifact
/// that does not load (damaged) is compiled again and replaced.
#[tokio::test]
async fn a_restarted_host_loads_compiled_operators_from_its_compiled_directory() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let load = || async {
        runtime()
            .with_compiled_dir(dir.path().to_owned())
            .load_operator(&guest("weir_test_counter"))
            .await
            .expect("loads")
    };
    let first = load().await;
    assert!(!first.from_compiled_dir(), "nothing compiled yet");
    let artifacts: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".lock"))
        .collect();
    assert_eq!(artifacts.len(), 1, "{artifacts:?}");
    assert!(artifacts[0].to_string_lossy().ends_with(".cwasm"));

    let restarted = load().await;
    assert!(restarted.from_compiled_dir());
    assert_eq!(restarted.meta().name, "counter");
    let shard = shard().await;
    let mut inst = restarted
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    let (d, out) = run_batch(&restarted, &mut inst, &shard, vec![record("a", "x", 0)]).await;
    assert_eq!(d, vec![Disposition::Ok]);
    assert_eq!(out[0]["count"], 1);

    let bytes = std::fs::read(&artifacts[0]).expect("artifact reads");
    std::fs::write(&artifacts[0], &bytes[..bytes.len() / 2]).expect("artifact truncates");
    let after_damage = load().await;
    assert!(
        !after_damage.from_compiled_dir(),
        "a damaged artifact is not used"
    );
    assert_eq!(
        std::fs::read(&artifacts[0]).expect("artifact reads").len(),
        bytes.len(),
        "and is replaced whole"
    );
    assert!(load().await.from_compiled_dir());
}

/// Loads of one component at once (the tests of one binary, or several hosts sharing the
/// directory) compile it once: the others wait for it and load its file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_of_one_component_compile_it_once() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let loads = (0..4).map(|_| {
        let dir = dir.path().to_owned();
        tokio::spawn(async move {
            runtime()
                .with_compiled_dir(dir)
                .load_operator(&guest("weir_test_counter"))
                .await
                .expect("loads")
                .from_compiled_dir()
        })
    });
    let mut from_dir = Vec::new();
    for load in loads.collect::<Vec<_>>() {
        from_dir.push(load.await.expect("no panic"));
    }
    assert_eq!(
        from_dir.iter().filter(|loaded| !**loaded).count(),
        1,
        "one compile, three loads: {from_dir:?}"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("directory reads") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Runs one batch through `call_batch` and applies its writes; returns dispositions and the
/// emits with their keys and headers.
async fn run_batch_emits(
    operator: &Operator<MemoryShard>,
    instance: &mut Instance<MemoryShard>,
    shard: &Arc<MemoryShard>,
    records: Vec<InputRecord>,
) -> (Vec<Disposition>, Vec<weir_host::runtime::StagedEmit>) {
    let batch = prefetch(&**shard, &operator.meta().value_states, Arc::new(records))
        .await
        .expect("memory prefetch");
    let (dispositions, batch) = instance
        .call_batch(batch, Duration::from_secs(5))
        .await
        .expect("call succeeds");
    let (writes, emits) = batch.into_effects();
    shard.apply(writes).await.expect("memory apply");
    (dispositions, emits)
}

/// Every host import through the Python SDK, in the real component (`tests/guests/python`):
/// value state (JSON and raw bytes), `get_many`, `clear`, map state across more than one page,
/// `del` and `discard`, emit with headers, logging, and the host's refusals as rejections.
#[tokio::test]
async fn the_python_sdk_reaches_every_host_import() {
    // The component compiled once for every test that loads it.
    let rt = cached_runtime();
    let op = rt
        .load_operator(&guest("sdk_probe_py"))
        .await
        .expect("loads");
    assert_eq!(op.meta().name, "sdk-probe");
    let shard = shard().await;
    let mut inst = op
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    // 300 words: more than one page (256) of the map.
    let mut records: Vec<_> = (0..300)
        .map(|i| record("k", &format!("add w{i:03}"), i))
        .collect();
    records.push(record("k", "add w000", 300));
    let (d, emits) = run_batch_emits(&op, &mut inst, &shard, records).await;
    assert!(d.iter().all(|d| *d == Disposition::Ok), "{d:?}");
    assert_eq!(emits.len(), 301);
    let last = emits.last().expect("emits");
    assert_eq!((&last.key[..], &last.value[..]), (&b"k"[..], &b"301"[..]));
    assert_eq!(last.headers.len(), 1);
    assert_eq!(
        (&last.headers[0].name[..], &last.headers[0].value[..]),
        ("word", &b"w000"[..])
    );

    let commands = [
        "dump w000",
        "remove w001",
        "remove w001",
        "dump w001",
        "clear w002",
        "dump w002",
        "undeclared",
        "big",
        "log hello",
        "lazy-import",
    ];
    let mut records: Vec<_> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| record("k", c, 301 + i as i64))
        .collect();
    records.push(record("other", "dump x", 400));
    let (d, emits) = run_batch_emits(&op, &mut inst, &shard, records).await;
    let reason = |i: usize| match &d[i] {
        Disposition::Reject(reason) => reason.clone(),
        Disposition::Ok => format!("{} was processed", commands[i]),
    };
    for ok in [0, 1, 3, 4, 5, 8, 10] {
        assert_eq!(d[ok], Disposition::Ok, "{ok}: {d:?}");
    }
    assert!(reason(2).starts_with("KeyError: 'w001'"), "{}", reason(2));
    assert_eq!(reason(6), "state error: undeclared state `nope`");
    assert_eq!(
        reason(7),
        "emit error: output for this record exceeds the limit of 1000000 bytes"
    );
    // Nothing is imported at run time: there is no filesystem to import from.
    assert!(
        reason(9).starts_with("ModuleNotFoundError: No module named 'decimal'"),
        "{}",
        reason(9)
    );
    let dumps: Vec<serde_json::Value> = emits
        .iter()
        .map(|e| serde_json::from_slice(&e.value).expect("dumps are JSON"))
        .collect();
    assert_eq!(
        dumps,
        vec![
            serde_json::json!({"count": 301, "last": "w000", "len": 300, "first": "w000",
                "items": 301, "has": true}),
            serde_json::json!({"count": 301, "last": "w000", "len": 299, "first": "w000",
                "items": 300, "has": false}),
            serde_json::json!({"count": null, "last": "w000", "len": 298, "first": "w000",
                "items": 299, "has": false}),
            serde_json::json!({"count": null, "last": null, "len": 0, "first": null,
                "items": 0, "has": false}),
        ]
    );
    assert_eq!(emits[3].key, b"other");

    // Bytes-like and None keys and values, input headers forwarded, wrong types refused
    // without a trap, any log level, and `SystemExit` as a rejection.
    let mut forward = record("k", "forward", 401);
    forward.headers = vec![weir_host::runtime::Header {
        name: "trace".into(),
        value: b"abc".to_vec(),
    }];
    let records = vec![
        forward,
        record("k", "bad-emit", 402),
        record("k", "levels", 403),
        record("k", "exit", 404),
    ];
    let (d, emits) = run_batch_emits(&op, &mut inst, &shard, records).await;
    assert_eq!(d[0], Disposition::Ok);
    assert_eq!(d[2], Disposition::Ok);
    assert!(
        matches!(&d[1], Disposition::Reject(r) if r.starts_with("TypeError: emit takes bytes, str or None, not int")),
        "{d:?}"
    );
    assert!(
        matches!(&d[3], Disposition::Reject(r) if r.starts_with("SystemExit: 3")),
        "{d:?}"
    );
    assert_eq!(emits.len(), 1);
    assert_eq!(
        (&emits[0].key[..], &emits[0].value[..]),
        (&b""[..], &b"forwarded"[..])
    );
    assert_eq!(emits[0].headers.len(), 1);
    assert_eq!(
        (
            &emits[0].headers[0].name[..],
            &emits[0].headers[0].value[..]
        ),
        ("trace", &b"abc"[..])
    );

    // A loop that never returns ends at the CPU deadline, as a Rust one does.
    let batch = prefetch(
        &*shard,
        &op.meta().value_states,
        Arc::new(vec![record("k", "spin", 500)]),
    )
    .await
    .expect("memory prefetch");
    match inst.call_batch(batch, Duration::from_millis(200)).await {
        Err(CallError::Trap { deadline, .. }) => assert!(deadline),
        other => panic!("expected a deadline trap, got {:?}", other.map(|(d, _)| d)),
    }
    python_timers(&op, &shard).await;
}

/// Timers through the Python SDK's WIT bindings: `set_timer`, `timer`, `watermark` and
/// `processing_time` in a record's call, and `on_timer` in an `on-timers` call.
async fn python_timers(op: &Operator<MemoryShard>, shard: &Arc<MemoryShard>) {
    let mut inst = op
        .instantiate(Some(shard.clone()), "t/0".into())
        .await
        .expect("instantiates");
    let records = Arc::new(vec![
        record("t", "timer 42", 600),
        record("t", "timer-get", 601),
    ]);
    let mut batch = prefetch(&**shard, &op.meta().value_states, records)
        .await
        .expect("memory prefetch");
    batch.set_time(Some(7), 1_000);
    let (d, batch) = inst
        .call_batch(batch, Duration::from_secs(5))
        .await
        .expect("call succeeds");
    assert!(d.iter().all(|d| *d == Disposition::Ok), "{d:?}");
    let (writes, emits) = batch.into_effects();
    shard.apply(writes).await.expect("memory apply");
    let seen: serde_json::Value = serde_json::from_slice(&emits[0].value).expect("JSON");
    assert_eq!(
        seen,
        serde_json::json!({"timer": [42, "event-time"], "watermark": 7, "now": 1000})
    );
    let fired = FiredTimer {
        key: b"t".to_vec(),
        name: "probe".into(),
        time_ms: 42,
        domain: TimeDomain::EventTime,
    };
    let batch = BatchCtx::for_timers(Arc::new(vec![fired]));
    let (d, batch) = inst
        .call_timers(batch, Duration::from_secs(5))
        .await
        .expect("call succeeds");
    assert_eq!(d, [Disposition::Ok]);
    let (writes, emits) = batch.into_effects();
    let fired: serde_json::Value = serde_json::from_slice(&emits[0].value).expect("JSON");
    assert_eq!(
        fired,
        serde_json::json!({"fired": "probe", "at": 42, "domain": "event-time", "count": null})
    );
    assert_eq!(emits[0].key, b"t");
    assert!(
        writes
            .iter()
            .any(|w| w.value.is_some() && w.key.ends_with(b"again")),
        "on_timer set a timer of its own"
    );
}
