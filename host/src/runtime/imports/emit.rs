//! `weir:operator/emit`: stages output records for the record that emits them.

use crate::runtime::StagedBytesExceeded;
use crate::runtime::batch::{StagedEmit, emit_size};
use crate::runtime::bindings::weir::operator::emit::{EmitError, Host};
use crate::runtime::bindings::weir::operator::types::Header;
use crate::runtime::host::HostCtx;
use crate::sink::limits::record_bytes;
use crate::state::Shard;

impl<S: Shard> Host for HostCtx<S> {
    async fn emit(
        &mut self,
        record: u32,
        key: Vec<u8>,
        value: Vec<u8>,
        headers: Vec<Header>,
    ) -> wasmtime::Result<Result<(), EmitError>> {
        let (limit, staged_max) = self.meta.as_ref().map_or((0, 0), |m| {
            (
                m.limits.emit_bytes_per_record_max,
                m.limits.batch_staged_bytes_max,
            )
        });
        // One record as Kafka counts it must fit the output topic (and the producer); all of a
        // record's emits together must fit the per-record limit.
        let header_bytes: u64 = headers
            .iter()
            .map(|h| (h.name.len() + h.value.len()) as u64)
            .sum();
        let wire = record_bytes(
            key.len() as u64,
            value.len() as u64,
            header_bytes,
            headers.len() as u64,
        );
        let record_max = self.batch.emit_record_bytes_max;
        if wire > record_max {
            return Ok(Err(EmitError::TooLarge(record_max)));
        }
        let size = emit_size(&key, &value, &headers);
        let Some(emitted) = usize::try_from(record)
            .ok()
            .and_then(|i| self.batch.emitted_bytes.get_mut(i))
        else {
            return Ok(Err(EmitError::InvalidRecord(record)));
        };
        if emitted.saturating_add(size) > limit {
            return Ok(Err(EmitError::TooLarge(limit)));
        }
        *emitted += size;
        if self.batch.staged_bytes().saturating_add(size) > staged_max {
            return Err(wasmtime::Error::new(StagedBytesExceeded {
                limit: staged_max,
            }));
        }
        self.batch.stage_emit(StagedEmit {
            record,
            key,
            value,
            headers,
        });
        Ok(Ok(()))
    }
}
