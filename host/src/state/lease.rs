//! Read leases: a reader outside the shard's owner (a paged state query, `crate::checkpoints::query`)
//! names the checkpoint versions it reads, and every shard's GC keeps the versions leased to it
//! until the lease expires (as a snapshot that pins an LSM version for an iterator in RocksDB,
//! but across processes, through the store).
//!
//! # Layout
//! `{pipeline}/leases/{id}.json` beside `{pipeline}/shards/{partition:05}/`: one object per
//! lease, `{"versions": {"0": 12, "1": 9}, "expires_at_ms": …}` (partition → manifest
//! version). GC reads them after listing a shard's versions
//! ([`crate::state::manifest::retention`]), so a lease written before a pass lists versions is
//! always seen by it; it deletes leases an hour past their expiry.

use crate::ids::{ManifestVersion, Partition};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// How long past its expiry a lease object is left before GC deletes it.
const EXPIRED_KEEP_MS: u64 = 60 * 60 * 1000;

/// One lease's object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Partition → the manifest version read there.
    pub versions: BTreeMap<Partition, ManifestVersion>,
    /// When the lease ends, ms since the Unix epoch.
    pub expires_at_ms: u64,
}

/// The lease directory of the pipeline whose shard lives at `shard_root`
/// (`{pipeline}/shards/{partition:05}` → `{pipeline}/leases`) and the shard's partition;
/// `None` for a root not of that shape.
pub fn leases_of_shard(shard_root: &Path) -> Option<(Path, i32)> {
    let root = shard_root.as_ref();
    let (shards, partition) = root.rsplit_once('/')?;
    let pipeline = shards.strip_suffix("/shards")?;
    Some((
        Path::from(format!("{pipeline}/leases")),
        partition.parse().ok()?,
    ))
}

/// Writes (or renews) lease `id` under `dir`.
///
/// # Errors
/// The store's.
pub async fn put(
    store: &Arc<dyn ObjectStore>,
    dir: &Path,
    id: &str,
    lease: &Lease,
) -> Result<(), object_store::Error> {
    let body = serde_json::to_vec(lease).expect("plain fields serialise");
    store
        .put(
            &Path::from(format!("{dir}/{id}.json")),
            PutPayload::from(body),
        )
        .await
        .map(|_| ())
}

/// Reads lease `id` under `dir`; `None` when it is gone (released, or collected after it
/// expired).
///
/// # Errors
/// The store's.
pub async fn get(
    store: &Arc<dyn ObjectStore>,
    dir: &Path,
    id: &str,
) -> Result<Option<Lease>, object_store::Error> {
    match store.get(&Path::from(format!("{dir}/{id}.json"))).await {
        Ok(got) => Ok(serde_json::from_slice(&got.bytes().await?).ok()),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes lease `id` under `dir` (gone already is fine).
///
/// # Errors
/// The store's.
pub async fn release(
    store: &Arc<dyn ObjectStore>,
    dir: &Path,
    id: &str,
) -> Result<(), object_store::Error> {
    match store.delete(&Path::from(format!("{dir}/{id}.json"))).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The versions of the shard at `shard_root` that unexpired leases hold at `now_ms`; deletes
/// the leases long expired (module docs). A lease object that does not decode holds nothing.
///
/// # Errors
/// The store's, when listing or reading fails (GC then tries again later).
pub async fn leased_versions(
    store: &Arc<dyn ObjectStore>,
    shard_root: &Path,
    now_ms: u64,
) -> Result<BTreeSet<ManifestVersion>, object_store::Error> {
    let Some((dir, partition)) = leases_of_shard(shard_root) else {
        return Ok(BTreeSet::new());
    };
    let listed: Vec<_> = store.list(Some(&dir)).try_collect().await?;
    let mut held = BTreeSet::new();
    for meta in listed {
        let lease: Option<Lease> = match store.get(&meta.location).await {
            Ok(got) => serde_json::from_slice(&got.bytes().await?).ok(),
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        let Some(lease) = lease else { continue };
        if now_ms < lease.expires_at_ms {
            held.extend(lease.versions.get(&Partition(partition)));
        } else if now_ms - lease.expires_at_ms > EXPIRED_KEEP_MS {
            match store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::test_support::block_on;

    #[test]
    fn a_shard_sees_its_partitions_version_of_unexpired_leases_only() {
        block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
            let dir = Path::from("t/state/u/pipelines/t.p/leases");
            let shard = Path::from("t/state/u/pipelines/t.p/shards/00001");
            assert_eq!(leases_of_shard(&shard), Some((dir.clone(), 1)));
            let lease = |v0, v1, expires_at_ms| Lease {
                versions: [
                    (Partition(0), ManifestVersion(v0)),
                    (Partition(1), ManifestVersion(v1)),
                ]
                .into(),
                expires_at_ms,
            };
            put(&store, &dir, "a", &lease(5, 7, 1_000))
                .await
                .expect("puts");
            put(&store, &dir, "b", &lease(6, 9, 500))
                .await
                .expect("puts");
            let held = leased_versions(&store, &shard, 600).await.expect("reads");
            assert_eq!(held, [ManifestVersion(7)].into(), "b expired at 500");
            // Long past expiry, a lease is deleted; released, it is gone.
            let later = 1_000 + EXPIRED_KEEP_MS + 1;
            assert!(
                leased_versions(&store, &shard, later)
                    .await
                    .expect("reads")
                    .is_empty()
            );
            assert_eq!(get(&store, &dir, "a").await.expect("reads"), None);
            put(&store, &dir, "c", &lease(1, 2, u64::MAX))
                .await
                .expect("puts");
            release(&store, &dir, "c").await.expect("releases");
            release(&store, &dir, "c").await.expect("twice is fine");
            assert_eq!(get(&store, &dir, "c").await.expect("reads"), None);
            // A root of another shape (a savepoint's shard) holds nothing.
            assert_eq!(leases_of_shard(&Path::from("x")), None);
        });
    }
}
