//! [`Ends`]: where the consumer stands against each input partition's end — whether the last
//! event of the partition was librdkafka's partition EOF (every record up to the end handed
//! out), and the offset after the last record it handed out. Between that offset and the end
//! there is no record a `read_committed` consumer gets: only transaction markers (one after
//! every transaction) and aborted records. So a partition written in transactions is not
//! behind by its markers: its lag counts from the last record (Kafka's Java consumer moves its
//! position over them the same way).

use super::TopicPartition;
use std::collections::HashMap;
use std::sync::Mutex;

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Ends(Mutex<HashMap<TopicPartition, End>>);

/// One partition's [`Ends`].
#[derive(Debug, Clone, Copy, Default)]
struct End {
    /// The offset after the last record handed out, or the one a seek set; `None` until
    /// either.
    next: Option<i64>,
    /// The last event was the partition's EOF.
    at_end: bool,
}

impl Ends {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<TopicPartition, End>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Records of `partition` were handed out, the last at offset `last` (none: only an EOF
    /// came), and the last event was its EOF (`at_end`) or a record.
    pub(super) fn handed(&self, partition: TopicPartition, last: Option<i64>, at_end: bool) {
        self.with(|ends| {
            let end = ends.entry(partition).or_default();
            if let Some(last) = last {
                end.next = Some(last.saturating_add(1));
            }
            end.at_end = at_end;
        });
    }

    /// `partition` was seeked to `next` (`None`: to a start librdkafka resolves). Whether it
    /// is at its end stays as its events since its assignment said: an EOF that came while
    /// the seek was made stands.
    pub(super) fn seeked(&self, partition: TopicPartition, next: Option<i64>) {
        self.with(|ends| ends.entry(partition).or_default().next = next);
    }

    /// `partitions` were assigned: each is at its end only once its fetches say so.
    pub(super) fn assigned(&self, partitions: &[i32]) {
        self.with(|ends| ends.retain(|(_, p), _| !partitions.contains(p)));
    }

    /// Whether `partition`'s last event was its EOF.
    pub(super) fn at_end(&self, partition: &TopicPartition) -> bool {
        self.with(|ends| ends.get(partition).is_some_and(|e| e.at_end))
    }

    /// The offset after the last record of `partition` handed out (or the seek's, when none
    /// was). At the partition's end — its EOF, or the statistics say so (an EOF of a
    /// partition fetched before its queue was split off reaches no queue) — it is below the
    /// end when transaction markers or aborted records follow the last record.
    pub(super) fn next(&self, partition: &TopicPartition) -> Option<i64> {
        self.with(|ends| ends.get(partition).and_then(|e| e.next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tp(partition: i32) -> TopicPartition {
        (Arc::from("in"), partition)
    }

    #[test]
    fn a_partition_is_handed_out_through_its_last_record_or_its_seek() {
        let ends = Ends::default();
        ends.seeked(tp(0), Some(10));
        assert!(!ends.at_end(&tp(0)));
        assert_eq!(ends.next(&tp(0)), Some(10), "resumed where the seek put it");
        ends.handed(tp(0), None, true);
        assert!(
            ends.at_end(&tp(0)),
            "an EOF and no record: resumed at its end"
        );
        assert_eq!(ends.next(&tp(0)), Some(10));
        // Records 10..=14, then (a transaction marker at 15) the EOF.
        ends.handed(tp(0), Some(14), false);
        assert!(!ends.at_end(&tp(0)));
        ends.handed(tp(0), None, true);
        assert!(ends.at_end(&tp(0)));
        assert_eq!(ends.next(&tp(0)), Some(15));
        assert_eq!(ends.next(&tp(1)), None, "another partition");
        ends.assigned(&[0]);
        assert!(!ends.at_end(&tp(0)), "assigned again: not known at its end");
        assert_eq!(ends.next(&tp(0)), None);
    }
}
