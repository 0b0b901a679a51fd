//! The asynchronous execution controller of one partition, as Flink 2.0's (FLIP-425): which
//! records may run now.
//!
//! Records are *admitted* in input order, up to `in_flight_max` at once, and leave when their
//! batch *finishes* (its effects applied, or its records dead-lettered). The controller forms
//! batches of admitted records under one rule: **a key is in at most one unfinished batch**.
//! So records with the same key run one after another in input order (they are taken in
//! admission order, and a key's later records wait until the batch holding its earlier ones
//! finishes), while records with other keys proceed in other batches while one waits for state.
//!
//! Keys are compared by a 64-bit hash of their bytes (xxh3): two keys that collide are simply
//! ordered as if they were one, which costs concurrency, never correctness.
//!
//! The controller is pure bookkeeping (no I/O, no clock); [`super::worker`] runs the batches it
//! hands out, and drains it (no admission until every admitted record finished) before a
//! checkpoint, so a checkpoint's offsets cover exactly the records whose effects the state holds.

use crate::runtime::InputRecord;
use foldhash::HashSet;
use std::collections::VecDeque;

/// A batch the controller handed out: its records in input order and its distinct key hashes
/// (to give back to [`ExecutionController::finish`]).
#[derive(Debug)]
pub(crate) struct Dispatch {
    /// The records, in input order.
    pub records: Vec<InputRecord>,
    /// Hashes of the records' distinct keys.
    pub keys: Vec<u64>,
}

/// Per-partition admission and batching under per-key FIFO order.
#[derive(Debug)]
pub(crate) struct ExecutionController {
    /// Admitted records not yet in a batch, in input order, with their key hashes.
    pending: VecDeque<(u64, InputRecord)>,
    /// Reused buffer for the records a batch leaves behind.
    kept: VecDeque<(u64, InputRecord)>,
    /// Keys of the batches handed out and not finished.
    running: HashSet<u64>,
    /// Reused: keys whose record was passed over while forming a batch.
    passed: HashSet<u64>,
    /// Reused: keys of the batch being formed.
    taking: HashSet<u64>,
    /// Admitted records not finished (pending plus running).
    in_flight: usize,
    in_flight_max: usize,
    batch_records_max: usize,
}

impl ExecutionController {
    /// A controller admitting up to `in_flight_max` records and forming batches of up to
    /// `batch_records_max` (both at least 1).
    pub fn new(in_flight_max: usize, batch_records_max: usize) -> Self {
        Self {
            pending: VecDeque::new(),
            kept: VecDeque::new(),
            running: HashSet::default(),
            passed: HashSet::default(),
            taking: HashSet::default(),
            in_flight: 0,
            in_flight_max: in_flight_max.max(1),
            batch_records_max: batch_records_max.max(1),
        }
    }

    /// Whether another record may be admitted (fewer than `in_flight_max` are in flight).
    pub fn has_room(&self) -> bool {
        self.in_flight < self.in_flight_max
    }

    /// Admits `record` (records must be admitted in input order).
    pub fn admit(&mut self, record: InputRecord) {
        let hash = key_hash(&record.key);
        self.pending.push_back((hash, record));
        self.in_flight += 1;
    }

    /// Records admitted and not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether every admitted record finished.
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0
    }

    /// The next batch that may run now: up to `batch_records_max` pending records, in input
    /// order, none of whose keys is in an unfinished batch, and no record taken past an
    /// earlier pending record of its key. `None` when no pending record may run.
    pub fn next_batch(&mut self) -> Option<Dispatch> {
        if self.pending.is_empty() {
            return None;
        }
        let mut records = Vec::new();
        self.passed.clear();
        self.taking.clear();
        while let Some((hash, record)) = self.pending.pop_front() {
            if records.len() == self.batch_records_max {
                self.kept.push_back((hash, record));
                self.kept.append(&mut self.pending);
                break;
            }
            let free = !self.passed.contains(&hash)
                && (self.taking.contains(&hash) || !self.running.contains(&hash));
            if free {
                self.taking.insert(hash);
                records.push(record);
            } else {
                self.passed.insert(hash);
                self.kept.push_back((hash, record));
            }
        }
        std::mem::swap(&mut self.pending, &mut self.kept);
        if records.is_empty() {
            return None;
        }
        let keys: Vec<u64> = self.taking.drain().collect();
        self.running.extend(keys.iter().copied());
        Some(Dispatch { records, keys })
    }

    /// Holds `keys` for a batch that is not made of admitted records (a round of fired timers,
    /// [`super::timers`]): until [`Self::finish`]ed with 0 records, records of those keys wait
    /// behind it, as behind an earlier batch of their key. Hold only keys not running (with
    /// nothing in flight, any).
    pub fn hold(&mut self, keys: &[u64]) {
        debug_assert!(keys.iter().all(|k| !self.running.contains(k)));
        self.running.extend(keys.iter().copied());
    }

    /// Ends a batch handed out by [`Self::next_batch`] (or held by [`Self::hold`]): its
    /// `records` records leave the in-flight count and its keys may run again.
    pub fn finish(&mut self, keys: &[u64], records: usize) {
        for key in keys {
            self.running.remove(key);
        }
        self.in_flight -= records;
    }
}

/// The hash a key is ordered by.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn record(key: u8, offset: i64) -> InputRecord {
        InputRecord {
            topic: "in".into(),
            partition: 0,
            offset,
            input: 0,
            key: vec![key],
            value: Vec::new(),
            timestamp_ms: 0,
            headers: Vec::new(),
        }
    }

    #[test]
    fn a_key_in_a_running_batch_waits_while_other_keys_go_on() {
        let mut c = ExecutionController::new(100, 10);
        for (offset, key) in [1u8, 2, 1, 3].into_iter().enumerate() {
            c.admit(record(key, offset as i64));
        }
        let first = c.next_batch().expect("a batch");
        let offsets: Vec<i64> = first.records.iter().map(|r| r.offset).collect();
        assert_eq!(
            offsets,
            [0, 1, 2, 3],
            "same-key records share a batch in order"
        );

        c.admit(record(1, 4));
        c.admit(record(4, 5));
        c.admit(record(1, 6));
        let second = c.next_batch().expect("key 4 is free");
        let offsets: Vec<i64> = second.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [5], "key 1 is running; key 4 is not");
        assert!(
            c.next_batch().is_none(),
            "only key 1 is pending, and it runs"
        );

        c.finish(&first.keys, first.records.len());
        let third = c.next_batch().expect("key 1 is free again");
        let offsets: Vec<i64> = third.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [4, 6]);
        assert_eq!(c.in_flight(), 3);
    }

    /// A round of timers holds its keys: a held key's records wait behind it, as behind an
    /// earlier batch of their key, while other keys' records run.
    #[test]
    fn records_of_a_held_key_wait_for_its_round_and_other_keys_go_on() {
        let mut c = ExecutionController::new(100, 10);
        let round = [key_hash(&[1])];
        c.hold(&round);
        c.admit(record(1, 0));
        c.admit(record(2, 1));
        c.admit(record(1, 2));
        let other = c.next_batch().expect("key 2 is free");
        let offsets: Vec<i64> = other.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [1]);
        assert!(c.next_batch().is_none(), "key 1 waits for its round");
        assert!(!c.is_idle());
        c.finish(&round, 0);
        let after = c.next_batch().expect("the round ended");
        let offsets: Vec<i64> = after.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [0, 2], "key 1's records in input order");
        assert_eq!(c.in_flight(), 3, "a round holds keys, not records");
    }

    #[test]
    fn a_full_batch_leaves_the_rest_in_order() {
        let mut c = ExecutionController::new(100, 2);
        for offset in 0..5 {
            c.admit(record(offset as u8, offset));
        }
        let a = c.next_batch().expect("a batch");
        let b = c.next_batch().expect("a batch");
        let offsets: Vec<i64> = a
            .records
            .iter()
            .chain(&b.records)
            .map(|r| r.offset)
            .collect();
        assert_eq!(offsets, [0, 1, 2, 3]);
    }

    #[test]
    fn admission_stops_at_in_flight_max_until_a_batch_finishes() {
        let mut c = ExecutionController::new(3, 10);
        for offset in 0..3 {
            assert!(c.has_room());
            c.admit(record(0, offset));
        }
        assert!(!c.has_room());
        let batch = c.next_batch().expect("a batch");
        assert!(!c.has_room(), "running records are still in flight");
        c.finish(&batch.keys, batch.records.len());
        assert!(c.is_idle());
        assert!(c.has_room());
    }

    proptest! {
        /// Whatever the keys and whichever running batch finishes first, each key's records
        /// are handed out in input order, no two unfinished batches share a key, in-flight
        /// stays within its limit, and every record is handed out once.
        #[test]
        fn batches_keep_per_key_order_under_any_completion_order(
            keys in proptest::collection::vec(0u8..12, 1..400),
            choices in proptest::collection::vec(any::<prop::sample::Index>(), 400),
            in_flight_max in 1usize..64,
            batch_records_max in 1usize..16,
            concurrency in 1usize..6,
        ) {
            let mut c = ExecutionController::new(in_flight_max, batch_records_max);
            let mut input = keys.iter().enumerate().map(|(o, k)| record(*k, o as i64)).peekable();
            let mut running: Vec<Dispatch> = Vec::new();
            let mut handed_out: BTreeMap<u8, Vec<i64>> = BTreeMap::new();
            let mut choice = choices.iter().cycle();
            let mut peak_running = 0;
            loop {
                while c.has_room() && let Some(next) = input.next() {
                    c.admit(next);
                }
                prop_assert!(c.in_flight() <= in_flight_max);
                while running.len() < concurrency {
                    let Some(batch) = c.next_batch() else { break };
                    for other in &running {
                        for key in &batch.keys {
                            prop_assert!(!other.keys.contains(key), "a key in two running batches");
                        }
                    }
                    for r in &batch.records {
                        handed_out.entry(r.key[0]).or_default().push(r.offset);
                    }
                    running.push(batch);
                }
                peak_running = peak_running.max(running.len());
                if running.is_empty() {
                    prop_assert!(input.peek().is_none() && c.is_idle(), "stuck with work left");
                    break;
                }
                let done = running.swap_remove(choice.next().expect("cycled").index(running.len()));
                c.finish(&done.keys, done.records.len());
            }
            let mut total = 0;
            for (key, offsets) in &handed_out {
                total += offsets.len();
                prop_assert!(offsets.windows(2).all(|w| w[0] < w[1]), "key {key} out of order: {offsets:?}");
            }
            prop_assert_eq!(total, keys.len());
            prop_assert!(peak_running >= 1);
        }
    }
}
