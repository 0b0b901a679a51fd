//! The internal topics between a pipeline's stages (docs/topologies.md), which Weir owns as
//! Kafka Streams owns its repartition topics: each one missing is created before the stages
//! start, with as many partitions as the stage that writes it reads (or as its output asks)
//! and `retention.ms = -1`, so that no record a downstream checkpoint has not passed is ever
//! deleted by time. One that exists must have the partitions it would be created with: the
//! downstream stage's shards are its partitions.
//!
//! [`delete_below`] purges what no reader needs any more (as Kafka Streams purges its
//! repartition topics with `DeleteRecords`).

use crate::config::KafkaSettings;
use crate::config::stages::InternalTopic;
use crate::source::kafka::broker::{TopicLookupError, topic_partitions};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a metadata or create request waits for the cluster.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the internal topics are not ready.
#[derive(Debug, thiserror::Error)]
pub enum InternalTopicError {
    /// A topic's partitions could not be read (a missing input topic among them).
    #[error(transparent)]
    Lookup(#[from] TopicLookupError),
    /// The admin client could not be made or asked.
    #[error("cannot ask Kafka to create the internal topics")]
    Admin(#[source] KafkaError),
    /// The cluster refused to create (or delete) one.
    #[error("Kafka refused to create or delete internal topic `{topic}`: {code}")]
    Refused {
        /// The topic.
        topic: String,
        /// Kafka's answer.
        code: RDKafkaErrorCode,
    },
    /// One exists with other partitions than its stage writes.
    #[error(
        "internal topic `{topic}` has {has} partitions, not the {wants} its stage writes: delete it (the pipeline's downstream state goes with it) or set the output's partitions to {has}"
    )]
    Partitions {
        /// The topic.
        topic: String,
        /// Its partitions.
        has: usize,
        /// The partitions it would be created with.
        wants: usize,
    },
}

/// An internal topic as it is: its partitions, and how many upstream shards write to it (the
/// partitions of the writing stage's inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// Its partitions.
    pub partitions: usize,
    /// The shards of the stage that writes it.
    pub upstream_shards: usize,
}

/// Makes every one of `topics` exist, in their order (a topic's `like` is an earlier one or a
/// topic of the user's), creating the missing ones; says what each is.
///
/// # Errors
/// [`InternalTopicError`]: a topic whose partitions cannot be read, a creation refused, or one
/// that exists with other partitions.
pub async fn ensure(
    kafka: &KafkaSettings,
    topics: &[InternalTopic],
) -> Result<BTreeMap<String, Ready>, InternalTopicError> {
    let mut known: BTreeMap<String, usize> = BTreeMap::new();
    let mut ready = BTreeMap::new();
    if topics.is_empty() {
        return Ok(ready);
    }
    let admin: AdminClient<DefaultClientContext> = kafka
        .client_config()
        .create()
        .map_err(InternalTopicError::Admin)?;
    for topic in topics {
        let upstream_shards = match known.get(&topic.like) {
            Some(n) => *n,
            None => partitions(kafka, &topic.like).await?,
        };
        let wants = topic.partitions.map_or(upstream_shards, |n| n as usize);
        let has = partitions_if_any(kafka, &topic.name).await?;
        match has {
            Some(has) if has != wants => {
                return Err(InternalTopicError::Partitions {
                    topic: topic.name.clone(),
                    has,
                    wants,
                });
            }
            Some(_) => {}
            None => create(&admin, &topic.name, wants).await?,
        }
        known.insert(topic.name.clone(), wants);
        ready.insert(
            topic.name.clone(),
            Ready {
                partitions: wants,
                upstream_shards,
            },
        );
    }
    Ok(ready)
}

/// Deletes the records of `topic` below `next` in each `(partition, next)` (Kafka's
/// `DeleteRecords`: its log start moves there); returns the partitions whose purge failed, with
/// why. One already purged further is left as it is.
///
/// # Errors
/// [`InternalTopicError::Admin`] when the request cannot be made or gets no answer.
pub async fn delete_below(
    kafka: &KafkaSettings,
    topic: &str,
    next: &[(i32, i64)],
) -> Result<Vec<(i32, String)>, InternalTopicError> {
    if next.is_empty() {
        return Ok(Vec::new());
    }
    let admin: AdminClient<DefaultClientContext> = kafka
        .client_config()
        .create()
        .map_err(InternalTopicError::Admin)?;
    let mut list = TopicPartitionList::new();
    for (partition, offset) in next {
        list.add_partition_offset(topic, *partition, KafkaOffset::Offset(*offset))
            .map_err(InternalTopicError::Admin)?;
    }
    let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let done = admin
        .delete_records(&list, &options)
        .await
        .map_err(InternalTopicError::Admin)?;
    Ok(done
        .elements()
        .iter()
        .filter_map(|e| match e.error() {
            Ok(()) => None,
            Err(err) => Some((e.partition(), err.to_string())),
        })
        .collect())
}

/// Deletes `topics` (a deleted pipeline's internal topics); one that does not exist is as good.
/// Kafka finishes a deletion in its own time.
///
/// # Errors
/// [`InternalTopicError::Admin`] when the request cannot be made or gets no answer;
/// [`InternalTopicError::Refused`] for the first topic the cluster would not delete.
pub async fn delete_topics(
    kafka: &KafkaSettings,
    topics: &[String],
) -> Result<(), InternalTopicError> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = kafka
        .client_config()
        .create()
        .map_err(InternalTopicError::Admin)?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let results = admin
        .delete_topics(&names, &options)
        .await
        .map_err(InternalTopicError::Admin)?;
    for result in results {
        match result {
            Ok(topic) => tracing::info!(topic, "internal topic deleted"),
            Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => return Err(InternalTopicError::Refused { topic, code }),
        }
    }
    Ok(())
}

/// Creates `topic` with `partitions`, as [`ensure`] creates a missing one, for a reset to
/// seed: one that exists already is refused, since a seed must be the only thing written to it.
///
/// # Errors
/// [`InternalTopicError::Refused`] (`TopicAlreadyExists` among others);
/// [`InternalTopicError::Admin`].
pub async fn create_new(
    kafka: &KafkaSettings,
    topic: &str,
    partitions: usize,
) -> Result<(), InternalTopicError> {
    let admin: AdminClient<DefaultClientContext> = kafka
        .client_config()
        .create()
        .map_err(InternalTopicError::Admin)?;
    if partitions_if_any(kafka, topic).await?.is_some() {
        return Err(InternalTopicError::Refused {
            topic: topic.to_owned(),
            code: RDKafkaErrorCode::TopicAlreadyExists,
        });
    }
    create(&admin, topic, partitions).await
}

async fn partitions_if_any(
    kafka: &KafkaSettings,
    topic: &str,
) -> Result<Option<usize>, InternalTopicError> {
    match partitions(kafka, topic).await {
        Ok(n) => Ok(Some(n)),
        Err(TopicLookupError::Missing { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `topic`'s partitions (a metadata request off the runtime's threads).
pub(crate) async fn partitions(
    kafka: &KafkaSettings,
    topic: &str,
) -> Result<usize, TopicLookupError> {
    let (kafka, topics) = (kafka.clone(), vec![topic.to_owned()]);
    tokio::task::spawn_blocking(move || topic_partitions(&kafka, &topics, REQUEST_TIMEOUT))
        .await
        .unwrap_or_else(|join| {
            Err(TopicLookupError::Unavailable {
                topic: topic.to_owned(),
                reason: join.to_string(),
            })
        })
        .map(|counts| counts[0])
}

/// Creates `topic` with `partitions`, the cluster's replication factor and no retention by
/// time; one that another host created meanwhile is as good.
async fn create(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    partitions: usize,
) -> Result<(), InternalTopicError> {
    let new = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(-1))
        .set("retention.ms", "-1");
    let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let results = admin
        .create_topics([&new], &options)
        .await
        .map_err(InternalTopicError::Admin)?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(InternalTopicError::Refused { topic, code }),
        }
    }
    tracing::info!(topic, partitions, "internal topic created");
    Ok(())
}
