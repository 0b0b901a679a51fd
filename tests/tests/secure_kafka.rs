//! Kafka over TLS and SASL: the local broker's SASL_SSL listener (deploy/local/kafka.sh: SCRAM
//! users, a throw-away CA). A pipeline runs end to end over it on a zstd-compressed input, and
//! wrong credentials or an untrusted certificate fail with a reason that names the cause — at
//! `weir run`'s start and in the API's pipeline status.

use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use weir_host::config::SaslMechanism;
use weir_host::source::kafka::broker::check_reachable;
use weir_tests::api::*;
use weir_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_runs_over_sasl_ssl_with_scram_on_a_zstd_compressed_input() -> anyhow::Result<()>
{
    init_tracing();
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    // The broker keeps the input zstd-compressed whatever the producer sends.
    create_topic_with(&input, 2, &[("compression.type", "zstd")]).await?;
    create_topics(&[(&output, 2), (&dlq, 1)]).await?;
    assert_eq!(
        topic_config(&input, "compression.type").await?.as_deref(),
        Some("zstd")
    );
    let kafka = kafka_sasl_ssl(SaslMechanism::ScramSha256, KAFKA_SASL_PASSWORD);

    // Produced over SASL_SSL (SCRAM-SHA-512), zstd-compressed batches.
    let producer: FutureProducer = kafka_sasl_ssl(SaslMechanism::ScramSha512, KAFKA_SASL_PASSWORD)
        .client_config()
        .set("compression.type", "zstd")
        .set("linger.ms", "5")
        .create()?;
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let mut deliveries = Vec::new();
    for i in 0..2_000u64 {
        let key = format!("key{}", i % 50);
        *expected.entry(key.clone()).or_default() += 1;
        let partition = i32::try_from(i % 50 % 2)?;
        let record = FutureRecord::to(&input)
            .partition(partition)
            .key(key.as_bytes())
            .payload("a record compressed with zstd");
        deliveries.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| anyhow::anyhow!("cannot enqueue: {e}"))?,
        );
    }
    for delivery in deliveries {
        delivery
            .await?
            .map_err(|(e, _)| anyhow::anyhow!("delivery over SASL_SSL failed: {e}"))?;
    }

    // The pipeline's consumer, producers and metadata clients all go through SASL_SSL
    // (SCRAM-SHA-256).
    let mut settings = settings(
        guest("weir_test_counter"),
        &input,
        &output,
        &dlq,
        runtime_settings(),
    );
    settings.kafka = kafka.clone();
    let pipeline = RunningPipeline::start(settings);
    let counts = read_counts(&output, &expected, TIMEOUT).await?;
    assert_counts_exact(&expected, &counts);
    assert!(!pipeline.is_finished(), "the pipeline keeps running");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_or_an_untrusted_certificate_are_named_as_the_cause_at_once()
-> anyhow::Result<()> {
    init_tracing();
    // What `weir run` checks before it starts. A refused client is told as soon as the broker
    // refuses it, not once the check's timeout (an hour here) has passed.
    let refused_within = Duration::from_secs(60);
    let wrong_password = kafka_sasl_ssl(SaslMechanism::ScramSha256, "not-the-password");
    let err = tokio::time::timeout(
        refused_within,
        tokio::task::spawn_blocking(move || {
            check_reachable(&wrong_password, Duration::from_secs(3600))
        }),
    )
    .await
    .expect("a wrong password is told before the check's timeout")?
    .expect_err("a wrong password must not connect")
    .to_string();
    assert!(
        err.contains("Authentication failed") && err.contains("invalid credentials"),
        "the reason names the credentials: {err}"
    );

    // The system's CAs do not trust the script's CA.
    let mut untrusted = kafka_sasl_ssl(SaslMechanism::ScramSha256, KAFKA_SASL_PASSWORD);
    untrusted.security.ssl_ca_location = None;
    let err = tokio::time::timeout(
        refused_within,
        tokio::task::spawn_blocking(move || check_reachable(&untrusted, Duration::from_secs(3600))),
    )
    .await
    .expect("an untrusted certificate is told before the check's timeout")?
    .expect_err("an untrusted certificate must not connect")
    .to_string();
    assert!(
        err.contains("certificate verify failed"),
        "the reason names the certificate: {err}"
    );

    // Through the API: a host whose Kafka password is wrong reports why its pipeline cannot
    // start, and the API stays up.
    let mut runner = runner_config(&unique("host"));
    let wrong = kafka_sasl_ssl(SaslMechanism::ScramSha512, "not-the-password");
    runner.bootstrap_servers = wrong.bootstrap_servers;
    runner.security = wrong.security;
    let (addr, _) = start_server_with(Some(runner)).await?;
    let tenant = tenant_id("secure");
    let key = tenant_with_key(addr, &tenant).await?;
    upload_counter(addr, &key, 1).await?;
    let spec = json!({
        "operator": "counter", "operator_version": 1,
        "input_topics": ["in"], "output_topic": "out", "dead_letter_topic": "dlq",
    });
    create_pipeline(addr, &key, "counts", &spec).await?;
    let view = wait_for_pipeline(addr, &key, "counts", Duration::from_secs(60), |view| {
        view.to_string().contains("invalid credentials")
    })
    .await?;
    assert_ne!(state_of(&view), "running", "{view:#}");
    Ok(())
}
