//! The engine's epoch: the clock of the guests' CPU deadlines (wasmtime's epoch interruption),
//! advanced by one thread every [`EPOCH_TICK`] while a call runs.

use super::EPOCH_TICK;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use wasmtime::Engine;

/// Increments the engine's epoch every [`EPOCH_TICK`] from a dedicated OS thread, while a call
/// runs, until dropped. With no call running the thread sleeps (an idle host wakes up for
/// nothing): the epoch only bounds calls, and a call's deadline counts ticks from its start.
#[derive(Debug)]
pub(super) struct EpochTicker {
    stop: Arc<AtomicBool>,
    /// Calls (and instantiations) running now.
    calls: Arc<AtomicUsize>,
    thread: std::thread::Thread,
}

/// Keeps the epoch ticking while it lives: held for the length of a call.
pub(super) struct Ticking<'a>(&'a EpochTicker);

impl EpochTicker {
    pub(super) fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        let (flag, running) = (stop.clone(), calls.clone());
        let thread = std::thread::Builder::new()
            .name("weir-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    if running.load(Ordering::Acquire) == 0 {
                        // Woken by the first call (an unpark before the park makes it return
                        // at once) or by the drop.
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawning the epoch thread succeeds unless the OS is out of threads")
            .thread()
            .clone();
        Self {
            stop,
            calls,
            thread,
        }
    }

    /// Ticks until the returned guard is dropped.
    pub(super) fn ticking(&self) -> Ticking<'_> {
        if self.calls.fetch_add(1, Ordering::AcqRel) == 0 {
            self.thread.unpark();
        }
        Ticking(self)
    }
}

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        self.0.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.unpark();
    }
}
