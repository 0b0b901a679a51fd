//! Tenants' operator logs in the catalog's store: each host writes its operators' lines as
//! small JSON-lines segments under the pipeline's log directory ([`writer`]), and any host
//! reads them (the API's `GET /v1/pipelines/{name}/logs`, `crate::api::logs`).
//!
//! Layout under the catalog prefix (beside [`super::pipelines`]'s):
//! `tenants/{tenant}/logs/{pipeline uid}/{host}/{written ms:013}-{seq:010}.jsonl`, one
//! [`LogEntry`] per line.

mod writer;

pub use writer::{OperatorLogSettings, SWEEP_INTERVAL, SegmentWriter, WriterTask, sweep_expired};

use crate::ids::Partition;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Segments fetched at once.
pub(crate) const FETCHES_IN_FLIGHT: usize = 8;

/// One line of an operator's log, as stored and as served (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LogEntry<'a> {
    /// When the operator logged it, ms since the Unix epoch.
    pub time_ms: u64,
    /// The host whose instance logged it.
    #[schema(value_type = String)]
    pub host: Cow<'a, str>,
    /// The stage whose instance logged it, in a pipeline of stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub stage: Option<Cow<'a, str>>,
    /// The input partition being processed, if any (none for the host's own notices).
    pub partition: Option<Partition>,
    /// `trace`, `debug`, `info`, `warn` or `error` (stdout is `info`, stderr `warn`).
    #[schema(value_type = String)]
    pub level: Cow<'a, str>,
    /// The line, at most 4 KiB.
    #[schema(value_type = String)]
    pub message: Cow<'a, str>,
}

/// A segment's file name: when it was written and the writing process's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SegmentName {
    pub time_ms: u64,
    pub seq: u64,
}

impl SegmentName {
    pub(crate) fn file_name(&self) -> String {
        format!("{:013}-{:010}.jsonl", self.time_ms, self.seq)
    }

    pub(crate) fn parse(file_name: &str) -> Option<Self> {
        let (time, seq) = file_name.strip_suffix(".jsonl")?.split_once('-')?;
        Some(Self {
            time_ms: time.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

/// `host_dir`'s segments with their sizes.
pub(crate) async fn list_segments(
    store: &dyn ObjectStore,
    host_dir: &Path,
) -> object_store::Result<Vec<(SegmentName, u64)>> {
    let metas: Vec<_> = store.list(Some(host_dir)).try_collect().await?;
    Ok(metas
        .into_iter()
        .filter_map(|m| Some((SegmentName::parse(m.location.filename()?)?, m.size)))
        .collect())
}

/// Every host's segments under `dir`: path, name, size.
#[cfg(test)]
pub(crate) async fn list_all_segments(
    store: &dyn ObjectStore,
    dir: &Path,
) -> object_store::Result<Vec<(Path, SegmentName, u64)>> {
    let metas: Vec<_> = store.list(Some(dir)).try_collect().await?;
    Ok(metas
        .into_iter()
        .filter_map(|m| {
            let name = SegmentName::parse(m.location.filename()?)?;
            Some((m.location, name, m.size))
        })
        .collect())
}

/// The lines of `paths`, in the order given, each segment's in its order.
pub(crate) async fn read_segments(
    store: &dyn ObjectStore,
    paths: Vec<Path>,
) -> object_store::Result<Vec<LogEntry<'static>>> {
    let bodies: Vec<Option<bytes::Bytes>> = futures::stream::iter(paths)
        .map(|path| async move {
            match store.get(&path).await {
                Ok(got) => got.bytes().await.map(Some),
                // Expired between the list and the read.
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(err) => Err(err),
            }
        })
        .buffered(FETCHES_IN_FLIGHT)
        .try_collect()
        .await?;
    let mut entries = Vec::new();
    for body in bodies.into_iter().flatten() {
        entries.extend(
            body.split(|b| *b == b'\n')
                .filter(|line| !line.is_empty())
                .filter_map(|line| serde_json::from_slice::<LogEntry<'_>>(line).ok())
                .map(LogEntry::into_owned),
        );
    }
    Ok(entries)
}

impl LogEntry<'_> {
    /// The same, owning its text.
    pub fn into_owned(self) -> LogEntry<'static> {
        LogEntry {
            time_ms: self.time_ms,
            host: Cow::Owned(self.host.into_owned()),
            stage: self.stage.map(|s| Cow::Owned(s.into_owned())),
            partition: self.partition,
            level: Cow::Owned(self.level.into_owned()),
            message: Cow::Owned(self.message.into_owned()),
        }
    }
}

/// Host names and their directories.
pub(crate) type HostDirs = BTreeMap<String, Path>;

/// The directory of each host under `dir`, by host.
pub(crate) async fn host_dirs(
    store: &dyn ObjectStore,
    dir: &Path,
) -> object_store::Result<HostDirs> {
    let listed = store.list_with_delimiter(Some(dir)).await?;
    Ok(listed
        .common_prefixes
        .into_iter()
        .filter_map(|host_dir| Some((host_of(dir, &host_dir)?, host_dir)))
        .collect())
}

/// The host directory of a segment path under `dir`.
fn host_of(dir: &Path, path: &Path) -> Option<String> {
    let mut parts = path.prefix_match(dir)?;
    Some(parts.next()?.as_ref().to_owned())
}
