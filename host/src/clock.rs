//! The clock seam: processing time comes from a [`Clock`], never from `SystemTime` deep in the
//! code, so TTL and timing behaviour are repeatable in tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Now on the wall clock. With [`monotonic_now`], the only read of the system's clocks in the
/// host outside [`SystemClock`] (`clippy.toml` refuses `SystemTime::now` elsewhere): ages of
/// files and objects, and the times records carry. Processing time comes from a [`Clock`].
#[allow(clippy::disallowed_methods)]
#[inline]
pub fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// Now on the wall clock in ms since the Unix epoch (0 before it): the times the catalog's
/// records and reports carry.
pub fn wall_now_ms() -> u64 {
    SystemClock.now_ms()
}

/// Now on the monotonic clock: how long something took (durations in logs, metrics and
/// reports), and deadlines outside the pipeline's loop and workers (which use
/// `tokio::time::Instant`, controlled by paused-time tests). `clippy.toml` refuses
/// `Instant::now` elsewhere.
#[allow(clippy::disallowed_methods)]
#[inline]
pub fn monotonic_now() -> Instant {
    Instant::now()
}

/// A source of processing time, in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Now, in ms since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        wall_now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            now_ms: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;
