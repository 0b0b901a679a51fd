//! A shard's state moved to the other backend when it opens (issue 20, item 3: a live switch
//! of a pipeline's `state_backend`). The old run drains and checkpoints on the old backend;
//! the new run's open finds that its newest decided checkpoint was written by the other
//! backend, exports it in the portable format ([`super::export`]) and imports it as a
//! checkpoint of its own, above every version, before recovery reads it. A switch back is the
//! same the other way. Each conversion is an `audit = true` line.

use super::export::{export_checkpoint, import_checkpoint};
use super::savepoint::{SavepointError, newest_decided_in, next_slot};
use crate::clock::SharedClock;
use crate::ids::ManifestVersion;
use crate::state::checkpoint::InputOffsets;
use crate::state::manifest::ManifestStore;
use crate::state::stored::{CheckpointFormat, checkpoint_backend};
use crate::state::{Recovery, ShardId, StateBackend, StateError};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::Arc;

/// Opens shard `id` of `backend` as [`StateBackend::open_shard_at`] does, after converting
/// the shard's newest decided checkpoint when the other backend wrote it (module docs): the
/// one way a pipeline opens its shards. The shard's versions are listed once, here, and handed
/// to the open unless a conversion added one.
///
/// # Errors
/// As [`convert_foreign`] and [`StateBackend::open_shard_at`].
pub async fn open_converted<B: StateBackend>(
    backend: &B,
    id: &ShardId,
    recovery: &Recovery,
) -> Result<B::Shard, StateError> {
    let Some(stored) = backend.stored(id) else {
        return backend.open_shard_at(id, recovery).await;
    };
    let versions = ManifestStore::new(stored.store.clone(), stored.root.clone())
        .versions()
        .await
        .map_err(|e| e.into_state_error(&stored.root))?;
    let own = stored.format.name();
    let converted = convert_foreign(
        &stored.store,
        &stored.root,
        (recovery, &versions),
        (stored.format, own),
        &stored.clock,
    )
    .await?;
    let recovery = Recovery {
        listed: converted.is_none().then_some(versions),
        ..recovery.clone()
    };
    backend.open_shard_at(id, &recovery).await
}

/// What a conversion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// The checkpoint converted, and its backend.
    pub from_version: ManifestVersion,
    /// See `from_version`.
    pub from_backend: &'static str,
    /// The checkpoint written.
    pub version: ManifestVersion,
    /// State entries and timers moved.
    pub entries: u64,
    /// See `entries`.
    pub timers: u64,
    /// Bytes of the export between them.
    pub export_bytes: u64,
}

/// Converts the newest decided checkpoint of the shard under `root` (per `recovery`, among
/// `versions`, the shard's versions as the open listed them) into backend `into` (named
/// `own`), when another backend wrote it (module docs); `None` when there is nothing to
/// convert (then nothing was written).
///
/// # Errors
/// [`StateError::Unavailable`] on a store error (the open is retried); [`StateError::Corrupt`]
/// when the checkpoint cannot be read or the export is not valid.
pub async fn convert_foreign(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    (recovery, versions): (&Recovery, &[ManifestVersion]),
    (into, own): (CheckpointFormat, &'static str),
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
    let Some(newest) = newest_decided_in(&manifests, versions, recovery.committed)
        .await
        .map_err(state_error)?
    else {
        return Ok(None);
    };
    let from_backend = checkpoint_backend(&newest);
    if from_backend == own {
        return Ok(None);
    }
    let started = crate::clock::monotonic_now();
    // Offsets that do not decode make the checkpoint unusable either way: recovery says so.
    if InputOffsets::from_metadata(&newest.metadata).is_err() {
        return Ok(None);
    }
    // The slot first, from the listing that chose `newest`: if anything is written to the shard
    // while the state is exported (another owner), the create-only commit at `version` fails,
    // rather than a stale checkpoint landing above that owner's (SCENARIOS.md S4).
    let (version, epoch) = next_slot(store, root, newest.writer_epoch)
        .await
        .map_err(state_error)?;
    let export = Path::from(format!(
        "{root}/convert/{:020}-{:08x}.jsonl",
        newest.version,
        super::savepoint::nonce()
    ));
    let export_error = |e: super::export::ExportError| match e {
        super::export::ExportError::Unavailable(source) => StateError::Unavailable {
            shard: root.to_string(),
            source: Box::new(source),
        },
        super::export::ExportError::State(state) => state,
        other => StateError::corrupt(root.to_string(), crate::error::Chain(&other).to_string()),
    };
    let exported = export_checkpoint(
        store,
        (root, &newest),
        (from_backend, crate::ids::Partition(0)),
        &export,
        clock,
    )
    .await
    .map_err(export_error)?;
    let token = crate::state::manifest::conversion_token(from_backend, newest.version);
    let imported = import_checkpoint(store, &export, root, into, (version.0, epoch, &token))
        .await
        .map_err(export_error);
    let _ = store.delete(&export).await;
    let imported = imported?;
    let converted = Converted {
        from_version: newest.version,
        from_backend,
        version: ManifestVersion(version.0),
        entries: imported.entries,
        timers: imported.timers,
        export_bytes: exported.bytes,
    };
    tracing::info!(
        audit = true,
        shard = %root,
        from_backend,
        from_version = newest.version.0,
        to_backend = own,
        version = version.0,
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
    use crate::ids::Offset;
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
        offsets.advance("t.in", Offset(next - 1));
        offsets
    }

    async fn all<S: Shard>(shard: &S) -> Vec<(Vec<u8>, Bytes)> {
        shard.scan(&[], None, usize::MAX).await.expect("scans")
    }

    /// The writes of one event-time timer at `time` of key `k` (`flush`), as the timer
    /// service makes them: its per-key entry, its index entry, the shard's count of timers.
    fn one_timer(time: i64) -> Vec<StateWrite> {
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
    }

    /// The version of a durable checkpoint of `shard` at `offsets(next)`, decided by `by`.
    async fn checkpointed<S: Shard>(shard: &S, next: i64, by: DecidedBy) -> u64 {
        (shard
            .checkpoint(&offsets(next), by)
            .await
            .expect("checkpoints")
            .expect("durable")
            .version)
            .0
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
                partition: crate::ids::Partition(0),
            };
            let mut versions = Vec::new();
            let on_memory = memory.open_shard(&id).await.expect("opens");
            on_memory
                .apply((0..80).map(|k| write(k, 1)).chain(one_timer(500)).collect())
                .await
                .expect("applies");
            versions.push(checkpointed(&on_memory, 80, DecidedBy::Manifest).await);
            let held = all(&on_memory).await;
            drop(on_memory);

            let on_lsm = open_converted(&lsm, &id, &Recovery::default())
                .await
                .expect("opens");
            assert_eq!(all(&on_lsm).await, held, "lsm reads what memory held");
            assert_eq!(
                on_lsm.recovered_offsets().expect("decodes"),
                Some(offsets(80))
            );
            on_lsm
                .apply((40..120).map(|k| write(k, 2)).collect())
                .await
                .expect("applies");
            versions.push(checkpointed(&on_lsm, 200, DecidedBy::Transaction).await);
            let held = all(&on_lsm).await;
            drop(on_lsm);

            // Back: exactly-once, so the transaction-decided checkpoint counts once Kafka
            // names it.
            let recovery = Recovery {
                committed: Some(ManifestVersion(versions[1])),
                ..Recovery::default()
            };
            let back = open_converted(&memory, &id, &recovery)
                .await
                .expect("opens");
            assert_eq!(all(&back).await, held, "memory reads what lsm held");
            assert_eq!(
                back.recovered_offsets().expect("decodes"),
                Some(offsets(200))
            );
            let newest = checkpointed(&back, 201, DecidedBy::Manifest).await;
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

    /// After a switch, the old backend's objects go with its checkpoints: once the `lsm`
    /// shard has checkpointed past them (and the grace period), its GC deletes the `memory`
    /// snapshot too.
    #[test]
    fn gc_after_a_switch_deletes_the_old_backends_objects() {
        block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            // A day ahead of the store's clock: every object is past the grace period.
            let day_ahead = crate::clock::wall_now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis() as u64
                + 86_400_000;
            let clock: SharedClock = Arc::new(ManualClock::new(day_ahead));
            let prefix = Path::from("state");
            let id = ShardId {
                pipeline: "t.p".into(),
                partition: crate::ids::Partition(0),
            };
            let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock.clone());
            let shard = memory.open_shard(&id).await.expect("opens");
            shard
                .apply((0..20).map(|k| write(k, 1)).collect())
                .await
                .expect("applies");
            shard
                .checkpoint(&offsets(20), DecidedBy::Manifest)
                .await
                .expect("checkpoints");
            drop(shard);
            let snapshots = Path::from(format!("{}/snapshot", id.root_under(&prefix)));
            let listed = |store: Arc<dyn ObjectStore>, prefix: Path| async move {
                futures::TryStreamExt::try_collect::<Vec<_>>(store.list(Some(&prefix)))
                    .await
                    .expect("lists")
                    .len()
            };
            assert_eq!(listed(store.clone(), snapshots.clone()).await, 1);
            let lsm = LsmBackend::new(
                store.clone(),
                prefix.clone(),
                Arc::new(BlockCaches::none()),
                crate::state::lsm::tests::small_settings(),
                clock,
            )
            // Its clock stands still: every checkpoint's GC pass runs, as 10 s apart.
            .with_retention(crate::state::manifest::RetentionPolicy {
                gc_interval: std::time::Duration::ZERO,
                ..Default::default()
            });
            let mut on_lsm = open_converted(&lsm, &id, &Recovery::default())
                .await
                .expect("opens");
            // Until the scrub has read the converted SSTs once, GC keeps the checkpoints up to
            // the converted one — the `memory` one with its snapshot among them. Waiting for
            // it, not for luck (this test failed when its checkpoints outran the scrub).
            on_lsm.scrub_settled().await;
            assert!(on_lsm.scrubbed());
            for round in 0..4 {
                on_lsm
                    .apply(vec![write(100 + round, 1)])
                    .await
                    .expect("applies");
                on_lsm
                    .checkpoint(&offsets(21 + i64::from(round)), DecidedBy::Manifest)
                    .await
                    .expect("checkpoints");
                on_lsm.gc_settled().await;
            }
            assert_eq!(
                listed(store.clone(), snapshots).await,
                0,
                "the snapshot went"
            );
            assert_eq!(
                on_lsm
                    .get(&crate::state::key::value_key(&3u32.to_be_bytes(), "count"))
                    .await
                    .expect("reads"),
                Some(Bytes::from("1"))
            );
        });
    }

    /// A fallback past the converted checkpoint meets the other backend's: refused (its state
    /// is not readable here), never opened as an empty tree at its offsets.
    #[test]
    fn a_fallback_never_opens_the_other_backends_checkpoint_as_empty_state() {
        block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let clock: SharedClock = Arc::new(ManualClock::new(0));
            let prefix = Path::from("state");
            let id = ShardId {
                pipeline: "t.p".into(),
                partition: crate::ids::Partition(0),
            };
            let memory = MemoryBackend::durable(store.clone(), prefix.clone(), clock.clone());
            let shard = memory.open_shard(&id).await.expect("opens");
            shard.apply(vec![write(1, 1)]).await.expect("applies");
            shard
                .checkpoint(&offsets(1), DecidedBy::Manifest)
                .await
                .expect("checkpoints");
            drop(shard);
            let lsm = LsmBackend::new(
                store.clone(),
                prefix.clone(),
                Arc::new(BlockCaches::none()),
                crate::state::lsm::tests::small_settings(),
                clock,
            );
            let converted = open_converted(&lsm, &id, &Recovery::default())
                .await
                .expect("opens");
            let version = converted
                .opened_from()
                .expect("from the converted checkpoint");
            // It resumed from what the memory checkpoint held: the version converted, below
            // the one written (what tells a fallback's conversion from a reset's checkpoint).
            let resumed = converted.resumed_from().expect("resumed from a checkpoint");
            assert!(resumed < version, "{resumed} converted into {version}");
            drop(converted);
            let mut recovery = Recovery::default();
            recovery.known_corruption.versions.insert(version);
            recovery.known_corruption.reason = "test".into();
            let Err(err) = open_converted(&lsm, &id, &recovery).await else {
                panic!("opened the memory checkpoint as an lsm one");
            };
            assert_eq!(err.kind(), crate::error::ErrorKind::Corrupt, "{err}");
        });
    }
}
