//! What a sink does with the outputs of records its shard processes again after it opened behind
//! its consumer group's committed offsets — only a fallback to an older checkpoint does that
//! (SCENARIOS.md S15, docs/checkpoints.md; a reset to a savepoint processes again what came
//! after it and sends its outputs again, and its shard opens without these offsets): an emit to an internal topic names its origin, so
//! that the stage downstream drops it as a repeat (`crate::time::edge`); exactly-once, an emit
//! to a topic of the tenant's, or a dead letter, is not sent again, since the transaction that
//! committed those offsets had committed it.

use super::KafkaSink;
use crate::runtime::InputRecord;
use crate::state::checkpoint::InputOffsets;

impl KafkaSink {
    /// Offsets, per input topic, below which a record's outputs may have been sent before
    /// (the group's committed offsets as the shard opened): an emit to an internal topic for
    /// a record below them names its origin, so that the stage downstream can drop it as a
    /// repeat if a frontier it read covers it; exactly-once, one to another topic is
    /// withheld ([`Self::committed_before`]). Above them nothing is a repeat, and no record
    /// carries an origin (`crate::time::edge`).
    pub fn replay_below(&mut self, committed: &InputOffsets) {
        self.replay_below = committed
            .iter()
            .map(|(topic, next)| (topic.to_owned(), next.0))
            .collect();
        self.input_replay_below = self
            .input_topics
            .iter()
            .map(|topic| self.replay_below_of(topic))
            .collect();
    }

    /// The offset below which records of `topic` were processed before ([`i64::MIN`]: none).
    pub(super) fn replay_below_of(&self, topic: &str) -> i64 {
        self.replay_below
            .iter()
            .find(|(t, _)| t == topic)
            .map_or(i64::MIN, |(_, next)| *next)
    }

    /// Whether an emit to output `output` for the record at `offset` of input topic `topic`
    /// (an index into the sink's input topics) went out before in a committed transaction:
    /// exactly-once, the record is below the group's committed offsets as the shard opened,
    /// and the output is a topic of the tenant's. Then it is not sent again: a
    /// `read_committed` consumer has it. An internal topic's emit is sent, with its origin (the
    /// stage downstream drops it); so is a fired timer's (no offset: when it fires depends on
    /// when the watermark moved, so no offset says whether it fired before).
    pub(super) fn committed_before(&mut self, output: u16, topic: usize, offset: i64) -> bool {
        let internal = self
            .outputs
            .get(usize::from(output))
            .and_then(Option::as_ref)
            .is_some_and(|o| o.marker_partitions.is_some());
        let below = offset >= 0
            && self
                .input_replay_below
                .get(topic)
                .is_some_and(|b| offset < *b);
        self.withheld_if(below && !internal, offset)
    }

    /// Whether `record`'s dead letter went out before in a committed transaction (as
    /// [`Self::committed_before`] says for an emit).
    pub(super) fn dead_letter_committed_before(&mut self, record: &InputRecord) -> bool {
        let below = record.offset >= 0 && record.offset < self.replay_below_of(&record.topic);
        self.withheld_if(below, record.offset)
    }

    /// `replayed` in exactly-once mode: counted as withheld, the first one logged.
    fn withheld_if(&mut self, replayed: bool, offset: i64) -> bool {
        if !replayed || self.group.is_none() {
            return false;
        }
        if self.withheld == 0 {
            tracing::info!(
                offset,
                "exactly-once after a fallback: the outputs of records below the group's committed offsets went out in transactions that committed; not sent again"
            );
        }
        self.withheld += 1;
        true
    }
}
