//! The reader's and the follow streams' unit tests, over the writer and an in-memory store.

use super::*;
use crate::ids::Partition;
use crate::runtime::guest_log::{GuestLevel, LogLine, LogSink};
use object_store::ObjectStoreExt;
use object_store::memory::InMemory;

fn line(time_ms: u64, message: &str) -> LogLine<'_> {
    LogLine {
        time_ms,
        level: GuestLevel::Info,
        partition: Some(Partition(0)),
        stage: None,
        message,
    }
}

#[test]
fn segment_names_round_trip_and_sort_in_writing_order() {
    let a = SegmentName {
        time_ms: 1_733_240_000_000,
        seq: 7,
    };
    assert_eq!(a.file_name(), "1733240000000-0000000007.jsonl");
    assert_eq!(SegmentName::parse(&a.file_name()), Some(a));
    let b = SegmentName { seq: 12, ..a };
    assert!(a.file_name() < b.file_name());
    assert_eq!(SegmentName::parse("x.jsonl"), None);
}

#[tokio::test]
async fn a_reader_gets_every_hosts_lines_in_time_order_then_only_new_ones() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dir = Path::from("tenants/t/logs/uid");
    let (a, a_task) =
        SegmentWriter::spawn(store.clone(), dir.clone(), "host-a", Default::default());
    let (b, b_task) =
        SegmentWriter::spawn(store.clone(), dir.clone(), "host-b", Default::default());
    a.line(line(10, "a1"));
    b.line(line(20, "b1"));
    a.line(line(30, "a2"));
    a_task.close().await;
    b_task.close().await;
    let (entries, mut cursors) = recent(&*store, &dir, 0, 100).await.expect("read");
    let seen: Vec<_> = entries
        .iter()
        .map(|e| (e.host.as_ref(), e.message.as_ref()))
        .collect();
    assert_eq!(seen, [("host-a", "a1"), ("host-b", "b1"), ("host-a", "a2")]);
    let (last, _) = recent(&*store, &dir, 0, 2).await.expect("read");
    assert_eq!(
        last.iter().map(|e| e.message.as_ref()).collect::<Vec<_>>(),
        ["b1", "a2"]
    );
    let (since, _) = recent(&*store, &dir, 20, 100).await.expect("read");
    assert_eq!(since.len(), 2);

    assert!(
        newer(&*store, &dir, &mut cursors)
            .await
            .expect("read")
            .is_empty()
    );
    let (b, b_task) =
        SegmentWriter::spawn(store.clone(), dir.clone(), "host-b", Default::default());
    let (c, c_task) =
        SegmentWriter::spawn(store.clone(), dir.clone(), "host-c", Default::default());
    b.line(line(40, "b2"));
    c.line(line(35, "c1"));
    b_task.close().await;
    c_task.close().await;
    let new = newer(&*store, &dir, &mut cursors).await.expect("read");
    assert_eq!(
        new.iter().map(|e| e.message.as_ref()).collect::<Vec<_>>(),
        ["c1", "b2"]
    );
    assert!(
        newer(&*store, &dir, &mut cursors)
            .await
            .expect("read")
            .is_empty()
    );
}

/// Puts a segment of `host` named as written at `time_ms`, holding `messages`.
async fn put_segment(
    store: &dyn ObjectStore,
    dir: &Path,
    host: &str,
    time_ms: u64,
    messages: &[&str],
) {
    let entries: Vec<LogEntry<'_>> = messages
        .iter()
        .map(|m| LogEntry {
            time_ms,
            host: host.into(),
            stage: None,
            partition: Some(Partition(0)),
            level: "info".into(),
            message: (*m).into(),
        })
        .collect();
    let name = SegmentName { time_ms, seq: 0 };
    let path = dir.clone().join(host).join(name.file_name());
    store
        .put(&path, json_lines(&entries).into())
        .await
        .expect("put");
}

#[tokio::test]
async fn a_tail_read_looks_further_back_only_until_it_has_enough_lines() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dir = Path::from("tenants/t/logs/uid");
    let now = wall_now_ms();
    put_segment(
        &*store,
        &dir,
        "old-host",
        now - 3 * 86_400_000,
        &["three days ago"],
    )
    .await;
    put_segment(
        &*store,
        &dir,
        "host-a",
        now - 2 * 3_600_000,
        &["two hours ago"],
    )
    .await;
    put_segment(&*store, &dir, "host-a", now - 1_000, &["a second ago"]).await;
    let messages = |entries: &[LogEntry<'_>]| -> Vec<String> {
        entries.iter().map(|e| e.message.to_string()).collect()
    };
    let (last, mut cursors) = recent(&*store, &dir, 0, 1).await.expect("read");
    assert_eq!(messages(&last), ["a second ago"]);
    let (all, _) = recent(&*store, &dir, 0, 100).await.expect("read");
    assert_eq!(
        messages(&all),
        ["three days ago", "two hours ago", "a second ago"]
    );
    let (since, _) = recent(&*store, &dir, now - 3 * 3_600_000, 100)
        .await
        .expect("read");
    assert_eq!(messages(&since), ["two hours ago", "a second ago"]);
    // Following from the narrow read: no old segment comes back as new.
    assert!(
        newer(&*store, &dir, &mut cursors)
            .await
            .expect("read")
            .is_empty()
    );
    put_segment(&*store, &dir, "old-host", now, &["back"]).await;
    let new = newer(&*store, &dir, &mut cursors).await.expect("read");
    assert_eq!(messages(&new), ["back"]);
}

#[tokio::test]
async fn the_sweep_deletes_every_hosts_segments_past_the_retention_only() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dir = Path::from("tenants/t/logs/uid");
    let now = wall_now_ms();
    put_segment(&*store, &dir, "gone-host", now - 2 * 86_400_000, &["old"]).await;
    put_segment(&*store, &dir, "host-a", now - 2 * 86_400_000, &["old"]).await;
    put_segment(&*store, &dir, "host-a", now - 3_600_000, &["kept"]).await;
    sweep_expired(&*store, &dir, Duration::from_secs(86_400)).await;
    let (all, _) = recent(&*store, &dir, 0, 100).await.expect("read");
    assert_eq!(
        all.iter()
            .map(|e| (e.host.as_ref(), e.message.as_ref()))
            .collect::<Vec<_>>(),
        [("host-a", "kept")]
    );
}

#[test]
fn a_tenant_has_at_most_its_follow_streams_open_and_a_closed_one_frees_its_slot() {
    let follows = Follows::default();
    let mut open: Vec<_> = (0..FOLLOWS_PER_TENANT_MAX)
        .map(|_| follows.take("t1").expect("a slot"))
        .collect();
    assert!(follows.take("t1").is_none());
    assert!(follows.take("t2").is_some(), "another tenant's are its own");
    open.pop();
    assert!(follows.take("t1").is_some());
}

#[tokio::test]
async fn a_follow_stream_ends_when_the_host_shuts_down() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let catalog = crate::catalog::Catalog::new(store, Path::from("weir"));
    let shutting_down = tokio::sync::watch::Sender::new(false);
    let mut follower = Follower {
        dir: catalog.pipeline_logs_prefix("t", "uid"),
        catalog,
        tenant: "t".into(),
        name: "p".into(),
        uid: "uid".into(),
        cursors: Cursors::default(),
        polls: 0,
        shutting_down: shutting_down.subscribe(),
        _slot: Follows::default().take("t").expect("a slot"),
    };
    shutting_down.send_replace(true);
    assert_eq!(follower.next_chunk().await, None);
}

#[tokio::test]
async fn lines_of_one_millisecond_across_segments_keep_their_order_and_tail_keeps_the_last() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dir = Path::from("tenants/t/logs/uid");
    let settings = OperatorLogSettings {
        segment_bytes_max: 200,
        ..Default::default()
    };
    let (writer, task) = SegmentWriter::spawn(store.clone(), dir.clone(), "host-a", settings);
    let now = wall_now_ms();
    for i in 0..20 {
        writer.line(line(now, &format!("ord {i}")));
    }
    task.close().await;
    let messages = |entries: &[LogEntry<'_>]| -> Vec<String> {
        entries.iter().map(|e| e.message.to_string()).collect()
    };
    let (all, _) = recent(&*store, &dir, 0, 100).await.expect("read");
    let expected: Vec<_> = (0..20).map(|i| format!("ord {i}")).collect();
    assert_eq!(messages(&all), expected);
    let (last, _) = recent(&*store, &dir, 0, 3).await.expect("read");
    assert_eq!(messages(&last), ["ord 17", "ord 18", "ord 19"]);
}
