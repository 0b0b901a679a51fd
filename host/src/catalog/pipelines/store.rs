//! Pipelines in the catalog's store: definitions as numbered revisions, each created once, and
//! the hosts' status reports (layout in the parent module's docs).

use super::spec::*;
use super::status::HostStatus;
use crate::catalog::Catalog;
use crate::catalog::CatalogError;
use crate::clock::wall_now_ms;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;

/// What to do after losing a race to change a pipeline.
const READ_AND_RETRY: &str = "read it and try again";

/// Revisions of a definition kept in the store (older ones are deleted after a change).
const REVISIONS_KEPT: u64 = 4;

/// The body of the definitions' change marker ([`Catalog::definitions_marker`]): the last
/// revision written, for an operator who reads it; readers compare only its version.
#[derive(serde::Serialize)]
struct DefinitionsChanged<'a> {
    tenant: &'a str,
    pipeline: &'a str,
    revision: u64,
    at_ms: u64,
}

impl Catalog {
    fn pipeline_dir(&self, tenant: &str, name: &str) -> Path {
        self.path(&format!("tenants/{tenant}/pipelines/{name}"))
    }

    /// Where the keyed state of the pipeline with uid `uid` lives.
    pub fn pipeline_state_prefix(&self, tenant: &str, uid: &str) -> Path {
        self.path(&format!("tenants/{tenant}/state/{uid}"))
    }

    /// Where the operator log segments of the pipeline with uid `uid` live
    /// ([`crate::catalog::logs`]).
    pub fn pipeline_logs_prefix(&self, tenant: &str, uid: &str) -> Path {
        self.path(&format!("tenants/{tenant}/logs/{uid}"))
    }

    async fn revision_numbers(&self, tenant: &str, name: &str) -> Result<Vec<u64>, CatalogError> {
        let dir = self.pipeline_dir(tenant, name).join("revisions");
        let metas: Vec<_> = self.store().list(Some(&dir)).try_collect().await?;
        let mut revisions: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        revisions.sort_unstable();
        Ok(revisions)
    }

    fn revision_path(&self, tenant: &str, name: &str, revision: u64) -> Path {
        self.pipeline_dir(tenant, name)
            .join("revisions")
            .join(format!("{revision:010}.json"))
    }

    /// The newest definition of pipeline `name`, if it exists (and is not deleted).
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn pipeline(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<PipelineRecord>, CatalogError> {
        Ok(self
            .newest_revision(tenant, name)
            .await?
            .filter(|r| !r.deleted))
    }

    /// The newest revision of pipeline `name`, a deletion's tombstone included.
    async fn newest_revision(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<PipelineRecord>, CatalogError> {
        // A revision can be deleted (pruned, or the pipeline deleted) between list and get.
        for revision in self.revision_numbers(tenant, name).await?.iter().rev() {
            if let Some(record) = self
                .get_json(&self.revision_path(tenant, name, *revision))
                .await?
            {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    /// Stores `record` as revision `record.revision`; `false` if another writer took it.
    async fn write_revision(
        &self,
        tenant: &str,
        record: &PipelineRecord,
    ) -> Result<bool, CatalogError> {
        let path = self.revision_path(tenant, &record.name, record.revision);
        if !self.create_json(&path, record).await? {
            return Ok(false);
        }
        // Every host's runner reads the definitions again at its next reconcile, and this
        // host's now (after the marker, so that its read sees the marker changed).
        self.mark_definitions_changed(tenant, record).await;
        self.changed();
        // Older revisions are history nobody reads; a failure to prune costs only space.
        if record.revision > REVISIONS_KEPT {
            for old in self.revision_numbers(tenant, &record.name).await? {
                if old + REVISIONS_KEPT <= record.revision {
                    let _ = self
                        .store()
                        .delete(&self.revision_path(tenant, &record.name, old))
                        .await;
                }
            }
        }
        Ok(true)
    }

    /// Where [`Catalog::mark_definitions_changed`] writes.
    fn definitions_marker_path(&self) -> Path {
        self.path("pipelines-changed.json")
    }

    /// Overwrites the definitions' change marker after `record` (a revision of a pipeline of
    /// `tenant`) was written. Runners (`crate::runner`) read every definition again only when
    /// the marker's version changed, or after a while whatever it says, instead of listing
    /// every tenant's pipelines and revisions each reconcile: on S3 a `HEAD` a second per host
    /// rather than a `LIST` of the tenants, and a `LIST` and a `GET` per tenant and pipeline.
    /// A failure is logged, not returned: the revision is written, and other hosts see it at
    /// their next full read.
    async fn mark_definitions_changed(&self, tenant: &str, record: &PipelineRecord) {
        let marker = DefinitionsChanged {
            tenant,
            pipeline: &record.name,
            revision: record.revision,
            at_ms: wall_now_ms(),
        };
        let body = serde_json::to_vec(&marker).expect("the marker serializes");
        if let Err(err) = self
            .store()
            .put(&self.definitions_marker_path(), body.into())
            .await
        {
            tracing::warn!(%tenant, pipeline = %record.name, revision = record.revision,
                error = %crate::error::Chain(&err),
                "cannot mark the pipeline definitions changed: other hosts act on this change at their next full read");
        }
    }

    /// The version of the definitions' change marker (its ETag; its modification time and
    /// version on a store without ETags), `None` while it does not exist. Every revision
    /// written before the marker had a version was written before that version was read: a
    /// reader that reads the marker and then the definitions, and later reads the same
    /// version again, has missed no revision written through a catalog (unless that writer
    /// failed to write the marker, logged).
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn definitions_marker(&self) -> Result<Option<String>, CatalogError> {
        match self.store().head(&self.definitions_marker_path()).await {
            Ok(meta) => Ok(Some(meta.e_tag.unwrap_or_else(|| {
                format!("{:?}/{:?}/{}", meta.last_modified, meta.version, meta.size)
            }))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Creates pipeline `record.name`: revision 1, or the one after a deleted pipeline's
    /// tombstone (set in `record`).
    ///
    /// # Errors
    /// [`CatalogError::Exists`] if it exists; [`CatalogError::Store`] on a store error.
    pub async fn create_pipeline(
        &self,
        tenant: &str,
        record: &mut PipelineRecord,
    ) -> Result<(), CatalogError> {
        let newest = self.newest_revision(tenant, &record.name).await?;
        record.revision = newest.as_ref().map_or(1, |r| r.revision + 1);
        if newest.is_some_and(|r| !r.deleted) || !self.write_revision(tenant, record).await? {
            return Err(CatalogError::Exists {
                what: format!("pipeline `{}`", record.name),
            });
        }
        Ok(())
    }

    /// Changes pipeline `name` with `change` and stores the result as the next revision.
    ///
    /// # Errors
    /// [`CatalogError::NotFound`] if it does not exist; `change`'s error; [`CatalogError::Changed`]
    /// if another request changed it at the same time; [`CatalogError::Store`] on a store
    /// error.
    pub async fn update_pipeline<E: From<CatalogError>>(
        &self,
        tenant: &str,
        name: &str,
        change: impl FnOnce(&mut PipelineRecord) -> Result<(), E>,
    ) -> Result<PipelineRecord, E> {
        let mut record =
            self.pipeline(tenant, name)
                .await?
                .ok_or_else(|| CatalogError::NotFound {
                    what: format!("pipeline `{name}`"),
                })?;
        let before = record.clone();
        change(&mut record)?;
        if record == before {
            return Ok(record); // nothing to change: no revision, no conflict with others
        }
        record.revision += 1;
        record.updated_ms = wall_now_ms();
        if self.write_revision(tenant, &record).await? {
            Ok(record)
        } else {
            Err(CatalogError::Changed {
                what: format!("pipeline `{name}`"),
                advice: READ_AND_RETRY,
            }
            .into())
        }
    }

    /// The tenant's pipelines, by name.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn pipelines(&self, tenant: &str) -> Result<Vec<PipelineRecord>, CatalogError> {
        let dir = self.path(&format!("tenants/{tenant}/pipelines"));
        let listed = self.store().list_with_delimiter(Some(&dir)).await?;
        let mut out = Vec::new();
        for prefix in listed.common_prefixes {
            if let Some(name) = prefix.filename()
                && let Some(record) = self.pipeline(tenant, name).await?
            {
                out.push(record);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Every tenant's pipelines, as `(tenant, definition)`.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn all_pipelines(&self) -> Result<Vec<(String, PipelineRecord)>, CatalogError> {
        let mut out = Vec::new();
        for tenant in self.tenants().await? {
            for record in self.pipelines(&tenant.id).await? {
                out.push((tenant.id.clone(), record));
            }
        }
        Ok(out)
    }

    fn host_status_path(&self, tenant: &str, name: &str, host: &str) -> Path {
        self.pipeline_dir(tenant, name)
            .join("hosts")
            .join(format!("{host}.json"))
    }

    /// Writes `status`, this host's report on pipeline `name`.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn put_host_status(
        &self,
        tenant: &str,
        name: &str,
        status: &HostStatus,
    ) -> Result<(), CatalogError> {
        let body = serde_json::to_vec(status).expect("host status serializes");
        self.store()
            .put(
                &self.host_status_path(tenant, name, &status.host),
                body.into(),
            )
            .await?;
        Ok(())
    }

    /// Deletes `host`'s report on pipeline `name`.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn delete_host_status(
        &self,
        tenant: &str,
        name: &str,
        host: &str,
    ) -> Result<(), CatalogError> {
        match self
            .store()
            .delete(&self.host_status_path(tenant, name, host))
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Every host's report on pipeline `name`, with its age in ms.
    ///
    /// # Errors
    /// [`CatalogError::Store`] on a store error.
    pub async fn host_statuses(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Vec<(HostStatus, u64)>, CatalogError> {
        let dir = self.pipeline_dir(tenant, name).join("hosts");
        let metas: Vec<_> = self.store().list(Some(&dir)).try_collect().await?;
        let now = wall_now_ms();
        let mut out = Vec::new();
        for meta in metas {
            if let Some(status) = self.get_json::<HostStatus>(&meta.location).await? {
                let age = now.saturating_sub(status.updated_ms);
                out.push((status, age));
            }
        }
        Ok(out)
    }

    /// Deletes the keyed state stored under uid `uid` (a create that failed after restoring a
    /// savepoint into it).
    ///
    /// # Errors
    /// [`CatalogError::Store`] when the store fails.
    pub async fn delete_state(&self, tenant: &str, uid: &str) -> Result<(), CatalogError> {
        let dir = self.pipeline_state_prefix(tenant, uid);
        let metas: Vec<_> = self.store().list(Some(&dir)).try_collect().await?;
        for meta in metas {
            match self.store().delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(())
    }

    /// Deletes pipeline `record.name`: writes a tombstone as its next revision (so a change
    /// racing with the deletion fails instead of bringing it back), then deletes its older
    /// revisions, reports, state and logs. The tombstone stays.
    ///
    /// # Errors
    /// [`CatalogError::Changed`] if it changed meanwhile; [`CatalogError::Store`] on a store
    /// error.
    pub async fn delete_pipeline(
        &self,
        tenant: &str,
        record: &PipelineRecord,
    ) -> Result<(), CatalogError> {
        let tombstone = PipelineRecord {
            deleted: true,
            desired: DesiredState::Stopped,
            revision: record.revision + 1,
            updated_ms: wall_now_ms(),
            ..record.clone()
        };
        if !self.write_revision(tenant, &tombstone).await? {
            return Err(CatalogError::Changed {
                what: format!("pipeline `{}`", record.name),
                advice: READ_AND_RETRY,
            });
        }
        let keep = self.revision_path(tenant, &record.name, tombstone.revision);
        for dir in [
            self.pipeline_dir(tenant, &record.name),
            self.pipeline_state_prefix(tenant, &record.uid),
            self.pipeline_logs_prefix(tenant, &record.uid),
        ] {
            let metas: Vec<_> = self.store().list(Some(&dir)).try_collect().await?;
            for meta in metas.into_iter().filter(|m| m.location != keep) {
                match self.store().delete(&meta.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(err) => return Err(err.into()),
                }
            }
        }
        Ok(())
    }
}
