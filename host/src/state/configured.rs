//! [`ConfiguredBackend`]: the state backend the settings name, behind one type, so that the
//! binary and the tests run a pipeline the same way whatever `state.backend` says.

use super::checkpoint::{CheckpointError, CheckpointReport, DecidedBy, InputOffsets};
use super::lsm::backend::{LsmBackend, LsmSetupError, object_store_from_url};
use super::lsm::shard::LsmShard;
use super::memory::{MemoryBackend, MemoryShard};
use super::{Recovery, Shard, ShardId, StateBackend, StateError, StateQuota, StateWrite};
use crate::clock::SharedClock;
use crate::config::{StateBackendKind, StateSettings};
use crate::ids::ManifestVersion;
use bytes::Bytes;

/// The backend `state.backend` selects.
#[derive(Debug, Clone)]
pub enum ConfiguredBackend {
    /// `memory`.
    Memory(MemoryBackend),
    /// `lsm`.
    Lsm(Box<LsmBackend>),
}

impl ConfiguredBackend {
    /// Builds the backend `settings` select.
    ///
    /// # Errors
    /// [`LsmSetupError`] when the `lsm` backend cannot be set up.
    pub fn from_settings(
        settings: &StateSettings,
        clock: SharedClock,
    ) -> Result<Self, LsmSetupError> {
        Ok(match settings.backend {
            StateBackendKind::Memory => match &settings.memory.url {
                None => Self::Memory(MemoryBackend::new(clock)),
                Some(url) => {
                    let (store, prefix) = object_store_from_url(url, &settings.memory.options)?;
                    Self::Memory(MemoryBackend::durable(store, prefix, clock))
                }
            },
            StateBackendKind::Lsm => {
                Self::Lsm(Box::new(LsmBackend::from_settings(&settings.lsm, clock)?))
            }
        })
    }
}

/// A shard of a [`ConfiguredBackend`].
#[derive(Debug)]
pub enum ConfiguredShard {
    /// A `memory` shard.
    Memory(Box<MemoryShard>),
    /// An `lsm` shard.
    Lsm(Box<LsmShard>),
}

impl StateBackend for ConfiguredBackend {
    type Shard = ConfiguredShard;

    async fn open_shard(&self, id: &ShardId) -> Result<ConfiguredShard, StateError> {
        Ok(match self {
            Self::Memory(b) => ConfiguredShard::Memory(Box::new(b.open_shard(id).await?)),
            Self::Lsm(b) => ConfiguredShard::Lsm(Box::new(b.open_shard(id).await?)),
        })
    }

    async fn open_shard_at(
        &self,
        id: &ShardId,
        recovery: &Recovery,
    ) -> Result<ConfiguredShard, StateError> {
        Ok(match self {
            Self::Memory(b) => {
                ConfiguredShard::Memory(Box::new(b.open_shard_at(id, recovery).await?))
            }
            Self::Lsm(b) => ConfiguredShard::Lsm(Box::new(b.open_shard_at(id, recovery).await?)),
        })
    }

    fn stored(&self, id: &ShardId) -> Option<super::stored::StoredShard> {
        match self {
            Self::Memory(b) => b.stored(id),
            Self::Lsm(b) => b.stored(id),
        }
    }
}

impl Shard for ConfiguredShard {
    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        match self {
            Self::Memory(s) => s.get(key).await,
            Self::Lsm(s) => s.get(key).await,
        }
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, StateError> {
        match self {
            Self::Memory(s) => s.get_many(keys).await,
            Self::Lsm(s) => s.get_many(keys).await,
        }
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StateError> {
        match self {
            Self::Memory(s) => s.scan(prefix, start_after, limit).await,
            Self::Lsm(s) => s.scan(prefix, start_after, limit).await,
        }
    }

    async fn apply(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        match self {
            Self::Memory(s) => s.apply(writes).await,
            Self::Lsm(s) => s.apply(writes).await,
        }
    }

    fn checkpoint_decided(&self, version: ManifestVersion) {
        match self {
            Self::Memory(s) => s.checkpoint_decided(version),
            Self::Lsm(s) => s.checkpoint_decided(version),
        }
    }

    async fn settle(&self, max: std::time::Duration) {
        match self {
            Self::Memory(s) => s.settle(max).await,
            Self::Lsm(s) => s.settle(max).await,
        }
    }

    fn recovered_offsets(&self) -> Result<Option<InputOffsets>, StateError> {
        match self {
            Self::Memory(s) => s.recovered_offsets(),
            Self::Lsm(s) => s.recovered_offsets(),
        }
    }

    fn opened_from(&self) -> Option<ManifestVersion> {
        match self {
            Self::Memory(s) => s.opened_from(),
            Self::Lsm(s) => s.opened_from(),
        }
    }

    fn resumed_from(&self) -> Option<ManifestVersion> {
        match self {
            Self::Memory(s) => s.resumed_from(),
            Self::Lsm(s) => s.resumed_from(),
        }
    }

    async fn next_checkpoint_version(&self) -> Option<ManifestVersion> {
        match self {
            Self::Memory(s) => s.next_checkpoint_version().await,
            Self::Lsm(s) => s.next_checkpoint_version().await,
        }
    }

    fn quota(&self) -> Option<std::sync::Arc<StateQuota>> {
        match self {
            Self::Memory(s) => s.quota(),
            Self::Lsm(s) => s.quota(),
        }
    }

    fn stored_value_len(&self, key: &[u8]) -> Option<u64> {
        match self {
            Self::Memory(s) => s.stored_value_len(key),
            Self::Lsm(s) => s.stored_value_len(key),
        }
    }

    fn corruption(&self) -> Option<StateError> {
        match self {
            Self::Memory(s) => s.corruption(),
            Self::Lsm(s) => s.corruption(),
        }
    }

    async fn checkpoint(
        &self,
        offsets: &InputOffsets,
        decided_by: DecidedBy,
    ) -> Result<Option<CheckpointReport>, CheckpointError> {
        match self {
            Self::Memory(s) => s.checkpoint(offsets, decided_by).await,
            Self::Lsm(s) => s.checkpoint(offsets, decided_by).await,
        }
    }
}
