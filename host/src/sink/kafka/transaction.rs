//! Exactly-once: committing a shard's Kafka transaction with its checkpoint
//! (docs/checkpoints.md step 8).

use super::producer::KafkaProducer;
use crate::ids::{ManifestVersion, Partition};
use crate::pipeline::ports::CommitError;
use crate::source::kafka::SourceConsumer;
use crate::state::checkpoint::{InputOffsets, manifest_metadata};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::Arc;
use std::time::Duration;

/// How long committing a checkpoint's Kafka transaction may take.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Commits `producer`'s open transaction — the outputs since the last checkpoint — with the
/// input offsets of `partition` and `version` in their metadata, then begins the next one. The
/// consumer's group metadata goes with the offsets, so that a stale generation is refused.
///
/// # Errors
/// [`CommitError::Fenced`] when another producer took the `transactional.id` over (or the
/// group moved on to a newer generation); [`CommitError::Failed`] for anything else: the
/// transaction is lost and the shard must be reopened from its decided checkpoint.
pub(super) async fn commit(
    producer: KafkaProducer,
    consumer: Arc<SourceConsumer>,
    partition: Partition,
    input: &InputOffsets,
    version: ManifestVersion,
) -> Result<(), CommitError> {
    let mut offsets = TopicPartitionList::new();
    for (topic, next) in input.iter() {
        offsets
            .add_partition_offset(topic, partition.0, Offset::Offset(next.0))
            .and_then(|()| {
                offsets
                    .find_partition(topic, partition.0)
                    .map(|mut e| e.set_metadata(manifest_metadata(version)))
                    .ok_or(KafkaError::Global(RDKafkaErrorCode::UnknownPartition))
            })
            .map_err(|e| CommitError::Failed(Box::new(e)))?;
    }
    let committed = tokio::task::spawn_blocking(move || {
        let group = consumer
            .group_metadata()
            .ok_or(KafkaError::Global(RDKafkaErrorCode::State))?;
        producer.send_offsets_to_transaction(&offsets, &group, TRANSACTION_TIMEOUT)?;
        producer.commit_transaction(TRANSACTION_TIMEOUT)?;
        producer.begin_transaction()
    })
    .await
    .unwrap_or(Err(KafkaError::Canceled));
    match committed {
        Ok(()) => Ok(()),
        Err(source) if is_fenced(&source) => Err(CommitError::Fenced(Box::new(source))),
        Err(source) => Err(CommitError::Failed(Box::new(source))),
    }
}

/// Whether a transactional producer's error means another owner took over (its producer
/// fenced ours, or the consumer group moved on to a newer generation).
fn is_fenced(error: &KafkaError) -> bool {
    let code = match error {
        KafkaError::Transaction(e) => e.code(),
        other => match other.rdkafka_error_code() {
            Some(code) => code,
            None => return false,
        },
    };
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::FencedInstanceId
            | RDKafkaErrorCode::IllegalGeneration
            | RDKafkaErrorCode::UnknownMemberId
    )
}

/// A failed commit of a transaction that stayed open `open`, past `timeout`
/// (`transaction.timeout.ms`): the broker aborted it and bumped the producer's epoch, so the
/// commit fails as if another owner had fenced it — it did not (SCENARIOS.md S19), and the
/// error says so. Any other failure is returned as it is.
pub(super) fn timed_out(err: CommitError, open: Duration, timeout: Duration) -> CommitError {
    if open < timeout {
        return err;
    }
    let source = match err {
        CommitError::Fenced(source) | CommitError::Failed(source) => source,
        timed_out @ CommitError::TimedOut { .. } => return timed_out,
    };
    CommitError::TimedOut {
        open_ms: open.as_millis() as u64,
        timeout_ms: timeout.as_millis() as u64,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fenced() -> CommitError {
        CommitError::Fenced(Box::new(KafkaError::Global(
            RDKafkaErrorCode::InvalidProducerEpoch,
        )))
    }

    #[test]
    fn a_commit_fenced_after_the_transaction_timeout_is_the_timeout_not_another_owner() {
        let timeout = Duration::from_secs(10);
        let err = timed_out(fenced(), Duration::from_secs(35), timeout);
        assert!(
            matches!(
                err,
                CommitError::TimedOut {
                    open_ms: 35_000,
                    timeout_ms: 10_000,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("transaction.timeout.ms"), "{err}");
        // Within its timeout, a fencing is another owner's.
        let err = timed_out(fenced(), Duration::from_secs(3), timeout);
        assert!(matches!(err, CommitError::Fenced(_)), "{err:?}");
    }
}
