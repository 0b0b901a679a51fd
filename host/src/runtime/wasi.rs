//! The WASI context of a guest: every interface a plain `wasm32-wasip2` build imports is linked,
//! and none grants anything.
//!
//! - `wasi:cli/environment`: no arguments, no environment variables, no working directory;
//! - `wasi:cli/stdin`: empty; `stdout`/`stderr`: lines into the operator's log (rate-limited);
//! - `wasi:filesystem/*`: no preopened directories, so no path can be opened;
//! - `wasi:sockets/*`: TCP, UDP and name lookup disabled, every address refused;
//! - `wasi:clocks/*`: frozen at zero (time an operator needs comes from record timestamps),
//!   which also keeps replays deterministic;
//! - `wasi:random/*`: available (hash-map seeds in `std` need it); it reveals nothing.

use super::guest_log::{GuestLevel, GuestLog};
use std::time::Duration;
use wasmtime_wasi::clocks::{HostMonotonicClock, HostWallClock};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder};

/// A wall clock stopped at the Unix epoch.
#[derive(Debug)]
struct FrozenWallClock;

impl HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// A monotonic clock that never moves.
#[derive(Debug)]
struct FrozenMonotonicClock;

impl HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Builds the WASI context of one instance; see the module docs for what it grants (nothing).
pub fn deny_all_ctx(log: &GuestLog) -> WasiCtx {
    WasiCtxBuilder::new()
        .stdout(log.stream(GuestLevel::Info))
        .stderr(log.stream(GuestLevel::Warn))
        .wall_clock(FrozenWallClock)
        .monotonic_clock(FrozenMonotonicClock)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build()
}
