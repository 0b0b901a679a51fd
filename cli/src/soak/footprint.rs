//! Host 0's settled footprint (resident memory, open files): the baseline the soak's end is
//! checked against.

use super::{FOOTPRINT_BASELINE, MINUTE};
use std::time::Duration;

/// Host 0's settled footprint, the baseline its end is checked against: the highest of the
/// minutes from minute 5 to a third of the soak (`by_minute[i]` is minute `i + 1`'s sample,
/// `None` when a fault held the host), and `early` (minute 5's own). One sample is an instant:
/// a host whose kills had just taken partitions from it, whose caches were still filling, sat
/// below what it settles at, and a check against it failed on a plateau (one soak: 177 MiB at
/// minute 5, 190 at minute 6, flat at 218–238 from minute 13 to 30). A leak grows every
/// minute and still shows against the highest of the first third.
pub(super) fn settled(
    by_minute: &[Option<(u64, u64)>],
    early: (u64, u64),
    length: Duration,
) -> (u64, u64) {
    let first = (FOOTPRINT_BASELINE.as_secs() / MINUTE.as_secs()) as usize;
    let last = ((length / 3).as_secs() / MINUTE.as_secs()) as usize;
    by_minute
        .iter()
        .enumerate()
        .filter(|(i, _)| (first..=last.max(first)).contains(&(i + 1)))
        .filter_map(|(_, sample)| *sample)
        .fold(early, |(rss, fds), (r, f)| (rss.max(r), fds.max(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn minutes(rss_mib: &[u64]) -> Vec<Option<(u64, u64)>> {
        rss_mib.iter().map(|r| Some((r * MIB, 60))).collect()
    }

    #[test]
    fn a_hosts_baseline_is_its_highest_settled_minute_of_the_first_third() {
        let length = Duration::from_secs(30 * 60);
        // The long tier's seed-41 soak that failed the old check (177 → 219 MiB): host 0
        // filled up to a plateau by minute 12 and stayed there.
        let mut plateau = minutes(&[149, 151, 154, 171, 0, 190, 183, 181, 177, 182, 190, 211]);
        plateau[4] = None;
        plateau.extend(minutes(&[237; 18]));
        let baseline = settled(&plateau, (177 * MIB, 84), length);
        assert_eq!(
            baseline,
            (190 * MIB, 84),
            "minutes 5–10 and minute 5's own sample"
        );
        assert!(219 * MIB < baseline.0 * 6 / 5, "the plateau's end passes");
        // A leak of 2 % a minute from the same start fails however its first third looked.
        let leak: Vec<u64> = (0..30).map(|m| (180.0 * 1.02f64.powi(m)) as u64).collect();
        let baseline = settled(&minutes(&leak), (leak[4] * MIB, 60), length);
        assert!(leak[29] * MIB > baseline.0 * 6 / 5, "{baseline:?}");
        // A soak shorter than a third past minute 5: minute 5 alone.
        let short = settled(
            &minutes(&[100, 100, 100, 100, 120, 150]),
            (120 * MIB, 9),
            Duration::from_secs(360),
        );
        assert_eq!(short, (120 * MIB, 60));
    }
}
