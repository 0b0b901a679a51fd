//! The soak's input and output: a steady producer into each pipeline's input topic, what it
//! produced (the oracle: per key, how many records; per key, the timers set), and readers of
//! each pipeline's output that keep what came out — counts and fired timers per key, and per
//! input partition the furthest offset an output answered and how late.

use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Keys the producer spreads records over.
pub const KEYS: u64 = 200;

/// Partitions of every input topic.
pub const PARTITIONS: i32 = 4;

/// One in this many records of the exactly-once pipeline sets a timer instead of counting.
const TIMER_EVERY: u64 = 20;

/// Whether record `seq` of the exactly-once input sets a timer: one in each [`TIMER_EVERY`],
/// at a place that moves by one each block, so that timers land on every key's partition (a
/// fixed place, with 200 keys over 4 partitions, would put them all on partition 0).
fn sets_timer(seq: u64) -> bool {
    (seq + seq / TIMER_EVERY).is_multiple_of(TIMER_EVERY)
}

/// What went into one pipeline and what came out of it.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Per key, records produced that count.
    pub produced: BTreeMap<String, u64>,
    /// Per key, the timers set (by name).
    pub timers_set: BTreeMap<String, BTreeSet<String>>,
    /// Per (partition, offset) of the input, when it was produced.
    produced_at: BTreeMap<(i32, i64), Instant>,
    /// Per input partition, the highest offset produced.
    pub high: BTreeMap<i32, i64>,
    /// Per key, each count emitted, in the order read.
    pub counts: BTreeMap<String, Vec<u64>>,
    /// Per key, per input offset, the counts the outputs answered it with: more than one for
    /// an offset is a record counted twice into one state (the failure message says so).
    pub answered_with: BTreeMap<String, BTreeMap<i64, BTreeSet<u64>>>,
    /// Per key, each timer that fired, in the order read (a name twice is a timer fired
    /// twice).
    pub fired: BTreeMap<String, Vec<String>>,
    /// Per input partition, the highest offset an output answered, and when it was read.
    pub answered: BTreeMap<i32, (i64, Instant)>,
    /// The longest time from a record's production to its output being read.
    pub worst_lag: Duration,
    /// Records whose delivery the soak's producer could not confirm: the oracle does not know
    /// whether they are in the input.
    pub unconfirmed: u64,
}

impl Ledger {
    /// Whether every partition has an output for an input offset at or past `offsets`'.
    pub fn answered_past(&self, offsets: &BTreeMap<i32, i64>) -> bool {
        offsets
            .iter()
            .all(|(p, o)| self.answered.get(p).is_some_and(|(a, _)| a >= o))
    }

    /// Whether every key has shown its final count and every timer set has fired.
    pub fn caught_up(&self) -> bool {
        self.produced
            .iter()
            .all(|(k, n)| self.counts.get(k).and_then(|c| c.iter().max()) == Some(n))
            && self.timers_set.iter().all(|(k, names)| {
                let fired: BTreeSet<&String> = self.fired.get(k).into_iter().flatten().collect();
                names.iter().all(|n| fired.contains(n))
            })
    }
}

/// One pipeline's traffic: its topics and the ledger.
#[derive(Debug, Clone)]
pub struct Traffic {
    /// The input topic (Kafka's name).
    pub input: String,
    /// The output topic (Kafka's name).
    pub output: String,
    /// Whether the pipeline is exactly-once (its output read `read_committed`) and gets timer
    /// records.
    pub exactly_once: bool,
    /// What went in and came out.
    pub ledger: Arc<Mutex<Ledger>>,
}

impl Traffic {
    /// The traffic of a pipeline over `input` and `output`.
    pub fn new(input: String, output: String, exactly_once: bool) -> Self {
        Self {
            input,
            output,
            exactly_once,
            ledger: Arc::new(Mutex::new(Ledger::default())),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Produces `per_second` records a second to the input until `stop` is set: keys
    /// `k0`…`k199`, a key always to one partition; for the exactly-once pipeline one in
    /// [`TIMER_EVERY`] sets a timer (event time 5 s past its timestamp, or processing time
    /// 3 s from now, in turn) and is not counted. Each record enters the ledger once its
    /// delivery is acknowledged.
    pub async fn produce(
        &self,
        producer: FutureProducer,
        per_second: u64,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) {
        let tick = Duration::from_millis(50);
        let per_tick = (per_second * 50 / 1000).max(1);
        let mut seq: u64 = 0;
        let mut next = tokio::time::Instant::now();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            next += tick;
            tokio::time::sleep_until(next).await;
            let mut sends = Vec::with_capacity(per_tick as usize);
            for _ in 0..per_tick {
                seq += 1;
                let k = seq % KEYS;
                let key = format!("k{k}");
                let partition = (k % PARTITIONS as u64) as i32;
                let now_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                let timer = self.exactly_once && sets_timer(seq);
                let value = if timer && (seq / TIMER_EVERY).is_multiple_of(2) {
                    format!("timer:event:t{seq}:{}", now_ms + 5_000)
                } else if timer {
                    format!("timer:processing:t{seq}:{}", now_ms + 3_000)
                } else {
                    format!("record {seq}")
                };
                let producer = producer.clone();
                let topic = self.input.clone();
                sends.push(async move {
                    let record = FutureRecord::to(&topic)
                        .key(&key)
                        .payload(&value)
                        .partition(partition)
                        .timestamp(now_ms);
                    let sent = producer.send(record, Duration::from_secs(60)).await;
                    (key, seq, timer, partition, sent.ok())
                });
            }
            for (key, seq, timer, partition, delivered) in futures::future::join_all(sends).await {
                let mut ledger = self.ledger();
                let Some(delivery) = delivered else {
                    ledger.unconfirmed += 1;
                    continue;
                };
                if timer {
                    ledger
                        .timers_set
                        .entry(key)
                        .or_default()
                        .insert(format!("t{seq}"));
                } else {
                    *ledger.produced.entry(key).or_default() += 1;
                }
                ledger
                    .produced_at
                    .insert((partition, delivery.offset), Instant::now());
                let high = ledger.high.entry(partition).or_insert(-1);
                *high = (*high).max(delivery.offset);
            }
        }
    }

    /// Reads the output from its start (`read_committed` for the exactly-once pipeline) into
    /// the ledger, for ever.
    ///
    /// # Errors
    /// When the consumer cannot be created.
    pub async fn read(&self, bootstrap: &str) -> anyhow::Result<()> {
        let consumer = reader(bootstrap, &self.output, self.exactly_once)?;
        let mut positions = OutputPositions::default();
        loop {
            let Ok(message) = consumer.recv().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            if !positions.first_read(message.partition(), message.offset()) {
                continue;
            }
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            let Ok(value) =
                serde_json::from_slice::<serde_json::Value>(message.payload().unwrap_or_default())
            else {
                continue;
            };
            let read_at = Instant::now();
            let mut ledger = self.ledger();
            if let Some(name) = value["fired"].as_str() {
                ledger.fired.entry(key).or_default().push(name.to_owned());
                continue;
            }
            let (Some(count), Some(offset)) = (value["count"].as_u64(), value["offset"].as_i64())
            else {
                continue;
            };
            let partition = key
                .strip_prefix('k')
                .and_then(|k| k.parse::<u64>().ok())
                .map_or(0, |k| (k % PARTITIONS as u64) as i32);
            ledger
                .answered_with
                .entry(key.clone())
                .or_default()
                .entry(offset)
                .or_default()
                .insert(count);
            ledger.counts.entry(key).or_default().push(count);
            if let Some(produced) = ledger.produced_at.get(&(partition, offset)).copied() {
                ledger.worst_lag = ledger.worst_lag.max(read_at - produced);
            }
            let answered = ledger.answered.entry(partition).or_insert((-1, read_at));
            if offset > answered.0 {
                *answered = (offset, read_at);
            }
        }
    }

    /// Makes `tally` (what the input topic holds) the oracle in place of what the producer's
    /// acknowledgements counted. Returns a note when they differ: more in the topic is the
    /// producer's doing (a retry written twice, an unconfirmed delivery that landed) and what
    /// Weir must count; fewer is records the broker acknowledged and lost, a problem.
    pub fn adopt_input(&self, tally: InputTally) -> (Option<String>, Option<String>) {
        let mut ledger = self.ledger();
        let acknowledged = InputTally {
            produced: ledger.produced.clone(),
            timers_set: ledger.timers_set.clone(),
        };
        let (held, acked) = (tally.records(), acknowledged.records());
        let lost = acknowledged
            .produced
            .iter()
            .any(|(key, n)| tally.produced.get(key).copied().unwrap_or_default() < *n)
            || acknowledged.timers_set.iter().any(|(key, names)| {
                !tally
                    .timers_set
                    .get(key)
                    .is_some_and(|t| t.is_superset(names))
            });
        let problem = lost.then(|| {
            format!(
                "{}: the topic holds fewer records of some key than the producer saw acknowledged ({held} against {acked})",
                self.input
            )
        });
        let note = (held != acked).then(|| {
            format!(
                "{}: the topic holds {held} records, the producer saw {acked} acknowledged and {} unconfirmed: the topic is the oracle",
                self.input, ledger.unconfirmed
            )
        });
        ledger.produced = tally.produced;
        ledger.timers_set = tally.timers_set;
        (note, problem)
    }

    /// What the pipeline's output shows against its input (module docs): every key's counts,
    /// every timer; exactly-once: each count and each timer once. Empty when all holds.
    pub fn problems(&self) -> Vec<String> {
        let ledger = self.ledger();
        let mut problems = Vec::new();
        for (key, n) in &ledger.produced {
            let seen = ledger.counts.get(key).cloned().unwrap_or_default();
            if self.exactly_once {
                let once: Vec<u64> = (1..=*n).collect();
                if seen != once {
                    problems.push(format!(
                        "{}: key {key}: counts {} (expected 1..={n} once each, in order)",
                        self.output,
                        summarise(&seen)
                    ));
                }
            } else {
                let distinct: BTreeSet<u64> = seen.iter().copied().collect();
                if seen.iter().max() != Some(n) || distinct.len() as u64 != *n {
                    problems.push(format!(
                        "{}: key {key}: counts {} (expected every one of 1..={n}){}",
                        self.output,
                        summarise(&seen),
                        counted_twice(ledger.answered_with.get(key))
                    ));
                }
            }
        }
        for (key, names) in &ledger.timers_set {
            let fired = ledger.fired.get(key).cloned().unwrap_or_default();
            for name in names {
                let times = fired.iter().filter(|f| *f == name).count();
                if times != 1 {
                    problems.push(format!(
                        "{}: key {key}: timer {name} fired {times} times",
                        self.output
                    ));
                }
            }
        }
        problems
    }
}

/// Input offsets the outputs answered with more than one count (`answered`: per input
/// offset, the counts), said after a failed key's counts: such an offset is one record counted
/// twice into one state, where a duplicate in the input shows as counts of distinct offsets.
fn counted_twice(answered: Option<&BTreeMap<i64, BTreeSet<u64>>>) -> String {
    let twice: Vec<String> = answered
        .into_iter()
        .flatten()
        .filter(|(_, counts)| counts.len() > 1)
        .take(4)
        .map(|(offset, counts)| format!("input offset {offset} answered with counts {counts:?}"))
        .collect();
    if twice.is_empty() {
        return String::new();
    }
    format!("; {}", twice.join(", "))
}

/// What an input topic holds, read back from it once the producer stopped: per key, the
/// records that count and the timers set. The oracle the outputs are checked against: the
/// producer's acknowledgements are not (an idempotent producer's retry after its epoch was
/// bumped can write a batch twice, confluentinc/librdkafka#4953; a delivery it could not
/// confirm may have landed). Weir counts what the topic holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct InputTally {
    /// Per key, records that count.
    pub produced: BTreeMap<String, u64>,
    /// Per key, the timers set (by name).
    pub timers_set: BTreeMap<String, BTreeSet<String>>,
}

impl InputTally {
    /// Adds one input record (its key and value as [`Traffic::produce`] wrote them).
    fn add(&mut self, key: &str, value: &str) {
        // `timer:{domain}:{name}:{at}`.
        match value
            .strip_prefix("timer:")
            .and_then(|rest| rest.split(':').nth(1))
        {
            Some(name) => {
                self.timers_set
                    .entry(key.to_owned())
                    .or_default()
                    .insert(name.to_owned());
            }
            None => *self.produced.entry(key.to_owned()).or_default() += 1,
        }
    }

    fn records(&self) -> u64 {
        self.produced.values().sum::<u64>()
            + self
                .timers_set
                .values()
                .map(|names| names.len() as u64)
                .sum::<u64>()
    }
}

/// Reads `topic` from its start to its end (the end when it begins: nothing is produced any
/// more) into an [`InputTally`]. Blocking: run it off the async threads.
///
/// # Errors
/// When the broker cannot be reached or the topic not read to its end within two minutes.
pub fn tally_input(bootstrap: &str, topic: &str) -> anyhow::Result<InputTally> {
    let consumer: BaseConsumer = crate::kafka::client(bootstrap)
        .set("group.id", format!("soak-oracle-{topic}"))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for partition in 0..PARTITIONS {
        let (_, high) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(30))?;
        if high > 0 {
            ends.insert(partition, high);
            assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
        }
    }
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut tally = InputTally::default();
    while !ends.is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{topic}: not read to its end within 2 minutes ({} partitions short)",
            ends.len()
        );
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message?;
        let Some(end) = ends.get(&message.partition()).copied() else {
            continue;
        };
        if message.offset() >= end {
            continue;
        }
        tally.add(
            &String::from_utf8_lossy(message.key().unwrap_or_default()),
            &String::from_utf8_lossy(message.payload().unwrap_or_default()),
        );
        if message.offset() + 1 >= end {
            ends.remove(&message.partition());
        }
    }
    Ok(tally)
}

/// A list of counts, short: its length, first and last few.
fn summarise(counts: &[u64]) -> String {
    if counts.len() <= 8 {
        return format!("{counts:?}");
    }
    format!(
        "{} of them, {:?} … {:?}",
        counts.len(),
        &counts[..4],
        &counts[counts.len() - 4..]
    )
}

/// A reader of `output` from its start (`read_committed` when `exactly_once`), in a group
/// of its own that commits nothing: a rebalance (a broker restart costs it its membership)
/// sends it back to the start, and [`OutputPositions`] skips what it read before. (A reader
/// that assigned its partitions itself and joined no group stopped fetching after a broker
/// restart in a 30-minute soak; this one rode through every restart of two earlier ones.)
///
/// # Errors
/// When librdkafka refuses the configuration or the subscription.
fn reader(bootstrap: &str, output: &str, exactly_once: bool) -> anyhow::Result<StreamConsumer> {
    let consumer: StreamConsumer = crate::kafka::client(bootstrap)
        .set("group.id", format!("soak-reader-{output}"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set(
            "isolation.level",
            if exactly_once {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .create()?;
    consumer.subscribe(&[output])?;
    Ok(consumer)
}

/// Per output partition, the furthest offset a reader has read: a record at or below it is
/// one read again after a rebalance sent the reader back (a soak counted the exactly-once
/// outputs 1.28 times, every record read before a broker restart read twice).
#[derive(Debug, Default)]
struct OutputPositions(BTreeMap<i32, i64>);

impl OutputPositions {
    /// Whether `partition`'s record at `offset` is read for the first time (and notes it).
    fn first_read(&mut self, partition: i32, offset: i64) -> bool {
        let furthest = self.0.entry(partition).or_insert(-1);
        if offset <= *furthest {
            return false;
        }
        *furthest = offset;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_are_one_in_twenty_and_land_on_every_partition() {
        let timers: Vec<u64> = (1..=4_000).filter(|&seq| sets_timer(seq)).collect();
        assert_eq!(timers.len(), 200, "one record in {TIMER_EVERY}");
        let partitions: BTreeSet<u64> = timers
            .iter()
            .map(|seq| seq % KEYS % PARTITIONS as u64)
            .collect();
        assert_eq!(partitions, (0..PARTITIONS as u64).collect());
    }

    #[test]
    fn the_input_tally_counts_records_and_names_timers_as_the_producer_wrote_them() {
        let mut tally = InputTally::default();
        tally.add("k1", "record 1");
        tally.add("k1", "record 201");
        tally.add("k2", "timer:event:t2:1700000005000");
        tally.add("k2", "timer:processing:t202:1700000003000");
        tally.add("k2", "record 402");
        assert_eq!(
            tally.produced,
            BTreeMap::from([("k1".into(), 2), ("k2".into(), 1)])
        );
        assert_eq!(
            tally.timers_set,
            BTreeMap::from([("k2".into(), BTreeSet::from(["t2".into(), "t202".into()]))])
        );
        assert_eq!(tally.records(), 5);
    }

    #[test]
    fn a_record_written_twice_by_the_producer_is_counted_and_noted_and_one_lost_is_a_problem() {
        let traffic = Traffic::new("t.in".into(), "t.out".into(), false);
        traffic.ledger().produced = BTreeMap::from([("k1".into(), 60), ("k2".into(), 60)]);
        let written_twice = InputTally {
            produced: BTreeMap::from([("k1".into(), 61), ("k2".into(), 60)]),
            ..InputTally::default()
        };
        let (note, problem) = traffic.adopt_input(written_twice);
        assert!(note.is_some_and(|n| n.contains("121 records")));
        assert_eq!(problem, None);
        assert_eq!(
            traffic.ledger().produced["k1"],
            61,
            "the topic is the oracle"
        );

        let lost = InputTally {
            produced: BTreeMap::from([("k1".into(), 61), ("k2".into(), 59)]),
            ..InputTally::default()
        };
        let (_, problem) = traffic.adopt_input(lost);
        assert!(problem.is_some_and(|p| p.contains("fewer records")));
    }

    #[test]
    fn an_offset_answered_with_two_counts_is_named_as_a_record_counted_twice() {
        let answered = BTreeMap::from([(40, BTreeSet::from([41])), (44, BTreeSet::from([42, 43]))]);
        assert_eq!(
            counted_twice(Some(&answered)),
            "; input offset 44 answered with counts {42, 43}"
        );
        assert_eq!(counted_twice(None), "");
    }

    #[test]
    fn a_record_read_again_after_a_rebalance_is_skipped() {
        let mut positions = OutputPositions::default();
        assert!(positions.first_read(0, 0));
        assert!(positions.first_read(0, 1));
        assert!(positions.first_read(1, 0), "partitions are apart");
        // The group sent the reader back to the start of partition 0.
        assert!(!positions.first_read(0, 0));
        assert!(!positions.first_read(0, 1));
        assert!(positions.first_read(0, 2));
    }
}
