//! The imports of `weir:operator@0.1.0`, served by the 0.2 implementations: the interfaces are
//! the same functions with the same types, so each call converts its error or enum and
//! delegates. Nothing here may change what a 0.1 component sees.

use crate::runtime::bindings::v0_1::weir::operator as v0_1;
use crate::runtime::bindings::weir::operator as v0_2;
use crate::runtime::host::HostCtx;
use crate::state::Shard;
use v0_1::types::StateError as LegacyStateError;
use v0_2::types::StateError;

type ImportResult<T> = wasmtime::Result<Result<T, LegacyStateError>>;

fn state_error(err: StateError) -> LegacyStateError {
    match err {
        StateError::UnknownState(name) => LegacyStateError::UnknownState(name),
        StateError::WrongKind(name) => LegacyStateError::WrongKind(name),
        StateError::InvalidRecord(index) => LegacyStateError::InvalidRecord(index),
        StateError::TooLarge(limit) => LegacyStateError::TooLarge(limit),
    }
}

fn legacy<T>(result: wasmtime::Result<Result<T, StateError>>) -> ImportResult<T> {
    Ok(result?.map_err(state_error))
}

impl<S: Shard> v0_1::types::Host for HostCtx<S> {}

impl<S: Shard> v0_1::state::Host for HostCtx<S> {
    async fn value_get(&mut self, record: u32, name: String) -> ImportResult<Option<Vec<u8>>> {
        legacy(v0_2::state::Host::value_get(self, record, name).await)
    }

    async fn get_many(
        &mut self,
        record: u32,
        names: Vec<String>,
    ) -> ImportResult<Vec<Option<Vec<u8>>>> {
        legacy(v0_2::state::Host::get_many(self, record, names).await)
    }

    async fn value_set(&mut self, record: u32, name: String, value: Vec<u8>) -> ImportResult<()> {
        legacy(v0_2::state::Host::value_set(self, record, name, value).await)
    }

    async fn value_clear(&mut self, record: u32, name: String) -> ImportResult<()> {
        legacy(v0_2::state::Host::value_clear(self, record, name).await)
    }

    async fn map_get(
        &mut self,
        record: u32,
        name: String,
        map_key: Vec<u8>,
    ) -> ImportResult<Option<Vec<u8>>> {
        legacy(v0_2::state::Host::map_get(self, record, name, map_key).await)
    }

    async fn map_put(
        &mut self,
        record: u32,
        name: String,
        map_key: Vec<u8>,
        value: Vec<u8>,
    ) -> ImportResult<()> {
        legacy(v0_2::state::Host::map_put(self, record, name, map_key, value).await)
    }

    async fn map_remove(
        &mut self,
        record: u32,
        name: String,
        map_key: Vec<u8>,
    ) -> ImportResult<()> {
        legacy(v0_2::state::Host::map_remove(self, record, name, map_key).await)
    }

    async fn map_iterate(
        &mut self,
        record: u32,
        name: String,
        start_after: Option<Vec<u8>>,
        page_size: u32,
    ) -> ImportResult<v0_1::state::MapPage> {
        let page = legacy(
            v0_2::state::Host::map_iterate(self, record, name, start_after, page_size).await,
        )?;
        Ok(page.map(|p| v0_1::state::MapPage {
            entries: p.entries,
            next: p.next,
        }))
    }
}

impl<S: Shard> v0_1::emit::Host for HostCtx<S> {
    async fn emit(
        &mut self,
        record: u32,
        key: Vec<u8>,
        value: Vec<u8>,
        headers: Vec<v0_1::types::Header>,
    ) -> wasmtime::Result<Result<(), v0_1::emit::EmitError>> {
        let headers = headers
            .into_iter()
            .map(|h| v0_2::types::Header {
                name: h.name,
                value: h.value,
            })
            .collect();
        let emitted = v0_2::emit::Host::emit(self, record, key, value, headers).await?;
        Ok(emitted.map_err(|e| match e {
            v0_2::emit::EmitError::InvalidRecord(index) => {
                v0_1::emit::EmitError::InvalidRecord(index)
            }
            v0_2::emit::EmitError::TooLarge(limit) => v0_1::emit::EmitError::TooLarge(limit),
        }))
    }
}

impl<S: Shard> v0_1::log::Host for HostCtx<S> {
    async fn log(&mut self, level: v0_1::log::Level, message: String) -> wasmtime::Result<()> {
        use v0_1::log::Level as L;
        use v0_2::log::Level;
        let level = match level {
            L::Trace => Level::Trace,
            L::Debug => Level::Debug,
            L::Info => Level::Info,
            L::Warn => Level::Warn,
            L::Error => Level::Error,
        };
        v0_2::log::Host::log(self, level, message).await
    }
}
