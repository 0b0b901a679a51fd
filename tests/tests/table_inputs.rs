//! A table input over the real broker (docs/topologies.md, "Tables"): a shard reads its
//! partition of the table outside the consumer group up to its end before any stream record
//! runs, and the updates that come later reach it through the group. The operator is native
//! (as `weir bench`'s baseline): per stream record it emits the table's row of its key.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::pipeline::{PipelineControl, PipelineStats};
use weir_host::runtime::bindings::{StateDescriptor, StateKind};
use weir_host::runtime::native::{NativeContext, NativeOperator, Rejected};
use weir_host::runtime::{InputRecord, OperatorInfo, Runtime};
use weir_host::state::StateBackend;
use weir_host::state::configured::ConfiguredBackend;
use weir_tests::*;

/// Emits `{"plane": row or null}` per record: the value state `plane` of its key.
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
        ctx.emit(
            &record.key,
            serde_json::to_vec(&serde_json::json!({ "plane": plane }))?,
        );
        Ok(())
    }
}

/// The plane each output saw, by key, in output order.
async fn planes_seen(
    output: &str,
    expected: usize,
) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let read = read_exactly(output, expected, Duration::from_secs(60), Duration::ZERO).await?;
    read.iter()
        .map(|m| {
            use rdkafka::Message;
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())?;
            Ok((key, v["plane"].as_str().map(str::to_owned)))
        })
        .collect()
}

/// A running pipeline: what stops it (send or drop) and its task.
type Started = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), weir_host::pipeline::PipelineError>>,
);

/// Runs `logic` as the pipeline of `settings` (its state backend as configured) until the
/// sender is used or dropped.
fn start_native(
    settings: weir_host::config::Settings,
    logic: Arc<dyn NativeOperator>,
) -> anyhow::Result<Started> {
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(ConfiguredBackend::from_settings(
        &settings.state,
        clock.clone(),
    )?);
    let runtime =
        Runtime::<<ConfiguredBackend as StateBackend>::Shard>::new(&settings.runtime, clock)?;
    let operator = Arc::new(runtime.native_operator(logic)?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (_requests, control) = PipelineControl::new();
    let pipeline = tokio::spawn(weir_host::runner::run_operator(
        settings,
        backend,
        operator,
        Arc::new(PipelineStats::default()),
        control,
        async move {
            let _ = stopped.await;
        },
    ));
    Ok((stop, pipeline))
}

fn key(i: i32) -> Vec<u8> {
    format!("k{i}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_is_read_from_the_broker_before_stream_records_and_updated_as_they_run()
-> anyhow::Result<()> {
    init_tracing();
    let (input, planes, output, dlq) =
        (unique("in"), unique("planes"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 2), (&planes, 2), (&output, 1), (&dlq, 1)]).await?;
    // The table's rows, key `k{i}` in partition i % 2; k1's deleted, k3's replaced. Then the
    // stream records, all before the pipeline starts.
    for i in 0..10 {
        produce(&planes, i % 2, &[(key(i), format!("P{i}").into_bytes())]).await?;
    }
    produce(
        &planes,
        1,
        &[(key(1), Vec::new()), (key(3), b"P3b".to_vec())],
    )
    .await?;
    for i in 0..10 {
        produce(&input, i % 2, &[(key(i), b"v".to_vec())]).await?;
    }
    let mut settings = settings(PathBuf::new(), &input, &output, &dlq, runtime_settings());
    settings.pipeline.input_topics.push(planes.clone());
    settings.pipeline.tables = [(planes.clone(), "plane".to_owned())].into();
    settings.pipeline.checkpoint_interval = Duration::from_millis(300);
    settings.state.memory.url = Some("memory:///".to_owned());
    let group = settings.pipeline.group_id();
    let (stop, pipeline) = start_native(settings, Arc::new(Lookup))?;

    let mut seen = planes_seen(&output, 10).await?;
    seen.sort();
    let expected: Vec<(String, Option<String>)> = (0..10)
        .map(|i| {
            let plane = match i {
                1 => None,
                3 => Some("P3b".to_owned()),
                _ => Some(format!("P{i}")),
            };
            (format!("k{i}"), plane)
        })
        .collect();
    assert_eq!(
        seen, expected,
        "every row there at the start, whatever came first"
    );

    // An update of k0 (partition 0's sixth table record), applied and checkpointed — the
    // group's offset of the table moves past it — before the next k0 record is produced.
    produce(&planes, 0, &[(key(0), b"P0new".to_vec())]).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed_offsets(&group, &planes, 2)?[0] != Some(6) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the table's update was not checkpointed in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    produce(&input, 0, &[(key(0), b"v".to_vec())]).await?;
    let seen = planes_seen(&output, 11).await?;
    assert_eq!(seen[10], ("k0".to_owned(), Some("P0new".to_owned())));
    let _ = stop.send(());
    pipeline.await??;
    Ok(())
}

/// Emits `{"plane": row or null}` per flight: the row of the global table `planes` whose key
/// is the record's value (a tail number), not its key.
#[derive(Debug)]
struct GlobalLookup;

impl NativeOperator for GlobalLookup {
    fn describe(&self) -> OperatorInfo {
        OperatorInfo {
            name: "global-lookup".into(),
            version: "0.1.0".into(),
            states: Vec::new(),
            outputs: Vec::new(),
        }
    }

    fn process(&self, ctx: &mut NativeContext<'_>, record: &InputRecord) -> Result<(), Rejected> {
        let plane = ctx
            .lookup("planes", &record.value)
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        ctx.emit(
            &record.key,
            serde_json::to_vec(&serde_json::json!({ "plane": plane }))?,
        );
        Ok(())
    }
}

/// Produces `records` to `topic` partition 0 in a transaction that is aborted.
fn produce_aborted(topic: &str, records: &[(&[u8], &[u8])]) -> anyhow::Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("transactional.id", unique("aborting"))
        .create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    producer.begin_transaction()?;
    for (key, value) in records {
        producer
            .send(BaseRecord::to(topic).partition(0).key(*key).payload(*value))
            .map_err(|(err, _)| err)?;
    }
    producer.flush(Duration::from_secs(30))?;
    producer.abort_transaction(Duration::from_secs(30))?;
    Ok(())
}

/// A global table over the real broker (docs/topologies.md, "Global tables"): every partition
/// read outside the group to its end before any flight runs, committed records only, looked up
/// by a key that is not the flight's; a later update reaches the flights after it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_table_is_read_whole_from_the_broker_before_the_stream_and_kept_up_to_date()
-> anyhow::Result<()> {
    init_tracing();
    let (input, planes, output, dlq) =
        (unique("in"), unique("planes"), unique("out"), unique("dlq"));
    create_topics(&[(&input, 2), (&planes, 3), (&output, 1), (&dlq, 1)]).await?;
    for i in 0..9 {
        produce(
            &planes,
            i % 3,
            &[(format!("N{i}").into_bytes(), format!("P{i}").into_bytes())],
        )
        .await?;
    }
    produce(&planes, 1, &[(b"N1".to_vec(), Vec::new())]).await?;
    produce_aborted(&planes, &[(b"N0", b"aborted"), (b"N99", b"aborted")])?;
    // Flight f{i} flies N{i}, in the stream's partition (i + 1) % 2: rarely the table's.
    for i in 0..10 {
        let flight = format!("f{i}").into_bytes();
        produce(
            &input,
            (i + 1) % 2,
            &[(flight, format!("N{i}").into_bytes())],
        )
        .await?;
    }
    let mut settings = settings(PathBuf::new(), &input, &output, &dlq, runtime_settings());
    settings.pipeline.global_tables = [(planes.clone(), "planes".to_owned())].into();
    settings.state.memory.url = Some("memory:///".to_owned());
    let (stop, pipeline) = start_native(settings, Arc::new(GlobalLookup))?;

    let mut seen = planes_seen(&output, 10).await?;
    seen.sort();
    let expected: Vec<(String, Option<String>)> = (0..10)
        .map(|i| {
            let plane = (i != 1 && i != 9).then(|| format!("P{i}"));
            (format!("f{i}"), plane)
        })
        .collect();
    assert_eq!(
        seen, expected,
        "every committed row of every partition there at the start; N1 deleted, N9 never there, the aborted N0 not seen"
    );

    // N9 arrives: flights of N9 go on until one sees it (the table's reader and the group's
    // consumer are not in step), and none after that misses it.
    produce(&planes, 2, &[(b"N9".to_vec(), b"P9".to_vec())]).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 10;
    loop {
        let flight = format!("g{n}").into_bytes();
        produce(&input, 0, &[(flight, b"N9".to_vec())]).await?;
        n += 1;
        let seen = planes_seen(&output, n).await?;
        if seen[n - 1].1.as_deref() == Some("P9") {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the update was not seen in 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    produce(&input, 1, &[(b"last".to_vec(), b"N9".to_vec())]).await?;
    let seen = planes_seen(&output, n + 1).await?;
    assert_eq!(seen[n], ("last".to_owned(), Some("P9".to_owned())));
    let _ = stop.send(());
    pipeline.await??;
    Ok(())
}
