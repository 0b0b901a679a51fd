//! Isolating the records of a batch whose call failed: which sub-ranges of the batch to call
//! next, so that the records that fail alone are found in few calls and every other record's
//! effects are applied once, in input order.
//!
//! A batch runs whole first. After a trap it is split in halves, the left half run (and its
//! effects applied) before the right one — a key can have records in both — and a half that
//! traps is split again, until the trapping record stands alone: one trapping record in a batch
//! of `n` costs at most `2·⌈log₂ n⌉ + 1` calls instead of `n + 1` (as a bisection; the
//! "split and retry" of Flink's batch-wise `AsyncWaitOperator` failures). A range that hit its
//! CPU deadline is re-run one record at a time instead: a range's deadline is its records'
//! deadlines summed, so halving would spend the looping record's budget at every level. A range
//! in which a record rejected after staging effects is cut around that record, so that exactly
//! its effects are discarded.
//!
//! The state machine knows nothing of records or guests, only index ranges of one batch, so
//! the same isolation serves batches of input records and (later) batches of fired timers.
//!
//! Invariant: the ranges still to run are disjoint, in input order, and together with the
//! ranges already finished cover `0..n` exactly once.

use std::collections::VecDeque;
use std::ops::Range;

/// How the last call over [`Isolation::current`] ended, as far as isolation cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The call succeeded and its effects were applied (or its records dead-lettered).
    Done,
    /// The guest trapped (not on its deadline).
    Trapped,
    /// The call ran out of its CPU deadline.
    Deadline,
    /// The call succeeded, but the record at this index of the batch rejected after staging
    /// effects, so nothing of the call was applied.
    RejectedWithEffects(usize),
}

/// What to do about a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go on: [`Isolation::current`] is the next range to call (or none is left).
    Continue,
    /// The record at this index of the batch failed alone: dead-letter it (or apply the
    /// failure policy), then call [`Isolation::record_settled`].
    Isolated(usize),
}

/// The ranges of one batch still to be called. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Isolation {
    /// Ranges to call, front first.
    pending: VecDeque<Range<usize>>,
}

impl Isolation {
    /// A batch of `n` records (n ≥ 1), to be called whole.
    pub fn whole(n: usize) -> Self {
        let mut pending = VecDeque::with_capacity(1);
        pending.push_back(0..n);
        Self { pending }
    }

    /// The range the next call covers; `None` when every record is settled.
    pub fn current(&self) -> Option<Range<usize>> {
        self.pending.front().cloned()
    }

    /// Whether the next call covers the whole batch (nothing failed yet).
    pub fn is_whole(&self, n: usize) -> bool {
        self.pending.len() == 1 && self.pending[0] == (0..n)
    }

    /// Whether nothing is left to call.
    pub fn is_finished(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes the outcome of the call over [`Isolation::current`].
    ///
    /// # Panics
    /// When nothing is pending (a caller bug), or an index lies outside the current range.
    pub fn settle(&mut self, outcome: Outcome) -> Verdict {
        let range = self
            .pending
            .pop_front()
            .expect("settle is called for the current range");
        match outcome {
            Outcome::Done => Verdict::Continue,
            Outcome::Trapped | Outcome::Deadline if range.len() == 1 => {
                // Put it back until the caller has settled it (dead letter), so that
                // `current` keeps naming it.
                let index = range.start;
                self.pending.push_front(range);
                Verdict::Isolated(index)
            }
            Outcome::Trapped => {
                let mid = range.start + range.len() / 2;
                self.pending.push_front(mid..range.end);
                self.pending.push_front(range.start..mid);
                Verdict::Continue
            }
            Outcome::Deadline => {
                for i in range.rev() {
                    self.pending.push_front(i..i + 1);
                }
                Verdict::Continue
            }
            Outcome::RejectedWithEffects(index) => {
                assert!(
                    range.contains(&index),
                    "the rejected record is in the range"
                );
                if range.len() == 1 {
                    self.pending.push_front(range);
                    return Verdict::Isolated(index);
                }
                for part in [index + 1..range.end, index..index + 1, range.start..index] {
                    if !part.is_empty() {
                        self.pending.push_front(part);
                    }
                }
                Verdict::Continue
            }
        }
    }

    /// The record [`Verdict::Isolated`] named has been dealt with: move past it.
    pub fn record_settled(&mut self) {
        let settled = self.pending.pop_front();
        debug_assert!(settled.is_some_and(|r| r.len() == 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Runs isolation over `n` records against a guest that traps on the records in `traps`
    /// (on its deadline for those in `loops`); returns (calls made, records isolated, records
    /// whose effects were applied, in order).
    fn isolate(
        n: usize,
        traps: &BTreeSet<usize>,
        loops: &BTreeSet<usize>,
    ) -> (usize, Vec<usize>, Vec<usize>) {
        let mut isolation = Isolation::whole(n);
        let (mut calls, mut isolated, mut applied) = (0, Vec::new(), Vec::new());
        while let Some(range) = isolation.current() {
            calls += 1;
            let outcome = if range.clone().any(|i| loops.contains(&i)) {
                Outcome::Deadline
            } else if range.clone().any(|i| traps.contains(&i)) {
                Outcome::Trapped
            } else {
                Outcome::Done
            };
            if outcome == Outcome::Done {
                applied.extend(range.clone());
            }
            if let Verdict::Isolated(i) = isolation.settle(outcome) {
                isolated.push(i);
                isolation.record_settled();
            }
            assert!(calls <= 4 * n + 1, "isolation ends");
        }
        (calls, isolated, applied)
    }

    #[test]
    fn one_trapping_record_in_512_is_isolated_in_at_most_2_log2_n_plus_1_calls() {
        for bad in [0, 1, 255, 256, 300, 511] {
            let (calls, isolated, applied) = isolate(512, &BTreeSet::from([bad]), &BTreeSet::new());
            assert!(calls <= 2 * 9 + 1, "record {bad}: {calls} calls");
            assert_eq!(isolated, vec![bad]);
            let expected: Vec<usize> = (0..512).filter(|i| *i != bad).collect();
            assert_eq!(applied, expected, "every other record once, in order");
        }
    }

    #[test]
    fn a_record_past_its_deadline_is_found_one_record_at_a_time() {
        let (calls, isolated, applied) = isolate(8, &BTreeSet::new(), &BTreeSet::from([5]));
        assert_eq!(calls, 1 + 8, "the whole batch, then each record alone");
        assert_eq!(isolated, vec![5]);
        assert_eq!(applied, vec![0, 1, 2, 3, 4, 6, 7]);
    }

    #[test]
    fn a_rejection_with_effects_cuts_the_range_around_the_record() {
        let mut isolation = Isolation::whole(10);
        assert!(isolation.is_whole(10));
        assert_eq!(
            isolation.settle(Outcome::RejectedWithEffects(4)),
            Verdict::Continue
        );
        assert_eq!(isolation.current(), Some(0..4));
        isolation.settle(Outcome::Done);
        assert_eq!(isolation.current(), Some(4..5));
        assert_eq!(
            isolation.settle(Outcome::RejectedWithEffects(4)),
            Verdict::Isolated(4)
        );
        isolation.record_settled();
        assert_eq!(isolation.current(), Some(5..10));
        isolation.settle(Outcome::Done);
        assert!(isolation.is_finished());
    }

    proptest! {
        #[test]
        fn isolation_finds_exactly_the_failing_records_and_applies_the_rest_in_order(
            n in 1usize..300,
            traps in proptest::collection::btree_set(0usize..300, 0..12),
            loops in proptest::collection::btree_set(0usize..300, 0..3),
        ) {
            let traps: BTreeSet<usize> = traps.into_iter().filter(|i| *i < n).collect();
            let loops: BTreeSet<usize> = loops.into_iter().filter(|i| *i < n && !traps.contains(i)).collect();
            let (_, isolated, applied) = isolate(n, &traps, &loops);
            let failing: Vec<usize> = traps.union(&loops).copied().collect();
            prop_assert_eq!(isolated, failing.clone());
            let expected: Vec<usize> = (0..n).filter(|i| !failing.contains(i)).collect();
            prop_assert_eq!(applied, expected);
        }
    }
}
