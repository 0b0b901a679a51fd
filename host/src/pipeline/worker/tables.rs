//! Table updates that reach a running shard (docs/topologies.md, "Tables"): the records of a
//! table input at the front of the backlog are applied to the shard — each sets, or when empty
//! clears, its key's value in the table's state — once every admitted record finished. So a
//! stream record sees exactly the updates its shard received before it, none after, whatever
//! its batch waits on. The table's offsets move with them; nothing of them runs the operator,
//! moves the watermark or counts as a record in.

use super::PartitionWorker;
use super::backlog::Backlog;
use crate::ids::Offset;
use crate::pipeline::WorkerError;
use crate::pipeline::events::Stall;
use crate::pipeline::ports::ShardSink;
use crate::pipeline::tables::table_writes;
use crate::runtime::InputRecord;
use crate::state::Shard;
use std::collections::VecDeque;

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// Whether the next record of `records` is a table update.
    pub(super) fn table_next(&self, records: &VecDeque<InputRecord>) -> bool {
        !self.tables.is_empty()
            && records
                .front()
                .is_some_and(|r| self.tables.contains_key(&*r.topic))
    }

    /// Applies the table updates at the front of `backlog` (everything admitted has finished).
    /// A state outage is waited out with the worker's backoff, told to the loop as a stall;
    /// returns `false`, nothing applied, when the worker was told to finish or revoked
    /// meanwhile (it then ends without its last checkpoint, as a batch in an outage does).
    pub(super) async fn apply_table_updates(
        &mut self,
        backlog: &mut Backlog,
    ) -> Result<bool, WorkerError> {
        let mut updates: Vec<(String, Vec<InputRecord>)> = Vec::new();
        while self.table_next(&backlog.records) {
            let Some(record) = backlog.records.pop_front() else {
                break;
            };
            // Delivered again around a seek: the state has it already.
            if self
                .admitted
                .next(&record.topic)
                .is_some_and(|next| record.offset < next.0)
            {
                continue;
            }
            self.admitted.advance(&record.topic, Offset(record.offset));
            match updates.last_mut() {
                Some((topic, records)) if **topic == *record.topic => records.push(record),
                _ => updates.push((record.topic.to_string(), vec![record])),
            }
        }
        let writes: Vec<_> = updates
            .iter()
            .flat_map(|(topic, records)| table_writes(records, &self.tables[topic]))
            .collect();
        if !writes.is_empty() && !self.apply_waiting_out_outages(writes).await {
            return Ok(false);
        }
        for (topic, records) in &updates {
            if let Some(last) = records.last() {
                self.offsets.advance(topic, Offset(last.offset));
                self.dirty = true;
            }
        }
        Ok(true)
    }

    /// Applies `writes`, again after each backoff step while the shard is unavailable;
    /// `false` when the worker was told to finish or revoked before they went in.
    async fn apply_waiting_out_outages(&mut self, writes: Vec<crate::state::StateWrite>) -> bool {
        let mut wait = self.settings.outage_backoff_min;
        loop {
            match self.shard.apply(writes.clone()).await {
                Ok(()) => break,
                Err(err) => {
                    if self.assignment.is_closing() {
                        self.gave_up = true;
                        return false;
                    }
                    tracing::warn!(partition = self.partition.0, error = %crate::error::Chain(&err), retry_in = ?wait, "cannot apply table updates; retrying");
                    self.events.stalled(Stall::StateOutage, true).await;
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(crate::pipeline::policy::OUTAGE_BACKOFF_MAX);
                }
            }
        }
        self.events
            .stalled(Stall::StateOutage, self.execution.backing_off > 0)
            .await;
        true
    }
}
