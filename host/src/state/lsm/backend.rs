//! [`LsmBackend`]: the `lsm` state backend — one [`LsmTree`] per shard, all of a host's
//! shards sharing one object store and one set of [`BlockCaches`].
//!
//! A shard lives under `{url prefix}/pipelines/{pipeline}/shards/{partition:05}/`. Opening it
//! finds the checkpoint to resume from ([`recover`]), claims the shard (a new manifest version
//! with the next writer epoch, which fences any previous owner) and opens the tree there,
//! reading nothing else. The pipeline does not take checkpoints yet (issue 4), so today a
//! shard starts empty at every open, like the `memory` backend.

use super::cache::{BlockCaches, CacheSettings, SstFiles};
use super::gc::GcSettings;
use super::shard::{LsmShard, recover, recover_decided};
use super::tree::{LsmSettings, LsmTree};
use crate::clock::SharedClock;
use crate::config::LsmStateSettings;
use crate::state::manifest::{Manifest, ManifestStore};
use crate::state::{ShardId, StateBackend, StateError};
use object_store::ObjectStore;
use object_store::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
}

/// The object store a state URL names (`file:///dir`, `s3://bucket/prefix`, `memory:///`) with
/// `object_store` options, and the prefix inside it. Installs the process's TLS crypto provider
/// if none is (object_store's HTTP client needs one even for plain HTTP).
///
/// # Errors
/// [`LsmSetupError::Url`] or [`LsmSetupError::Store`].
pub fn object_store_from_url(
    url_text: &str,
    options: &std::collections::BTreeMap<String, String>,
) -> Result<(Arc<dyn ObjectStore>, Path), LsmSetupError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = url::Url::parse(url_text).map_err(|source| LsmSetupError::Url {
        url: url_text.to_owned(),
        source,
    })?;
    let (store, prefix) = object_store::parse_url_opts(&url, options.iter()).map_err(|source| {
        LsmSetupError::Store {
            url: url_text.to_owned(),
            source,
        }
    })?;
    Ok((Arc::from(store), prefix))
}

/// The `lsm` state backend.
#[derive(Debug, Clone)]
pub struct LsmBackend {
    files: SstFiles,
    prefix: Path,
    settings: LsmSettings,
    clock: SharedClock,
    /// Unique per process; a claim's writer token adds a per-claim counter, so that two claims
    /// of one process (a partition reassigned while its old tree lives) never share a token.
    process_token: String,
    claims: Arc<AtomicU64>,
    gc: GcSettings,
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
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            files: SstFiles::new(store, caches),
            prefix,
            settings,
            clock,
            process_token: format!("weir-{}-{nanos:x}", std::process::id()),
            claims: Arc::new(AtomicU64::new(0)),
            gc: GcSettings::default(),
        }
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
        Ok(Self::new(store, prefix, Arc::new(caches), tree, clock))
    }

    /// Where the shard `id` lives.
    pub fn shard_root(&self, id: &ShardId) -> Path {
        let shard = format!("pipelines/{}/shards/{:05}", id.pipeline, id.partition);
        if self.prefix.as_ref().is_empty() {
            Path::from(shard)
        } else {
            Path::from(format!("{}/{shard}", self.prefix))
        }
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        self.files.store()
    }
}

impl StateBackend for LsmBackend {
    type Shard = LsmShard;

    async fn open_shard(&self, id: &ShardId) -> Result<LsmShard, StateError> {
        let root = self.shard_root(id);
        let base = recover(self.files.store(), &root).await?;
        self.open_from(root, base).await
    }

    async fn open_shard_at(
        &self,
        id: &ShardId,
        committed: Option<u64>,
    ) -> Result<LsmShard, StateError> {
        let root = self.shard_root(id);
        let base = recover_decided(self.files.store(), &root, committed).await?;
        self.open_from(root, base).await
    }
}

impl LsmBackend {
    /// Claims the shard under `root` from checkpoint `base` (empty when `None`) and opens it.
    async fn open_from(&self, root: Path, base: Option<Manifest>) -> Result<LsmShard, StateError> {
        let store = self.files.store().clone();
        let token = format!(
            "{}-{}",
            self.process_token,
            self.claims.fetch_add(1, Ordering::Relaxed)
        );
        let claim = ManifestStore::new(store.clone(), root.clone())
            .claim(&token, base.as_ref())
            .await
            .map_err(|e| e.into_state_error(&root))?;
        tracing::info!(shard = %root, version = claim.version, writer_epoch = claim.writer_epoch, from_checkpoint = ?base.as_ref().map(|b| b.version), "claimed shard");
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
            self.gc.clone(),
            self.clock.clone(),
        ))
    }
}
