use super::*;
use crate::clock::ManualClock;
use crate::ids::{ManifestVersion, Offset, Partition};
use crate::state::configured::ConfiguredShard;
use crate::state::lsm::backend::LsmBackend;
use crate::state::memory::MemoryBackend;
use crate::state::stored::CheckpointFormat;
use crate::state::test_support::block_on;
use crate::state::{Shard, ShardId, StateBackend, StateWrite};
use object_store::memory::InMemory;
use proptest::prelude::*;

/// A shard's state: entries (encoded key → value, expiry), timers ((record key, name) →
/// (domain, time)), the watermark, and the next input offset.
#[derive(Debug, Clone)]
struct State {
    entries: BTreeMap<Vec<u8>, (Vec<u8>, Option<u64>)>,
    timers: BTreeMap<(Vec<u8>, String), (TimeDomain, i64)>,
    watermark_ms: Option<i64>,
    /// The Iceberg sink's pending list: one entry of this checkpoint version, if any.
    iceberg_pending: Option<u64>,
    /// A stage's edge state: one upstream shard's frontier, if any (`crate::time::edge`).
    edges_frontier: Option<i64>,
    next_offset: i64,
}

impl State {
    /// The writes that hold it, with what the backends derive (time index, count).
    fn writes(&self) -> Vec<StateWrite> {
        let put = |key: Vec<u8>, value: Vec<u8>, expires_at_ms| StateWrite {
            key,
            value: Some(Bytes::from(value)),
            expires_at_ms,
        };
        let mut out: Vec<StateWrite> = self
            .entries
            .iter()
            .map(|(k, (v, e))| put(k.clone(), v.clone(), *e))
            .collect();
        for ((key, name), (domain, time)) in &self.timers {
            out.push(put(
                time_keys::per_key(key, name),
                time_keys::per_key_value(*domain, *time),
                None,
            ));
            out.push(put(
                time_keys::time_index(*domain, *time, key, name),
                Vec::new(),
                None,
            ));
        }
        if !self.timers.is_empty() {
            out.push(put(
                time_keys::TIMER_COUNT_KEY.to_vec(),
                (self.timers.len() as u64).to_be_bytes().to_vec(),
                None,
            ));
        }
        if let Some(version) = self.iceberg_pending {
            let list = format!(
                r#"{{"entries":[{{"version":{version},"files":["{{\"file-path\":\"s3://b/w/t/f.parquet\"}}"]}}]}}"#
            );
            out.push(put(
                crate::sink::iceberg::shard::PENDING_KEY.to_vec(),
                list.into_bytes(),
                None,
            ));
        }
        if let Some(next) = self.edges_frontier {
            let state = crate::time::edge::EdgeState {
                edges: BTreeMap::from([(
                    "t.edge".to_owned(),
                    vec![crate::time::edge::UpstreamState {
                        shard: 1,
                        watermark: Some((next, false)),
                        frontier: vec![(crate::time::edge::TopicKey(7), next)],
                    }],
                )]),
            };
            out.push(put(
                crate::time::edge::EDGES_KEY.to_vec(),
                state.to_bytes(),
                None,
            ));
        }
        if let Some(ms) = self.watermark_ms {
            out.push(put(
                time_keys::WATERMARK_KEY.to_vec(),
                ms.to_be_bytes().to_vec(),
                None,
            ));
        }
        out
    }

    fn offsets(&self) -> InputOffsets {
        let mut offsets = InputOffsets::new();
        offsets.advance("t.in", Offset(self.next_offset - 1));
        offsets
    }
}

fn record_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[a-z0-9]{0,6}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..6),
    ]
}

fn state() -> impl Strategy<Value = State> {
    let entry = (
        record_key(),
        "[a-z][a-z0-9_]{0,5}",
        proptest::collection::vec(any::<u8>(), 0..4),
        proptest::collection::vec(any::<u8>(), 0..40),
        proptest::option::of(1u64..1_000_000_000_000),
    )
        .prop_map(|(k, name, map_key, value, expiry)| {
            (key::map_key(&k, &name, &map_key), (value, expiry))
        });
    let timer = (
        (record_key(), "[a-z]{1,5}"),
        (
            prop_oneof![
                Just(TimeDomain::EventTime),
                Just(TimeDomain::ProcessingTime)
            ],
            any::<i64>(),
        ),
    );
    (
        proptest::collection::vec(entry, 0..150),
        proptest::collection::btree_map(timer.0, timer.1, 0..20),
        proptest::option::of(any::<i64>()),
        proptest::option::of(1u64..1_000_000),
        proptest::option::of(0i64..1_000_000),
        1i64..1_000_000,
    )
        .prop_map(
            |(entries, timers, watermark_ms, iceberg_pending, edges_frontier, next_offset)| State {
                entries: entries.into_iter().collect(),
                timers,
                watermark_ms,
                iceberg_pending,
                edges_frontier,
                next_offset,
            },
        )
}

fn store_and_clock() -> (Arc<dyn ObjectStore>, SharedClock) {
    (Arc::new(InMemory::new()), Arc::new(ManualClock::new(0)))
}

fn lsm(store: &Arc<dyn ObjectStore>, clock: &SharedClock) -> LsmBackend {
    LsmBackend::new(
        store.clone(),
        Path::from("lsm"),
        Arc::new(BlockCaches::none()),
        crate::state::lsm::tests::small_settings(),
        clock.clone(),
    )
}

fn id(pipeline: &str) -> ShardId {
    ShardId {
        pipeline: pipeline.into(),
        partition: Partition(2),
    }
}

/// Writes `state` into a new shard `pipeline` on `backend` and checkpoints it; its root and
/// checkpoint.
async fn checkpointed(
    store: &Arc<dyn ObjectStore>,
    clock: &SharedClock,
    backend: &str,
    pipeline: &str,
    state: &State,
) -> (Path, Manifest) {
    let shard = open(store, clock, backend, pipeline).await;
    shard.apply(state.writes()).await.expect("applies");
    let version = shard
        .checkpoint(&state.offsets(), DecidedBy::Manifest)
        .await
        .expect("checkpoints")
        .expect("durable")
        .version;
    let root = id(pipeline).root_under(&Path::from(backend));
    let manifest = ManifestStore::new(store.clone(), root.clone())
        .read(version)
        .await
        .expect("reads");
    (root, manifest)
}

async fn open(
    store: &Arc<dyn ObjectStore>,
    clock: &SharedClock,
    backend: &str,
    pipeline: &str,
) -> ConfiguredShard {
    match backend {
        "lsm" => ConfiguredShard::Lsm(Box::new(
            lsm(store, clock)
                .open_shard(&id(pipeline))
                .await
                .expect("opens"),
        )),
        _ => ConfiguredShard::Memory(Box::new(
            MemoryBackend::durable(store.clone(), Path::from("memory"), clock.clone())
                .open_shard(&id(pipeline))
                .await
                .expect("opens"),
        )),
    }
}

async fn all(shard: &ConfiguredShard) -> Vec<(Vec<u8>, Bytes)> {
    shard.scan(&[], None, usize::MAX).await.expect("scans")
}

async fn text(store: &Arc<dyn ObjectStore>, path: &Path) -> String {
    let bytes = store
        .get(path)
        .await
        .expect("gets")
        .bytes()
        .await
        .expect("reads");
    String::from_utf8(bytes.to_vec()).expect("UTF-8")
}

/// Exports `state` from `from`, imports it into `into`, and checks the imported shard: the
/// same entries (raw keys, the derived timer index and count included), expiries, timers,
/// watermark and offsets — its own export equals the first but for the header's source.
async fn round_trip(state: &State, from: &str, into: &str) {
    let (store, clock) = store_and_clock();
    let (root, manifest) = checkpointed(&store, &clock, from, "t.a", state).await;
    let exported = Path::from("exports/a.jsonl");
    let summary = export_checkpoint(
        &store,
        (&root, &manifest),
        (from, Partition(2)),
        &exported,
        &clock,
    )
    .await
    .expect("exports");
    assert_eq!(summary.entries, state.entries.len() as u64);
    assert_eq!(summary.timers, state.timers.len() as u64);
    let target = id("t.b").root_under(&Path::from(into));
    let sink = match into {
        "lsm" => CheckpointFormat::Lsm(crate::state::lsm::tests::small_settings()),
        _ => CheckpointFormat::Memory,
    };
    import_checkpoint(&store, &exported, &target, sink, (1, 1, "import"))
        .await
        .expect("imports");
    let imported = open(&store, &clock, into, "t.b").await;
    let source = open(&store, &clock, from, "t.a").await;
    assert_eq!(all(&imported).await, all(&source).await);
    assert_eq!(
        imported.recovered_offsets().expect("decodes"),
        Some(state.offsets())
    );
    let target_manifest = ManifestStore::new(store.clone(), target.clone())
        .read(ManifestVersion(1))
        .await
        .expect("reads");
    let again = Path::from("exports/b.jsonl");
    export_checkpoint(
        &store,
        (&target, &target_manifest),
        (into, Partition(2)),
        &again,
        &clock,
    )
    .await
    .expect("exports");
    let body = |t: String| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        body(text(&store, &again).await),
        body(text(&store, &exported).await)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Export → import into the other backend keeps every key, value, expiry, timer, the
    /// watermark and the offsets, both directions.
    #[test]
    fn export_then_import_into_the_other_backend_keeps_everything(state in state()) {
        block_on(round_trip(&state, "memory", "lsm"));
        block_on(round_trip(&state, "lsm", "memory"));
    }
}

/// The format, frozen: changing it breaks every export users keep.
#[test]
fn the_export_format_is_frozen() {
    block_on(async {
        let (store, clock) = store_and_clock();
        let state = State {
            entries: BTreeMap::from([
                (key::value_key(b"key7", "count"), (b"3".to_vec(), None)),
                (
                    key::map_key(b"key7", "seen", b"a"),
                    (b"raw \xff".to_vec(), Some(1_767_225_600_000)),
                ),
                (
                    key::value_key(b"\xff\x00", "count"),
                    (b"{\"n\":1}".to_vec(), None),
                ),
            ]),
            timers: BTreeMap::from([(
                (b"key7".to_vec(), "flush".to_owned()),
                (TimeDomain::EventTime, 60_000),
            )]),
            watermark_ms: Some(59_000),
            // Shards without an Iceberg table export as before.
            iceberg_pending: None,
            edges_frontier: None,
            next_offset: 301,
        };
        let (root, manifest) = checkpointed(&store, &clock, "memory", "t.a", &state).await;
        let path = Path::from("export.jsonl");
        export_checkpoint(
            &store,
            (&root, &manifest),
            ("memory", Partition(2)),
            &path,
            &clock,
        )
        .await
        .expect("exports");
        insta::assert_snapshot!(text(&store, &path).await);
    });
}

/// An export cut short, of another version, or out of order is refused, naming the line.
#[test]
fn a_truncated_or_foreign_export_is_refused() {
    block_on(async {
        let (store, _) = store_and_clock();
        let header = r#"{"format":"weir-state-export","version":1,"partition":0,"source_backend":"lsm","source_version":3,"offsets":{}}"#;
        let entry = |k: &str| format!(r#"{{"key":"{k}","state":"count","value_b64":"MQ=="}}"#);
        for (body, needle) in [
            (format!("{header}\n{}\n", entry("a")), "incomplete"),
            (
                header.replace("\"version\":1", "\"version\":9"),
                "version 9",
            ),
            (
                format!(
                    "{header}\n{}\n{}\n{{\"end\":true,\"entries\":2,\"timers\":0}}\n",
                    entry("b"),
                    entry("a")
                ),
                "increasing key order",
            ),
            (
                format!(
                    "{header}\n{}\n{{\"end\":true,\"entries\":5,\"timers\":0}}\n",
                    entry("a")
                ),
                "counts",
            ),
        ] {
            let path = Path::from("bad.jsonl");
            store
                .put(&path, PutPayload::from(body.into_bytes()))
                .await
                .expect("puts");
            let err = import_checkpoint(
                &store,
                &path,
                &Path::from("target"),
                CheckpointFormat::Memory,
                (1, 1, "import"),
            )
            .await
            .expect_err("refused");
            assert!(err.to_string().contains(needle), "{err} / {needle}");
        }
    });
}

/// A store that fails while an import uploads its SSTs is an outage to retry, not a fault of
/// the export: the error says unavailable (it said "invalid state export" before, for an SST
/// uploaded in the middle of the import).
#[test]
fn a_store_failure_during_an_import_is_unavailable_not_invalid() {
    use crate::state::faulty_store::{Fault, FaultyStore};
    block_on(async {
        let faulty = Arc::new(FaultyStore::default());
        let store: Arc<dyn ObjectStore> = faulty.clone();
        let header = r#"{"format":"weir-state-export","version":1,"partition":0,"source_backend":"lsm","source_version":3,"offsets":{}}"#;
        // Enough entries that the SSTs of 256-byte target fill and upload before the end.
        let mut body = format!("{header}\n");
        for k in 0..40 {
            body.push_str(&format!(
                r#"{{"key":"key-{k:04}","state":"count","value_b64":"MTIzNDU2Nzg5MA=="}}"#
            ));
            body.push('\n');
        }
        body.push_str("{\"end\":true,\"entries\":40,\"timers\":0}\n");
        let path = Path::from("export.jsonl");
        store
            .put(&path, PutPayload::from(body.into_bytes()))
            .await
            .expect("puts");
        faulty.inject_on("/sst/", Fault::PutFails);
        let err = import_checkpoint(
            &store,
            &path,
            &Path::from("target"),
            CheckpointFormat::Lsm(crate::state::lsm::tests::small_settings()),
            (1, 1, "import"),
        )
        .await
        .expect_err("the upload fails");
        assert!(
            matches!(err, ExportError::Unavailable(_)),
            "a store failure is unavailable: {err:?}"
        );
    });
}
