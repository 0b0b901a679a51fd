//! The test tiers (`WEIR_TEST_TIER`: the short tier of the README's test command, the long
//! one of `bash deploy/test.sh --long`) and the flights CSV each reads: every flight in the
//! long tier, January's in the short one.

use anyhow::Context as _;
use std::path::PathBuf;

/// The flights CSV of `deploy/local/flights.sh`: `WEIR_FLIGHTS_CSV`, else
/// `$WEIR_DATA_DIR/flights.csv` (default `~/.cache/weir/data`).
pub fn flights_csv() -> PathBuf {
    if let Ok(path) = std::env::var("WEIR_FLIGHTS_CSV") {
        return PathBuf::from(path);
    }
    let data = std::env::var("WEIR_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/weir/data")
        });
    data.join("flights.csv")
}

/// Which tier of the test command runs: `WEIR_TEST_TIER=long` (`bash deploy/test.sh --long`)
/// runs the tests at full size — 50-kill crash loops, every flight, long soaks — and the
/// default short tier (the README's test command, CI) runs the same tests on a slice of each,
/// the size that proves the behaviour (README, "Run all the tests").
pub fn long_tier() -> bool {
    std::env::var("WEIR_TEST_TIER").is_ok_and(|tier| tier == "long")
}

/// `short` in the short tier, `long` in the long one ([`long_tier`]).
pub fn tiered<T>(short: T, long: T) -> T {
    if long_tier() { long } else { short }
}

/// The months the short tier's "every flight" tests run: January (27,004 flights, whole days,
/// every origin and most routes).
pub const SHORT_TIER_MONTHS: std::ops::RangeInclusive<u32> = 1..=1;

/// Flights in the whole CSV.
pub const ALL_FLIGHTS: usize = 336_776;

/// Flights in [`SHORT_TIER_MONTHS`].
pub const SHORT_TIER_FLIGHTS: usize = 27_004;

/// Flights in [`tier_flights_csv`]'s CSV.
pub fn tier_flight_count() -> usize {
    tiered(SHORT_TIER_FLIGHTS, ALL_FLIGHTS)
}

/// The flights CSV the tests over every flight read: all 336,776 in the long tier, those of
/// [`SHORT_TIER_MONTHS`] in the short one (written once beside the full CSV, rows in the
/// order the full one has them).
///
/// # Errors
/// When the full CSV cannot be read or the slice written.
pub fn tier_flights_csv() -> anyhow::Result<PathBuf> {
    let full = flights_csv();
    if long_tier() {
        return Ok(full);
    }
    let slice = full.with_file_name("flights-january.csv");
    if slice.exists() {
        return Ok(slice);
    }
    let text = std::fs::read_to_string(&full)
        .with_context(|| format!("reading {}; run deploy/local/flights.sh", full.display()))?;
    let mut lines = text.lines();
    let header = lines.next().context("the flights CSV has a header")?;
    let month = header
        .split(',')
        .position(|c| c == "month")
        .context("the flights CSV has a month column")?;
    let mut out = String::with_capacity(text.len() / 5);
    out.push_str(header);
    out.push('\n');
    for line in lines {
        let in_slice = line
            .split(',')
            .nth(month)
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|m| SHORT_TIER_MONTHS.contains(&m));
        if in_slice {
            out.push_str(line);
            out.push('\n');
        }
    }
    // Written aside and renamed: tests running side by side may write it at once.
    let part = slice.with_extension(format!("csv.{}", std::process::id()));
    std::fs::write(&part, out)?;
    std::fs::rename(&part, &slice)?;
    Ok(slice)
}
