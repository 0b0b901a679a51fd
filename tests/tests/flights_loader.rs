//! `weir load-flights` keeps what it loads: the records carry 2013 timestamps, which the
//! broker's time-based retention would delete at its next check, so the loader turns it off.

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use weir_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaded_flights_topics_have_no_time_based_retention() -> anyhow::Result<()> {
    let topic = unique("flights-retained");
    let mut flights = weir_cli::flights::read_csv(&flights_csv())?;
    flights.truncate(20);
    assert!(
        flights[0].timestamp_ms < 1_400_000_000_000,
        "2013 timestamps"
    );
    let n = weir_cli::flights::produce(&kafka_bootstrap(), &topic, &flights).await?;
    assert_eq!(n, 20);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()?;
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(&topic)], &AdminOptions::new())
        .await?;
    let resource = described
        .into_iter()
        .next()
        .expect("one resource")
        .map_err(|code| anyhow::anyhow!("describe_configs: {code:?}"))?;
    let retention = resource
        .get("retention.ms")
        .and_then(|entry| entry.value.clone());
    assert_eq!(retention.as_deref(), Some("-1"));
    Ok(())
}
