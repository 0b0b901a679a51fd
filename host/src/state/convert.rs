//! A shard's state moved to the other backend when it opens (issue 20, item 3: a live switch
//! of a pipeline's `state_backend`). The old run drains and checkpoints on the old backend;
//! the new run's open finds that its newest decided checkpoint was written by the other
//! backend, exports it in the portable format ([`super::export`]) and imports it as a
//! checkpoint of its own, above every version, before recovery reads it. A switch back is the
//! same the other way. Each conversion is an `audit = true` line.

use super::checkpoint::InputOffsets;
use super::export::{ImportInto, export_checkpoint, import_checkpoint};
use super::manifest::{Manifest, ManifestStore};
use super::savepoint::{SavepointError, newest_decided, next_slot};
use super::{Recovery, StateError, snapshot};
use crate::clock::SharedClock;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::Arc;

/// The backend that wrote checkpoint `manifest`: `memory` when it names a snapshot, else `lsm`.
pub fn checkpoint_backend(manifest: &Manifest) -> &'static str {
    if snapshot::snapshot_name(&manifest.metadata).is_some() {
        "memory"
    } else {
        "lsm"
    }
}

/// What a conversion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// The checkpoint converted, and its backend.
    pub from_version: u64,
    /// See `from_version`.
    pub from_backend: &'static str,
    /// The checkpoint written.
    pub version: u64,
    /// State entries and timers moved.
    pub entries: u64,
    /// See `entries`.
    pub timers: u64,
    /// Bytes of the export between them.
    pub export_bytes: u64,
}

/// Converts the newest decided checkpoint of the shard under `root` (per `recovery`) into
/// backend `into` (named `own`), when another backend wrote it (module docs); `None` when
/// there is nothing to convert.
///
/// # Errors
/// [`StateError::Unavailable`] on a store error (the open is retried); [`StateError::Corrupt`]
/// when the checkpoint cannot be read or the export is not valid.
pub async fn convert_foreign(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    recovery: &Recovery,
    (into, own): (ImportInto, &'static str),
    clock: &SharedClock,
) -> Result<Option<Converted>, StateError> {
    let state_error = |e: SavepointError| match e {
        SavepointError::Unavailable(source) => StateError::Unavailable {
            shard: root.to_string(),
            source: Box::new(source),
        },
        SavepointError::Unusable(reason) => StateError::corrupt(root.to_string(), reason),
    };
    let manifests = ManifestStore::new(store.clone(), root.clone());
    let Some(newest) = newest_decided(&manifests, recovery.committed)
        .await
        .map_err(state_error)?
    else {
        return Ok(None);
    };
    let from_backend = checkpoint_backend(&newest);
    if from_backend == own {
        return Ok(None);
    }
    let started = std::time::Instant::now();
    // Offsets that do not decode make the checkpoint unusable either way: recovery says so.
    if InputOffsets::from_metadata(&newest.metadata).is_err() {
        return Ok(None);
    }
    let export = Path::from(format!("{root}/convert/{:020}.jsonl", newest.version));
    let export_error = |e: super::export::ExportError| match e {
        super::export::ExportError::Unavailable(source) => StateError::Unavailable {
            shard: root.to_string(),
            source: Box::new(source),
        },
        super::export::ExportError::State(state) => state,
        other => StateError::corrupt(root.to_string(), crate::error::Chain(&other).to_string()),
    };
    let exported = export_checkpoint(store, (root, &newest), (from_backend, 0), &export, clock)
        .await
        .map_err(export_error)?;
    let (version, epoch) = next_slot(store, root, newest.writer_epoch)
        .await
        .map_err(state_error)?;
    let token = format!("convert-{from_backend}-{}", newest.version);
    let imported = import_checkpoint(store, &export, root, into, (version, epoch, &token))
        .await
        .map_err(export_error);
    let _ = store.delete(&export).await;
    let imported = imported?;
    let converted = Converted {
        from_version: newest.version,
        from_backend,
        version,
        entries: imported.entries,
        timers: imported.timers,
        export_bytes: exported.bytes,
    };
    tracing::info!(
        audit = true,
        shard = %root,
        from_backend,
        from_version = newest.version,
        to_backend = own,
        version,
        entries = converted.entries,
        timers = converted.timers,
        export_bytes = converted.export_bytes,
        ms = started.elapsed().as_millis() as u64,
        "state converted to the pipeline's new backend"
    );
    Ok(Some(converted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::state::checkpoint::DecidedBy;
    use crate::state::lsm::backend::LsmBackend;
    use crate::state::lsm::cache::BlockCaches;
    use crate::state::memory::MemoryBackend;
    use crate::state::test_support::block_on;
    use crate::state::{Shard, ShardId, StateBackend, StateWrite};
    use crate::time::keys as time_keys;
    use bytes::Bytes;
    use object_store::memory::InMemory;

    fn write(key: u32, value: u32) -> StateWrite {
        StateWrite {
            key: crate::state::key::value_key(&key.to_be_bytes(), "count"),
            value: Some(Bytes::from(value.to_string())),
            expires_at_ms: None,
        }
    }

    fn offsets(next: i64) -> InputOffsets {
        let mut offsets = InputOffsets::new();
        offsets.advance("t.in", next - 1);
        offsets
    }

    async fn all<S: Shard>(shard: &S) -> Vec<(Vec<u8>, Bytes)> {
        shard.scan(&[], None, usize::MAX).await.expect("scans")
    }

    /// `memory` → `lsm` → `memory` on one shard, as a live switch does: each open converts
    /// the other backend's newest checkpoint, and reads what it held, timers and offsets
    /// included, with checkpoint versions only going up.
    #[test]
    fn a_shard_opened_on_the_other_backend_converts_its_newest_checkpoint() {
        block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let clock: SharedClock = Arc::new(ManualClock::new(0));
            let prefix = Path::from("state");
            let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock.clone());
            let lsm = LsmBackend::new(
                store.clone(),
                prefix.clone(),
                Arc::new(BlockCaches::none()),
                crate::state::lsm::tests::small_settings(),
                clock.clone(),
            );
            let id = ShardId {
                pipeline: "t.p".into(),
                partition: 0,
            };
            let timer = |time: i64| {
                vec![
                    StateWrite {
                        key: time_keys::per_key(b"k", "flush"),
                        value: Some(Bytes::from(time_keys::per_key_value(
                            crate::runtime::TimeDomain::EventTime,
                            time,
                        ))),
                        expires_at_ms: None,
                    },
                    StateWrite {
                        key: time_keys::time_index(
                            crate::runtime::TimeDomain::EventTime,
                            time,
                            b"k",
                            "flush",
                        ),
                        value: Some(Bytes::new()),
                        expires_at_ms: None,
                    },
                    StateWrite {
                        key: time_keys::TIMER_COUNT_KEY.to_vec(),
                        value: Some(Bytes::copy_from_slice(&1u64.to_be_bytes())),
                        expires_at_ms: None,
                    },
                ]
            };
            let mut versions = Vec::new();
            let on_memory = memory.open_shard(&id).await.expect("opens");
            on_memory
                .apply((0..80).map(|k| write(k, 1)).chain(timer(500)).collect())
                .await
                .expect("applies");
            versions.push(
                on_memory
                    .checkpoint(&offsets(80), DecidedBy::Manifest)
                    .await
                    .expect("checkpoints")
                    .expect("durable")
                    .version,
            );
            let held = all(&on_memory).await;
            drop(on_memory);

            let on_lsm = lsm.open_shard(&id).await.expect("opens");
            assert_eq!(all(&on_lsm).await, held, "lsm reads what memory held");
            assert_eq!(
                on_lsm.recovered_offsets().expect("decodes"),
                Some(offsets(80))
            );
            on_lsm
                .apply((40..120).map(|k| write(k, 2)).collect())
                .await
                .expect("applies");
            versions.push(
                on_lsm
                    .checkpoint(&offsets(200), DecidedBy::Transaction)
                    .await
                    .expect("checkpoints")
                    .expect("durable")
                    .version,
            );
            let held = all(&on_lsm).await;
            drop(on_lsm);

            // Back: exactly-once, so the transaction-decided checkpoint counts once Kafka
            // names it.
            let recovery = Recovery {
                committed: Some(versions[1]),
                ..Recovery::default()
            };
            let back = memory.open_shard_at(&id, &recovery).await.expect("opens");
            assert_eq!(all(&back).await, held, "memory reads what lsm held");
            assert_eq!(
                back.recovered_offsets().expect("decodes"),
                Some(offsets(200))
            );
            let newest = back
                .checkpoint(&offsets(201), DecidedBy::Manifest)
                .await
                .expect("checkpoints")
                .expect("durable")
                .version;
            assert!(
                versions[0] < versions[1] && versions[1] < newest,
                "{versions:?} then {newest}"
            );
            // Nothing is left of the conversions' exports.
            let left: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(store.list(Some(
                &Path::from(format!("{}/convert", id.root_under(&prefix))),
            )))
            .await
            .expect("lists");
            assert!(left.is_empty(), "{left:?}");
        });
    }
}
