//! The imports of the frozen worlds `weir:operator@0.2.0` and `@0.1.0`, served by the 0.3
//! implementations: their `state`, `emit` and `log` (and 0.2's `timers`) are 0.3's functions
//! with the same shapes, so each call converts its error or enum and delegates. Nothing here
//! may change what an older component sees.

use crate::runtime::bindings::v0_2 as frozen_v0_2;
use crate::runtime::bindings::weir::operator as current;
use crate::runtime::host::HostCtx;
use crate::state::Shard;

/// `emit.emit` returned `unknown-output`, which it never does (it emits to `default`).
fn default_output_unknown() -> wasmtime::Error {
    wasmtime::format_err!("emit to the default output reported an unknown output")
}

/// Implements the `types`, `state`, `emit` and `log` hosts of the frozen world `$world` (a
/// `bindings` module) by delegating to the current world's.
macro_rules! delegate_record_imports {
    ($world:ident) => {
        mod $world {
            use super::{current, default_output_unknown};
            use crate::runtime::bindings::$world::weir::operator as old;
            use crate::runtime::host::HostCtx;
            use crate::state::Shard;
            use current::types::StateError;
            use old::types::StateError as OldStateError;

            type ImportResult<T> = wasmtime::Result<Result<T, OldStateError>>;

            fn state_error(err: StateError) -> OldStateError {
                match err {
                    StateError::UnknownState(name) => OldStateError::UnknownState(name),
                    StateError::WrongKind(name) => OldStateError::WrongKind(name),
                    StateError::InvalidRecord(index) => OldStateError::InvalidRecord(index),
                    StateError::TooLarge(limit) => OldStateError::TooLarge(limit),
                }
            }

            fn old<T>(result: wasmtime::Result<Result<T, StateError>>) -> ImportResult<T> {
                Ok(result?.map_err(state_error))
            }

            impl<S: Shard> old::types::Host for HostCtx<S> {}

            impl<S: Shard> old::state::Host for HostCtx<S> {
                async fn value_get(
                    &mut self,
                    record: u32,
                    name: String,
                ) -> ImportResult<Option<Vec<u8>>> {
                    old(current::state::Host::value_get(self, record, name).await)
                }

                async fn get_many(
                    &mut self,
                    record: u32,
                    names: Vec<String>,
                ) -> ImportResult<Vec<Option<Vec<u8>>>> {
                    old(current::state::Host::get_many(self, record, names).await)
                }

                async fn value_set(
                    &mut self,
                    record: u32,
                    name: String,
                    value: Vec<u8>,
                ) -> ImportResult<()> {
                    old(current::state::Host::value_set(self, record, name, value).await)
                }

                async fn value_clear(&mut self, record: u32, name: String) -> ImportResult<()> {
                    old(current::state::Host::value_clear(self, record, name).await)
                }

                async fn map_get(
                    &mut self,
                    record: u32,
                    name: String,
                    map_key: Vec<u8>,
                ) -> ImportResult<Option<Vec<u8>>> {
                    old(current::state::Host::map_get(self, record, name, map_key).await)
                }

                async fn map_put(
                    &mut self,
                    record: u32,
                    name: String,
                    map_key: Vec<u8>,
                    value: Vec<u8>,
                ) -> ImportResult<()> {
                    old(current::state::Host::map_put(self, record, name, map_key, value).await)
                }

                async fn map_remove(
                    &mut self,
                    record: u32,
                    name: String,
                    map_key: Vec<u8>,
                ) -> ImportResult<()> {
                    old(current::state::Host::map_remove(self, record, name, map_key).await)
                }

                async fn map_iterate(
                    &mut self,
                    record: u32,
                    name: String,
                    start_after: Option<Vec<u8>>,
                    page_size: u32,
                ) -> ImportResult<old::state::MapPage> {
                    let page = old(current::state::Host::map_iterate(
                        self,
                        record,
                        name,
                        start_after,
                        page_size,
                    )
                    .await)?;
                    Ok(page.map(|p| old::state::MapPage {
                        entries: p.entries,
                        next: p.next,
                    }))
                }
            }

            impl<S: Shard> old::emit::Host for HostCtx<S> {
                async fn emit(
                    &mut self,
                    record: u32,
                    key: Vec<u8>,
                    value: Vec<u8>,
                    headers: Vec<old::types::Header>,
                ) -> wasmtime::Result<Result<(), old::emit::EmitError>> {
                    use current::emit::EmitError;
                    let headers = headers
                        .into_iter()
                        .map(|h| current::types::Header {
                            name: h.name,
                            value: h.value,
                        })
                        .collect();
                    let emitted =
                        current::emit::Host::emit(self, record, key, value, headers).await?;
                    match emitted {
                        Ok(()) => Ok(Ok(())),
                        Err(EmitError::InvalidRecord(index)) => {
                            Ok(Err(old::emit::EmitError::InvalidRecord(index)))
                        }
                        Err(EmitError::TooLarge(limit)) => {
                            Ok(Err(old::emit::EmitError::TooLarge(limit)))
                        }
                        Err(EmitError::UnknownOutput(_)) => Err(default_output_unknown()),
                    }
                }
            }

            impl<S: Shard> old::log::Host for HostCtx<S> {
                async fn log(
                    &mut self,
                    level: old::log::Level,
                    message: String,
                ) -> wasmtime::Result<()> {
                    use current::log::Level;
                    use old::log::Level as L;
                    let level = match level {
                        L::Trace => Level::Trace,
                        L::Debug => Level::Debug,
                        L::Info => Level::Info,
                        L::Warn => Level::Warn,
                        L::Error => Level::Error,
                    };
                    current::log::Host::log(self, level, message).await
                }
            }
        }
    };
}

delegate_record_imports!(v0_1);
delegate_record_imports!(v0_2);

/// `weir:operator@0.2.0`'s timers: 0.3's, with its own error and domain types.
mod v0_2_timers {
    use super::frozen_v0_2 as v0_2;
    use super::{HostCtx, Shard, current};
    use current::timers::TimerError;
    use current::types::TimeDomain;
    use v0_2::weir::operator::timers::TimerError as OldTimerError;
    use v0_2::weir::operator::types::TimeDomain as OldTimeDomain;

    type ImportResult<T> = wasmtime::Result<Result<T, OldTimerError>>;

    fn timer_error(err: TimerError) -> OldTimerError {
        match err {
            TimerError::InvalidRecord(index) => OldTimerError::InvalidRecord(index),
            TimerError::InvalidName(name) => OldTimerError::InvalidName(name),
            TimerError::TooManyTimers(limit) => OldTimerError::TooManyTimers(limit),
        }
    }

    fn old<T>(result: wasmtime::Result<Result<T, TimerError>>) -> ImportResult<T> {
        Ok(result?.map_err(timer_error))
    }

    fn domain(old: OldTimeDomain) -> TimeDomain {
        match old {
            OldTimeDomain::EventTime => TimeDomain::EventTime,
            OldTimeDomain::ProcessingTime => TimeDomain::ProcessingTime,
        }
    }

    fn old_domain(domain: TimeDomain) -> OldTimeDomain {
        match domain {
            TimeDomain::EventTime => OldTimeDomain::EventTime,
            TimeDomain::ProcessingTime => OldTimeDomain::ProcessingTime,
        }
    }

    impl<S: Shard> v0_2::weir::operator::timers::Host for HostCtx<S> {
        async fn set(
            &mut self,
            record: u32,
            name: String,
            at_ms: i64,
            at_domain: OldTimeDomain,
        ) -> ImportResult<()> {
            let set = current::timers::Host::set(self, record, name, at_ms, domain(at_domain));
            old(set.await)
        }

        async fn clear(&mut self, record: u32, name: String) -> ImportResult<()> {
            old(current::timers::Host::clear(self, record, name).await)
        }

        async fn get(
            &mut self,
            record: u32,
            name: String,
        ) -> ImportResult<Option<(i64, OldTimeDomain)>> {
            let got = old(current::timers::Host::get(self, record, name).await)?;
            Ok(got.map(|timer| timer.map(|(at, d)| (at, old_domain(d)))))
        }

        async fn watermark(&mut self) -> wasmtime::Result<Option<i64>> {
            current::timers::Host::watermark(self).await
        }

        async fn current_processing_time(&mut self) -> wasmtime::Result<i64> {
            current::timers::Host::current_processing_time(self).await
        }
    }
}
