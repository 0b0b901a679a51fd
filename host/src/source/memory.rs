//! An in-memory [`Source`] for tests of the pipeline without a broker: partitions of input
//! topics as logs in memory, assignments and revokes made by the test through a
//! [`MemorySourceHandle`] (reported once the member joined: [`Source::subscribe`]), pause, seek and committed offsets (with their metadata) as a
//! consumer group member sees them. Deterministic: a fetch hands out the records of the
//! assigned, unpaused partitions in partition order, as many of each as it is asked for, in
//! each partition's offset order (as a Kafka consumer whose prefetch holds a large chunk of
//! every partition); a revoke or an assignment is reported before any record handed out after
//! it.

use crate::ids::{ManifestVersion, Offset, Partition};
use crate::pipeline::ports::{Cause, Committed, GroupOffsets, Source, SourceError};
use crate::runtime::InputRecord;
use crate::state::checkpoint::{InputOffsets, manifest_metadata, parse_manifest_metadata};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The logs and the member's view of them.
#[derive(Debug, Default)]
struct Logs {
    /// (topic, partition) → records, at their offsets.
    records: BTreeMap<(String, i32), Vec<InputRecord>>,
    /// (topic, partition) → the next offset to hand out.
    positions: BTreeMap<(String, i32), i64>,
    assigned: BTreeSet<i32>,
    paused: BTreeSet<i32>,
    /// Partitions whose fetches hand out nothing though not paused, as a consumer whose
    /// fetches stall (a slow broker): Weir does not hold them back.
    stalled: BTreeSet<i32>,
    revoked_events: Vec<i32>,
    assigned_events: Vec<i32>,
    /// (topic, partition) → committed next offset and its metadata.
    committed: BTreeMap<(String, i32), (i64, String)>,
    /// Commits made, in order: (offsets, waited).
    commits: Vec<(GroupOffsets, bool)>,
    /// Global tables' reads begun, in order: (topic, the offsets they began from).
    table_follows: Vec<(String, BTreeMap<i32, i64>)>,
    /// Global tables' reads caught up so far.
    tables_caught_up: usize,
    /// Whether the member joined the group ([`Source::subscribe`]), and how many global
    /// tables had caught up then: no rebalance is reported before it joined.
    joined: Option<usize>,
}

/// A [`Source`] in memory over `topics` (co-partitioned).
#[derive(Debug, Clone)]
pub struct MemorySource {
    topics: Vec<String>,
    logs: Arc<Mutex<Logs>>,
    /// Notified when there may be something new to fetch: records, a rebalance, a resume.
    ready: Arc<Notify>,
    /// Counts the records produced: what global tables' readers wait on.
    appended: Arc<tokio::sync::watch::Sender<u64>>,
}

/// What a test drives a [`MemorySource`] with.
#[derive(Debug, Clone)]
pub struct MemorySourceHandle {
    source: MemorySource,
}

impl MemorySource {
    /// A source over `topics` and its handle.
    pub fn new(topics: &[&str]) -> (Self, MemorySourceHandle) {
        let source = Self {
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            logs: Arc::new(Mutex::new(Logs::default())),
            ready: Arc::new(Notify::new()),
            appended: Arc::new(tokio::sync::watch::Sender::new(0)),
        };
        let handle = MemorySourceHandle {
            source: source.clone(),
        };
        (source, handle)
    }

    fn logs(&self) -> std::sync::MutexGuard<'_, Logs> {
        self.logs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes at most `per_partition_max` records of each assigned, unpaused partition, in
    /// partition order, into `records`; returns whether any was left behind. Takes nothing
    /// while a rebalance is unreported.
    fn take_records(&self, per_partition_max: usize, records: &mut Vec<InputRecord>) -> bool {
        let mut logs = self.logs();
        if logs.joined.is_none()
            || !logs.revoked_events.is_empty()
            || !logs.assigned_events.is_empty()
        {
            return false;
        }
        let logs = &mut *logs;
        let mut more = false;
        for partition in logs.assigned.difference(&logs.paused) {
            if logs.stalled.contains(partition) {
                // Nothing to fetch until the stall ends (which notifies).
                continue;
            }
            let mut budget = per_partition_max;
            for (input, topic) in (0u32..).zip(&self.topics) {
                let key = (topic.clone(), *partition);
                let Some(log) = logs.records.get(&key) else {
                    continue;
                };
                let at = logs.positions.entry(key).or_insert(0);
                let from = usize::try_from(*at).unwrap_or(usize::MAX).min(log.len());
                let to = from.saturating_add(budget).min(log.len());
                records.extend(
                    log[from..to]
                        .iter()
                        .map(|r| InputRecord { input, ..r.clone() }),
                );
                budget -= to - from;
                *at = to as i64;
                more |= to < log.len();
            }
        }
        more
    }
}

impl MemorySource {
    /// Whether an offset of `from` is past the end of its partition of `topic`.
    fn table_past_end(&self, topic: &str, from: &BTreeMap<i32, i64>) -> bool {
        let logs = self.logs();
        from.iter().any(|(partition, next)| {
            let len = logs
                .records
                .get(&(topic.to_owned(), *partition))
                .map_or(0, Vec::len);
            *next > len as i64
        })
    }

    /// The records of every partition of `topic` from `next`'s offsets on (each partition's
    /// beginning when it names none), moving `next` past them; `None` when the topic has no
    /// partition.
    fn table_records(
        &self,
        topic: &str,
        next: &mut BTreeMap<i32, i64>,
    ) -> Option<Vec<InputRecord>> {
        let logs = self.logs();
        let mut records = Vec::new();
        let mut any = false;
        for ((t, partition), log) in &logs.records {
            if t != topic {
                continue;
            }
            any = true;
            let at = next.entry(*partition).or_insert(0);
            let from = usize::try_from(*at).unwrap_or(usize::MAX).min(log.len());
            records.extend_from_slice(&log[from..]);
            *at = log.len() as i64;
        }
        any.then_some(records)
    }
}

impl MemorySourceHandle {
    /// Appends a record with `key` and `value` to `partition` of `topic`; its offset is the
    /// log's length, its timestamp `timestamp_ms`.
    pub fn produce(
        &self,
        topic: &str,
        partition: impl Into<Partition>,
        key: &[u8],
        value: &[u8],
        timestamp_ms: i64,
    ) {
        self.produce_with_headers(topic, partition, (key, value), timestamp_ms, Vec::new());
    }

    /// [`Self::produce`] with `headers` (a watermark marker's, for one).
    pub fn produce_with_headers(
        &self,
        topic: &str,
        partition: impl Into<Partition>,
        (key, value): (&[u8], &[u8]),
        timestamp_ms: i64,
        headers: Vec<crate::runtime::Header>,
    ) {
        let partition: Partition = partition.into();
        {
            let mut logs = self.source.logs();
            let log = logs
                .records
                .entry((topic.to_owned(), partition.0))
                .or_default();
            let offset = log.len() as i64;
            log.push(InputRecord {
                key: key.to_vec(),
                value: value.to_vec(),
                timestamp_ms,
                headers,
                topic: topic.into(),
                partition: partition.0,
                offset,
                input: 0,
            });
        }
        self.source.appended.send_modify(|n| *n += 1);
        self.source.ready.notify_one();
    }

    /// Makes `topic` with `partitions` empty partitions (a topic that exists before its first
    /// record, as a compacted table's topic often does).
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        let mut logs = self.source.logs();
        for p in 0..partitions {
            logs.records.entry((topic.to_owned(), p)).or_default();
        }
    }

    /// Assigns `partitions` to the member (an assignment event, reported before any record
    /// of theirs).
    pub fn assign(&self, partitions: &[i32]) {
        {
            let mut logs = self.source.logs();
            for &p in partitions {
                logs.assigned.insert(p);
                logs.paused.remove(&p);
                logs.assigned_events.push(p);
            }
        }
        self.source.ready.notify_one();
    }

    /// Revokes `partitions` (a revoke event, reported before any record handed out after it;
    /// none of theirs is handed out any more).
    pub fn revoke(&self, partitions: &[i32]) {
        {
            let mut logs = self.source.logs();
            for &p in partitions {
                logs.assigned.remove(&p);
                logs.revoked_events.push(p);
            }
        }
        self.source.ready.notify_one();
    }

    /// The member is gone without a word (its process crashed): its assignment, pauses,
    /// positions and unreported rebalance events are forgotten; the logs and the group's
    /// committed offsets stay. A new pipeline can then run over the same source.
    pub fn crash(&self) {
        let mut logs = self.source.logs();
        logs.assigned.clear();
        logs.paused.clear();
        logs.positions.clear();
        logs.revoked_events.clear();
        logs.assigned_events.clear();
        logs.joined = None;
        logs.tables_caught_up = 0;
    }

    /// How many global tables had caught up when the member joined the group
    /// ([`Source::subscribe`]) since it was made or last crashed; `None` while it has not.
    pub fn joined_after_tables(&self) -> Option<usize> {
        self.source.logs().joined
    }

    /// Where each global table's read began, in order: (topic, partition → offset).
    pub fn table_follows(&self) -> Vec<(String, BTreeMap<i32, i64>)> {
        self.source.logs().table_follows.clone()
    }

    /// The records of `topic`'s `partition`, in offset order.
    pub fn records(&self, topic: &str, partition: impl Into<Partition>) -> Vec<InputRecord> {
        let partition: Partition = partition.into();
        self.source
            .logs()
            .records
            .get(&(topic.to_owned(), partition.0))
            .cloned()
            .unwrap_or_default()
    }

    /// The group's committed offsets: (topic, partition) → (next offset, metadata).
    pub fn committed(&self) -> BTreeMap<(String, i32), (i64, String)> {
        self.source.logs().committed.clone()
    }

    /// Every commit made so far, in order, with whether it waited for the broker.
    pub fn commits(&self) -> Vec<(GroupOffsets, bool)> {
        self.source.logs().commits.clone()
    }

    /// Commits `offsets` of `partition` naming checkpoint `version` in their metadata, as an
    /// exactly-once transaction does (the in-memory sink calls this when it commits).
    pub fn commit_transaction(
        &self,
        partition: impl Into<Partition>,
        offsets: &InputOffsets,
        version: ManifestVersion,
    ) {
        let partition: Partition = partition.into();
        let mut logs = self.source.logs();
        for (topic, next) in offsets.iter() {
            logs.committed.insert(
                (topic.to_owned(), partition.0),
                (next.0, manifest_metadata(version)),
            );
        }
    }

    /// The partitions paused now.
    pub fn paused(&self) -> BTreeSet<i32> {
        self.source.logs().paused.clone()
    }

    /// Stalls `partition`'s fetches (they hand out nothing, as a consumer waiting on a slow
    /// broker) or ends the stall.
    pub fn stall(&self, partition: impl Into<Partition>, stalled: bool) {
        let partition: Partition = partition.into();
        {
            let mut logs = self.source.logs();
            if stalled {
                logs.stalled.insert(partition.0);
            } else {
                logs.stalled.remove(&partition.0);
            }
        }
        if !stalled {
            self.source.ready.notify_one();
        }
    }

    /// The next offset to hand out of `topic`'s `partition`.
    pub fn position(&self, topic: &str, partition: impl Into<Partition>) -> i64 {
        let partition: Partition = partition.into();
        self.source
            .logs()
            .positions
            .get(&(topic.to_owned(), partition.0))
            .copied()
            .unwrap_or(0)
    }
}

impl Source for MemorySource {
    async fn ready(&self) {
        self.ready.notified().await;
    }

    fn fetch(
        &self,
        per_partition_max: usize,
        records: &mut Vec<InputRecord>,
    ) -> Result<bool, Cause> {
        Ok(self.take_records(per_partition_max, records))
    }

    fn take_revoked(&self) -> Vec<Partition> {
        let revoked = std::mem::take(&mut self.logs().revoked_events);
        revoked.into_iter().map(Partition).collect()
    }

    fn take_assigned(&self) -> Vec<Partition> {
        let mut logs = self.logs();
        if logs.joined.is_none() {
            return Vec::new(); // assignments come once the member joined
        }
        let assigned = std::mem::take(&mut logs.assigned_events);
        assigned.into_iter().map(Partition).collect()
    }

    fn subscribe(&self) -> Result<(), SourceError> {
        {
            let mut logs = self.logs();
            // A member already in the group stays as it joined.
            logs.joined = logs.joined.or(Some(logs.tables_caught_up));
        }
        self.ready.notify_one();
        Ok(())
    }

    fn set_paused(&self, partition: Partition, paused: bool) -> Result<(), SourceError> {
        {
            let mut logs = self.logs();
            if paused {
                logs.paused.insert(partition.0);
            } else {
                logs.paused.remove(&partition.0);
            }
        }
        if !paused {
            self.ready.notify_one();
        }
        Ok(())
    }

    fn seek(&self, partition: Partition, offsets: &InputOffsets) -> Result<(), SourceError> {
        let mut logs = self.logs();
        for topic in &self.topics {
            let key = (topic.clone(), partition.0);
            // A topic the checkpoint has no offset for starts where a new group does: at
            // the beginning.
            let to = offsets.next(topic).unwrap_or(Offset(0));
            logs.positions.insert(key, to.0);
        }
        drop(logs);
        self.ready.notify_one();
        Ok(())
    }

    fn commit(&self, offsets: &GroupOffsets, wait: bool) -> Result<(), SourceError> {
        let mut logs = self.logs();
        for ((topic, partition), next) in offsets {
            logs.committed
                .insert((topic.clone(), partition.0), (*next, String::new()));
        }
        logs.commits.push((offsets.clone(), wait));
        Ok(())
    }

    async fn committed_checkpoint(&self, partition: Partition) -> Result<Committed, SourceError> {
        let logs = self.logs();
        let version = self.topics.iter().find_map(|topic| {
            logs.committed
                .get(&(topic.clone(), partition.0))
                .and_then(|(_, metadata)| parse_manifest_metadata(metadata))
        });
        let mut offsets = InputOffsets::new();
        for topic in &self.topics {
            if let Some((next, _)) = logs.committed.get(&(topic.clone(), partition.0)) {
                offsets.advance(topic, crate::ids::Offset(*next - 1));
            }
        }
        Ok(Committed { version, offsets })
    }

    fn high_watermark(&self, topic: &str, partition: Partition) -> Option<i64> {
        self.logs()
            .records
            .get(&(topic.to_owned(), partition.0))
            .map(|r| r.len() as i64)
    }

    fn at_end(&self, topic: &str, partition: Partition) -> bool {
        let logs = self.logs();
        let key = (topic.to_owned(), partition.0);
        let len = logs.records.get(&key).map_or(0, Vec::len) as i64;
        logs.positions.get(&key).copied().unwrap_or(0) >= len
    }

    /// The partition's records from `from` as they are at the call, 64 a chunk.
    fn read_table(
        &self,
        topic: &str,
        partition: Partition,
        from: Option<Offset>,
        chunks: tokio::sync::mpsc::Sender<Vec<InputRecord>>,
    ) -> impl std::future::Future<Output = Result<Offset, SourceError>> + Send {
        let start = from.map_or(0, |o| o.0.max(0));
        let records: Vec<InputRecord> = self
            .logs()
            .records
            .get(&(topic.to_owned(), partition.0))
            .map(|log| log.iter().skip(start as usize).cloned().collect())
            .unwrap_or_default();
        let end = records.last().map_or(start, |r| r.offset + 1);
        let what = format!("table `{topic}` partition {}", partition.0);
        async move {
            for chunk in records.chunks(64) {
                if chunks.send(chunk.to_vec()).await.is_err() {
                    return Err(SourceError {
                        what,
                        source: "the load was given up".into(),
                    });
                }
            }
            Ok(Offset(end))
        }
    }

    fn follow_table(
        &self,
        topic: &str,
        from: BTreeMap<i32, i64>,
        updates: tokio::sync::mpsc::Sender<crate::pipeline::ports::TableUpdate>,
    ) -> impl std::future::Future<Output = Result<(), SourceError>> + Send {
        use crate::pipeline::ports::TableUpdate;
        let source = self.clone();
        let topic = topic.to_owned();
        let mut appended = self.appended.subscribe();
        self.logs()
            .table_follows
            .push((topic.clone(), from.clone()));
        async move {
            let mut next = from;
            if source.table_past_end(&topic, &next) {
                next.clear();
                if updates.send(TableUpdate::Reset).await.is_err() {
                    return Ok(());
                }
            }
            let mut caught_up = false;
            loop {
                appended.borrow_and_update();
                let Some(records) = source.table_records(&topic, &mut next) else {
                    return Err(SourceError {
                        what: format!("global table `{topic}`"),
                        source: "the topic has no partitions".into(),
                    });
                };
                if !records.is_empty() && updates.send(TableUpdate::Records(records)).await.is_err()
                {
                    return Ok(());
                }
                if !caught_up {
                    if updates
                        .send(TableUpdate::CaughtUp(next.clone()))
                        .await
                        .is_err()
                    {
                        return Ok(());
                    }
                    caught_up = true;
                    source.logs().tables_caught_up += 1;
                }
                tokio::select! {
                    changed = appended.changed() => if changed.is_err() { return Ok(()) },
                    () = updates.closed() => return Ok(()),
                }
            }
        }
    }
}
