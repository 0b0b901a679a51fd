//! The rules a [`Settings`] must keep ([`Settings::validate`]), section by section: every broken
//! one is reported at once.

use super::ConfigError;
use super::{Delivery, PipelineTable, Settings, StateBackendKind, valid_topic};
use std::time::Duration;

impl Settings {
    /// Checks every rule and returns all broken ones.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] listing each problem.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.pipeline_problems(&mut problems);
        if self.pipeline.stages.is_empty() {
            self.run_problems(&mut problems);
        }
        self.interval_problems(&mut problems);
        self.delivery_problems(&mut problems);
        if self.pipeline.stages.is_empty() {
            self.topic_problems(&mut problems);
        } else {
            self.stage_problems(&mut problems);
        }
        problems.extend(self.kafka.problems("kafka"));
        problems.extend(self.iceberg.problems("iceberg"));
        if let Some(table) = &self.pipeline.iceberg {
            problems.extend(self.table_problems(table));
        }
        self.state_problems(&mut problems);
        self.runtime_problems(&mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid { problems })
        }
    }

    /// `pipeline.name`.
    fn pipeline_problems(&self, problems: &mut Vec<String>) {
        let p = &self.pipeline;
        if p.name.is_empty()
            || p.name.len() > 64
            || !p
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            problems.push(format!(
                "pipeline.name must be 1..=64 bytes of [A-Za-z0-9._-]. name=`{}`",
                p.name
            ));
        }
    }

    /// `pipeline.checkpoint_interval`: at least 10 ms.
    fn interval_problems(&self, problems: &mut Vec<String>) {
        let p = &self.pipeline;
        if p.checkpoint_interval < Duration::from_millis(10) {
            problems.push(format!(
                "pipeline.checkpoint_interval must be at least 10ms. checkpoint_interval={:?}",
                p.checkpoint_interval
            ));
        }
    }

    /// What one operator's run needs: in-flight records and event time within their ranges
    /// (a pipeline of stages checks each stage's run).
    pub(super) fn run_problems(&self, problems: &mut Vec<String>) {
        let p = &self.pipeline;
        if p.operator.as_os_str().is_empty() {
            problems.push(
                "pipeline.operator must name the operator's component (or pipeline.stages the stages')"
                    .to_owned(),
            );
        }
        if !(1..=1_000_000).contains(&p.in_flight_max) {
            problems.push(format!(
                "pipeline.in_flight_max must be 1..=1000000. value={}",
                p.in_flight_max
            ));
        }
        if p.max_out_of_orderness > Duration::from_secs(365 * 24 * 3600) {
            problems.push(format!(
                "pipeline.max_out_of_orderness must be at most 365 days. max_out_of_orderness={:?}",
                p.max_out_of_orderness
            ));
        }
        if p.idle_advance && p.idle_timeout.is_none() {
            problems.push("pipeline.idle_advance needs pipeline.idle_timeout".to_owned());
        }
        if p.idle_timeout
            .is_some_and(|t| t < Duration::from_millis(10))
        {
            problems.push(format!(
                "pipeline.idle_timeout must be at least 10ms. idle_timeout={:?}",
                p.idle_timeout
            ));
        }
    }

    /// `pipeline.tables`: each an input topic, into a named state, with a stream besides;
    /// `pipeline.global_tables`: none an input topic, each named once.
    fn table_input_problems(&self, problems: &mut Vec<String>) {
        let p = &self.pipeline;
        for (topic, state) in &p.tables {
            if !p.input_topics.contains(topic) {
                problems.push(format!(
                    "pipeline.tables: `{topic}` is not one of pipeline.input_topics (a table is an input read into state)"
                ));
            }
            if state.is_empty() || state.len() > 64 {
                problems.push(format!(
                    "pipeline.tables: the state of table `{topic}` must be 1..=64 bytes. state=`{state}`"
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (topic, name) in &p.global_tables {
            if p.input_topics.contains(topic) {
                problems.push(format!(
                    "pipeline.global_tables: `{topic}` is also one of pipeline.input_topics (a global table is read outside the consumer group, by every host)"
                ));
            }
            if name.is_empty() || name.len() > 64 {
                problems.push(format!(
                    "pipeline.global_tables: the name of table `{topic}` must be 1..=64 bytes. name=`{name}`"
                ));
            }
            if !names.insert(name) {
                problems.push(format!(
                    "pipeline.global_tables: two topics are read as table `{name}`"
                ));
            }
        }
        if !p.input_topics.is_empty() && p.input_topics.iter().all(|t| p.tables.contains_key(t)) {
            problems.push(
                "pipeline.input_topics must have a topic besides the tables: tables only fill state, the other inputs' records run the operator".to_owned(),
            );
        }
    }

    /// What the delivery mode needs: checkpoints, offsets committed with the state, and for
    /// exactly-once read-committed input and transactions that outlive an interval.
    fn delivery_problems(&self, problems: &mut Vec<String>) {
        let p = &self.pipeline;
        if p.delivery == Delivery::ExactlyOnce
            && self.state.backend == StateBackendKind::Memory
            && self.state.memory.url.is_none()
        {
            problems.push(
                "pipeline.delivery = \"exactly_once\" needs checkpoints: state.backend = \"lsm\", or state.memory.url for the memory backend's snapshots".to_owned(),
            );
        }
        let consumer = &self.kafka.consumer;
        if consumer
            .get("enable.auto.commit")
            .is_some_and(|v| v == "true")
        {
            problems.push(
                "kafka.consumer.\"enable.auto.commit\" must stay false: offsets are committed with the state, at checkpoints".to_owned(),
            );
        }
        if p.delivery == Delivery::ExactlyOnce
            && consumer
                .get("isolation.level")
                .is_some_and(|v| v != "read_committed")
        {
            problems.push(
                "kafka.consumer.\"isolation.level\" must stay read_committed with exactly_once (recovery reads stable committed offsets, and uncommitted input would be processed)".to_owned(),
            );
        }
        if let Some(timeout) = self.kafka.producer.get("transaction.timeout.ms") {
            let at_least = 2 * p.checkpoint_interval.as_millis();
            match timeout.parse::<u128>() {
                Ok(ms) if ms >= at_least => {}
                _ => problems.push(format!(
                    "kafka.producer.\"transaction.timeout.ms\" must be at least twice pipeline.checkpoint_interval ({at_least} ms): a transaction stays open for an interval. value=`{timeout}`"
                )),
            }
        }
        // The memory backend's snapshots, which checkpoints need (before the interval's rule,
        // as the report has always listed them).
        if let Some(Err(e)) = self.state.memory.url.as_deref().map(url::Url::parse) {
            problems.push(format!("state.memory.url is not a URL: {e}"));
        }
        if p.delivery == Delivery::ExactlyOnce && p.checkpoint_interval > Duration::from_secs(300) {
            problems.push(format!(
                "pipeline.checkpoint_interval must be at most 5min with exactly_once (a transaction stays open that long). checkpoint_interval={:?}",
                p.checkpoint_interval
            ));
        }
    }

    /// The pipeline's topics: valid Kafka names, an output unless a table takes the rows, no
    /// input also the output or the dead-letter topic.
    pub(super) fn topic_problems(&self, problems: &mut Vec<String>) {
        let p = &self.pipeline;
        if p.input_topics.is_empty() {
            problems.push("pipeline.input_topics must name at least one topic".to_owned());
        }
        self.table_input_problems(problems);
        if p.output_topic.is_none() && p.iceberg.is_none() {
            problems.push(
                "pipeline.output_topic is required unless pipeline.iceberg is set".to_owned(),
            );
        }
        for (field, topic) in p
            .input_topics
            .iter()
            .map(|t| ("pipeline.input_topics", t))
            .chain(p.output_topic.iter().map(|t| ("pipeline.output_topic", t)))
            .chain(p.outputs.values().map(|t| ("pipeline.outputs", t)))
            .chain(
                p.global_tables
                    .keys()
                    .map(|t| ("pipeline.global_tables", t)),
            )
            .chain([("pipeline.dead_letter_topic", &p.dead_letter_topic)])
        {
            if !valid_topic(topic) {
                problems.push(format!(
                    "{field} is not a valid Kafka topic name. topic=`{topic}`"
                ));
            }
        }
        if p.input_topics
            .iter()
            .chain(p.global_tables.keys())
            .any(|t| {
                p.output_topic.as_ref() == Some(t)
                    || p.outputs.values().any(|o| o == t)
                    || *t == p.dead_letter_topic
            })
        {
            problems.push("an input topic is also an output or the dead-letter topic".to_owned());
        }
        for name in p.outputs.keys() {
            if !crate::topology::valid_name(name) || name == crate::topology::DEFAULT_OUTPUT {
                problems.push(format!(
                    "pipeline.outputs: output names are 1..=64 bytes of [a-z0-9_-], not `default` (that is pipeline.output_topic). name=`{name}`"
                ));
            }
        }
        if p.output_topic
            .iter()
            .chain(p.outputs.values())
            .any(|t| *t == p.dead_letter_topic)
        {
            problems.push(format!(
                "an output goes to the dead-letter topic `{}`: results and dead letters would mix",
                p.dead_letter_topic
            ));
        }
        if !p.outputs.is_empty() && p.iceberg.is_some() {
            problems.push(
                "pipeline.outputs with pipeline.iceberg: named outputs go to topics, and a pipeline with a table does not write them yet".to_owned(),
            );
        }
    }

    /// `state`: the LSM's URL and sizes (the memory backend's URL is checked with the delivery).
    fn state_problems(&self, problems: &mut Vec<String>) {
        if self.state.backend == StateBackendKind::Lsm {
            let lsm = &self.state.lsm;
            match lsm.url.as_deref().map(url::Url::parse) {
                None => {
                    problems.push("state.lsm.url is required with backend = \"lsm\"".to_owned())
                }
                Some(Err(e)) => problems.push(format!("state.lsm.url is not a URL: {e}")),
                Some(Ok(_)) => {}
            }
            if lsm.memtable_bytes_max < 1024 {
                problems.push("state.lsm.memtable_bytes_max must be at least 1024".to_owned());
            }
            if !(64..=(4 << 20)).contains(&lsm.block_size_bytes) {
                problems.push("state.lsm.block_size_bytes must be 64..=4194304".to_owned());
            }
        }
    }

    /// `runtime`: batches, deadlines, memory, staged bytes, timers and instances within range.
    fn runtime_problems(&self, problems: &mut Vec<String>) {
        let r = &self.runtime;
        if !(1..=65_536).contains(&r.batch_records_max) {
            problems.push(format!(
                "runtime.batch_records_max must be 1..=65536. value={}",
                r.batch_records_max
            ));
        }
        if r.record_deadline < Duration::from_millis(1) {
            problems.push("runtime.record_deadline must be at least 1ms".to_owned());
        }
        if r.instance_memory_bytes_max < (1 << 20) {
            problems.push("runtime.instance_memory_bytes_max must be at least 1 MiB".to_owned());
        }
        if r.outage_backoff_min < Duration::from_millis(1) {
            problems.push("runtime.outage_backoff_min must be at least 1ms".to_owned());
        }
        let one_record = r.state_value_bytes_max
            + r.state_map_key_bytes_max
            + r.emit_bytes_per_record_max
            + (1 << 10);
        if r.batch_staged_bytes_max < one_record {
            problems.push(format!(
                "runtime.batch_staged_bytes_max must hold at least one largest write and one record's emits ({one_record} bytes). value={}",
                r.batch_staged_bytes_max
            ));
        }
        if !(1..=65_536).contains(&r.timers_per_key_max) {
            problems.push(format!(
                "runtime.timers_per_key_max must be 1..=65536. value={}",
                r.timers_per_key_max
            ));
        }
        if !(1..=65_536).contains(&r.timer_batch_max) {
            problems.push(format!(
                "runtime.timer_batch_max must be 1..=65536. value={}",
                r.timer_batch_max
            ));
        }
        if r.partition_queue_batches_max == 0 {
            problems.push("runtime.partition_queue_batches_max must be at least 1".to_owned());
        }
        if !(1..=64).contains(&r.partition_instances_max) {
            problems.push(format!(
                "runtime.partition_instances_max must be 1..=64. value={}",
                r.partition_instances_max
            ));
        }
    }

    /// What is wrong with `pipeline.iceberg`: its names and columns, and what the committer
    /// needs (a catalog and warehouse; checkpoints in a store it can read).
    fn table_problems(&self, table: &PipelineTable) -> Vec<String> {
        use crate::sink::iceberg::{TableSchema, check_table_name};
        let mut problems = Vec::new();
        for (field, name) in [
            ("pipeline.iceberg.namespace", &table.namespace),
            ("pipeline.iceberg.table", &table.table),
        ] {
            if let Err(e) = check_table_name(field, name) {
                problems.push(e.to_string());
            }
        }
        if let Err(e) = TableSchema::new(&table.columns) {
            problems.push(format!("pipeline.iceberg.columns: {e}"));
        }
        if self.iceberg.catalog_uri.is_none() || self.iceberg.warehouse.is_none() {
            problems.push(
                "pipeline.iceberg needs iceberg.catalog_uri and iceberg.warehouse".to_owned(),
            );
        }
        if self.state.backend == StateBackendKind::Memory && self.state.memory.url.is_none() {
            problems.push("pipeline.iceberg needs checkpoints in an object store the committer reads: state.backend = \"lsm\", or state.memory.url".to_owned());
        }
        problems
    }
}
