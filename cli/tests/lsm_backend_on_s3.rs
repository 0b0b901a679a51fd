//! The `lsm` backend built from settings, as the `weir` binary builds it, against the S3 server
//! of `deploy/local/s3.sh` — in a process that installs nothing beforehand (the TLS crypto
//! provider object_store's client needs must come from the backend itself). Checkpoints, then a
//! second owner resumes from the checkpoint with its offsets.

use std::io::{Read, Write};
use std::sync::Arc;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::LsmStateSettings;
use weir_host::ids::Offset;
use weir_host::state::checkpoint::{DecidedBy, InputOffsets};
use weir_host::state::lsm::backend::LsmBackend;
use weir_host::state::{Shard, ShardId, StateBackend, StateWrite};

fn endpoint() -> String {
    std::env::var("WEIR_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:9000".into())
}

/// Creates a bucket with a bare HTTP/1.1 `PUT /bucket` (no TLS stack involved).
fn create_bucket(name: &str) {
    let host = endpoint()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut conn = std::net::TcpStream::connect(&host).unwrap_or_else(|e| {
        panic!("cannot reach the S3 server at {host}: {e}; is deploy/local/s3.sh up?")
    });
    write!(
        conn,
        "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("request written");
    let mut response = String::new();
    conn.read_to_string(&mut response).expect("response read");
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "CreateBucket: {response}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_backend_from_settings_checkpoints_and_a_new_owner_resumes() {
    let bucket = format!("weir-backend-{}", std::process::id());
    create_bucket(&bucket);
    let settings = LsmStateSettings {
        url: Some(format!("s3://{bucket}/state")),
        options: [
            ("aws_endpoint", endpoint()),
            ("aws_region", "us-east-1".to_owned()),
            ("aws_access_key_id", "test".to_owned()),
            ("aws_secret_access_key", "test".to_owned()),
            ("aws_allow_http", "true".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        memtable_bytes_max: 1024,
        ..LsmStateSettings::default()
    };
    let clock: SharedClock = Arc::new(SystemClock);
    let id = ShardId {
        pipeline: "counts".into(),
        partition: weir_host::ids::Partition(0),
    };
    let a = LsmBackend::from_settings(&settings, clock.clone())
        .expect("sets up")
        .open_shard(&id)
        .await
        .expect("opens");
    for i in 0u32..200 {
        let write = StateWrite {
            key: i.to_be_bytes().to_vec(),
            value: Some(format!("v{i}").into()),
            expires_at_ms: None,
        };
        a.apply(vec![write]).await.expect("apply");
    }
    let mut offsets = InputOffsets::new();
    offsets.advance("in", Offset(199));
    let report = a
        .checkpoint(&offsets, DecidedBy::Manifest)
        .await
        .expect("checkpoint")
        .expect("lsm checkpoints are durable");
    assert!(report.uploaded_bytes > 0, "{report:?}");
    assert_eq!(report.uploaded_bytes, report.state_bytes, "the first one");

    let b = LsmBackend::from_settings(&settings, clock)
        .expect("sets up")
        .open_shard(&id)
        .await
        .expect("a new owner opens");
    assert_eq!(b.recovered_offsets().expect("decodes"), Some(offsets));
    for i in [0u32, 99, 199] {
        assert_eq!(
            b.get(&i.to_be_bytes()).await.expect("get"),
            Some(format!("v{i}").into())
        );
    }
}
