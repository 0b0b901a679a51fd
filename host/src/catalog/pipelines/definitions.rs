//! Every tenant's pipeline definitions, read again only when they may have changed: what a
//! runner (`crate::runner`) reconciles against each second and what the status page samples.
//!
//! Listing every tenant's pipelines and the newest revision of each is one `LIST` of the
//! tenants plus a `GET`, a `LIST` and, per pipeline, a `LIST` and a `GET` per tenant: every
//! host paid that each reconcile (1 s by default) and each status sample, most of the store's
//! requests of a quiet cluster. A catalog overwrites a change marker after every revision it writes
//! ([`Catalog::definitions_marker`]); a pass reads the marker (one `HEAD`) and reads the
//! definitions only when its version differs from the one it read them after, or when its
//! last full read is [`FULL_READ_EVERY`] old (a writer that died between its revision and the
//! marker, or whose marker write failed, or an older host's API during an upgrade, which writes
//! no marker). The idea is an `etcd` watch's, or a Kubernetes
//! informer's resync, on a store that can only be polled.

use crate::catalog::pipelines::PipelineRecord;
use crate::catalog::{Catalog, CatalogError};
use std::time::Duration;
use tokio::time::Instant;

/// [`Definitions::read`] reads every definition at least this often, whatever the marker says.
pub const FULL_READ_EVERY: Duration = Duration::from_secs(30);

/// The definitions last read, and the marker's version read just before them.
#[derive(Debug, Default)]
pub struct Definitions {
    last: Option<FullRead>,
}

#[derive(Debug)]
struct FullRead {
    /// The marker's version read before the definitions; `None` when it could not be read
    /// (the next pass reads them again).
    marker: Option<Option<String>>,
    at: Instant,
    records: Vec<(String, PipelineRecord)>,
}

impl Definitions {
    /// Every tenant's pipelines, as `(tenant, definition)`: read from `catalog` when `fresh`
    /// asks for it (say, this host's API just wrote one), when the change marker moved since the
    /// last read, or when that read is [`FULL_READ_EVERY`] old; the last read's otherwise.
    ///
    /// # Errors
    /// [`CatalogError::Store`] when the definitions cannot be read.
    pub async fn read(
        &mut self,
        catalog: &Catalog,
        fresh: bool,
    ) -> Result<&[(String, PipelineRecord)], CatalogError> {
        // The marker before the definitions: a revision written after this read moves it, so
        // the next pass reads again. A marker that cannot be read means a full read (which
        // fails too when the store is down).
        let marker = catalog.definitions_marker().await.ok();
        let current = self.last.as_ref().is_some_and(|last| {
            !fresh
                && marker.is_some()
                && last.marker == marker
                && last.at.elapsed() < FULL_READ_EVERY
        });
        if !current {
            let records = catalog.all_pipelines().await?;
            self.last = Some(FullRead {
                marker,
                at: Instant::now(),
                records,
            });
        }
        Ok(&self.last.as_ref().expect("read above").records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Tenant;
    use crate::catalog::pipelines::PipelineSpec;
    use crate::state::hooked_store::{HookedStore, Request, RequestHook};
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{ObjectStore, ObjectStoreExt};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// Counts the LISTs the catalog's store serves; fails reads of the marker when told.
    #[derive(Debug, Default)]
    struct Lists(AtomicU64, AtomicBool);

    #[async_trait::async_trait]
    impl RequestHook for Lists {
        async fn before(&self, request: Request, at: Option<&Path>) -> object_store::Result<()> {
            if request == Request::List {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
            let marker = at.is_some_and(|p| p.as_ref().ends_with("pipelines-changed.json"));
            if marker && self.1.load(Ordering::Relaxed) {
                return Err(object_store::Error::Generic {
                    store: "test",
                    source: "the marker cannot be read".into(),
                });
            }
            Ok(())
        }
    }

    fn pipeline(name: &str) -> PipelineRecord {
        let spec: PipelineSpec = serde_json::from_value(serde_json::json!({
            "operator": "counter", "operator_version": 1,
            "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
        }))
        .expect("a spec");
        PipelineRecord::new(name.into(), format!("uid-{name}"), spec, 0)
    }

    fn names(records: &[(String, PipelineRecord)]) -> Vec<&str> {
        records.iter().map(|(_, r)| r.name.as_str()).collect()
    }

    /// A store with tenant `acme` and its pipeline `a`; the runner's catalog on it, counting
    /// its LISTs; another host's API's catalog, writing through its own.
    async fn cluster() -> (Arc<dyn ObjectStore>, Arc<Lists>, Catalog, Catalog) {
        let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let lists = Arc::new(Lists::default());
        let hooked: Arc<dyn ObjectStore> =
            Arc::new(HookedStore::new(memory.clone(), lists.clone()));
        let runner_catalog = Catalog::new(hooked, Path::from("weir"));
        let api = Catalog::new(memory.clone(), Path::from("weir"));
        let tenant = Tenant {
            id: "acme".into(),
            name: "Acme".into(),
            created_ms: 0,
        };
        api.create_tenant(&tenant).await.expect("tenant");
        api.create_pipeline("acme", &mut pipeline("a"))
            .await
            .expect("a");
        (memory, lists, runner_catalog, api)
    }

    #[tokio::test(start_paused = true)]
    async fn definitions_are_listed_again_only_after_a_revision_or_the_full_read_interval() {
        let (memory, lists, runner_catalog, api) = cluster().await;

        let mut definitions = Definitions::default();
        let first = definitions
            .read(&runner_catalog, false)
            .await
            .expect("read");
        assert_eq!(names(first), ["a"]);
        let listed = lists.0.load(Ordering::Relaxed);
        assert!(listed > 0, "the first read lists the definitions");

        // Nothing changed: the marker alone is read, no LIST.
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(1)).await;
            let same = definitions
                .read(&runner_catalog, false)
                .await
                .expect("read");
            assert_eq!(names(same), ["a"]);
        }
        assert_eq!(lists.0.load(Ordering::Relaxed), listed);

        // A revision written by another host moves the marker: read at the next pass.
        api.create_pipeline("acme", &mut pipeline("b"))
            .await
            .expect("b");
        let after = definitions
            .read(&runner_catalog, false)
            .await
            .expect("read");
        assert_eq!(names(after), ["a", "b"]);
        let listed = lists.0.load(Ordering::Relaxed);

        // A revision whose writer died before the marker: seen by the full read at the latest.
        let mut lost = pipeline("c");
        lost.revision = 1;
        memory
            .put(
                &Path::from("weir/tenants/acme/pipelines/c/revisions/0000000001.json"),
                serde_json::to_vec(&lost).expect("json").into(),
            )
            .await
            .expect("put");
        let still = definitions
            .read(&runner_catalog, false)
            .await
            .expect("read");
        assert_eq!(names(still), ["a", "b"]);
        assert_eq!(lists.0.load(Ordering::Relaxed), listed);
        tokio::time::advance(FULL_READ_EVERY).await;
        let full = definitions
            .read(&runner_catalog, false)
            .await
            .expect("read");
        assert_eq!(names(full), ["a", "b", "c"]);

        // This host's own API asks for a fresh read whatever the marker says.
        let listed = lists.0.load(Ordering::Relaxed);
        definitions.read(&runner_catalog, true).await.expect("read");
        assert!(lists.0.load(Ordering::Relaxed) > listed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_marker_that_cannot_be_read_means_a_full_read() {
        let (_, lists, runner_catalog, _) = cluster().await;
        let mut definitions = Definitions::default();
        definitions
            .read(&runner_catalog, false)
            .await
            .expect("read");
        let listed = lists.0.load(Ordering::Relaxed);
        // The definitions are read whole, then again once the marker can be read (its version
        // unknown before), then no more.
        lists.1.store(true, Ordering::Relaxed);
        let unread = definitions
            .read(&runner_catalog, false)
            .await
            .expect("read");
        assert_eq!(names(unread), ["a"]);
        let listed_unread = lists.0.load(Ordering::Relaxed);
        assert!(listed_unread > listed);
        lists.1.store(false, Ordering::Relaxed);
        definitions
            .read(&runner_catalog, false)
            .await
            .expect("read");
        let listed_again = lists.0.load(Ordering::Relaxed);
        assert!(listed_again > listed_unread);
        definitions
            .read(&runner_catalog, false)
            .await
            .expect("read");
        assert_eq!(lists.0.load(Ordering::Relaxed), listed_again);
    }
}
