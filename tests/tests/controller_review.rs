//! Review tests for the execution controller (commit 53f1d12): behaviours that break the
//! requirement. Each asserts the required behaviour, so a failure shows the bug.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::RuntimeSettings;
use weir_host::state::configured::ConfiguredBackend;
use weir_host::state::delayed::{DelayedReads, ReadDelay};
use weir_tests::*;

/// Partitions keep every instance they ever created (idle ones are never given back to the
/// host's pool of 256), and a partition whose instantiation fails while it has no instance
/// stops the whole pipeline (`WorkerError::Instantiate`). With `partition_instances_max = 64`
/// (valid config) five partitions of one host are enough; with the default 4, 65 partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_pool_shared_by_partitions_is_not_exhausted_into_a_failure() -> anyhow::Result<()>
{
    init_tracing();
    const PARTITIONS: i32 = 6;
    const RECORDS: u64 = 3_000;
    let (input, output, dlq) = (unique("in"), unique("out"), unique("dlq"));
    create_topics(&[(&input, PARTITIONS), (&output, 1), (&dlq, 1)]).await?;
    let mut expected = BTreeMap::new();
    // Every record its own key: batches of one record, many at once.
    produce_counter(&input, PARTITIONS, (0, RECORDS), RECORDS, &mut expected).await?;
    let runtime = RuntimeSettings {
        batch_records_max: 1,
        partition_instances_max: 64,
        ..RuntimeSettings::default()
    };
    let settings = settings(guest("weir_test_counter"), &input, &output, &dlq, runtime);
    let clock: SharedClock = Arc::new(SystemClock);
    let backend = Arc::new(DelayedReads::new(
        ConfiguredBackend::from_settings(&settings.state, clock.clone())?,
        ReadDelay::Fixed(Duration::from_millis(20)),
    ));
    let pipeline = RunningPipeline::start_on(settings, backend, clock);
    let done = pipeline.wait_done(RECORDS, Duration::from_secs(120)).await;
    let stats = pipeline.stats.clone();
    let stopped = pipeline.stop().await;
    eprintln!(
        "done: {done:?}; stop: {stopped:?}; batches peak {}",
        stats.batches_in_flight_peak.load(Ordering::Relaxed)
    );
    done?;
    stopped?;
    Ok(())
}
