//! A table input through the API (docs/topologies.md, "Tables"), on the real broker and S3
//! server: a stage of the counter guest whose `count` state a table seeds — the table's row of
//! a key is where that key's count starts, loaded before any click runs.

use crate::api_stages::{PARTITIONS, Rig, rig};
use rdkafka::Message;
use serde_json::json;
use std::time::Duration;
use weir_tests::api::*;
use weir_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_seeds_a_stages_state_through_the_api() -> anyhow::Result<()> {
    let Rig {
        addr,
        acme_id,
        acme,
        input,
        output,
        ..
    } = rig(1).await?;
    let seeds = kafka_topic_of(&acme_id, "seeds");
    create_topics(&[(&seeds, PARTITIONS)]).await?;
    // k0's count starts at 100; k1 has no row. The clicks are there before the pipeline.
    produce(&seeds, 0, &[(b"k0".to_vec(), b"100".to_vec())]).await?;
    let click = |key: &[u8]| (key.to_vec(), b"v".to_vec());
    produce(&input, 0, &[click(b"k0"), click(b"k0")]).await?;
    produce(&input, 1, &[click(b"k1")]).await?;
    let spec = json!({
        "stages": [{
            "name": "count", "operator": "counter", "operator_version": 1,
            "inputs": [{"topic": "clicks"}, {"topic": "seeds", "table": "count"}],
            "outputs": {"default": {"topic": "counts"}},
        }],
        "dead_letter_topic": "dlq",
        "checkpoint_interval_ms": 500,
        "delivery": "exactly_once",
        "state_backend": "memory",
    });
    create_pipeline(addr, &acme, "seeded", &spec).await?;
    let read = read_exactly(&output, 3, Duration::from_secs(60), Duration::ZERO).await?;
    let mut counts: Vec<(String, u64)> = read
        .iter()
        .map(|m| {
            let value: serde_json::Value =
                serde_json::from_slice(m.payload().unwrap_or_default()).expect("counter JSON");
            (
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                value["count"].as_u64().expect("a count"),
            )
        })
        .collect();
    counts.sort();
    assert_eq!(
        counts,
        [
            ("k0".to_owned(), 101),
            ("k0".to_owned(), 102),
            ("k1".to_owned(), 1)
        ]
    );
    Ok(())
}
