//! Where Weir's producer puts a keyed emit: the partition the Java client's default partitioner
//! gives its key (librdkafka's `murmur2_random`), in both delivery modes, so that a topic
//! Weir writes is co-partitioned with one a Java client or Kafka Streams wrote.

use rdkafka::Message;
use std::time::Duration;
use weir_host::config::{Delivery, RuntimeSettings};
use weir_tests::*;

const KEYS: usize = 200;
const OUTPUT_PARTITIONS: i32 = 4;

#[test]
fn the_reference_hash_is_kafkas_murmur2() {
    // Kafka's own vectors (UtilsTest.testMurmur2 of the Java client).
    for (key, hash) in [
        ("21", -973_932_308),
        ("foobar", -790_332_482),
        ("a-little-bit-long-string", -985_981_536),
        ("a-little-bit-longer-string", -1_486_304_829),
        (
            "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58_897_971,
        ),
        ("abc", 479_470_107),
    ] {
        assert_eq!(java_murmur2(key.as_bytes()), hash, "murmur2({key:?})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emits_land_on_the_java_clients_partition_of_their_key() -> anyhow::Result<()> {
    init_tracing();
    for delivery in [Delivery::AtLeastOnce, Delivery::ExactlyOnce] {
        let (input, output, dlq) = (unique("keys"), unique("counts"), unique("dlq"));
        create_topics(&[(&input, 1), (&output, OUTPUT_PARTITIONS), (&dlq, 1)]).await?;
        let records: Vec<_> = (0..KEYS)
            .map(|i| (format!("key-{i}").into_bytes(), b"x".to_vec()))
            .collect();
        produce(&input, 0, &records).await?;
        let mut settings = settings(
            guest("weir_test_counter"),
            &input,
            &output,
            &dlq,
            RuntimeSettings::default(),
        );
        settings.pipeline.delivery = delivery;
        // Exactly-once commits its outputs at checkpoints, which need a store.
        settings.state = lsm_state_on_s3(4 << 10).await?;
        settings.pipeline.checkpoint_interval = Duration::from_millis(200);
        let pipeline = RunningPipeline::start(settings);
        pipeline
            .wait_done(KEYS as u64, Duration::from_secs(60))
            .await?;
        let out = read_exactly(
            &output,
            KEYS,
            Duration::from_secs(60),
            Duration::from_millis(500),
        )
        .await?;
        pipeline.stop().await?;
        let mut used = std::collections::BTreeSet::new();
        for msg in &out {
            let key = msg.key().unwrap_or_default();
            assert_eq!(
                msg.partition(),
                java_partition(key, OUTPUT_PARTITIONS),
                "{delivery:?}: the emit keyed {:?}",
                String::from_utf8_lossy(key)
            );
            used.insert(msg.partition());
        }
        assert_eq!(used.len(), OUTPUT_PARTITIONS as usize, "{used:?}");
    }
    Ok(())
}
