//! The sink's parts together on a real SQLite catalog and a `file://` warehouse: rows written
//! as data files, carried through their JSON form (as a checkpoint's manifest carries them),
//! committed, and read back with the `iceberg` crate's own scan.

use super::commit::{self, PendingCheckpoint, committed_versions};
use super::files::{decode_data_file, encode_data_file};
use super::*;
use crate::ids::{ManifestVersion, Offset, Partition};
use crate::runtime::InputRecord;
use crate::state::checkpoint::InputOffsets;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use futures::TryStreamExt;
use iceberg::spec::DataFile;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use std::collections::BTreeMap;
use std::time::Duration;

const UID: &str = "p-0001";

struct Fixture {
    _dir: tempfile::TempDir,
    lakehouse: Lakehouse,
    schema: TableSchema,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let settings = LakehouseSettings {
        catalog_uri: Some(format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("catalog.db").display()
        )),
        warehouse: Some(format!("file://{}", dir.path().join("warehouse").display())),
        ..LakehouseSettings::default()
    };
    let lakehouse = Lakehouse::open(&settings).await.expect("catalog opens");
    let schema = TableSchema::new(&[
        ColumnSpec {
            name: "route".into(),
            kind: ColumnType::String,
            required: true,
        },
        ColumnSpec {
            name: "flights".into(),
            kind: ColumnType::Long,
            required: true,
        },
    ])
    .expect("valid schema");
    Fixture {
        _dir: dir,
        lakehouse,
        schema,
    }
}

impl Fixture {
    async fn table(&self) -> Table {
        self.lakehouse
            .table("t1", "routes", &self.schema)
            .await
            .expect("table")
    }

    /// The data files of one checkpoint of `partition` holding `flights` for route `route`,
    /// through their JSON form.
    async fn checkpoint(
        &self,
        partition: i32,
        version: u64,
        route: &str,
        flights: std::ops::RangeInclusive<i64>,
    ) -> PendingCheckpoint {
        let table = self.table().await;
        let mut files = ShardFiles::new(
            &table,
            self.schema.clone(),
            format!("weir-{UID}-{partition}-v{version}"),
            128 << 20,
        )
        .expect("writer");
        for n in flights {
            let row = format!(r#"{{"route":"{route}","flights":{n}}}"#);
            files.push(row.as_bytes()).await.expect("fits");
        }
        let written = files.close().await.expect("files close");
        let files = written
            .into_iter()
            .map(|f| {
                let text = encode_data_file(f).expect("encodes");
                decode_data_file(&text, table.metadata().current_schema()).expect("decodes")
            })
            .collect();
        PendingCheckpoint {
            partition: Partition(partition),
            version: ManifestVersion(version),
            files,
            covered: Default::default(),
        }
    }

    async fn commit(
        &self,
        pending: &[PendingCheckpoint],
        look_for_files: bool,
    ) -> commit::CommitReport {
        commit::commit(
            self.lakehouse.catalog(),
            &Lakehouse::ident("t1", "routes"),
            UID,
            pending,
            look_for_files,
        )
        .await
        .expect("commit")
    }

    /// Every row of the table as (route, flights), sorted.
    async fn rows(&self) -> Vec<(String, i64)> {
        let table = self.table().await;
        let batches: Vec<_> = table
            .scan()
            .build()
            .expect("scan")
            .to_arrow()
            .await
            .expect("arrow stream")
            .try_collect()
            .await
            .expect("batches");
        let mut rows = Vec::new();
        for batch in batches {
            let routes = batch.column(0).as_string::<i32>();
            let flights = batch.column(1).as_primitive::<Int64Type>();
            for i in 0..batch.num_rows() {
                rows.push((routes.value(i).to_owned(), flights.value(i)));
            }
        }
        rows.sort();
        rows
    }

    /// Another writer's snapshot: one file of its own, no Weir summary.
    async fn foreign_append(&self) {
        let table = self.table().await;
        let mut files = ShardFiles::new(&table, self.schema.clone(), "spark-job".into(), 1 << 20)
            .expect("writer");
        files
            .push(br#"{"route":"OTHER","flights":1}"#)
            .await
            .expect("fits");
        let written: Vec<DataFile> = files.close().await.expect("close");
        let tx = Transaction::new(&table);
        let tx = tx
            .fast_append()
            .add_data_files(written)
            .apply(tx)
            .expect("apply");
        tx.commit(self.lakehouse.catalog().as_ref())
            .await
            .expect("foreign commit");
    }

    async fn expire_all_but_current(&self) {
        let table = self.table().await;
        let tx = Transaction::new(&table);
        let tx = tx
            .expire_snapshots()
            .retain_last(1)
            .expire_older_than_ms(i64::MAX)
            .apply(tx)
            .expect("apply");
        let table = tx
            .commit(self.lakehouse.catalog().as_ref())
            .await
            .expect("expiry commits");
        assert_eq!(table.metadata().snapshots().count(), 1);
    }
}

fn expected(routes: &[(&str, std::ops::RangeInclusive<i64>)]) -> Vec<(String, i64)> {
    let mut rows: Vec<_> = routes
        .iter()
        .flat_map(|(r, ns)| ns.clone().map(|n| ((*r).to_owned(), n)))
        .collect();
    rows.sort();
    rows
}

#[tokio::test]
async fn checkpoints_of_several_shards_commit_in_one_snapshot_with_every_row() {
    let f = fixture().await;
    let a = f.checkpoint(0, 3, "JFK-LAX", 1..=1000).await;
    let b = f.checkpoint(1, 7, "EWR-SFO", 1..=10).await;
    let report = f.commit(&[a, b], true).await;
    assert_eq!((report.files, report.rows, report.skipped), (2, 1010, 0));
    assert_eq!(
        report.committed,
        BTreeMap::from([
            (Partition(0), ManifestVersion(3)),
            (Partition(1), ManifestVersion(7))
        ])
    );
    assert_eq!(
        f.rows().await,
        expected(&[("JFK-LAX", 1..=1000), ("EWR-SFO", 1..=10)])
    );
    let table = f.table().await;
    let summary = &table
        .metadata()
        .current_snapshot()
        .expect("a snapshot")
        .summary()
        .additional_properties;
    assert_eq!(summary["weir.pipeline-id"], UID);
    assert_eq!(
        (
            summary["weir.shard.0"].as_str(),
            summary["weir.shard.1"].as_str()
        ),
        ("3", "7")
    );
}

#[tokio::test]
async fn a_checkpoint_committed_before_is_skipped_and_only_newer_ones_are_appended() {
    let f = fixture().await;
    let first = f.checkpoint(0, 3, "A", 1..=5).await;
    f.commit(std::slice::from_ref(&first), false).await;
    // The shard's manifest still lists checkpoint 3 (it has not seen the commit yet) with 4.
    let second = f.checkpoint(0, 4, "A", 6..=9).await;
    let report = f.commit(&[first.clone(), second], false).await;
    assert_eq!((report.files, report.skipped), (1, 1));
    // Again, nothing new: no snapshot.
    let table = f.table().await;
    let snapshots = table.metadata().snapshots().count();
    let report = f.commit(&[first], true).await;
    assert_eq!((report.snapshot_id, report.skipped), (None, 1));
    assert_eq!(f.table().await.metadata().snapshots().count(), snapshots);
    assert_eq!(f.rows().await, expected(&[("A", 1..=9)]));
}

#[tokio::test]
async fn another_writer_committing_between_our_commits_makes_us_neither_recommit_nor_skip() {
    let f = fixture().await;
    let first = f.checkpoint(0, 3, "A", 1..=5).await;
    f.commit(std::slice::from_ref(&first), false).await;
    f.foreign_append().await;
    let second = f.checkpoint(0, 4, "A", 6..=9).await;
    let report = f.commit(&[first, second], false).await;
    assert_eq!((report.files, report.skipped), (1, 1));
    let mut want = expected(&[("A", 1..=9)]);
    want.push(("OTHER".into(), 1));
    want.sort();
    assert_eq!(f.rows().await, want);
}

#[tokio::test]
async fn expiring_our_snapshots_does_not_make_a_checkpoint_commit_twice() {
    let f = fixture().await;
    let first = f.checkpoint(2, 11, "A", 1..=5).await;
    f.commit(std::slice::from_ref(&first), false).await;
    f.foreign_append().await;
    f.expire_all_but_current().await;
    // Our snapshot is gone; the table property still says shard 2 is at 11.
    let table = f.table().await;
    assert_eq!(
        committed_versions(&table, UID),
        BTreeMap::from([(Partition(2), ManifestVersion(11))])
    );
    let report = f.commit(&[first], false).await;
    assert_eq!((report.files, report.skipped), (0, 1));
    assert_eq!(f.rows().await.len(), 6);
}

#[tokio::test]
async fn a_committer_finds_its_files_in_the_table_when_property_and_snapshots_are_gone() {
    let f = fixture().await;
    let first = f.checkpoint(0, 3, "A", 1..=5).await;
    f.commit(std::slice::from_ref(&first), false).await;
    f.foreign_append().await;
    f.expire_all_but_current().await;
    // Someone removed the property too: only the files themselves say it was committed.
    let table = f.table().await;
    let tx = Transaction::new(&table);
    let tx = tx
        .update_table_properties()
        .remove(format!("weir.committed.{UID}"))
        .apply(tx)
        .expect("apply");
    let table = tx
        .commit(f.lakehouse.catalog().as_ref())
        .await
        .expect("commit");
    assert!(committed_versions(&table, UID).is_empty());
    let second = f.checkpoint(0, 4, "A", 6..=9).await;
    let report = f.commit(&[first, second], true).await;
    assert_eq!((report.files, report.skipped), (1, 1));
    let mut want = expected(&[("A", 1..=9)]);
    want.push(("OTHER".into(), 1));
    want.sort();
    assert_eq!(f.rows().await, want);
}

#[tokio::test]
async fn an_existing_table_with_other_columns_is_refused() {
    let f = fixture().await;
    f.table().await;
    let other = TableSchema::new(&[ColumnSpec {
        name: "route".into(),
        kind: ColumnType::Long,
        required: true,
    }])
    .expect("valid");
    let refused = f.lakehouse.table("t1", "routes", &other).await;
    assert!(
        matches!(refused, Err(LakehouseError::Mismatch { .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn orphan_files_are_deleted_and_committed_or_pending_ones_kept() {
    let f = fixture().await;
    let committed = f.checkpoint(0, 3, "A", 1..=5).await;
    f.commit(std::slice::from_ref(&committed), false).await;
    // Written for checkpoints that never became decided: one still listed by its shard (the
    // newest decided checkpoint holds it), one nobody lists.
    let listed = f.checkpoint(1, 4, "B", 1..=5).await;
    let orphan = f.checkpoint(2, 9, "C", 1..=5).await;
    let path = |c: &PendingCheckpoint| c.files[0].file_path().to_owned();
    let pending = std::collections::BTreeSet::from([path(&listed)]);
    let table = f.table().await;
    let now_ms = crate::clock::wall_now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let storage = f.lakehouse.storage();
    let young = super::orphans::delete_orphans(
        &table,
        UID,
        &pending,
        storage,
        super::orphans::ORPHAN_GRACE,
        now_ms,
    )
    .await
    .expect("gc");
    assert!(young.is_empty(), "within the grace period: {young:?}");
    let deleted =
        super::orphans::delete_orphans(&table, UID, &pending, storage, Duration::ZERO, now_ms)
            .await
            .expect("gc");
    assert_eq!(deleted, [path(&orphan)]);
    use iceberg::io::Storage;
    assert!(!storage.exists(&path(&orphan)).await.expect("head"));
    assert!(storage.exists(&path(&listed)).await.expect("head"));
    assert_eq!(f.rows().await, expected(&[("A", 1..=5)]));
}

/// Two committers of one pipeline (a zombie and its successor) decide on the same table; the
/// one that commits second must not land its append on the table the first one changed (the
/// `iceberg` crate's transaction reloads and re-applies unless the catalog pins the table).
#[tokio::test]
async fn an_append_decided_on_an_older_table_fails_instead_of_landing_on_a_newer_one() {
    let f = fixture().await;
    let pending = f.checkpoint(0, 3, "A", 1..=5).await;
    let decided = f.table().await;
    // The other committer appends the same checkpoint first.
    f.commit(std::slice::from_ref(&pending), false).await;
    let tx = Transaction::new(&decided);
    let tx = tx
        .fast_append()
        .with_check_duplicate(false)
        .add_data_files(pending.files.clone())
        .apply(tx)
        .expect("apply");
    let pinned = commit::NoRetry {
        inner: f.lakehouse.catalog().clone(),
        decided,
    };
    let refused = tx.commit(&pinned).await.expect_err("the table changed");
    assert_eq!(refused.kind(), iceberg::ErrorKind::CatalogCommitConflicts);
    assert_eq!(f.rows().await, expected(&[("A", 1..=5)]), "each row once");
    // The committer's own loop decides again and finds it committed.
    let again = f.commit(std::slice::from_ref(&pending), false).await;
    assert_eq!((again.snapshot_id, again.skipped), (None, 1));
}

/// A shard restored from another pipeline's savepoint does not take over that pipeline's
/// uncommitted files (they are for its table, and its committer); its own stay.
#[tokio::test]
async fn a_shard_takes_only_its_own_pipelines_pending_files_when_restored() {
    let f = fixture().await;
    let open = |uid: &'static str| {
        let lakehouse = f.lakehouse.clone();
        let schema = f.schema.clone();
        async move {
            shard::IcebergShard::open(&lakehouse, ("t1", "routes"), &schema, uid, Partition(0))
                .await
                .expect("opens")
        }
    };
    let mut source = open("source").await;
    source
        .push(br#"{"route":"A","flights":1}"#)
        .await
        .expect("fits");
    let write = source
        .prepare(ManifestVersion(7), &InputOffsets::new(), None)
        .await
        .expect("prepares")
        .expect("a list");
    let stored = write.value.expect("a value");
    let mut other = open("other").await;
    other
        .restore(Some(&stored), &InputOffsets::new())
        .expect("decodes");
    assert!(other.pending().entries.is_empty());
    let mut same = open("source").await;
    same.restore(Some(&stored), &InputOffsets::new())
        .expect("decodes");
    assert_eq!(same.pending().entries.len(), 1);
    assert_eq!(same.pending().entries[0].version, ManifestVersion(7));
}

/// A record of topic `in`, partition 0, at `offset`.
fn record(offset: i64) -> InputRecord {
    InputRecord {
        key: Vec::new(),
        value: Vec::new(),
        timestamp_ms: 0,
        headers: Vec::new(),
        topic: "in".into(),
        partition: 0,
        offset,
        input: 0,
    }
}

/// A timer round's source of an `event-time` or `processing-time` timer at `time_ms`.
fn timer(domain: &str, time_ms: i64) -> InputRecord {
    InputRecord {
        timestamp_ms: time_ms,
        headers: vec![crate::runtime::Header {
            name: "weir.timer.domain".into(),
            value: domain.as_bytes().to_vec(),
        }],
        ..record(-1)
    }
}

fn offsets(next: i64) -> InputOffsets {
    let mut offsets = InputOffsets::new();
    offsets.advance("in", Offset(next - 1));
    offsets
}

/// A shard that resumes behind what the table holds (reset to a savepoint, or fallen back
/// past a committed checkpoint) does not write the replayed records' rows again, in whatever
/// order their emits come, nor an event-time timer's that the table's checkpoint had fired
/// (any while the input is behind; through its time at its offsets); a processing-time
/// timer's, a later record's and a timer's once the input is past are written. A shard that
/// restarts at the table's checkpoint writes a late record's timer.
#[tokio::test]
async fn a_shard_behind_what_the_table_holds_does_not_write_the_replayed_rows_again() {
    let f = fixture().await;
    let open = || async {
        shard::IcebergShard::open(&f.lakehouse, ("t1", "routes"), &f.schema, UID, Partition(0))
            .await
            .expect("opens")
    };
    // Records 0..4 and the event-time timers through 1000 committed as checkpoint 1.
    let mut first = open().await;
    first
        .restore(None, &InputOffsets::new())
        .expect("nothing to restore");
    for n in 0..4 {
        assert!(!first.written(&record(n)), "offset {n}");
        let row = format!(r#"{{"route":"A","flights":{}}}"#, n + 1);
        first.push(row.as_bytes()).await.expect("fits");
    }
    let write = first
        .prepare(ManifestVersion(1), &offsets(4), Some(1000))
        .await
        .expect("prepares")
        .expect("a list");
    let list = shard::PendingList::decode(write.value.as_deref()).expect("decodes");
    assert_eq!(
        list.entries[0].offsets,
        BTreeMap::from([("in".into(), Offset(4))])
    );
    assert_eq!(list.entries[0].timers_through_ms, Some(1000));
    let table = f.table().await;
    let pending =
        shard::pending_checkpoints(Partition(0), &list, table.metadata().current_schema())
            .expect("decodes");
    f.commit(&pending, false).await;
    let covered = commit::committed_covered(&f.table().await, UID);
    assert_eq!(
        covered[&Partition(0)].offsets,
        BTreeMap::from([("in".into(), Offset(4))])
    );
    assert_eq!(covered[&Partition(0)].timers_through_ms, Some(1000));

    // Reset to a savepoint at offset 1: records 1..4 and the timers among them are replayed.
    let mut reset = open().await;
    reset
        .restore(write.value.as_deref(), &offsets(1))
        .expect("restores");
    for offset in [3, 1, 2] {
        assert!(reset.written(&record(offset)), "replayed offset {offset}");
        assert!(reset.written(&record(offset)), "its second emit too");
    }
    assert!(!reset.written(&record(4)), "a new record");
    // While the input is behind, every event-time round ran before the table's checkpoint.
    assert!(reset.written(&timer("event-time", 5000)));
    assert!(
        !reset.written(&timer("processing-time", 10)),
        "by the clock"
    );
    // At the table's offsets, the rounds the checkpoint had run are the timers through 1000.
    reset.position(&offsets(4));
    assert!(reset.written(&timer("event-time", 1000)));
    assert!(!reset.written(&timer("event-time", 1001)), "a later timer");
    // Past them, every timer is new: a late record's, earlier than 1000, too.
    reset.position(&offsets(5));
    assert!(!reset.written(&timer("event-time", 500)));
    assert!(reset.written(&record(2)), "a record, by its offset alone");

    // Resuming where the table ends (a restart): the rounds it had run do not come again, and
    // once a record is past, a late record's timer is written.
    let mut resumed = open().await;
    resumed.restore(None, &offsets(4)).expect("restores");
    assert!(!resumed.written(&record(4)));
    assert!(resumed.written(&timer("event-time", 1000)));
    assert!(!resumed.written(&timer("event-time", 1001)));
    resumed.position(&offsets(5));
    assert!(
        !resumed.written(&timer("event-time", 900)),
        "a late record's timer"
    );
}
