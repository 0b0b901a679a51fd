//! What a partition's worker received from its queue and has not admitted yet: records wait
//! here while the in-flight window is full, and the queue behind them fills and pauses the
//! partition (module docs of `worker`).

use crate::pipeline::events::Batch;
use crate::pipeline::timers::Timers;
use crate::runtime::InputRecord;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Records received from the partition's queue and not admitted yet (the in-flight limit), the
/// topics of those received since it was last empty, and whether the queue is closed.
#[derive(Default)]
pub(super) struct Backlog {
    /// The records, in the order received.
    pub(super) records: VecDeque<InputRecord>,
    /// The topics of the records received since it was last empty.
    pub(super) topics: Vec<Arc<str>>,
    /// The queue is closed: nothing more comes.
    pub(super) closed: bool,
}

impl Backlog {
    /// Takes `first` and every batch queued behind it at once: behind a steady stream of
    /// finishing attempts (served first), one batch per intake kept the in-flight window from
    /// filling under CPU load. Their topics are active from their arrival, admitted or not.
    /// `None` (the loop closed the queue after the last batch) closes the backlog. A table's
    /// records (topics in `tables`) make no topic active: tables never hold the watermark.
    pub(super) fn receive(
        &mut self,
        first: Option<Batch>,
        queue: &mut mpsc::Receiver<Batch>,
        (timers, tables): (&mut Timers, &BTreeMap<String, String>),
    ) {
        let mut next = first;
        loop {
            let Some(records) = next else {
                self.closed = true;
                return;
            };
            let now = timers.now_ms();
            for record in &records {
                if tables.contains_key(&*record.topic) {
                    continue;
                }
                timers.watermarks_mut().seen(&record.topic, now);
                if !self
                    .topics
                    .iter()
                    .any(|t| Arc::ptr_eq(t, &record.topic) || *t == record.topic)
                {
                    self.topics.push(record.topic.clone());
                }
            }
            self.records.extend(records);
            next = match queue.try_recv() {
                Ok(message) => Some(message),
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            };
        }
    }

    /// Drops what waits, and closes the queue with what is still in it.
    pub(super) fn close(&mut self, queue: &mut mpsc::Receiver<Batch>) {
        self.records.clear();
        queue.close();
        while queue.try_recv().is_ok() {}
        self.closed = true;
    }
}
