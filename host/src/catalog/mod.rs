//! The catalog: the records every `weir serve` host shares in object storage — tenants, API
//! keys (hashed), operator versions and their components, pipelines ([`pipelines`]) and the
//! operators' log segments ([`logs`]). Every `weir serve` host sharing the store sees the same catalog; there is
//! no other shared state.
//!
//! Layout under the configured prefix:
//! - `tenants/{tenant}/tenant.json` — a [`Tenant`];
//! - `api-keys/{sha256 of the key, hex}.json` — an [`ApiKeyRecord`] (the key itself is never
//!   stored);
//! - `tenants/{tenant}/blobs/{sha256}.wasm` — an uploaded component, content-addressed;
//! - `tenants/{tenant}/operators/{name}/versions/{version:010}.json` — an
//!   [`OperatorVersion`], created once (`PutMode::Create`) and never changed: versions are
//!   immutable, and two hosts uploading at once get different version numbers.

pub mod logs;
pub mod pipelines;

use crate::error::ErrorKind;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use utoipa::ToSchema;

/// A tenant: the owner of operators and pipelines, isolated from every other tenant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    /// The tenant id, 1..=32 bytes of `[a-z0-9-]`, used in paths.
    pub id: String,
    /// A display name.
    pub name: String,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
}

/// What the store keeps of an API key: whose it is, never the key.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyRecord {
    /// A short public id of the key (the first 12 hex digits of its SHA-256).
    pub key_id: String,
    /// The tenant the key acts for.
    pub tenant: String,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
}

/// A state an operator declared in `describe`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StateDescription {
    /// The state's name.
    pub name: String,
    /// `value` or `map`.
    pub kind: String,
    /// Time to live of an entry since its last write, ms; none for no expiry.
    pub ttl_ms: Option<u64>,
    /// The version of the state's value schema (0 unless declared). An operator whose state
    /// is at version `v` reads values written at every version up to `v`, upgrading older ones
    /// as it reads them (the SDKs require an upgrade function for `v > 0`); it cannot read
    /// values of a newer version. Absent in records stored before versions existed: 0.
    #[serde(default)]
    pub version: u32,
}

/// Why an operator version's declared states cannot take over a pipeline's state from another
/// version's (schema evolution, as Kafka Streams' KIP-258 upgrades): a state whose kind changed
/// (its stored entries would be read as the other kind), or whose schema version went down
/// (values the running version wrote cannot be read by older code). States added or dropped
/// are fine. `None` when compatible.
pub fn incompatible_states(from: &[StateDescription], to: &[StateDescription]) -> Option<String> {
    let mut problems = Vec::new();
    for new in to {
        let Some(old) = from.iter().find(|old| old.name == new.name) else {
            continue;
        };
        if old.kind != new.kind {
            problems.push(format!(
                "state `{}` changes kind from {} to {}: its stored entries cannot be read as the other kind (declare a new state instead)",
                new.name, old.kind, new.kind
            ));
        } else if new.version < old.version {
            problems.push(format!(
                "state `{}` is at schema version {} in the running operator and {} in the new one: there is no upgrade path from a newer version to an older one",
                new.name, old.version, new.version
            ));
        }
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// One immutable version of a tenant's operator.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OperatorVersion {
    /// The operator's name in the API (chosen at upload), 1..=64 bytes of `[a-z0-9_-]`.
    pub name: String,
    /// The version number, from 1, one more than the newest at upload.
    pub version: u64,
    /// SHA-256 of the component, hex.
    pub sha256: String,
    /// Size of the component, bytes.
    pub size_bytes: u64,
    /// Upload time, ms since the Unix epoch.
    pub created_ms: u64,
    /// The name the component gives itself in `describe`.
    pub declared_name: String,
    /// The version the component gives itself in `describe` (free text).
    pub declared_version: String,
    /// The states it declared.
    pub states: Vec<StateDescription>,
    /// The named outputs it declared in `describe`, besides `default` (`weir:operator@0.3.0`;
    /// none before). Absent for a version uploaded before Weir kept them: a pipeline's use of
    /// its outputs is then checked when the pipeline runs, not when it is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Vec<String>>,
}

/// A tenant's operator and its versions.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OperatorSummary {
    /// The operator's name.
    pub name: String,
    /// Its versions, ascending.
    pub versions: Vec<u64>,
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha256(bytes))
}

/// Why a catalog read or write failed. The API answers each as its kind says
/// (`crate::api::problem`); the runner reports it as a run's failure.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// A record that is created once exists already (a tenant, an API key, a pipeline).
    #[error("{what} exists")]
    Exists {
        /// The record, as a person names it (``tenant `acme` ``).
        what: String,
    },
    /// The record is not there.
    #[error("no {what}")]
    NotFound {
        /// See [`CatalogError::Exists`].
        what: String,
    },
    /// Another writer changed the record at the same time (a lost create-only race).
    #[error("{what} was changed by another request at the same time; {advice}")]
    Changed {
        /// See [`CatalogError::Exists`].
        what: String,
        /// What the caller can do.
        advice: &'static str,
    },
    /// An object a record names is gone (an operator version's component).
    #[error("{what} is missing")]
    Missing {
        /// See [`CatalogError::Exists`].
        what: String,
    },
    /// Too many writers raced for the next number of a record (operator uploads): none lost
    /// anything, the caller tries again.
    #[error("too many concurrent uploads of {what}; try again")]
    Busy {
        /// See [`CatalogError::Exists`].
        what: String,
    },
    /// A record in the store does not decode.
    #[error("unreadable catalog record `{path}`")]
    Unreadable {
        /// The record's object.
        path: Path,
        /// Why it does not decode.
        #[source]
        source: serde_json::Error,
    },
    /// The object store failed (unreachable, refused, timed out).
    #[error("the object store failed")]
    Store(#[from] object_store::Error),
}

impl CatalogError {
    /// The crate's error kind: what the caller asked against the catalog's records (one that
    /// exists, is missing or changed meanwhile) is [`ErrorKind::InvalidInput`]; the store's
    /// failures and undecodable records are [`ErrorKind::Unavailable`] (worth a retry).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Exists { .. }
            | Self::NotFound { .. }
            | Self::Missing { .. }
            | Self::Changed { .. }
            | Self::Busy { .. } => ErrorKind::InvalidInput,
            Self::Unreadable { .. } | Self::Store(_) => ErrorKind::Unavailable,
        }
    }
}

/// The catalog on one object store.
#[derive(Debug, Clone)]
pub struct Catalog {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// Told of every pipeline revision this catalog writes ([`Catalog::with_changes`]).
    changes: Option<Arc<tokio::sync::Notify>>,
}

/// Whether `id` is a valid tenant id: 1..=32 bytes of `[a-z0-9-]`, not starting with `-`.
pub fn valid_tenant_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && !id.starts_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `name` is a valid operator name: 1..=64 bytes of `[a-z0-9_-]`, not starting with
/// `-` or `_`.
pub fn valid_operator_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with(['-', '_'])
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl Catalog {
    /// The catalog under `prefix` of `store`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: Path) -> Self {
        Self {
            store,
            prefix,
            changes: None,
        }
    }

    /// The same catalog, notifying `changes` after each pipeline revision it writes (a create,
    /// a change, a delete): `weir serve` hands the API's catalog the notify its runner wakes on
    /// ([`crate::runner::Runner::with_wake`]), so that a pipeline created, stopped or switched
    /// through this host is acted on at once rather than at the runner's next reconcile. Other
    /// hosts see the change at theirs.
    #[must_use]
    pub fn with_changes(mut self, changes: Arc<tokio::sync::Notify>) -> Self {
        self.changes = Some(changes);
        self
    }

    /// Tells the runner waiting on [`Catalog::with_changes`]' notify, if any.
    pub(crate) fn changed(&self) {
        if let Some(changes) = &self.changes {
            changes.notify_one();
        }
    }

    /// Lists the catalog's prefix once: `Ok` when the store answers (readiness).
    ///
    /// # Errors
    /// The store's error (unreachable, wrong credentials, no such bucket).
    pub async fn check_readable(&self) -> Result<(), object_store::Error> {
        self.store
            .list_with_delimiter(Some(&self.prefix))
            .await
            .map(|_| ())
    }

    /// The object store.
    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// `rest` under the catalog's prefix.
    pub(crate) fn path(&self, rest: &str) -> Path {
        Path::from(format!("{}/{rest}", self.prefix).trim_start_matches('/'))
    }

    pub(crate) async fn get_json<T: for<'de> Deserialize<'de>>(
        &self,
        path: &Path,
    ) -> Result<Option<T>, CatalogError> {
        match self.store.get(path).await {
            Ok(got) => {
                let bytes = got.bytes().await?;
                serde_json::from_slice(&bytes).map(Some).map_err(|source| {
                    CatalogError::Unreadable {
                        path: path.clone(),
                        source,
                    }
                })
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Writes `value` at `path` only if nothing is there; `Ok(false)` if something is.
    pub(crate) async fn create_json<T: Serialize>(
        &self,
        path: &Path,
        value: &T,
    ) -> Result<bool, CatalogError> {
        let body = serde_json::to_vec(value).expect("catalog records serialize");
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(path, PutPayload::from(body), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// Creates `tenant`.
    ///
    /// # Errors
    /// [`CatalogError::Exists`] if it exists; [`CatalogError::Store`] on a store error.
    pub async fn create_tenant(&self, tenant: &Tenant) -> Result<(), CatalogError> {
        let path = self.path(&format!("tenants/{}/tenant.json", tenant.id));
        if self.create_json(&path, tenant).await? {
            Ok(())
        } else {
            Err(CatalogError::Exists {
                what: format!("tenant `{}`", tenant.id),
            })
        }
    }

    /// The tenant `id`, if it exists.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn tenant(&self, id: &str) -> Result<Option<Tenant>, CatalogError> {
        self.get_json(&self.path(&format!("tenants/{id}/tenant.json")))
            .await
    }

    /// Every tenant, by id.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn tenants(&self) -> Result<Vec<Tenant>, CatalogError> {
        let listed = self
            .store
            .list_with_delimiter(Some(&self.path("tenants")))
            .await?;
        let mut tenants = Vec::new();
        for dir in listed.common_prefixes {
            if let Some(id) = dir.filename()
                && let Some(tenant) = self.tenant(id).await?
            {
                tenants.push(tenant);
            }
        }
        tenants.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(tenants)
    }

    /// Records an API key by the SHA-256 (hex) of its text.
    ///
    /// # Errors
    /// [`CatalogError::Exists`] if that hash is recorded (a 256-bit collision: a bug);
    /// [`CatalogError::Store`] on a store error.
    pub async fn create_key(&self, hash: &str, record: &ApiKeyRecord) -> Result<(), CatalogError> {
        if self
            .create_json(&self.path(&format!("api-keys/{hash}.json")), record)
            .await?
        {
            Ok(())
        } else {
            Err(CatalogError::Exists {
                what: "API key".to_owned(),
            })
        }
    }

    /// The key whose text hashes to `hash`, if any.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn key(&self, hash: &str) -> Result<Option<ApiKeyRecord>, CatalogError> {
        self.get_json(&self.path(&format!("api-keys/{hash}.json")))
            .await
    }

    /// Stores a component under its SHA-256 (idempotent).
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn put_blob(
        &self,
        tenant: &str,
        sha256: &str,
        bytes: Bytes,
    ) -> Result<(), CatalogError> {
        self.store
            .put(
                &self.path(&format!("tenants/{tenant}/blobs/{sha256}.wasm")),
                PutPayload::from(bytes),
            )
            .await?;
        Ok(())
    }

    /// The component with SHA-256 `sha256`.
    ///
    /// # Errors
    /// [`CatalogError::Missing`] when it is gone; [`CatalogError::Store`] on a store error.
    pub async fn blob(&self, tenant: &str, sha256: &str) -> Result<Bytes, CatalogError> {
        let path = self.path(&format!("tenants/{tenant}/blobs/{sha256}.wasm"));
        match self.store.get(&path).await {
            Ok(got) => Ok(got.bytes().await?),
            Err(object_store::Error::NotFound { .. }) => Err(CatalogError::Missing {
                what: format!("component {sha256}"),
            }),
            Err(err) => Err(err.into()),
        }
    }

    fn versions_dir(&self, tenant: &str, name: &str) -> Path {
        self.path(&format!("tenants/{tenant}/operators/{name}/versions"))
    }

    /// The version numbers of operator `name`, ascending (empty if it has none).
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn version_numbers(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Vec<u64>, CatalogError> {
        let dir = self.versions_dir(tenant, name);
        let metas: Vec<_> = self.store.list(Some(&dir)).try_collect().await?;
        let mut versions: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        versions.sort_unstable();
        Ok(versions)
    }

    /// Records `version` as the next version of its operator: tries `newest + 1`, and the next
    /// number again when another host took that one meanwhile. Returns the version as stored.
    ///
    /// # Errors
    /// [`CatalogError::Changed`] after 16 lost races; [`CatalogError::Store`] on a store error.
    pub async fn create_version(
        &self,
        tenant: &str,
        mut version: OperatorVersion,
    ) -> Result<OperatorVersion, CatalogError> {
        let mut next = self
            .version_numbers(tenant, &version.name)
            .await?
            .last()
            .map_or(1, |v| v + 1);
        for _ in 0..16 {
            version.version = next;
            let path = self
                .versions_dir(tenant, &version.name)
                .join(format!("{next:010}.json"));
            if self.create_json(&path, &version).await? {
                return Ok(version);
            }
            next += 1;
        }
        Err(CatalogError::Busy {
            what: format!("operator `{}`", version.name),
        })
    }

    /// Version `version` of operator `name`, if it exists.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn version(
        &self,
        tenant: &str,
        name: &str,
        version: u64,
    ) -> Result<Option<OperatorVersion>, CatalogError> {
        self.get_json(
            &self
                .versions_dir(tenant, name)
                .join(format!("{version:010}.json")),
        )
        .await
    }

    /// Deletes version `version` of operator `name`; `false` if it did not exist. The component
    /// stays (another version may share it).
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn delete_version(
        &self,
        tenant: &str,
        name: &str,
        version: u64,
    ) -> Result<bool, CatalogError> {
        if self.version(tenant, name, version).await?.is_none() {
            return Ok(false);
        }
        self.store
            .delete(
                &self
                    .versions_dir(tenant, name)
                    .join(format!("{version:010}.json")),
            )
            .await?;
        Ok(true)
    }

    /// The tenant's operators with their versions, by name; operators whose versions were all
    /// deleted are left out.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn operators(&self, tenant: &str) -> Result<Vec<OperatorSummary>, CatalogError> {
        let dir = self.path(&format!("tenants/{tenant}/operators"));
        let listed = self.store.list_with_delimiter(Some(&dir)).await?;
        let mut out = Vec::new();
        for prefix in listed.common_prefixes {
            let Some(name) = prefix.filename() else {
                continue;
            };
            let versions = self.version_numbers(tenant, name).await?;
            if !versions.is_empty() {
                out.push(OperatorSummary {
                    name: name.to_owned(),
                    versions,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

#[cfg(test)]
mod state_compatibility_tests {
    use super::*;

    fn state(name: &str, kind: &str, version: u32) -> StateDescription {
        StateDescription {
            name: name.into(),
            kind: kind.into(),
            ttl_ms: None,
            version,
        }
    }

    #[test]
    fn a_switch_may_raise_a_states_version_add_or_drop_states_but_not_change_kind_or_go_down() {
        let running = [state("count", "value", 0), state("seen", "map", 1)];
        // Upgraded, a state added, one dropped: fine.
        assert_eq!(
            incompatible_states(
                &running,
                &[state("count", "value", 1), state("new", "map", 0)]
            ),
            None
        );
        let kind = incompatible_states(&running, &[state("count", "map", 0)]).expect("refused");
        assert!(
            kind.contains("state `count` changes kind from value to map"),
            "{kind}"
        );
        let down = incompatible_states(&running, &[state("seen", "map", 0)]).expect("refused");
        assert!(
            down.contains("state `seen` is at schema version 1")
                && down.contains("no upgrade path"),
            "{down}"
        );
    }
}
