//! `weir:operator/emit`: stages output records for the record that emits them.

use crate::runtime::batch::StagedEmit;
use crate::runtime::bindings::weir::operator::emit::{EmitError, Host};
use crate::runtime::bindings::weir::operator::types::Header;
use crate::runtime::host::HostCtx;
use crate::state::Shard;

impl<S: Shard> Host for HostCtx<S> {
    async fn emit(
        &mut self,
        record: u32,
        key: Vec<u8>,
        value: Vec<u8>,
        headers: Vec<Header>,
    ) -> wasmtime::Result<Result<(), EmitError>> {
        let limit = self
            .meta
            .as_ref()
            .map_or(0, |m| m.limits.emit_bytes_per_record_max);
        let Some(emitted) = usize::try_from(record)
            .ok()
            .and_then(|i| self.batch.emitted_bytes.get_mut(i))
        else {
            return Ok(Err(EmitError::InvalidRecord(record)));
        };
        let size = (key.len()
            + value.len()
            + headers
                .iter()
                .map(|h| h.name.len() + h.value.len())
                .sum::<usize>()) as u64;
        if emitted.saturating_add(size) > limit {
            return Ok(Err(EmitError::TooLarge(limit)));
        }
        *emitted += size;
        self.batch.stage_emit(StagedEmit {
            record,
            key,
            value,
            headers,
        });
        Ok(Ok(()))
    }
}
