//! `weir:operator/log`: lines into the host's log, rate-limited per instance.

use crate::runtime::bindings::weir::operator::log::{Host, Level};
use crate::runtime::guest_log::GuestLevel;
use crate::runtime::host::HostCtx;
use crate::state::Shard;

impl<S: Shard> Host for HostCtx<S> {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            Level::Trace => GuestLevel::Trace,
            Level::Debug => GuestLevel::Debug,
            Level::Info => GuestLevel::Info,
            Level::Warn => GuestLevel::Warn,
            Level::Error => GuestLevel::Error,
        };
        self.log.line(level, &message);
        Ok(())
    }
}
