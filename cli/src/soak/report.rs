//! The soak's report as printed: faults by kind with their recovery times, the worst lag,
//! host 0's footprint and the store's size, then every failed check.

use super::SoakReport;

/// Prints `report` as a table of faults and the figures after it.
pub fn print(report: &SoakReport) {
    println!(
        "{:<24} {:>6} {:>11} {:>10} {:>10} {:>10}",
        "fault", "times", "overlapped", "p50 s", "p99 s", "max s"
    );
    for (kind, (n, overlapped, took)) in &report.faults {
        let mut took = took.clone();
        took.sort();
        let at = |q: f64| {
            took.get(((took.len() as f64 - 1.0) * q).round() as usize)
                .map_or("-".to_owned(), |d| format!("{:.1}", d.as_secs_f64()))
        };
        println!(
            "{:<24} {n:>6} {overlapped:>11} {:>10} {:>10} {:>10}",
            kind.as_str(),
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
    let ((rss0, fds0), (rss1, fds1)) = report.footprint;
    let ((o0, b0), (o1, b1)) = report.store;
    println!(
        "\nworst output lag {:.1} s; {} host starts, {} process kills; host 0: {} → {} MiB resident, {fds0} → {fds1} open files{}; store: {o0} → {o1} objects, {} → {} KiB{}",
        report.worst_lag.as_secs_f64(),
        report.starts,
        report.kills,
        rss0 >> 20,
        rss1 >> 20,
        if report.footprint_checked {
            ""
        } else {
            " (not checked: the soak is shorter than twice its 5-minute baseline)"
        },
        b0 >> 10,
        b1 >> 10,
        if report.store_checked {
            ""
        } else {
            " (not checked: the soak is shorter than twice GC's 10-minute grace period)"
        }
    );
    let minutes: Vec<String> = report
        .footprint_by_minute
        .iter()
        .enumerate()
        .map(|(i, sample)| match sample {
            Some((rss, fds)) => format!("{}: {}/{fds}", i + 1, rss >> 20),
            None => format!("{}: -", i + 1),
        })
        .collect();
    println!(
        "host 0 by minute (MiB resident/open files): {}",
        minutes.join(", ")
    );
    if report.problems.is_empty() {
        println!("every check holds");
    }
    for problem in &report.problems {
        println!("FAILED: {problem}");
    }
}
