//! Reading one page of a pipeline's state ([`Scan`]): at the versions a page token names, or
//! the newest decided ones (or a savepoint's); and the token of the page after it, with the
//! lease that keeps GC off what the scan reads.

use super::{
    GONE, LEASE_TTL_MS, PageToken, Read, ReadCheckpoint, ReadKind, chosen, encode_token,
    partitions_of, query_error, unavailable,
};
use crate::api::ApiState;
use crate::api::pipelines::PipelineRecord;
use crate::api::pipelines::savepoints::committed_versions_of;
use crate::api::problem::ApiError;
use crate::checkpoints::query::{QueryEntry, QueryError, QueryShard, merge_pages};
use crate::clock::SharedClock;
use crate::ids::{ManifestVersion, Partition};
use crate::state::StateError;
use crate::state::key;
use crate::state::lease::{self, Lease};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use object_store::path::Path;
use std::collections::BTreeMap;

/// One page: the checkpoints read, the entries merged across them, and whether more follow.
pub(super) type Page = (Vec<ReadCheckpoint>, (Vec<(Partition, QueryEntry)>, bool));

/// A read of a pipeline's state, one page of it.
pub(super) struct Scan<'a> {
    pub(super) state: &'a ApiState,
    pub(super) record: &'a PipelineRecord,
    /// The run whose shards are read (a stage's, in a pipeline of stages).
    pub(super) run: &'a crate::api::pipelines::runs::ShardRun,
    pub(super) read: &'a Read,
    pub(super) state_name: &'a str,
    /// The savepoint read, if one (else the newest decided checkpoints).
    pub(super) savepoint: Option<&'a str>,
    /// Where the previous page ended: the last encoded key it returned.
    pub(super) after: Option<Vec<u8>>,
    pub(super) clock: SharedClock,
    /// The wall clock at the request, ms since the Unix epoch: TTLs and leases count from it.
    pub(super) now_ms: u64,
    /// Where the pipeline's read leases live.
    pub(super) leases: Path,
}

impl Scan<'_> {
    /// A page of the shards at `versions` ((partition, root, version)).
    async fn read_page(
        &self,
        versions: Vec<(Partition, Path, ManifestVersion)>,
    ) -> Result<Page, QueryError> {
        let store = self.state.catalog.store();
        let caches = &self.state.query_caches;
        let opened = futures::future::try_join_all(
            versions
                .iter()
                .map(|(p, root, v)| QueryShard::open(store, (root, *p), *v, caches, &self.clock)),
        )
        .await?;
        let (after, limit) = (self.after.as_deref(), self.read.limit + 1);
        let pages = futures::future::try_join_all(opened.iter().map(|shard| async {
            let page = match &self.read.kind {
                ReadKind::Key(record_key) => {
                    let mut prefix = Vec::new();
                    key::encode_prefix(&mut prefix, record_key, self.state_name);
                    shard.scan(&prefix, after, limit, self.now_ms).await
                }
                ReadKind::Prefix(key_prefix) => {
                    shard
                        .scan_state(self.state_name, key_prefix, after, limit, self.now_ms)
                        .await
                }
            }?;
            Ok::<_, QueryError>((shard.partition, page))
        }))
        .await?;
        let checkpoints: Vec<ReadCheckpoint> = opened
            .iter()
            .map(|s| ReadCheckpoint {
                partition: s.partition,
                version: s.version,
            })
            .collect();
        Ok((checkpoints, merge_pages(pages, self.read.limit)))
    }

    /// The next page of a scan, at the versions its `token` names; its lease (`held`) renewed
    /// before it reads. 410 once they were collected.
    pub(super) async fn go_on(
        &self,
        token: &PageToken,
        roots: Vec<(Partition, Path, Option<ManifestVersion>)>,
        held: Option<&str>,
    ) -> Result<Page, ApiError> {
        let name = &self.record.name;
        let versions = roots
            .into_iter()
            .filter_map(|(p, root, _)| {
                // A partition the token does not name had no checkpoint then.
                let (_, v) = token.v.iter().find(|(tp, _)| *tp == p)?;
                Some((p, root, *v))
            })
            .collect();
        if let Some(id) = held {
            // Renewed before this page reads: GC passes from now on keep the versions.
            let renewed = Lease {
                versions: token.v.iter().copied().collect(),
                expires_at_ms: self.now_ms.saturating_add(LEASE_TTL_MS),
            };
            lease::put(self.state.catalog.store(), &self.leases, id, &renewed)
                .await
                .map_err(|e| unavailable(name, &e))?;
        }
        self.read_page(versions).await.map_err(|e| match e {
            // The token's versions, or objects they name, were collected.
            QueryError::State(StateError::Corrupt { .. }) => ApiError::gone(GONE.to_owned()),
            other => query_error(name, other),
        })
    }

    /// The first page: the savepoint's versions, or the newest decided ones. GC may collect
    /// one between choosing it and reading it (three newer checkpoints meanwhile): choose
    /// again, once.
    pub(super) async fn first(
        &self,
        roots: Vec<(Partition, Path, Option<ManifestVersion>)>,
    ) -> Result<Page, ApiError> {
        let name = &self.record.name;
        let committed = if self.savepoint.is_none() {
            let partitions = partitions_of(&roots);
            committed_versions_of(self.state, self.record, self.run, &partitions).await
        } else {
            BTreeMap::new()
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let versions = chosen(self.state.catalog.store(), &roots, &committed)
                .await
                .map_err(|e| unavailable(name, &e))?;
            match self.read_page(versions).await {
                Ok(page) => return Ok(page),
                Err(QueryError::Gone { .. } | QueryError::State(StateError::Corrupt { .. }))
                    if attempt == 1 && self.savepoint.is_none() => {}
                Err(e) => return Err(query_error(name, e)),
            }
        }
    }

    /// The token of the page after this one, which ended at `last` (none: the last page,
    /// whose lease `held` is released). A scan that goes on holds a lease on the
    /// `checkpoints` it reads (a savepoint needs none).
    pub(super) async fn next_token(
        &self,
        checkpoints: &[ReadCheckpoint],
        last: Option<&Vec<u8>>,
        held: Option<String>,
        bound: String,
    ) -> Result<Option<String>, ApiError> {
        let store = self.state.catalog.store();
        let Some(last) = last else {
            // The last page: its lease is no longer needed (one left behind expires).
            if let Some(id) = &held
                && let Err(e) = lease::release(store, &self.leases, id).await
            {
                tracing::warn!(error = %e, "cannot release a state query's lease; it expires");
            }
            return Ok(None);
        };
        let versions: Vec<(Partition, ManifestVersion)> = checkpoints
            .iter()
            .map(|c| (c.partition, c.version))
            .collect();
        let lease_id = match (held, self.savepoint) {
            (_, Some(_)) => None,
            (Some(id), None) => Some(id),
            (None, None) => {
                let id = format!("{:016x}", rand::random::<u64>());
                let taken = Lease {
                    versions: versions.iter().copied().collect(),
                    expires_at_ms: self.now_ms.saturating_add(LEASE_TTL_MS),
                };
                lease::put(store, &self.leases, &id, &taken)
                    .await
                    .map_err(|e| unavailable(&self.record.name, &e))?;
                Some(id)
            }
        };
        Ok(Some(encode_token(&PageToken {
            v: versions,
            a: B64.encode(last),
            q: bound,
            s: self.savepoint.map(str::to_owned),
            l: lease_id,
            t: None,
        })))
    }
}
