//! Isolating the records of a batch whose call failed: which sub-ranges of the batch to call
//! next, so that the records that fail alone are found in few calls and every other record's
//! effects are applied once, in input order.
//!
//! A batch runs whole first. After a trap, the guest's progress guides the split: a guest goes
//! through its records in order, and the host knows the highest record its imports named
//! before the trap (`reached`, one past it). So the records before it most likely finished and
//! run again as one call, and the trapping record is that one or the next, each tried alone:
//! one trapping record costs about four calls, and the records before it run twice (once up
//! to the trap, once to apply them), whatever the number of traps in the batch (SCENARIOS.md
//! S21). The re-runs take the values the failed call read, rather than reading the shard
//! again, for every key whose records' effects were not applied since (`super::attempt`). The hint is only ever a guess: each guided split predicts how its first part ends,
//! and once a prediction is wrong (a guest that names records out of order, or none) the task
//! halves instead — the left half run (and its effects applied) before the right one, a key
//! can have records in both — and a half that traps is split again, until the trapping record
//! stands alone: at most `2·⌈log₂ n⌉ + 1` calls for one trapping record in `n` instead of
//! `n + 1` (a bisection; the "split and retry" of Flink's batch-wise `AsyncWaitOperator`
//! failures). A range that hit its CPU deadline is re-run one record at a time instead: a
//! range's deadline is its records' deadlines summed, so halving would spend the looping
//! record's budget at every level. A range in which a record rejected after staging effects is
//! cut around that record, so that exactly its effects are discarded.
//!
//! The state machine knows nothing of records or guests, only index ranges of one batch, so
//! the same isolation serves batches of input records and (later) batches of fired timers.
//!
//! Invariant: the ranges still to run are disjoint, in input order, and together with the
//! ranges already finished cover `0..n` exactly once — whatever the hints say.

use std::collections::VecDeque;
use std::ops::Range;

/// How the last call over [`Isolation::current`] ended, as far as isolation cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The call succeeded and its effects were applied (or its records dead-lettered).
    Done,
    /// The guest trapped (not on its deadline), having named records up to `reached` (one
    /// past the highest index its imports named, counted from the start of the range called;
    /// `Some(0)`: none) — `None` when the failure says nothing of its progress.
    Trapped {
        /// How far the guest got in the range.
        reached: Option<usize>,
    },
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
    /// Whether the guest's progress still guides splits: false once a guided split's
    /// prediction was wrong.
    guided: bool,
    /// What the last guided split predicted of the range it put first: it traps (`true`) or
    /// not.
    predicted: Option<(Range<usize>, bool)>,
}

impl Isolation {
    /// A batch of `n` records (n ≥ 1), to be called whole.
    pub fn whole(n: usize) -> Self {
        let mut pending = VecDeque::with_capacity(1);
        pending.push_back(0..n);
        Self {
            pending,
            guided: true,
            predicted: None,
        }
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
        if let Some((predicted, traps)) = self.predicted.take()
            && predicted == range
            && traps != matches!(outcome, Outcome::Trapped { .. })
        {
            // The guest's progress misled: halve from here on.
            self.guided = false;
        }
        match outcome {
            Outcome::Done => Verdict::Continue,
            Outcome::Trapped { .. } | Outcome::Deadline if range.len() == 1 => {
                // Put it back until the caller has settled it (dead letter), so that
                // `current` keeps naming it.
                let index = range.start;
                self.pending.push_front(range);
                Verdict::Isolated(index)
            }
            Outcome::Trapped { reached } => {
                let guided = reached.filter(|_| self.guided);
                let (parts, traps) = match guided {
                    Some(reached) => guided_split(&range, reached),
                    None => {
                        let mid = range.start + range.len() / 2;
                        (vec![range.start..mid, mid..range.end], None)
                    }
                };
                self.predicted = traps.map(|traps| (parts[0].clone(), traps));
                for part in parts.into_iter().rev() {
                    self.pending.push_front(part);
                }
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

/// The parts, in order, that a guest which got to `reached` (one past the highest index it
/// named, counted from the start of `range`, two records or more) suggests splitting `range`
/// into, and whether the first is expected to trap.
///
/// Named `reached - 1`, the guest had finished every record before it: those run clean as one
/// call. The trap is at `reached - 1` (named, then trapped) or at `reached` (trapped before its
/// first import): each is tried alone, then the rest runs — so a trap costs no call over the
/// rest of the range that would trap at once.
fn guided_split(range: &Range<usize>, reached: usize) -> (Vec<Range<usize>>, Option<bool>) {
    let (start, end) = (range.start, range.end);
    if reached == 0 {
        // No record named: the first trapped before its first import. Alone, it traps.
        return (vec![start..start + 1, start + 1..end], Some(true));
    }
    let named = (start + reached - 1).min(end - 1);
    let next = (named + 1).min(end);
    let parts: Vec<Range<usize>> = [
        start..named,
        named..named + 1,
        next..(next + 1).min(end),
        (next + 1).min(end)..end,
    ]
    .into_iter()
    .filter(|part| !part.is_empty())
    .collect();
    // The finished records run clean; the lone records may trap or not.
    let clean = (named > start).then_some(false);
    (parts, clean)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// What a simulated guest tells of its progress when it traps.
    #[derive(Debug, Clone, Copy)]
    enum Guest {
        /// Nothing (halving only).
        Blind,
        /// Goes through its records in order, naming each in an import; a trapping record
        /// names itself before it traps when `named_then_trapped`.
        InOrder { named_then_trapped: bool },
        /// Names the range's last record first, whatever it does: a misleading hint.
        Misleading,
    }

    /// Runs isolation over `n` records against `guest`, which traps on the records in `traps`
    /// (on its deadline for those in `loops`); returns (calls made, records isolated, records
    /// whose effects were applied, in order, record executions).
    fn isolate(
        n: usize,
        traps: &BTreeSet<usize>,
        loops: &BTreeSet<usize>,
        guest: Guest,
    ) -> (usize, Vec<usize>, Vec<usize>, usize) {
        let mut isolation = Isolation::whole(n);
        let (mut calls, mut isolated, mut applied, mut executed) = (0, Vec::new(), Vec::new(), 0);
        while let Some(range) = isolation.current() {
            calls += 1;
            let trap = range.clone().find(|i| traps.contains(i));
            let outcome = if range.clone().any(|i| loops.contains(&i)) {
                executed += range.len();
                Outcome::Deadline
            } else if let Some(trap) = trap {
                executed += trap - range.start + 1;
                let reached = match guest {
                    Guest::Blind => None,
                    Guest::InOrder { named_then_trapped } => {
                        Some(trap - range.start + usize::from(named_then_trapped))
                    }
                    Guest::Misleading => Some(range.len()),
                };
                Outcome::Trapped { reached }
            } else {
                executed += range.len();
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
        (calls, isolated, applied, executed)
    }

    #[test]
    fn one_trapping_record_in_512_is_isolated_in_about_2_log2_n_calls_without_a_trusty_hint() {
        for guest in [Guest::Blind, Guest::Misleading] {
            for bad in [0, 1, 255, 256, 300, 511] {
                let (calls, isolated, applied, _) =
                    isolate(512, &BTreeSet::from([bad]), &BTreeSet::new(), guest);
                // A misleading hint costs at most two calls before halving takes over.
                assert!(calls <= 2 * 9 + 3, "{guest:?} record {bad}: {calls} calls");
                assert_eq!(isolated, vec![bad]);
                let expected: Vec<usize> = (0..512).filter(|i| *i != bad).collect();
                assert_eq!(applied, expected, "every other record once, in order");
            }
        }
    }

    #[test]
    fn a_guest_going_in_order_has_each_trap_isolated_in_a_few_calls_and_each_record_run_at_most_about_twice()
     {
        // One record in a hundred traps (SCENARIOS.md S21): five in a batch of 512.
        let traps: BTreeSet<usize> = (0..512).filter(|i| i % 100 == 37).collect();
        for named_then_trapped in [false, true] {
            let guest = Guest::InOrder { named_then_trapped };
            let (calls, isolated, applied, executed) =
                isolate(512, &traps, &BTreeSet::new(), guest);
            assert_eq!(isolated, traps.iter().copied().collect::<Vec<_>>());
            assert_eq!(applied.len(), 512 - traps.len());
            assert!(
                calls <= 1 + 5 * traps.len(),
                "{guest:?}: {calls} calls for {} traps",
                traps.len()
            );
            assert!(
                executed <= 2 * 512 + 5 * traps.len(),
                "{guest:?}: {executed} record executions for 512 records"
            );
            // Halving the same batch runs far more.
            let (blind_calls, _, _, blind_executed) =
                isolate(512, &traps, &BTreeSet::new(), Guest::Blind);
            assert!(calls < blind_calls && executed < blind_executed);
        }
    }

    #[test]
    fn a_record_past_its_deadline_is_found_one_record_at_a_time() {
        let (calls, isolated, applied, _) =
            isolate(8, &BTreeSet::new(), &BTreeSet::from([5]), Guest::Blind);
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
            guest in 0usize..4,
        ) {
            let traps: BTreeSet<usize> = traps.into_iter().filter(|i| *i < n).collect();
            let loops: BTreeSet<usize> = loops.into_iter().filter(|i| *i < n && !traps.contains(i)).collect();
            let guest = [
                Guest::Blind,
                Guest::InOrder { named_then_trapped: false },
                Guest::InOrder { named_then_trapped: true },
                Guest::Misleading,
            ][guest];
            let (_, isolated, applied, _) = isolate(n, &traps, &loops, guest);
            let failing: Vec<usize> = traps.union(&loops).copied().collect();
            prop_assert_eq!(isolated, failing.clone());
            let expected: Vec<usize> = (0..n).filter(|i| !failing.contains(i)).collect();
            prop_assert_eq!(applied, expected);
        }
    }
}
