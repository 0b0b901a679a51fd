use super::*;
use crate::clock::ManualClock;
use crate::ids::Partition;

#[test]
fn rate_limit_drops_lines_past_the_budget_and_refills_each_second() {
    let clock = ManualClock::new(10_000);
    let log = GuestLog::new("t/0".into(), Arc::new(clock.clone()), 3);
    for i in 0..5 {
        log.line(GuestLevel::Info, &format!("hello {i}"));
    }
    assert_eq!(log.dropped(), 2);
    clock.advance_ms(1_000);
    log.line(GuestLevel::Info, "again");
    assert_eq!(log.dropped(), 2);
}

/// A line as the sink saw it: time, level, partition, message.
type Seen = (u64, GuestLevel, Option<i32>, String);

#[derive(Debug, Default)]
struct Recorded(Mutex<Vec<Seen>>);

impl LogSink for Recorded {
    fn line(&self, line: LogLine<'_>) {
        let mut lines = self.0.lock().expect("unpoisoned");
        lines.push((
            line.time_ms,
            line.level,
            line.partition.map(|p| p.0),
            line.message.to_owned(),
        ));
    }
}

#[test]
fn the_sink_gets_the_lines_past_the_limit_and_a_notice_of_those_dropped() {
    let clock = ManualClock::new(10_000);
    let sink = Arc::new(Recorded::default());
    let source = LogSource::partition("acme.counts", Partition(3), Some(sink.clone()));
    assert_eq!(source.to_string(), "acme.counts/3");
    let log = GuestLog::new(source, Arc::new(clock.clone()), 2);
    for i in 0..5 {
        log.line(GuestLevel::Error, &format!("line {i}"));
    }
    clock.advance_ms(1_000);
    log.line(GuestLevel::Info, "next second");
    let lines = sink.0.lock().expect("unpoisoned").clone();
    assert_eq!(
        lines,
        [
            (10_000, GuestLevel::Error, Some(3), "line 0".to_owned()),
            (10_000, GuestLevel::Error, Some(3), "line 1".to_owned()),
            (
                11_000,
                GuestLevel::Warn,
                Some(3),
                "weir: 3 log lines dropped by the rate limit (2 lines/s per partition)".to_owned()
            ),
            (11_000, GuestLevel::Info, Some(3), "next second".to_owned()),
        ]
    );
}

#[test]
fn a_line_repeated_back_to_back_is_summarised_with_the_next_one_outside_the_budget() {
    let clock = ManualClock::new(10_000);
    let sink = Arc::new(Recorded::default());
    let source = LogSource::partition("p", Partition(0), Some(sink.clone()));
    let log = GuestLog::new(source, Arc::new(clock.clone()), 3);
    for _ in 0..50 {
        log.line(GuestLevel::Warn, "same");
    }
    log.line(GuestLevel::Info, "other");
    let lines: Vec<String> = sink
        .0
        .lock()
        .expect("unpoisoned")
        .iter()
        .map(|l| l.3.clone())
        .collect();
    assert_eq!(
        lines,
        [
            "same",
            "weir: the line before repeated 49 more times",
            "other"
        ]
    );
    assert_eq!(log.dropped(), 0, "repeats do not spend the budget");
}

#[test]
fn the_pipelines_budget_bounds_its_partitions_together() {
    let clock: SharedClock = Arc::new(ManualClock::new(10_000));
    let pipeline = Limiter::shared(10);
    let logs: Vec<GuestLog> = (0..8)
        .map(|p| {
            GuestLog::with_budgets(
                LogSource::partition("p", Partition(p), None),
                clock.clone(),
                Budgets {
                    partition: Limiter::shared(5),
                    pipeline: pipeline.clone(),
                },
            )
        })
        .collect();
    for (p, log) in logs.iter().enumerate() {
        for i in 0..5 {
            log.line(GuestLevel::Info, &format!("partition {p} line {i}"));
        }
    }
    // Each partition's 5 lines are within its own budget; together, 40 against the
    // pipeline's 10.
    let dropped = pipeline.lock().expect("unpoisoned").dropped;
    assert_eq!(dropped, 30);
}

#[test]
fn stderr_of_a_call_is_held_logged_if_it_succeeds_and_dropped_if_it_traps() {
    let clock = ManualClock::new(10_000);
    let sink = Arc::new(Recorded::default());
    let log = GuestLog::new(
        LogSource::partition("p", Partition(0), Some(sink.clone())),
        Arc::new(clock.clone()),
        100,
    );
    let stderr = log.stream(GuestLevel::Warn);
    log.call_started();
    stderr.push(b"panicked at lib.rs\npoison record\n");
    assert!(sink.0.lock().expect("unpoisoned").is_empty(), "held");
    log.call_ended(false);
    assert!(
        sink.0.lock().expect("unpoisoned").is_empty(),
        "a trapped call's stderr is its trap's report"
    );
    assert_eq!(
        log.take_recent_stderr(),
        ["panicked at lib.rs", "poison record"]
    );
    log.call_started();
    stderr.push(b"a warning\n");
    log.call_ended(true);
    assert_eq!(sink.0.lock().expect("unpoisoned")[0].3, "a warning");
    // Between calls (a component's start), at once.
    stderr.push(b"at start\n");
    assert_eq!(sink.0.lock().expect("unpoisoned")[1].3, "at start");
}

#[test]
fn line_writer_splits_lines_and_truncates_long_ones() {
    let log = GuestLog::new("t/0".into(), Arc::new(ManualClock::new(0)), 1000);
    let w = log.stream(GuestLevel::Warn);
    w.push(b"partial");
    assert_eq!(*w.pending.lock().expect("unpoisoned"), b"partial");
    w.push(b" line\nnext");
    assert_eq!(*w.pending.lock().expect("unpoisoned"), b"next");
    assert_eq!(log.take_recent_stderr(), vec!["partial line".to_owned()]);
    w.push(&vec![b'x'; LINE_BYTES_MAX * 2]);
    assert_eq!(w.pending.lock().expect("unpoisoned").len(), LINE_BYTES_MAX);
    assert_eq!(truncate("héllo", 2), "h");
}
