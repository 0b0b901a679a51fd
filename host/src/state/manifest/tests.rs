//! The manifest commit protocol against an object store that answers ambiguously: a 409 with
//! nothing written, a lost acknowledgement, another writer's version, a claim that fences an
//! older owner (also in a slot above it), and corrupt bytes.

use super::*;
use crate::ids::ManifestVersion;
use crate::state::faulty_store::{Fault, FaultyStore};
use crate::state::test_support::block_on;

fn checkpoint(base: &Manifest, version: u64, offset: &str) -> Manifest {
    Manifest {
        version: ManifestVersion(version),
        parent: Some(base.version),
        kind: ManifestKind::Checkpoint,
        writer_epoch: base.writer_epoch,
        writer_token: base.writer_token.clone(),
        levels: vec![vec![SstRef {
            writer_epoch: base.writer_epoch,
            seq: version,
            size_bytes: 100,
            first_key: b"a".to_vec(),
            last_key: b"k".to_vec(),
        }]],
        metadata: [("offset.0".to_owned(), offset.to_owned())].into(),
        rejected: Vec::new(),
    }
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
        let claim = store.claim("writer-a", None, &[]).await.expect("claims");
        assert_eq!((claim.version.0, claim.writer_epoch), (1, 1));
        let cp = checkpoint(&claim, 2, "42");
        store.commit(&cp).await.expect("commits");
        assert_eq!(store.read(ManifestVersion(2)).await.expect("reads"), cp);
        assert_eq!(store.versions().await.expect("lists"), vec![1, 2]);
    });
}

#[test]
fn a_409_with_nothing_written_is_retried_not_fenced() {
    block_on(async {
        let (faulty, store) = setup();
        let claim = store.claim("writer-a", None, &[]).await.expect("claims");
        faulty.inject(Fault::ConflictNothingWritten);
        store
            .commit(&checkpoint(&claim, 2, "7"))
            .await
            .expect("retried and committed");
        assert_eq!(
            store
                .read(ManifestVersion(2))
                .await
                .expect("reads")
                .metadata["offset.0"],
            "7"
        );
    });
}

#[test]
fn a_lost_acknowledgement_is_recognised_by_our_writer_token() {
    block_on(async {
        let (faulty, store) = setup();
        let claim = store.claim("writer-a", None, &[]).await.expect("claims");
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
        let a = store.claim("writer-a", None, &[]).await.expect("a claims");
        let b = store
            .claim("writer-b", Some(&a), &[])
            .await
            .expect("b claims above a");
        assert_eq!((b.version.0, b.writer_epoch), (2, 2));
        // A, a zombie, tries to commit into the slot B took.
        let err = store
            .commit(&checkpoint(&a, 2, "100"))
            .await
            .expect_err("fenced");
        assert!(
            matches!(
                err,
                ManifestError::Fenced {
                    version: ManifestVersion(2),
                    our_epoch: 1
                }
            ),
            "{err}"
        );
        assert_eq!(
            store
                .read(ManifestVersion(2))
                .await
                .expect("reads")
                .writer_token,
            "writer-b"
        );
    });
}

#[test]
fn a_zombie_writing_into_a_free_slot_is_fenced_by_the_check_after_commit() {
    block_on(async {
        let (_, store) = setup();
        let a = store.claim("writer-a", None, &[]).await.expect("a claims");
        let b = store
            .claim("writer-b", Some(&a), &[])
            .await
            .expect("b claims");
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
                    version: ManifestVersion(4),
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
        store.claim("writer-a", None, &[]).await.expect("claims");
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
        let err = store.read(ManifestVersion(1)).await.expect_err("corrupt");
        assert!(
            matches!(
                err,
                ManifestError::Corrupt {
                    version: ManifestVersion(1),
                    ..
                }
            ),
            "{err}"
        );
        assert!(matches!(
            store.read(ManifestVersion(9)).await,
            Err(ManifestError::NotFound(9))
        ));
    });
}

#[test]
fn the_encoded_manifest_is_frozen() {
    let m = Manifest {
        version: ManifestVersion(3),
        parent: Some(ManifestVersion(2)),
        kind: ManifestKind::Checkpoint,
        writer_epoch: 2,
        writer_token: "token".into(),
        levels: vec![vec![
            SstRef {
                writer_epoch: 2,
                seq: 0,
                size_bytes: 4096,
                first_key: vec![0, 1],
                last_key: vec![0, 9, 0xff],
            },
            SstRef {
                writer_epoch: 2,
                seq: 1,
                size_bytes: 812,
                first_key: b"a".to_vec(),
                last_key: b"b".to_vec(),
            },
        ]],
        metadata: [("offset.0".to_owned(), "4000".to_owned())].into(),
        rejected: Vec::new(),
    };
    let bytes = m.encode();
    assert_eq!(
        Manifest::decode(ManifestVersion(3), &bytes).expect("decodes"),
        m
    );
    insta::assert_snapshot!(format!(
        "{:02x?}\n{}",
        &bytes[..16],
        String::from_utf8_lossy(&bytes[16..])
    ));
}

/// Disaster recovery: a replica lacks versions 3 to 9, and Kafka's committed offsets name 9.
/// The new owner's claim goes above 9, so none of its checkpoints takes the number Kafka
/// decided (a restart would take such a checkpoint for the decided one).
#[test]
fn a_claim_goes_above_a_committed_version_the_store_lacks() {
    block_on(async {
        let (_, store) = setup();
        let claim = store.claim("writer-a", None, &[]).await.expect("claims");
        let cp = checkpoint(&claim, 2, "42");
        store.commit(&cp).await.expect("commits");
        let next = store
            .claim_above("writer-b", Some(&cp), &[], Some(ManifestVersion(9)))
            .await
            .expect("claims");
        assert_eq!((next.version.0, next.writer_epoch), (10, 2));
        assert_eq!(next.parent, Some(ManifestVersion(2)));
        // A floor below the stored versions changes nothing.
        let again = store
            .claim_above("writer-c", Some(&cp), &[], Some(ManifestVersion(4)))
            .await
            .expect("claims");
        assert_eq!(again.version, ManifestVersion(11));
    });
}
