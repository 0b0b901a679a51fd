//! The checks of a run's topics before it starts: the tenant's topics a pipeline names exist,
//! its input topics are co-partitioned, and how many shards a pipeline of stages has.

use super::METADATA_TIMEOUT;
use super::job::RunFailure;
use crate::config::Settings;
use crate::config::stages::StagePlan;
use crate::error::ErrorKind;

/// The shards of a pipeline of stages (`plan`): each stage's partitions, summed (an internal
/// topic has its output's `partitions`, or as many as the stage that writes it reads). Every
/// topic of the tenant's it names is checked as [`check_topics`] checks a one-operator
/// pipeline's; the internal topics are the stages' run's to create.
pub(super) async fn check_stage_topics(
    plan: &StagePlan,
    tenant: &str,
) -> Result<usize, RunFailure> {
    let internal: std::collections::BTreeSet<&str> =
        plan.internal.iter().map(|t| t.name.as_str()).collect();
    let mut partitions: std::collections::BTreeMap<String, usize> = Default::default();
    for run in &plan.runs {
        let mut own = run.settings.clone();
        let p = &mut own.pipeline;
        p.input_topics.retain(|t| !internal.contains(t.as_str()));
        p.output_topic = p
            .output_topic
            .take()
            .filter(|t| !internal.contains(t.as_str()));
        p.outputs.retain(|_, t| !internal.contains(t.as_str()));
        let n = check_topics(&own, tenant)
            .await
            .map_err(|f| RunFailure::new(f.kind, format!("stage `{}`: {}", run.stage, f.reason)))?;
        for topic in &own.pipeline.input_topics {
            partitions.insert(topic.clone(), n);
        }
    }
    for topic in &plan.internal {
        let n = match topic.partitions {
            Some(n) => usize::try_from(n).unwrap_or(1),
            None => partitions.get(&topic.like).copied().unwrap_or(1),
        };
        partitions.insert(topic.name.clone(), n);
    }
    Ok(plan
        .runs
        .iter()
        .filter_map(|run| partitions.get(run.settings.pipeline.input_topics.first()?))
        .sum())
}

/// The number of partitions of the pipeline's input topics; fails, naming it, when one of the
/// pipeline's topics does not exist in the cluster, or when its input topics (co-partitioned:
/// partition `p` of each is shard `p`) do not all have the same number of partitions.
pub(super) async fn check_topics(settings: &Settings, tenant: &str) -> Result<usize, RunFailure> {
    let kafka = settings.kafka.clone();
    let p = &settings.pipeline;
    let inputs = p.input_topics.clone();
    let mut topics = inputs.clone();
    topics.extend(p.output_topic.clone());
    // A global table's topic must exist too; it need not be co-partitioned with the inputs.
    topics.extend(p.global_tables.keys().cloned());
    topics.push(p.dead_letter_topic.clone());
    let prefix = format!("{tenant}.");
    tokio::task::spawn_blocking(move || {
        use crate::source::kafka::broker::{TopicLookupError, topic_partitions};
        let name = |topic: &str| topic.strip_prefix(&prefix).unwrap_or(topic).to_owned();
        let counts = topic_partitions(&kafka, &topics, METADATA_TIMEOUT).map_err(|e| match e {
            TopicLookupError::Client(e) => RunFailure::new(
                ErrorKind::InvalidInput,
                format!("cannot create a Kafka client: {e}"),
            ),
            TopicLookupError::Unavailable { topic, reason } => RunFailure::new(
                ErrorKind::Unavailable,
                format!(
                    "cannot read the metadata of topic `{}`: {reason}",
                    name(&topic)
                ),
            ),
            TopicLookupError::Missing { topic } => RunFailure::new(
                ErrorKind::InvalidInput,
                format!(
                    "topic `{}` (Kafka topic `{topic}`) does not exist; create it first",
                    name(&topic)
                ),
            ),
        })?;
        let input_partitions: Vec<(String, usize)> = topics
            .iter()
            .zip(counts)
            .filter(|(topic, _)| inputs.contains(topic))
            .map(|(topic, n)| (name(topic), n))
            .collect();
        if input_partitions
            .iter()
            .any(|(_, n)| *n != input_partitions[0].1)
        {
            let each: Vec<String> = input_partitions
                .iter()
                .map(|(topic, n)| format!("`{topic}` has {n}"))
                .collect();
            return Err(RunFailure::new(
                ErrorKind::InvalidInput,
                format!(
                    "the input topics are co-partitioned and must have as many partitions each: {}",
                    each.join(", ")
                ),
            ));
        }
        Ok(input_partitions.first().map_or(0, |(_, n)| *n))
    })
    .await
    .unwrap_or_else(|e| {
        Err(RunFailure::new(
            ErrorKind::Internal,
            format!("the topic check panicked: {e}"),
        ))
    })
}
