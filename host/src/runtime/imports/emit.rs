//! `weir:operator/emit`: stages output records for the record that emits them.

use crate::runtime::batch::{StagedEmit, emit_size};
use crate::runtime::bindings::weir::operator::emit::{EmitError, Host};
use crate::runtime::bindings::weir::operator::types::Header;
use crate::runtime::host::HostCtx;
use crate::runtime::record_size::record_bytes;
use crate::runtime::{EmitDoesNotFit, ReservedHeader, StagedBytesExceeded};
use crate::state::Shard;
use crate::time::edge::{FRONTIER_HEADER, ORIGIN_HEADER};
use crate::time::watermark::MARKER_HEADER;

impl<S: Shard> Host for HostCtx<S> {
    async fn emit(
        &mut self,
        record: u32,
        key: Vec<u8>,
        value: Vec<u8>,
        headers: Vec<Header>,
    ) -> wasmtime::Result<Result<(), EmitError>> {
        self.stage_checked_emit(StagedEmit {
            record,
            output: 0,
            timestamp_ms: None,
            key,
            value,
            headers,
        })
    }

    async fn emit_to(
        &mut self,
        record: u32,
        output: String,
        key: Vec<u8>,
        value: Vec<u8>,
        headers: Vec<Header>,
        timestamp_ms: Option<i64>,
    ) -> wasmtime::Result<Result<(), EmitError>> {
        let Some(output) = self.meta.as_ref().and_then(|m| m.output_index(&output)) else {
            return Ok(Err(EmitError::UnknownOutput(output)));
        };
        self.stage_checked_emit(StagedEmit {
            record,
            output,
            timestamp_ms,
            key,
            value,
            headers,
        })
    }
}

impl<S: Shard> HostCtx<S> {
    /// Stages `emit` once it passes the emit rules (`emit.wit`): it fits the output topics and
    /// its record's budget, is a row of the table (the default output's, when there is one),
    /// carries no reserved header, and keeps the call within its staging budget — the last
    /// three failing the call rather than returning an error to the guest.
    fn stage_checked_emit(&mut self, emit: StagedEmit) -> wasmtime::Result<Result<(), EmitError>> {
        let record = emit.record;
        let (limit, staged_max) = self.meta.as_ref().map_or((0, 0), |m| {
            (
                m.limits.emit_bytes_per_record_max,
                m.limits.batch_staged_bytes_max,
            )
        });
        // One record as Kafka counts it must fit the output topics (and the producer); all of a
        // record's emits together must fit the per-record limit.
        let header_bytes: u64 = emit
            .headers
            .iter()
            .map(|h| (h.name.len() + h.value.len()) as u64)
            .sum();
        let wire = record_bytes(
            emit.key.len() as u64,
            emit.value.len() as u64,
            header_bytes,
            emit.headers.len() as u64,
        );
        let record_max = self.batch.call.record_bytes_max;
        if wire > record_max {
            return Ok(Err(EmitError::TooLarge(record_max)));
        }
        let size = emit_size(&emit.key, &emit.value, &emit.headers);
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
        if emit.output == 0
            && let Some(table) = &self.batch.call.table
            && let Err(e) = table.check(&emit.value)
        {
            return Err(wasmtime::Error::new(EmitDoesNotFit(e)));
        }
        if emit
            .headers
            .iter()
            .any(|h| [MARKER_HEADER, ORIGIN_HEADER, FRONTIER_HEADER].contains(&h.name.as_str()))
        {
            return Err(wasmtime::Error::new(ReservedHeader));
        }
        *emitted += size;
        if self.batch.staged_bytes().saturating_add(size) > staged_max {
            return Err(wasmtime::Error::new(StagedBytesExceeded {
                limit: staged_max,
            }));
        }
        self.batch.stage_emit(emit);
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
        ctx.batch.call = Arc::new(crate::runtime::CallSettings {
            record_bytes_max: u64::MAX,
            table: Some(Arc::new(table)),
            parameters: Default::default(),
            global_tables: Default::default(),
        });
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
            for reserved in [MARKER_HEADER, ORIGIN_HEADER, FRONTIER_HEADER] {
                let emitted = ctx
                    .emit(0, b"k".to_vec(), b"v".to_vec(), vec![header(reserved)])
                    .await;
                let err = emitted.expect_err("fails the call");
                assert!(err.downcast_ref::<ReservedHeader>().is_some(), "{err}");
            }
        });
        let (_, emits) = std::mem::take(&mut ctx.batch).into_effects();
        assert_eq!(emits.len(), 1, "only the first is staged");
    }

    /// `emit-to` stages an emit for a declared output under its index, with the timestamp
    /// given; `default` is index 0; an undeclared name is the guest's error and stages
    /// nothing.
    #[test]
    fn emits_to_named_outputs_keep_their_index_and_timestamp_and_unknown_ones_are_refused() {
        let mut ctx = host();
        futures::executor::block_on(async {
            let late = ctx.emit_to(
                0,
                "late".into(),
                b"k".to_vec(),
                b"l".to_vec(),
                vec![],
                Some(7),
            );
            assert!(matches!(late.await, Ok(Ok(()))));
            let default = ctx.emit_to(
                0,
                "default".into(),
                b"k".to_vec(),
                b"d".to_vec(),
                vec![],
                None,
            );
            assert!(matches!(default.await, Ok(Ok(()))));
            let unknown = ctx
                .emit_to(
                    0,
                    "early".into(),
                    b"k".to_vec(),
                    b"e".to_vec(),
                    vec![],
                    None,
                )
                .await;
            assert_eq!(
                unknown.expect("not a trap"),
                Err(EmitError::UnknownOutput("early".into()))
            );
        });
        let (_, emits) = std::mem::take(&mut ctx.batch).into_effects();
        let staged: Vec<_> = emits
            .iter()
            .map(|e| (e.output, e.value.as_slice(), e.timestamp_ms))
            .collect();
        assert_eq!(staged, [(1, &b"l"[..], Some(7)), (0, &b"d"[..], None)]);
    }

    /// The parameters a call is given are what `parameters.get` and `entries` return, in name
    /// order.
    #[test]
    fn parameters_are_the_calls_in_name_order() {
        use crate::runtime::bindings::weir::operator::parameters::Host as _;
        let mut ctx = host();
        let parameters = [("threshold", "60"), ("mode", "fast")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into_iter()
            .collect();
        ctx.batch
            .set_call_settings(&Arc::new(crate::runtime::CallSettings {
                record_bytes_max: u64::MAX,
                table: None,
                parameters: Arc::new(parameters),
                global_tables: Default::default(),
            }));
        futures::executor::block_on(async {
            assert_eq!(
                ctx.get("threshold".into()).await.ok(),
                Some(Some("60".into()))
            );
            assert_eq!(ctx.get("other".into()).await.ok(), Some(None));
            let entries = ctx.entries().await.expect("never fails");
            assert_eq!(
                entries,
                [
                    ("mode".into(), "fast".into()),
                    ("threshold".into(), "60".into())
                ]
            );
        });
    }
}
