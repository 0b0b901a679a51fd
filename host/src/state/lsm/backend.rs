//! [`LsmBackend`]: the `lsm` state backend — one [`LsmTree`] per shard, all of a host's
//! shards sharing one object store and one set of [`BlockCaches`].
//!
//! A shard lives under `{url prefix}/pipelines/{pipeline}/shards/{partition:05}/`. Opening it
//! finds the checkpoint to resume from ([`recover`]), claims the shard (a new manifest version
//! with the next writer epoch, which fences any previous owner) and opens the tree there,
//! reading nothing else: blocks are read lazily and warm the caches (docs/checkpoints.md,
//! "Recovery").

use super::cache::{BlockCaches, CacheSettings, SstFiles};
use super::shard::{LsmShard, Recovered, ScrubSettings, recover};
use super::tree::{LsmSettings, LsmTree};
use crate::clock::SharedClock;
use crate::config::LsmStateSettings;
use crate::ids::ManifestVersion;
use crate::state::manifest::{ManifestStore, RetentionPolicy, WriterTokens};
use crate::state::{Recovery, ShardId, StateBackend, StateError};
use object_store::ObjectStore;
use object_store::path::Path;
use std::sync::Arc;

/// Why the backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LsmSetupError {
    /// The URL does not parse.
    #[error("the state store URL is not a URL. url=`{url}`")]
    Url {
        /// The URL.
        url: String,
        /// The parse error.
        #[source]
        source: url::ParseError,
    },
    /// `object_store` refused the URL or its options.
    #[error("cannot open the object store. url=`{url}`")]
    Store {
        /// The URL.
        url: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// The disk cache directory cannot be created.
    #[error("cannot create the disk cache directory")]
    DiskCache(#[source] std::io::Error),
    /// A `file://` store's directory cannot be created.
    #[error("cannot create the store's directory. dir=`{}`", dir.display())]
    Directory {
        /// The directory.
        dir: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The object store a state URL names (`file:///dir`, `s3://bucket/prefix`, `memory:///`) with
/// `object_store` options, and the prefix inside it, behind the process's
/// [`StoreGuard`](crate::state::store_guard::StoreGuard): requests in flight bounded and
/// retries budgeted (an `s3://` store's client retries nothing itself). A `file://` store is
/// rooted at its directory (created if missing) with an empty prefix, so that object paths —
/// in log lines too — are relative to the URL rather than an absolute path without its leading
/// `/`. Installs the process's TLS crypto provider if none is (object_store's HTTP client needs
/// one even for plain HTTP).
///
/// # Errors
/// [`LsmSetupError::Url`], [`LsmSetupError::Store`] or [`LsmSetupError::Directory`].
pub fn object_store_from_url(
    url_text: &str,
    options: &std::collections::BTreeMap<String, String>,
) -> Result<(Arc<dyn ObjectStore>, Path), LsmSetupError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = url::Url::parse(url_text).map_err(|source| LsmSetupError::Url {
        url: url_text.to_owned(),
        source,
    })?;
    if url.scheme() == "file"
        && let Ok(dir) = url.to_file_path()
    {
        std::fs::create_dir_all(&dir).map_err(|source| LsmSetupError::Directory {
            dir: dir.clone(),
            source,
        })?;
        let store =
            object_store::local::LocalFileSystem::new_with_prefix(&dir).map_err(|source| {
                LsmSetupError::Store {
                    url: url_text.to_owned(),
                    source,
                }
            })?;
        return Ok((guarded(Arc::new(store)), Path::default()));
    }
    let failed = |source| LsmSetupError::Store {
        url: url_text.to_owned(),
        source,
    };
    let (scheme, path) =
        object_store::ObjectStoreScheme::parse(&url).map_err(|e| failed(e.into()))?;
    if scheme != object_store::ObjectStoreScheme::AmazonS3 {
        let (store, prefix) = object_store::parse_url_opts(&url, options.iter()).map_err(failed)?;
        return Ok((guarded(Arc::from(store)), prefix));
    }
    // As `parse_url_opts` builds it (unknown keys ignored), but with the client's own retries
    // off: the guard retries, within its budget.
    let builder = options.iter().fold(
        object_store::aws::AmazonS3Builder::new().with_url(url.to_string()),
        |builder, (key, value)| match key.to_ascii_lowercase().parse() {
            Ok(key) => builder.with_config(key, value),
            Err(_) => builder,
        },
    );
    let store = builder
        .with_retry(object_store::RetryConfig {
            max_retries: 0,
            ..object_store::RetryConfig::default()
        })
        .build()
        .map_err(failed)?;
    let prefix = Path::parse(path).map_err(|e| failed(e.into()))?;
    Ok((guarded(Arc::new(store)), prefix))
}

/// `store` behind the process's guard.
fn guarded(store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
    Arc::new(crate::state::store_guard::GuardedStore::new(
        store,
        crate::state::store_guard::StoreGuard::process(),
    ))
}

/// The `lsm` state backend.
#[derive(Debug, Clone)]
pub struct LsmBackend {
    files: SstFiles,
    prefix: Path,
    settings: LsmSettings,
    clock: SharedClock,
    tokens: WriterTokens,
    retention: RetentionPolicy,
    scrub: ScrubSettings,
}

impl LsmBackend {
    /// A backend over `store` under `prefix`, reading through `caches`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        caches: Arc<BlockCaches>,
        settings: LsmSettings,
        clock: SharedClock,
    ) -> Self {
        Self {
            files: SstFiles::new(store, caches),
            prefix,
            settings,
            clock,
            tokens: WriterTokens::new(),
            retention: RetentionPolicy::default(),
            scrub: ScrubSettings::default(),
        }
    }

    /// This backend with the scrub at `scrub`'s pace.
    pub fn with_scrub(mut self, scrub: ScrubSettings) -> Self {
        self.scrub = scrub;
        self
    }

    /// This backend keeping history as `retention` says instead of the default policy (a
    /// test that collects after every checkpoint: `gc_interval` zero).
    #[must_use]
    pub fn with_retention(mut self, retention: RetentionPolicy) -> Self {
        self.retention = retention;
        self
    }

    /// Builds the backend `settings` describe.
    ///
    /// # Errors
    /// [`LsmSetupError`] for a bad URL or options, or an uncreatable disk cache directory.
    pub fn from_settings(
        settings: &LsmStateSettings,
        clock: SharedClock,
    ) -> Result<Self, LsmSetupError> {
        let (store, prefix) = object_store_from_url(
            settings.url.as_deref().unwrap_or_default(),
            &settings.options,
        )?;
        let caches = BlockCaches::new(&CacheSettings {
            block_cache_bytes: settings.block_cache_bytes,
            disk_cache_bytes: settings.disk_cache_bytes,
            disk_cache_dir: settings.disk_cache_dir.clone(),
        })
        .map_err(LsmSetupError::DiskCache)?;
        let tree = LsmSettings {
            memtable_bytes_max: settings.memtable_bytes_max,
            block_size_bytes: settings.block_size_bytes,
            ..LsmSettings::default()
        };
        Ok(
            Self::new(store, prefix, Arc::new(caches), tree, clock).with_scrub(ScrubSettings {
                bytes_per_second: settings.scrub_bytes_per_second,
                ..ScrubSettings::default()
            }),
        )
    }

    /// Where the shard `id` lives.
    pub fn shard_root(&self, id: &ShardId) -> Path {
        id.root_under(&self.prefix)
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        self.files.store()
    }

    /// The prefix of every shard's objects in the store.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }
}

impl StateBackend for LsmBackend {
    type Shard = LsmShard;

    async fn open_shard(&self, id: &ShardId) -> Result<LsmShard, StateError> {
        self.open_shard_at(id, &Recovery::default()).await
    }

    async fn open_shard_at(
        &self,
        id: &ShardId,
        recovery: &Recovery,
    ) -> Result<LsmShard, StateError> {
        let root = self.shard_root(id);
        let versions = match &recovery.listed {
            Some(versions) => versions.clone(),
            None => listed_versions(self.files.store(), &root).await?,
        };
        let recovered = recover(self.files.store(), &root, recovery, versions.clone()).await?;
        self.open_from(root, recovered, versions).await
    }

    fn stored(&self, id: &ShardId) -> Option<crate::state::stored::StoredShard> {
        Some(crate::state::stored::StoredShard {
            store: self.files.store().clone(),
            root: self.shard_root(id),
            format: crate::state::stored::CheckpointFormat::Lsm(self.settings.clone()),
            clock: self.clock.clone(),
        })
    }
}

/// The shard's manifest versions: an open's one LIST of them, which conversion, recovery and
/// the claim all read (listed again only after a write: a conversion, a claim slot another
/// owner won). Shared by both backends.
///
/// # Errors
/// [`StateError::Unavailable`] when listing fails.
pub(crate) async fn listed_versions(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
) -> Result<Vec<ManifestVersion>, StateError> {
    ManifestStore::new(store.clone(), root.clone())
        .versions()
        .await
        .map_err(|e| e.into_state_error(root))
}

impl LsmBackend {
    /// Claims the shard under `root` (its manifest `versions` as the open listed them) from
    /// what recovery found (empty without a checkpoint), recording the versions it fell back
    /// past, and opens it.
    async fn open_from(
        &self,
        root: Path,
        recovered: Recovered,
        versions: Vec<ManifestVersion>,
    ) -> Result<LsmShard, StateError> {
        let store = self.files.store().clone();
        let token = self.tokens.next();
        let base = recovered.checkpoint;
        let claim = ManifestStore::new(store.clone(), root.clone())
            .claim_listed(
                versions,
                &token,
                base.as_ref(),
                &recovered.rejected,
                recovered.committed,
            )
            .await
            .map_err(|e| e.into_state_error(&root))?;
        tracing::info!(shard = %root, version = claim.version.0, writer_epoch = claim.writer_epoch, from_checkpoint = ?base.as_ref().map(|b| b.version), rejected = claim.rejected.len(), "claimed shard");
        let tree = LsmTree::open(
            self.files.clone(),
            root.clone(),
            &claim,
            claim.writer_epoch,
            self.settings.clone(),
            self.clock.clone(),
        )?;
        Ok(LsmShard::new(
            tree,
            store,
            root,
            claim,
            base,
            self.retention.clone(),
            &self.scrub,
            self.clock.clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    #[test]
    fn a_file_store_is_rooted_at_its_directory_so_paths_read_relative_to_the_url() {
        crate::state::test_support::block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let url = format!("file://{}/state", dir.path().display());
            let (store, prefix) =
                object_store_from_url(&url, &Default::default()).expect("a file store");
            assert_eq!(
                prefix.as_ref(),
                "",
                "no absolute path without its leading `/`"
            );
            store
                .put(&Path::from("pipelines/p/x"), "v".into())
                .await
                .expect("put");
            assert!(dir.path().join("state/pipelines/p/x").exists());
        });
    }
}
