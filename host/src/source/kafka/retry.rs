//! librdkafka calls asked again while it answers that the partition moved under them
//! (`Outdated`) or its fetcher has not started (`State`), as it asks its callers to.

use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use std::time::Duration;

/// How long a seek refused for a fetcher not yet started waits before it is tried again.
const SEEK_RETRY_DELAY: Duration = Duration::from_millis(5);

/// Pause between tries of a request librdkafka answered `Outdated`.
const OUTDATED_RETRY: Duration = Duration::from_millis(50);

/// Runs `request` (a blocking librdkafka call) again while it fails with `Outdated` — the
/// partition's leader or metadata changed under it, and librdkafka asks the caller to retry
/// (`RD_KAFKA_RESP_ERR__OUTDATED`) — for up to `within`; any other answer is returned. A
/// partition's end read at an assignment met it when the topic was new (a test failed on it).
pub(super) fn retry_while_outdated<T>(
    within: Duration,
    mut request: impl FnMut() -> rdkafka::error::KafkaResult<T>,
) -> rdkafka::error::KafkaResult<T> {
    let deadline = crate::clock::monotonic_now() + within;
    loop {
        match request() {
            Err(err)
                if err.rdkafka_error_code() == Some(RDKafkaErrorCode::Outdated)
                    && crate::clock::monotonic_now() + OUTDATED_RETRY < deadline =>
            {
                tracing::debug!(error = %err, "outdated answer; asking again");
                std::thread::sleep(OUTDATED_RETRY);
            }
            answered => return answered,
        }
    }
}

/// Runs `seek` (one partition's) again, for up to `within`, while librdkafka refuses it for a
/// fetcher not started yet (`State`) or answers it `Outdated`: the partition's fetcher moved to
/// a newer version under it — its own lookup of the start offset of a partition with no
/// committed offset, which a new assignment starts beside the seek — and the seek did not
/// apply. Asked again it applies after that lookup, so the seek's offset wins (a test that
/// seeks right after an assignment failed on `Outdated`). Any other answer is returned.
pub(super) fn seek_retried(
    within: Duration,
    mut seek: impl FnMut() -> KafkaResult<()>,
) -> KafkaResult<()> {
    let deadline = crate::clock::monotonic_now() + within;
    loop {
        match seek() {
            Err(KafkaError::OffsetFetch(RDKafkaErrorCode::State | RDKafkaErrorCode::Outdated))
                if crate::clock::monotonic_now() < deadline =>
            {
                std::thread::sleep(SEEK_RETRY_DELAY);
            }
            result => return result,
        }
    }
}
