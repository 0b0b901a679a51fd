//! The S3 server of `deploy/local/s3.sh` honours conditional PUT atomically, as Weir's
//! manifest commit needs: of 16 concurrent create-only PUTs exactly one wins, and an `If-Match`
//! with a stale ETag is refused. Uses `object_store` 0.14, the client Weir's state layer uses.

use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use std::sync::Arc;
use weir_tests::{create_s3_bucket, s3_endpoint};

async fn bucket() -> anyhow::Result<Arc<dyn ObjectStore>> {
    let name = create_s3_bucket().await?;
    let store = AmazonS3Builder::new()
        .with_endpoint(s3_endpoint())
        .with_bucket_name(name)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .build()?;
    Ok(Arc::new(store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_create_only_puts_have_exactly_one_winner() -> anyhow::Result<()> {
    let store = bucket().await?;
    for round in 0..5 {
        let path = Path::from(format!("manifest/{round:020}"));
        let attempts = (0..16).map(|writer| {
            let store = store.clone();
            let path = path.clone();
            tokio::spawn(async move {
                let opts = PutOptions::from(PutMode::Create);
                store
                    .put_opts(&path, PutPayload::from(format!("writer {writer}")), opts)
                    .await
            })
        });
        let mut winners = 0;
        for attempt in futures::future::join_all(attempts).await {
            match attempt? {
                Ok(_) => winners += 1,
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(other) => anyhow::bail!("unexpected error: {other}"),
            }
        }
        assert_eq!(winners, 1, "round {round}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_match_with_a_stale_etag_is_refused() -> anyhow::Result<()> {
    let store = bucket().await?;
    let path = Path::from("pointer");
    let first = store.put(&path, PutPayload::from("v1")).await?;
    let second = store
        .put_opts(
            &path,
            PutPayload::from("v2"),
            PutOptions::from(PutMode::Update(UpdateVersion::from(first.clone()))),
        )
        .await?;
    let stale = store
        .put_opts(
            &path,
            PutPayload::from("v3"),
            PutOptions::from(PutMode::Update(UpdateVersion::from(first.clone()))),
        )
        .await;
    assert!(
        matches!(stale, Err(object_store::Error::Precondition { .. })),
        "stale If-Match must fail with a precondition error: {stale:?}"
    );
    let current = store
        .put_opts(
            &path,
            PutPayload::from("v3"),
            PutOptions::from(PutMode::Update(UpdateVersion::from(second.clone()))),
        )
        .await;
    assert!(current.is_ok(), "{current:?}");
    let body = store.get(&path).await?.bytes().await?;
    assert_eq!(&body[..], b"v3");
    Ok(())
}
