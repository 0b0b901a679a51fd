//! Queryable state (issue 20, item 5): reads of a pipeline's keyed state as of one committed
//! checkpoint per shard, from the store alone — any host can serve them, none has to run the
//! pipeline, and nothing is written (as Kafka Streams' interactive queries, but against the
//! checkpoint rather than a running instance's local store).
//!
//! - A shard is read at the manifest version the caller names ([`QueryShard::open`]): an `lsm`
//!   checkpoint through a read-only tree over the host's shared block cache (blocks are fetched
//!   lazily, as a query touches them); a `memory` checkpoint by reading its snapshot.
//! - Entries past their TTL read as absent, as they do for the operator.
//! - Timers and the watermark live under reserved state names (`!…`) and are not queryable
//!   here (the export has them).
//! - A key's state lives in the shard of the partition its record went to; a point read asks
//!   every shard (a host cannot know the producer's partitioner) and merges.
//!
//! Orders: entries come in the order of their encoded state keys ([`crate::state::key`]): by
//! record key length, then record key bytes, then map key — so a scan's pages continue after
//! the last encoded key they returned, across every shard at once.

use crate::clock::SharedClock;
use crate::ids::{ManifestVersion, Partition};
use crate::state::StateError;
use crate::state::key;
use crate::state::lsm::cache::{BlockCaches, SstFiles};
use crate::state::lsm::tree::{LsmSettings, LsmTree};
use crate::state::manifest::{Manifest, ManifestError, ManifestStore};
use crate::state::snapshot;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::BTreeMap;
use std::sync::Arc;

/// An entry as a query returns it: (encoded state key, value, expiry in ms since the epoch).
pub type QueryEntry = (Vec<u8>, Bytes, Option<u64>);

/// Encoded entries read from a shard at a time while a scan filters.
const SCAN_PAGE: usize = 1024;

/// Why a query could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The checkpoint version the query reads is no longer stored (GC collected it after a
    /// page token named it): start the scan again.
    #[error("checkpoint version {version} of partition {partition} is no longer stored")]
    Gone {
        /// The input partition.
        partition: Partition,
        /// The version.
        version: ManifestVersion,
    },
    /// The version named is no checkpoint (a claim): nothing to read there.
    #[error("version {version} of partition {partition}, which is no checkpoint")]
    NotCheckpoint {
        /// The input partition.
        partition: Partition,
        /// The version.
        version: ManifestVersion,
    },
    /// The store failed, or what it holds cannot be read.
    #[error(transparent)]
    State(#[from] StateError),
}

/// One shard opened at one checkpoint for reading.
#[derive(Debug)]
pub struct QueryShard {
    /// The input partition.
    pub partition: Partition,
    /// The checkpoint's manifest version.
    pub version: ManifestVersion,
    reader: Reader,
}

#[derive(Debug)]
enum Reader {
    Lsm(Box<LsmTree>),
    Snapshot(snapshot::SnapshotEntries),
}

impl QueryShard {
    /// Opens version `version` of the shard under `root` (partition `partition`), reading
    /// `lsm` blocks through `caches`.
    ///
    /// # Errors
    /// [`QueryError::Gone`] when that version is not stored (or its snapshot is gone);
    /// [`QueryError::State`] when the store fails or the checkpoint does not decode.
    pub async fn open(
        store: &Arc<dyn ObjectStore>,
        (root, partition): (&Path, Partition),
        version: ManifestVersion,
        caches: &Arc<BlockCaches>,
        clock: &SharedClock,
    ) -> Result<Self, QueryError> {
        let manifests = ManifestStore::new(store.clone(), root.clone());
        let manifest = match manifests.read(version).await {
            Ok(m) => m,
            Err(ManifestError::NotFound(_)) => return Err(QueryError::Gone { partition, version }),
            Err(e) => return Err(e.into_state_error(root).into()),
        };
        if manifest.kind != crate::state::manifest::ManifestKind::Checkpoint {
            return Err(QueryError::NotCheckpoint { partition, version });
        }
        let reader = open_reader(store, root, &manifest, caches, clock)
            .await?
            .ok_or(QueryError::Gone { partition, version })?;
        Ok(Self {
            partition,
            version,
            reader,
        })
    }

    /// Up to `limit` live entries whose encoded key starts with `prefix`, after `after`, in
    /// key order.
    ///
    /// # Errors
    /// [`StateError`] when a block cannot be read.
    pub async fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<QueryEntry>, StateError> {
        match &self.reader {
            Reader::Lsm(tree) => tree.scan_with_expiry(prefix, after, limit).await,
            Reader::Snapshot(entries) => {
                let start = match after {
                    Some(a) => std::ops::Bound::Excluded(a.to_vec()),
                    None => std::ops::Bound::Included(prefix.to_vec()),
                };
                Ok(entries
                    .range((start, std::ops::Bound::Unbounded))
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .filter(|(_, (_, expires))| expires.is_none_or(|at| now_ms < at))
                    .take(limit)
                    .map(|(k, (v, e))| (k.clone(), v.clone(), *e))
                    .collect())
            }
        }
    }

    /// Up to `limit` live entries of state `state` after the encoded key `after`, in key order,
    /// whose record key starts with `key_prefix` — every entry of a map state, the one entry of
    /// a value state. Reads the shard's entries in order and keeps the matching ones (the
    /// encoding orders by record key first, so one state's entries are not contiguous).
    ///
    /// # Errors
    /// [`StateError`] when a block cannot be read.
    pub async fn scan_state(
        &self,
        state: &str,
        key_prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<QueryEntry>, StateError> {
        let mut out = Vec::new();
        let mut cursor = after.map(<[u8]>::to_vec);
        loop {
            let page = self.scan(&[], cursor.as_deref(), SCAN_PAGE, now_ms).await?;
            let full = page.len() == SCAN_PAGE;
            cursor = page.last().map(|(k, _, _)| k.clone()).or(cursor);
            for entry in page {
                let matches = key::decode(&entry.0).is_some_and(|(record_key, name, _)| {
                    name == state && record_key.starts_with(key_prefix)
                });
                if matches {
                    out.push(entry);
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            if !full {
                return Ok(out);
            }
        }
    }
}

/// The reader of checkpoint `manifest`; `None` when its snapshot is gone.
async fn open_reader(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    manifest: &Manifest,
    caches: &Arc<BlockCaches>,
    clock: &SharedClock,
) -> Result<Option<Reader>, StateError> {
    if let Some(name) = snapshot::snapshot_name(&manifest.metadata) {
        let path = Path::from(format!("{root}/{name}"));
        let bytes = match store.get(&path).await {
            Ok(got) => got.bytes().await,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => Err(e),
        }
        .map_err(|e| StateError::Unavailable {
            shard: root.to_string(),
            source: Box::new(e),
        })?;
        let entries = snapshot::decode(&bytes)
            .map_err(|reason| StateError::corrupt(root.to_string(), reason))?;
        return Ok(Some(Reader::Snapshot(entries)));
    }
    // Read only: nothing is written, so nothing is flushed, compacted or collected.
    let tree = LsmTree::open(
        SstFiles::new(store.clone(), caches.clone()),
        root.clone(),
        manifest,
        manifest.writer_epoch,
        LsmSettings::default(),
        clock.clone(),
    )?;
    Ok(Some(Reader::Lsm(Box::new(tree))))
}

/// A stored value decoded as JSON, for reading: the SDKs' typed states write JSON, behind a
/// version header (byte 0, the schema version as u32 BE) for a state at schema version 1 or
/// above (wit/types.wit, `state-descriptor`); `None` for a value that is not JSON.
pub fn json_of(value: &[u8]) -> Option<serde_json::Value> {
    let payload = match value {
        [0, _, _, _, _, payload @ ..] => payload,
        plain => plain,
    };
    serde_json::from_slice(payload).ok()
}

/// Merges per-shard pages (each in key order, each of up to `limit + 1` entries) into the
/// first `limit` entries in key order, with the shard each came from; the flag says whether
/// any entry is left past them.
pub fn merge_pages(
    pages: Vec<(Partition, Vec<QueryEntry>)>,
    limit: usize,
) -> (Vec<(Partition, QueryEntry)>, bool) {
    let mut all: BTreeMap<Vec<u8>, (Partition, Bytes, Option<u64>)> = BTreeMap::new();
    for (partition, page) in pages {
        for (k, v, e) in page {
            // The same key in two shards (a key whose records went to two partitions): the
            // lower partition's is shown; both are counted as one entry.
            all.entry(k).or_insert((partition, v, e));
        }
    }
    let more = all.len() > limit;
    let merged = all
        .into_iter()
        .take(limit)
        .map(|(k, (p, v, e))| (p, (k, v, e)))
        .collect();
    (merged, more)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::state::test_support::block_on;

    const P0: Partition = Partition(0);

    fn entries(keys: &[(&str, &str, &str)]) -> snapshot::SnapshotEntries {
        keys.iter()
            .map(|(k, state, map_key)| {
                (
                    key::map_key(k.as_bytes(), state, map_key.as_bytes()),
                    (Bytes::from(format!("{k}/{state}/{map_key}")), None),
                )
            })
            .collect()
    }

    fn shard(entries: snapshot::SnapshotEntries) -> QueryShard {
        QueryShard {
            partition: Partition(0),
            version: ManifestVersion(1),
            reader: Reader::Snapshot(entries),
        }
    }

    #[test]
    fn a_state_scan_keeps_one_states_entries_with_the_key_prefix_in_key_order() {
        block_on(async {
            let s = shard(entries(&[
                ("a1", "count", ""),
                ("a1", "seen", "x"),
                ("a1", "seen", "y"),
                ("a12", "count", ""),
                ("b", "count", ""),
            ]));
            let got = s
                .scan_state("count", b"a", None, 10, 0)
                .await
                .expect("reads");
            let keys: Vec<_> = got
                .iter()
                .map(|(k, _, _)| key::decode(k).expect("an encoding").0.to_vec())
                .collect();
            assert_eq!(keys, vec![b"a1".to_vec(), b"a12".to_vec()]);
            // Paged: after the first, the second.
            let next = s
                .scan_state("count", b"a", Some(&got[0].0), 1, 0)
                .await
                .expect("reads");
            assert_eq!(next, vec![got[1].clone()]);
            let map = s
                .scan(&key_prefix(b"a1", "seen"), None, 10, 0)
                .await
                .expect("reads");
            assert_eq!(map.len(), 2);
            assert_eq!(map[0].1, Bytes::from("a1/seen/x"));
        });
    }

    #[test]
    fn entries_past_their_ttl_read_as_absent() {
        block_on(async {
            let mut e = entries(&[("k", "count", "")]);
            for (_, (_, expires)) in e.iter_mut() {
                *expires = Some(1_000);
            }
            let s = shard(e);
            assert_eq!(s.scan(&[], None, 10, 999).await.expect("reads").len(), 1);
            assert!(
                s.scan(&[], None, 10, 1_000)
                    .await
                    .expect("reads")
                    .is_empty()
            );
        });
    }

    #[test]
    fn pages_of_shards_merge_in_key_order_and_say_when_more_is_left() {
        let k = |s: &str| (key::value_key(s.as_bytes(), "c"), Bytes::new(), None);
        let (merged, more) = merge_pages(
            vec![
                (Partition(0), vec![k("a"), k("c")]),
                (Partition(1), vec![k("b"), k("d")]),
            ],
            3,
        );
        let order: Vec<i32> = merged.iter().map(|(p, _)| p.0).collect();
        assert_eq!(order, vec![0, 1, 0]);
        assert!(more);
        let (merged, more) = merge_pages(vec![(Partition(0), vec![k("a")])], 3);
        assert_eq!(merged.len(), 1);
        assert!(!more);
    }

    #[test]
    fn a_missing_version_is_gone() {
        block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
            let clock: SharedClock = Arc::new(SystemClock);
            let err = QueryShard::open(
                &store,
                (&Path::from("shard"), Partition(3)),
                ManifestVersion(7),
                &Arc::new(BlockCaches::none()),
                &clock,
            )
            .await
            .expect_err("nothing stored");
            assert!(
                matches!(
                    err,
                    QueryError::Gone {
                        partition: Partition(3),
                        version: ManifestVersion(7)
                    }
                ),
                "{err:?}"
            );
        });
    }

    /// Round `round` of writes: state `count` of keys `k000`…`k039` set to `round`.
    fn counts_of_round(round: u32) -> Vec<crate::state::StateWrite> {
        (0..40u32)
            .map(|i| crate::state::StateWrite {
                key: key::value_key(format!("k{i:03}").as_bytes(), "count"),
                value: Some(Bytes::from(format!("{round}"))),
                expires_at_ms: None,
            })
            .collect()
    }

    /// Leases `version` of the shard at `root` as a scan does (lease `scan`, never expiring).
    async fn lease_version(store: &Arc<dyn ObjectStore>, root: &Path, version: ManifestVersion) {
        use crate::state::lease::{self, Lease};
        let held = Lease {
            versions: [(Partition(0), version)].into(),
            expires_at_ms: u64::MAX,
        };
        let dir = lease::leases_of_shard(root).expect("a shard root").0;
        lease::put(store, &dir, "scan", &held)
            .await
            .expect("leases");
    }

    /// Every entry of state `count` in `shard`, read in pages of 15.
    async fn every_count(shard: &QueryShard) -> Vec<QueryEntry> {
        let mut all = Vec::new();
        loop {
            let after = all.last().map(|(k, _, _): &QueryEntry| k.clone());
            let page = shard
                .scan_state("count", b"", after.as_deref(), 15, 0)
                .await
                .expect("reads");
            if page.is_empty() {
                return all;
            }
            all.extend(page);
        }
    }

    /// A paged query holds a lease on version 1; between its pages every key is overwritten,
    /// compacted and checkpointed four times and GC runs with no grace: the lease keeps
    /// version 1 and its SSTs, and the next page — opened anew, as on another host — reads
    /// version 1's values. Released, GC collects it and a page of it is gone.
    #[test]
    fn a_leased_version_reads_the_same_across_compaction_and_gc_without_grace() {
        use crate::state::Shard as _;
        use crate::state::lease;
        use crate::state::lsm::gc::{LiveWriter, collect_garbage};
        use crate::state::manifest::{Protected, RetentionPolicy};
        block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
            let clock: SharedClock = Arc::new(SystemClock);
            let root = Path::from("t/state/u/pipelines/t.p/shards/00000");
            let caches = Arc::new(BlockCaches::none());
            let manifests = ManifestStore::new(store.clone(), root.clone());
            let mut last = manifests.claim("w", None, &[]).await.expect("claims");
            let tree = LsmTree::new(
                SstFiles::new(store.clone(), caches.clone()),
                root.clone(),
                last.writer_epoch,
                crate::state::lsm::tests::small_settings(),
                clock.clone(),
            );
            let mut versions = Vec::new();
            for round in 0..5 {
                tree.apply(counts_of_round(round)).await.expect("applies");
                tree.compact_until_settled().await.expect("compacts");
                tree.flush().await.expect("flushes");
                let seq = tree.next_seq();
                let checkpoint = last.next_checkpoint(tree.levels(), Default::default());
                manifests.commit(&checkpoint).await.expect("commits");
                tree.checkpoint_committed(seq);
                last = checkpoint;
                versions.push(last.version);
                if round == 0 {
                    // The first page, then the lease the scan takes.
                    let first =
                        QueryShard::open(&store, (&root, P0), last.version, &caches, &clock)
                            .await
                            .expect("opens");
                    let page = first
                        .scan_state("count", b"", None, 15, 0)
                        .await
                        .expect("reads");
                    assert_eq!(page.len(), 15);
                    lease_version(&store, &root, last.version).await;
                }
            }
            let policy = RetentionPolicy {
                retained_checkpoints: 1,
                grace: std::time::Duration::ZERO,
                ..RetentionPolicy::default()
            };
            let gc = || async {
                collect_garbage(
                    &store,
                    &root,
                    &LiveWriter::of(&tree, &policy),
                    &Protected::default(),
                    &policy,
                    clock.now_ms() + 1,
                )
                .await
                .expect("collects")
            };
            let report = gc().await;
            assert!(report.manifests_deleted > 0, "{report:?}");
            // The next pages, read anew at the leased version: round 0's values, all 40.
            let leased = versions[0];
            let shard = QueryShard::open(&store, (&root, P0), leased, &caches, &clock)
                .await
                .expect("the leased version is kept");
            let all = every_count(&shard).await;
            assert_eq!(all.len(), 40);
            assert!(all.iter().all(|(_, v, _)| v == &Bytes::from("0")));
            // Released: the next pass collects it.
            let dir = lease::leases_of_shard(&root).expect("a shard root").0;
            lease::release(&store, &dir, "scan")
                .await
                .expect("releases");
            gc().await;
            let gone = QueryShard::open(&store, (&root, P0), leased, &caches, &clock)
                .await
                .expect_err("collected");
            assert!(matches!(gone, QueryError::Gone { .. }), "{gone:?}");
        });
    }

    #[test]
    fn a_versioned_value_reads_as_its_json() {
        assert_eq!(json_of(b"41"), Some(serde_json::json!(41)));
        assert_eq!(
            json_of(b"\0\0\0\0\x01{\"count\":3}"),
            Some(serde_json::json!({"count": 3}))
        );
        assert_eq!(json_of(b"\xff"), None);
    }

    fn key_prefix(record_key: &[u8], state: &str) -> Vec<u8> {
        let mut out = Vec::new();
        key::encode_prefix(&mut out, record_key, state);
        out
    }
}
