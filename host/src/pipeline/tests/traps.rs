//! A trap storm's log (SCENARIOS.md S21): a trapping record is re-run while isolation finds it,
//! and every run writes its panic to stderr. The operator's log gets one line per trapping
//! record — none of the re-runs' panic output — within the partition's and the pipeline's
//! budgets.

use super::*;
use crate::runtime::guest_log::{LogLine, LogSink};

/// The lines an operator's log sink received: partition, text.
#[derive(Debug, Default)]
struct Lines(std::sync::Mutex<Vec<(Option<i32>, String)>>);

impl LogSink for Lines {
    fn line(&self, line: LogLine<'_>) {
        self.0
            .lock()
            .expect("unpoisoned")
            .push((line.partition.map(|p| p.0), line.message.to_owned()));
    }
}

#[tokio::test(start_paused = true)]
async fn a_trap_storm_logs_one_line_per_trapping_record_and_none_of_the_reruns_panics() {
    const PER_PARTITION: i64 = 500;
    let world = World::new(4, 0, "at_least_once");
    // One record in fifty traps: ten per partition, each in a batch of other records.
    for partition in 0..4 {
        for i in 0..PER_PARTITION {
            let key = format!("k{}", i % 20);
            let value: &[u8] = if i % 50 == 25 { b"poison:trap" } else { b"v" };
            world
                .handle
                .produce(TOPIC, partition, key.as_bytes(), value, i);
        }
    }
    let lines = Arc::new(Lines::default());
    let clock: SharedClock = Arc::new(SystemClock);
    let (run, _) = start_logging(
        settings("at_least_once"),
        (
            world.source.clone(),
            world.output.clone(),
            world.store.clone(),
        ),
        (ReadDelay::Fixed(Duration::ZERO), "weir_test_counter", clock),
        Some(lines.clone()),
    )
    .await;
    world.handle.assign(&[0, 1, 2, 3]);
    until("every record is done", || {
        run.stats.records_done() == 4 * PER_PARTITION as u64
    })
    .await;
    let stats = run.stats.clone();
    run.stop().await.expect("clean stop");
    assert_eq!(stats.dead_lettered.load(Ordering::Relaxed), 40);
    for partition in 0..4 {
        assert_eq!(outputs_of(&world.output, partition), 490);
    }
    let lines = lines.0.lock().expect("unpoisoned").clone();
    assert_eq!(lines.len(), 40, "one line per trapping record: {lines:#?}");
    for partition in 0..4 {
        let offsets: Vec<i64> = lines
            .iter()
            .filter(|(p, _)| *p == Some(partition))
            .map(|(_, text)| {
                let after = text.split_once('@').expect("the line names the record").1;
                after[..after.find(' ').expect("then the kind")]
                    .parse()
                    .expect("an offset")
            })
            .collect();
        assert_eq!(
            offsets,
            (0..PER_PARTITION)
                .filter(|i| i % 50 == 25)
                .collect::<Vec<_>>(),
            "partition {partition}: each trapping record once, in order"
        );
    }
    assert!(
        lines
            .iter()
            .all(|(_, text)| text.contains("(trapped)") && text.contains("poison record")),
        "each line says the record trapped, with its panic message: {lines:#?}"
    );
}
