//! `weir:operator/emit`: stages output records for the record that emits them.

use crate::runtime::batch::{StagedEmit, emit_size};
use crate::runtime::bindings::weir::operator::emit::{EmitError, Host};
use crate::runtime::bindings::weir::operator::types::Header;
use crate::runtime::host::HostCtx;
use crate::runtime::record_size::record_bytes;
use crate::runtime::{EmitDoesNotFit, ReservedHeader, StagedBytesExceeded};
use crate::state::Shard;
use crate::time::watermark::MARKER_HEADER;

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
        if usize::try_from(record).is_ok_and(|i| i < self.batch.emitted_bytes.len()) {
            self.batch.note_reached(record);
        }
        let Some(emitted) = usize::try_from(record)
            .ok()
            .and_then(|i| self.batch.emitted_bytes.get_mut(i))
        else {
            return Ok(Err(EmitError::InvalidRecord(record)));
        };
        if emitted.saturating_add(size) > limit {
            return Ok(Err(EmitError::TooLarge(limit)));
        }
        if let Some(table) = &self.batch.emit_table
            && let Err(e) = table.check(&value)
        {
            return Err(wasmtime::Error::new(EmitDoesNotFit(e)));
        }
        if headers.iter().any(|h| h.name == MARKER_HEADER) {
            return Err(wasmtime::Error::new(ReservedHeader));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SharedClock};
    use crate::row::{ColumnSpec, ColumnType, RowError, RowSchema};
    use crate::state::memory::MemoryBackend;
    use crate::state::{ShardId, StateBackend};
    use std::sync::Arc;

    /// A host context over a fresh in-memory shard.
    fn host() -> HostCtx<<MemoryBackend as StateBackend>::Shard> {
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let backend = MemoryBackend::new(clock.clone());
        let id = ShardId {
            pipeline: "t".into(),
            partition: crate::ids::Partition(0),
        };
        let shard = Arc::new(futures::executor::block_on(backend.open_shard(&id)).expect("opens"));
        crate::runtime::imports::test_host(shard, clock, "m", 1024)
    }

    /// With a table, an emit that is not one of its rows fails the call (the record is then
    /// isolated and dead-lettered, its effects discarded) naming the column, and is not
    /// staged; rows that fit are.
    #[test]
    fn an_emit_that_is_not_a_row_of_the_table_fails_its_record_naming_the_column() {
        let mut ctx = host();
        let table = RowSchema::new(&[ColumnSpec {
            name: "n".into(),
            kind: ColumnType::Long,
            required: true,
        }])
        .expect("valid");
        ctx.batch.emit_table = Some(Arc::new(table));
        futures::executor::block_on(async {
            let fits = ctx.emit(0, b"k".to_vec(), br#"{"n":1}"#.to_vec(), Vec::new());
            assert!(matches!(fits.await, Ok(Ok(()))));
            let wrong = ctx
                .emit(0, b"k".to_vec(), br#"{"n":"one"}"#.to_vec(), Vec::new())
                .await;
            let err = wrong.expect_err("fails the call");
            let cause = err
                .downcast_ref::<EmitDoesNotFit>()
                .expect("an emit that does not fit");
            assert!(matches!(&cause.0, RowError::Type { column, .. } if column == "n"));
            assert!(err.to_string().contains("Iceberg table"), "{err}");
        });
        let (_, emits) = std::mem::take(&mut ctx.batch).into_effects();
        assert_eq!(emits.len(), 1);
    }

    /// An emit with Weir's watermark marker header fails its record: an operator cannot fake a
    /// marker for the stage after it (docs/topologies.md).
    #[test]
    fn an_emit_with_the_watermark_marker_header_fails_its_record() {
        let mut ctx = host();
        let header = |name: &str| Header {
            name: name.to_owned(),
            value: b"0:99".to_vec(),
        };
        futures::executor::block_on(async {
            let other = ctx.emit(0, b"k".to_vec(), b"v".to_vec(), vec![header("weir.other")]);
            assert!(matches!(other.await, Ok(Ok(()))));
            let marker = ctx
                .emit(0, b"k".to_vec(), b"v".to_vec(), vec![header(MARKER_HEADER)])
                .await;
            let err = marker.expect_err("fails the call");
            assert!(err.downcast_ref::<ReservedHeader>().is_some(), "{err}");
        });
        let (_, emits) = std::mem::take(&mut ctx.batch).into_effects();
        assert_eq!(emits.len(), 1, "only the first is staged");
    }
}
