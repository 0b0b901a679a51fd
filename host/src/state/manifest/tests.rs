//! The manifest commit protocol against an object store that answers ambiguously: a 409 with
//! nothing written, a lost acknowledgement, another writer's version, a claim that fences an
//! older owner (also in a slot above it), and corrupt bytes.

use super::*;
use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
    PutMultipartOptions, PutResult,
};
use std::collections::VecDeque;
use std::sync::Mutex;

/// What the next `put_opts` does wrong.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Answer `AlreadyExists` without writing (a 409 "concurrent operation").
    ConflictNothingWritten,
    /// Write, then lose the acknowledgement.
    LostAck,
}

/// Wraps the in-memory store, injecting the queued faults into PUTs.
#[derive(Debug, Default)]
struct FaultyStore {
    inner: InMemory,
    faults: Mutex<VecDeque<Fault>>,
}

impl FaultyStore {
    fn inject(&self, fault: Fault) {
        self.faults.lock().expect("unpoisoned").push_back(fault);
    }
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let fault = self.faults.lock().expect("unpoisoned").pop_front();
        match fault {
            Some(Fault::ConflictNothingWritten) => Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                source: "409 ConditionalRequestConflict (injected)".into(),
            }),
            Some(Fault::LostAck) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(object_store::Error::Generic {
                    store: "faulty",
                    source: "connection reset after the PUT (injected)".into(),
                })
            }
            None => self.inner.put_opts(location, payload, opts).await,
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn checkpoint(base: &Manifest, version: u64, offset: &str) -> Manifest {
    Manifest {
        version,
        parent: Some(base.version),
        kind: ManifestKind::Checkpoint,
        writer_epoch: base.writer_epoch,
        writer_token: base.writer_token.clone(),
        levels: vec![vec![SstRef {
            writer_epoch: base.writer_epoch,
            seq: version,
        }]],
        metadata: [("offset.0".to_owned(), offset.to_owned())].into(),
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn setup() -> (Arc<FaultyStore>, ManifestStore) {
    let faulty = Arc::new(FaultyStore::default());
    let store = ManifestStore::new(faulty.clone(), Path::from("shard"));
    (faulty, store)
}

#[test]
fn a_commit_reads_back_what_it_wrote() {
    block_on(async {
        let (_, store) = setup();
        let claim = store.claim("writer-a", None).await.expect("claims");
        assert_eq!((claim.version, claim.writer_epoch), (1, 1));
        let cp = checkpoint(&claim, 2, "42");
        store.commit(&cp).await.expect("commits");
        assert_eq!(store.read(2).await.expect("reads"), cp);
        assert_eq!(store.versions().await.expect("lists"), vec![1, 2]);
    });
}

#[test]
fn a_409_with_nothing_written_is_retried_not_fenced() {
    block_on(async {
        let (faulty, store) = setup();
        let claim = store.claim("writer-a", None).await.expect("claims");
        faulty.inject(Fault::ConflictNothingWritten);
        store
            .commit(&checkpoint(&claim, 2, "7"))
            .await
            .expect("retried and committed");
        assert_eq!(
            store.read(2).await.expect("reads").metadata["offset.0"],
            "7"
        );
    });
}

#[test]
fn a_lost_acknowledgement_is_recognised_by_our_writer_token() {
    block_on(async {
        let (faulty, store) = setup();
        let claim = store.claim("writer-a", None).await.expect("claims");
        faulty.inject(Fault::LostAck);
        store
            .commit(&checkpoint(&claim, 2, "9"))
            .await
            .expect("our own version counts as committed");
    });
}

#[test]
fn a_version_created_by_another_writer_fences_us() {
    block_on(async {
        let (_, store) = setup();
        let a = store.claim("writer-a", None).await.expect("a claims");
        let b = store
            .claim("writer-b", Some(&a))
            .await
            .expect("b claims above a");
        assert_eq!((b.version, b.writer_epoch), (2, 2));
        // A, a zombie, tries to commit into the slot B took.
        let err = store
            .commit(&checkpoint(&a, 2, "100"))
            .await
            .expect_err("fenced");
        assert!(
            matches!(
                err,
                ManifestError::Fenced {
                    version: 2,
                    our_epoch: 1
                }
            ),
            "{err}"
        );
        assert_eq!(store.read(2).await.expect("reads").writer_token, "writer-b");
    });
}

#[test]
fn a_zombie_writing_into_a_free_slot_is_fenced_by_the_check_after_commit() {
    block_on(async {
        let (_, store) = setup();
        let a = store.claim("writer-a", None).await.expect("a claims");
        let b = store.claim("writer-b", Some(&a)).await.expect("b claims");
        // B commits version 4, leaving slot 3 free (as if GC had removed it). A, a zombie,
        // writes into slot 3: its PUT succeeds, but the check after the commit finds version 4
        // written with B's higher epoch.
        store
            .commit(&checkpoint(&b, 4, "50"))
            .await
            .expect("b commits");
        let err = store
            .commit(&checkpoint(&a, 3, "10"))
            .await
            .expect_err("fenced after the write");
        assert!(
            matches!(
                err,
                ManifestError::Fenced {
                    version: 4,
                    our_epoch: 1
                }
            ),
            "{err}"
        );
    });
}

#[test]
fn a_corrupt_manifest_is_reported_as_corrupt() {
    block_on(async {
        let (faulty, store) = setup();
        store.claim("writer-a", None).await.expect("claims");
        let path = Path::from("shard/manifest/00000000000000000001.manifest");
        let mut bytes = faulty
            .inner
            .get(&path)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes")
            .to_vec();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x01;
        faulty
            .inner
            .put(&path, PutPayload::from(bytes))
            .await
            .expect("overwrite for the test");
        let err = store.read(1).await.expect_err("corrupt");
        assert!(
            matches!(err, ManifestError::Corrupt { version: 1, .. }),
            "{err}"
        );
        assert!(matches!(
            store.read(9).await,
            Err(ManifestError::NotFound(9))
        ));
    });
}

#[test]
fn the_encoded_manifest_is_frozen() {
    let m = Manifest {
        version: 3,
        parent: Some(2),
        kind: ManifestKind::Checkpoint,
        writer_epoch: 2,
        writer_token: "token".into(),
        levels: vec![vec![
            SstRef {
                writer_epoch: 2,
                seq: 0,
            },
            SstRef {
                writer_epoch: 2,
                seq: 1,
            },
        ]],
        metadata: [("offset.0".to_owned(), "4000".to_owned())].into(),
    };
    let bytes = m.encode();
    assert_eq!(Manifest::decode(3, &bytes).expect("decodes"), m);
    insta::assert_snapshot!(format!(
        "{:02x?}\n{}",
        &bytes[..16],
        String::from_utf8_lossy(&bytes[16..])
    ));
}
