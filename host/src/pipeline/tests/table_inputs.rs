//! Table inputs (docs/topologies.md, "Tables") over the memory source: a shard loads its
//! partition of the table before any stream record runs, a later update is seen by the records
//! after it and not by those before, an empty value clears a row, a partition handed over
//! (revoked, then assigned again) keeps its table, and a table never holds the watermark back.
//! The operator is native: per stream record it emits the table's row of the record's key.

use super::*;
use crate::runtime::bindings::{StateDescriptor, StateKind};
use crate::runtime::native::{NativeContext, NativeOperator, Rejected};
use crate::runtime::{InputRecord, OperatorInfo};

const PLANES: &str = "planes";

/// Emits `{"plane": row or null, "offset": o, "watermark": w}` per record: the value state
/// `plane` of its key, which the `planes` table fills.
#[derive(Debug)]
struct Lookup;

impl NativeOperator for Lookup {
    fn describe(&self) -> OperatorInfo {
        OperatorInfo {
            name: "lookup".into(),
            version: "0.1.0".into(),
            states: vec![StateDescriptor {
                name: "plane".into(),
                kind: StateKind::Value,
                ttl_ms: None,
                version: 0,
            }],
            outputs: Vec::new(),
        }
    }

    fn process(&self, ctx: &mut NativeContext<'_>, record: &InputRecord) -> Result<(), Rejected> {
        let plane = ctx
            .value_get("plane")
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let out = serde_json::json!({
            "plane": plane,
            "offset": record.offset,
        });
        ctx.emit(&record.key, serde_json::to_vec(&out)?);
        Ok(())
    }
}

/// The test pipeline's settings with `planes` a table into state `plane`.
fn table_settings() -> Settings {
    let mut settings = settings("at_least_once");
    settings.pipeline.input_topics = vec![TOPIC.to_owned(), PLANES.to_owned()];
    settings.pipeline.tables = [(PLANES.to_owned(), "plane".to_owned())].into();
    settings
}

/// Starts the lookup pipeline over `source` and `output`, checkpointing to `store`.
async fn start_lookup(
    settings: Settings,
    source: &MemorySource,
    output: &MemoryOutput,
    store: &Arc<InMemory>,
) -> Run {
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(MemoryBackend::durable(
        store.clone(),
        "weir".into(),
        clock.clone(),
    ));
    let runtime = Runtime::<<MemoryBackend as StateBackend>::Shard>::new(&settings.runtime, clock)
        .expect("runtime");
    let operator = Arc::new(
        runtime
            .native_operator(Arc::new(Lookup))
            .expect("a valid description"),
    );
    let stats = Arc::new(PipelineStats::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (requests, control) = PipelineControl::new();
    let task = tokio::spawn(run_with(
        settings,
        backend,
        operator,
        stats.clone(),
        control,
        Arc::new(source.clone()),
        Arc::new(output.clone()),
        async move {
            let _ = stopped.await;
        },
    ));
    Run {
        stats,
        requests,
        stop,
        task,
    }
}

/// Partition 0's outputs: (offset, the plane it saw), in output order.
fn planes_seen(output: &MemoryOutput) -> Vec<(i64, Option<String>)> {
    output
        .log()
        .outputs
        .iter()
        .filter(|w| w.partition == Partition(0))
        .map(|w| {
            let v: serde_json::Value = serde_json::from_slice(&w.value).expect("lookup JSON");
            (
                v["offset"].as_i64().expect("offset"),
                v["plane"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

fn world() -> (
    MemorySource,
    MemorySourceHandle,
    MemoryOutput,
    Arc<InMemory>,
) {
    let (source, handle) = MemorySource::new(&[TOPIC, PLANES]);
    let output = MemoryOutput::new(1 << 20, Some(handle.clone()));
    (source, handle, output, Arc::new(InMemory::new()))
}

/// Stream records produced before the table's rows still see them: the shard loads the
/// table to its end before any stream record runs. A row whose last value is empty is gone.
#[tokio::test(start_paused = true)]
async fn a_shard_loads_its_table_to_the_end_before_any_stream_record_runs() {
    let (source, handle, output, store) = world();
    for i in 0..10 {
        handle.produce(TOPIC, 0, format!("k{i}").as_bytes(), b"v", i);
    }
    for i in 0..5 {
        let plane = format!("N{i}");
        handle.produce(
            PLANES,
            0,
            format!("k{i}").as_bytes(),
            plane.as_bytes(),
            100 + i,
        );
    }
    // k1's row deleted (a tombstone), k3's replaced.
    handle.produce(PLANES, 0, b"k1", b"", 200);
    handle.produce(PLANES, 0, b"k3", b"N3b", 201);
    let run = start_lookup(table_settings(), &source, &output, &store).await;
    handle.assign(&[0]);
    until("every stream record's output", || {
        planes_seen(&output).len() == 10
    })
    .await;
    let expected: Vec<(i64, Option<String>)> = (0..10)
        .map(|i| {
            let plane = match i {
                0 | 2 | 4 => Some(format!("N{i}")),
                3 => Some("N3b".to_owned()),
                _ => None,
            };
            (i, plane)
        })
        .collect();
    assert_eq!(planes_seen(&output), expected);
    run.stop().await.expect("stops cleanly");
}

/// An update that arrives while the pipeline runs is seen by the stream records after it and
/// not by those before; after a restart the shard has it from its checkpoint.
#[tokio::test(start_paused = true)]
async fn a_table_update_is_seen_by_later_stream_records_only_and_survives_a_restart() {
    let (source, handle, output, store) = world();
    handle.produce(PLANES, 0, b"k0", b"old", 0);
    handle.produce(TOPIC, 0, b"k0", b"v", 0);
    let run = start_lookup(table_settings(), &source, &output, &store).await;
    handle.assign(&[0]);
    until("the first output", || planes_seen(&output).len() == 1).await;
    handle.produce(PLANES, 0, b"k0", b"new", 1);
    // Applied and checkpointed: the group's offset of the table moved past the update.
    until("the update is checkpointed", || {
        handle
            .committed()
            .get(&(PLANES.to_owned(), 0))
            .is_some_and(|(next, _)| *next == 2)
    })
    .await;
    handle.produce(TOPIC, 0, b"k0", b"v", 1);
    until("the second output", || planes_seen(&output).len() == 2).await;
    run.stop().await.expect("stops cleanly");
    let run = start_lookup(table_settings(), &source, &output, &store).await;
    handle.assign(&[0]);
    handle.produce(TOPIC, 0, b"k0", b"v", 2);
    until("the third output", || planes_seen(&output).len() == 3).await;
    assert_eq!(
        planes_seen(&output),
        vec![
            (0, Some("old".to_owned())),
            (1, Some("new".to_owned())),
            (2, Some("new".to_owned())),
        ]
    );
    run.stop().await.expect("stops cleanly");
}

/// A rescale's handover — the partition revoked (its shard closes) and then assigned again,
/// as to the host that takes it over — reopens the shard with its table from its last
/// checkpoint: the rows it had, and an update made while no one held the partition, are seen
/// by the records after.
#[tokio::test(start_paused = true)]
async fn a_revoked_table_partition_reopens_with_its_rows_and_sees_updates_made_meanwhile() {
    let (source, handle, output, store) = world();
    handle.produce(PLANES, 0, b"k0", b"old", 0);
    handle.produce(PLANES, 0, b"k1", b"one", 1);
    handle.produce(TOPIC, 0, b"k0", b"v", 0);
    let run = start_lookup(table_settings(), &source, &output, &store).await;
    handle.assign(&[0]);
    until("the first output", || planes_seen(&output).len() == 1).await;
    handle.revoke(&[0]);
    until("a checkpoint of both topics", || {
        let committed = handle.committed();
        let next = |topic: &str| committed.get(&(topic.to_owned(), 0)).map(|(n, _)| *n);
        next(TOPIC) == Some(1) && next(PLANES) == Some(2)
    })
    .await;
    handle.produce(PLANES, 0, b"k0", b"new", 2);
    handle.produce(TOPIC, 0, b"k0", b"v", 1);
    handle.produce(TOPIC, 0, b"k1", b"v", 2);
    handle.assign(&[0]);
    until("the outputs after the handover", || {
        planes_seen(&output).len() == 3
    })
    .await;
    assert_eq!(
        planes_seen(&output),
        vec![
            (0, Some("old".to_owned())),
            (1, Some("new".to_owned())),
            (2, Some("one".to_owned())),
        ]
    );
    run.stop().await.expect("stops cleanly");
}

/// A pipeline whose table fills a state its operator does not declare refuses to start,
/// naming the table and the states it does declare.
#[tokio::test(start_paused = true)]
async fn a_table_into_a_state_the_operator_does_not_declare_refuses_to_start() {
    let (source, _handle, output, store) = world();
    let mut settings = table_settings();
    settings.pipeline.tables = [(PLANES.to_owned(), "planes".to_owned())].into();
    let run = start_lookup(settings, &source, &output, &store).await;
    let err = run.task.await.expect("no panic").expect_err("refused");
    let message = err.to_string();
    assert!(
        message.contains("table `planes` fills state `planes`") && message.contains(r#"["plane"]"#),
        "{message}"
    );
}

/// A table's records never hold the watermark back: it follows the stream alone, though the
/// table's records are older and the table gets no more.
#[tokio::test(start_paused = true)]
async fn a_table_never_holds_the_watermark_back() {
    let (source, handle, output, store) = world();
    handle.produce(PLANES, 0, b"k0", b"N0", 5);
    for i in 0..10 {
        handle.produce(TOPIC, 0, format!("k{i}").as_bytes(), b"v", 10_000 + i);
    }
    let run = start_lookup(table_settings(), &source, &output, &store).await;
    handle.assign(&[0]);
    until("the stream's watermark", || {
        run.stats
            .watermarks
            .lock()
            .expect("watermarks")
            .get(&Partition(0))
            .is_some_and(|w| *w >= 10_000)
    })
    .await;
    run.stop().await.expect("stops cleanly");
}
