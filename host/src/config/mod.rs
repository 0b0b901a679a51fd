//! The settings tree, read from TOML (`weir run --config weir.toml`) with environment
//! variables layered over it ([`env`]: `WEIR_KAFKA__BOOTSTRAP_SERVERS` and so on).
//!
//! Settings are passed down as values; nothing reads the environment deep in the code.
//! [`Settings::validate`] reports every problem at once rather than the first.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod env;
mod kafka;
mod lenient;
mod policy;
pub mod stages;
mod validate;
pub use env::EnvVars;
pub use kafka::{KafkaSecurity, KafkaSettings, SaslMechanism, SecurityProtocol};
pub(crate) use lenient::{client_properties, string_map};
pub use policy::{Delivery, FailurePolicy, LateRecords};

/// Everything one `weir run` needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The pipeline to run.
    pub pipeline: PipelineSettings,
    /// How to reach Kafka.
    pub kafka: KafkaSettings,
    /// Limits and batching of the Wasm runtime.
    #[serde(default)]
    pub runtime: RuntimeSettings,
    /// The state backend.
    #[serde(default)]
    pub state: StateSettings,
    /// The Iceberg catalog and warehouse (`[iceberg]`), for a pipeline with a table
    /// (`pipeline.iceberg`, docs/iceberg.md).
    #[serde(default)]
    pub iceberg: crate::sink::iceberg::LakehouseSettings,
}

/// One pipeline: input topic(s) → operator → output topic and/or Iceberg table; or, with
/// `stages`, a graph of operators ([`stages`]), whose fields then replace `operator`,
/// `input_topics`, `output_topic` and `iceberg`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSettings {
    /// A name for logs and the default consumer group, 1..=64 bytes of `[A-Za-z0-9._-]`.
    pub name: String,
    /// Path to the operator component (`.wasm`, a `wasm32-wasip2` component); required unless
    /// `stages` is set.
    #[serde(default)]
    pub operator: PathBuf,
    /// Topics to consume; co-partitioned when more than one (their partition `p` share shard
    /// `p`); required unless `stages` is set.
    #[serde(default)]
    pub input_topics: Vec<String>,
    /// Topic that receives the operator's emits. May be left out when `iceberg` is set: the
    /// emits then go only to the table.
    #[serde(default)]
    pub output_topic: Option<String>,
    /// Topic that receives rejected records and records whose call trapped, with the error in
    /// the `weir.error` header.
    pub dead_letter_topic: String,
    /// Kafka consumer group id; defaults to `weir-{name}`.
    #[serde(default)]
    pub group_id: Option<String>,
    /// How often each shard checkpoints its state together with its input offsets (as Flink's
    /// `execution.checkpointing.interval`); default 10 s. A shorter interval means less input
    /// re-read after a crash and more manifests written.
    #[serde(default = "default_checkpoint_interval", with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// What the output guarantees after a failure (as Kafka Streams' `processing.guarantee`);
    /// state is exactly-once either way.
    #[serde(default)]
    pub delivery: Delivery,
    /// Most records of one partition admitted and not finished (as Flink's
    /// `execution.async-state.in-flight-records-limit`); default 4096. Records with the same
    /// key run one after another in input order; records with other keys run in other batches
    /// while one waits for state (the execution controller, docs/checkpoints.md). A checkpoint
    /// waits for them all to finish.
    #[serde(default = "default_in_flight_max")]
    pub in_flight_max: usize,
    /// What a record whose call fails for good does (it trapped, broke a limit or ran past its
    /// deadline, alone in its call): default `dead_letter`. Records the operator rejects are
    /// dead-lettered whatever this says.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// How far behind the highest record timestamp seen the event-time watermark stays (as
    /// Flink's `WatermarkStrategy.forBoundedOutOfOrderness`); default 0. A record whose
    /// timestamp is behind the watermark is late (docs/time.md).
    #[serde(default, with = "humantime_serde")]
    pub max_out_of_orderness: Duration,
    /// A co-partitioned input topic with no record for this long stops holding the shard's
    /// watermark back (as Flink's `withIdleness`); default none: never idle. A shard Weir
    /// itself holds back (a full queue, a state outage) never goes idle.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// With `idle_timeout`: once every input of a shard is idle, its watermark follows
    /// processing time less `max_out_of_orderness`, so that the last windows of a stream that
    /// went silent close. Default false: only records move the watermark.
    #[serde(default)]
    pub idle_advance: bool,
    /// What a record at or before the watermark (late) does; default `process`.
    #[serde(default)]
    pub late_records: LateRecords,
    /// An Apache Iceberg table that receives the operator's emits too, exactly once, in the
    /// catalog and warehouse of `[iceberg]` (docs/iceberg.md); default none.
    #[serde(default)]
    pub iceberg: Option<PipelineTable>,
    /// The stages of a pipeline of more than one step (`[[pipeline.stages]]`,
    /// docs/topologies.md); default none: the one operator above.
    #[serde(default)]
    pub stages: Vec<stages::StageSettings>,
    /// Set by a pipeline of stages for each stage's run ([`stages::Edges`]); none in a file.
    #[serde(skip)]
    pub edges: stages::Edges,
    /// Where the operator's named outputs go (`weir:operator@0.3.0`'s `emit-to`): output name
    /// → topic, one for every output the operator declares (a pipeline whose operator declares
    /// one it leaves out, or that binds one the operator does not declare, refuses to start).
    /// Default none: the operator's `default` output alone, to `output_topic`.
    #[serde(default)]
    pub outputs: BTreeMap<String, String>,
    /// The operator's parameters (`weir:operator/parameters`): name → value, as
    /// `rpk transform deploy --var`. Default none.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Input topics read as tables (docs/topologies.md, "Tables"): topic → the value state its
    /// records fill, keyed by the record's key (an empty or null value deletes). Each topic is
    /// one of `input_topics` (co-partitioned with the others, as a Kafka Streams KTable) and
    /// the operator declares the state; a shard loads its partition of each to the end before
    /// any stream record runs, and the tables never hold the watermark back. In `stages`, an
    /// input's `table`. Default none.
    #[serde(default)]
    pub tables: BTreeMap<String, String>,
    /// Topics read as global tables (docs/topologies.md, "Global tables"): topic → the table's
    /// name, which the operator reads by any key with `weir:operator/tables.get`. Every host
    /// that runs the pipeline holds the whole table (all partitions, read outside the consumer
    /// group, as a Kafka Streams GlobalKTable) and loads it to the end before the pipeline
    /// consumes; later updates apply as they arrive, not in step with the stream. Not one of
    /// `input_topics`. In `stages`, an input's `global_table`. Default none.
    #[serde(default)]
    pub global_tables: BTreeMap<String, String>,
}

/// A `weir run` pipeline's Iceberg table (`[pipeline.iceberg]`): each emit is a JSON object
/// of its columns. Created if missing at `{iceberg.warehouse}/{namespace}/{table}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineTable {
    /// The table's namespace in the catalog, 1..=128 bytes of `[a-z0-9_]`; default `weir`.
    #[serde(default = "default_table_namespace")]
    pub namespace: String,
    /// The table's name, 1..=128 bytes of `[a-z0-9_]`.
    pub table: String,
    /// Its columns, in order (1..=256): `{ name, type, required }`.
    pub columns: Vec<crate::sink::iceberg::ColumnSpec>,
}

fn default_table_namespace() -> String {
    "weir".to_owned()
}

fn default_checkpoint_interval() -> Duration {
    Duration::from_secs(10)
}

/// `pipeline.in_flight_max` when not set.
pub const DEFAULT_IN_FLIGHT_MAX: usize = 4096;

/// librdkafka's default `message.max.bytes`: the default of `emit_bytes_per_record_max`, and
/// the producer's limit when `kafka.producer` sets none.
pub const PRODUCER_MESSAGE_BYTES_DEFAULT: u64 = 1_000_000;

fn default_in_flight_max() -> usize {
    DEFAULT_IN_FLIGHT_MAX
}

impl PipelineSettings {
    /// The consumer group id: `group_id`, or `weir-{name}`.
    pub fn group_id(&self) -> String {
        self.group_id
            .clone()
            .unwrap_or_else(|| format!("weir-{}", self.name))
    }
}

/// Batching and per-call limits of the Wasm runtime.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSettings {
    /// Most records passed to one guest call (1..=65536).
    pub batch_records_max: usize,
    /// CPU deadline per record; a batch call gets this times its record count.
    #[serde(with = "humantime_serde")]
    pub record_deadline: Duration,
    /// Cap on a batch call's CPU deadline; a batch (or part of one) that hits it is re-run one
    /// record at a time, each with the full `record_deadline`, so the cap delays good records
    /// but never fails them.
    #[serde(with = "humantime_serde")]
    pub batch_deadline_max: Duration,
    /// Wall-clock time a call may take beyond twice its CPU deadline, for state reads that wait
    /// on storage; a call past it is ended as a deadline trap.
    #[serde(with = "humantime_serde")]
    pub call_io_allowance: Duration,
    /// Bytes of state writes and emits one call may stage (keys, values, headers, plus 64 bytes
    /// per entry); a call that stages more traps.
    pub batch_staged_bytes_max: u64,
    /// First retry delay after a state backend outage; doubles per failed attempt up to 5 s.
    #[serde(with = "humantime_serde")]
    pub outage_backoff_min: Duration,
    /// How long shutdown waits for partition workers to finish their queued records before
    /// stopping them unfinished (nothing is lost: their offsets are not committed).
    #[serde(with = "humantime_serde")]
    pub shutdown_drain_max: Duration,
    /// Linear memory cap per instance, bytes.
    pub instance_memory_bytes_max: usize,
    /// Bytes (keys, values, headers, plus 64 bytes per entry) one input record may emit in
    /// all; default 1,000,000, librdkafka's default `message.max.bytes`. Each emit must also
    /// fit the output topic as Kafka counts it: the smaller of the producer's
    /// `message.max.bytes` and the topic's `max.message.bytes`, read when the pipeline starts.
    pub emit_bytes_per_record_max: u64,
    /// Largest state value, bytes.
    pub state_value_bytes_max: u64,
    /// Largest map-state key, bytes.
    pub state_map_key_bytes_max: u64,
    /// Log lines (WIT `log` plus stdout/stderr lines) one instance may write per second; the
    /// excess is dropped and counted.
    pub log_lines_per_second_max: u32,
    /// Batches queued per partition between the consumer and the partition's worker.
    pub partition_queue_batches_max: usize,
    /// Operator instances per partition, so that many batches (of different keys) run at once
    /// while others wait for state; 1..=64, default 4. Created on demand from the pooling
    /// allocator, which holds 256 per host: a partition that cannot get another one runs with
    /// those it has.
    pub partition_instances_max: usize,
    /// Timers one key may have at once (1..=65536, default 1024); a `timers.set` of a new name
    /// beyond it fails with `too-many-timers` (moving a timer never does).
    pub timers_per_key_max: u32,
    /// Most fired timers passed to one `on-timers` call (1..=65536, default 512). Due timers
    /// fire in rounds of one such call, interleaved with records: a checkpoint waits for at
    /// most one round, however many timers are due.
    pub timer_batch_max: usize,
    /// Where compiled components are kept (wasmtime's serialized form, one file per component
    /// and engine configuration), so that a restarted host loads its operator in milliseconds
    /// instead of compiling it again (~0.1 s for a Rust operator, ~8 s of CPU for a Python one);
    /// created when missing. Unset (the default): compiled at every start. As wasmtime's own
    /// cache, the directory is trusted: only this host may write to it
    /// ([`crate::runtime::Runtime::with_compiled_dir`]).
    pub compiled_dir: Option<PathBuf>,
    /// Most bytes `compiled_dir` may hold (default 2 GiB; a Python component's compiled form
    /// is ~36 MB, a Rust one's well under 1 MB): each compiled file written deletes the least
    /// recently used ones past it, files of other engine configurations included.
    pub compiled_dir_bytes_max: u64,
    /// Object-store requests this host has in flight at most, over every store it opens (the
    /// state, checkpoints, tables, the catalog): a host's, set from its own `[runtime]` at
    /// start (a pipeline's limits do not change it). Default 64: enough for the state reads of
    /// many partitions to overlap; few enough that a degraded store is not buried
    /// (docs/reliability.md, `host/src/state/store_guard.rs`).
    pub store_requests_in_flight_max: usize,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        Self {
            batch_records_max: 512,
            record_deadline: Duration::from_millis(100),
            batch_deadline_max: Duration::from_secs(2),
            call_io_allowance: Duration::from_secs(5),
            outage_backoff_min: Duration::from_millis(50),
            shutdown_drain_max: Duration::from_secs(30),
            batch_staged_bytes_max: 64 << 20,
            instance_memory_bytes_max: 64 << 20,
            emit_bytes_per_record_max: PRODUCER_MESSAGE_BYTES_DEFAULT,
            state_value_bytes_max: 1 << 20,
            state_map_key_bytes_max: 4 << 10,
            log_lines_per_second_max: 100,
            partition_queue_batches_max: 4,
            partition_instances_max: 4,
            timers_per_key_max: 1024,
            timer_batch_max: 512,
            compiled_dir: None,
            compiled_dir_bytes_max: 2 << 30,
            store_requests_in_flight_max: crate::state::store_guard::REQUESTS_IN_FLIGHT_MAX,
        }
    }
}

/// Which state backend holds keyed state.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateSettings {
    /// The backend.
    pub backend: StateBackendKind,
    /// Settings of the `lsm` backend (ignored by `memory`).
    pub lsm: LsmStateSettings,
    /// Settings of the `memory` backend (ignored by `lsm`).
    pub memory: MemoryStateSettings,
}

/// The `memory` backend's checkpoint storage (as Flink's `state.checkpoints.dir` for its
/// HashMapStateBackend): each checkpoint writes a full snapshot of the shard there.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryStateSettings {
    /// The object store for snapshots: `file:///absolute/dir`, `s3://bucket/prefix` or
    /// `memory:///`. Unset: no checkpoints; a restarted pipeline rebuilds its state from the
    /// consumer group's start position.
    pub url: Option<String>,
    /// `object_store` options for the URL's scheme (as `state.lsm.options`).
    #[serde(deserialize_with = "lenient::string_map")]
    pub options: BTreeMap<String, String>,
}

/// State backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackendKind {
    /// A map per shard in RAM, as Flink's HashMapStateBackend; durable when `state.memory.url`
    /// names checkpoint storage (a full snapshot per checkpoint).
    #[default]
    Memory,
    /// The disaggregated LSM tree: SSTs in object storage, RAM and local disk as caches (as
    /// Flink 2.0's ForSt backend).
    Lsm,
}

/// The `lsm` backend: where state lives and how much RAM and disk cache it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LsmStateSettings {
    /// The object store: `file:///absolute/dir`, `s3://bucket/prefix` or `memory:///`.
    /// Required with `backend = "lsm"`.
    pub url: Option<String>,
    /// `object_store` options for the URL's scheme, e.g. `aws_endpoint`,
    /// `aws_allow_http`, `aws_access_key_id`, `aws_secret_access_key`, `aws_region`. For an
    /// `s3://` URL, the standard `AWS_*` variables fill in what this does not set
    /// ([`store_options_with_env`]).
    #[serde(deserialize_with = "lenient::string_map")]
    pub options: BTreeMap<String, String>,
    /// Memtable size that triggers a flush, bytes (as RocksDB's `write_buffer_size`).
    pub memtable_bytes_max: usize,
    /// Target raw size of a data block, bytes (as RocksDB's `block_size`).
    pub block_size_bytes: usize,
    /// Memory block cache shared by every shard of the host, bytes; 0 turns it off.
    pub block_cache_bytes: u64,
    /// Local disk cache shared by every shard of the host, bytes; 0 turns it off.
    pub disk_cache_bytes: u64,
    /// Where the disk cache keeps its files (a fresh subdirectory, removed at exit); the
    /// system temporary directory when unset.
    pub disk_cache_dir: Option<PathBuf>,
    /// Pace of the scrub that reads every block a recovered checkpoint handed on, once, in
    /// the background, bytes per second; 0 turns it off (GC then keeps every checkpoint that
    /// existed at the claim for as long as the shard is open). docs/checkpoints.md,
    /// "Corruption".
    pub scrub_bytes_per_second: u64,
}

impl Default for LsmStateSettings {
    fn default() -> Self {
        Self {
            url: None,
            options: BTreeMap::new(),
            memtable_bytes_max: 64 << 20,
            block_size_bytes: 64 << 10,
            block_cache_bytes: 256 << 20,
            disk_cache_bytes: 1 << 30,
            disk_cache_dir: None,
            scrub_bytes_per_second: 16 << 20,
        }
    }
}

/// `options` for the object store at `url`, with, for an `s3://` URL, every standard `AWS_*`
/// variable of `env` that `object_store` knows (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, and the
/// web-identity role of a Kubernetes service account: `AWS_WEB_IDENTITY_TOKEN_FILE`,
/// `AWS_ROLE_ARN`) for each option `options` does not set — as `AmazonS3Builder::from_env`,
/// but passed down as values. Instance and container credentials need no variable.
pub fn store_options_with_env(
    url: &str,
    options: &BTreeMap<String, String>,
    env: &EnvVars,
) -> BTreeMap<String, String> {
    use object_store::aws::AmazonS3ConfigKey;
    let mut options = options.clone();
    if url.starts_with("s3://") || url.starts_with("s3a://") {
        // Compared as keys, not names: `aws_endpoint` in the file and `AWS_ENDPOINT_URL` in
        // the environment are one option, and the file's wins.
        let mut set: Vec<AmazonS3ConfigKey> =
            options.keys().filter_map(|k| k.parse().ok()).collect();
        let mut vars: Vec<_> = env
            .iter()
            .filter(|(name, _)| name.starts_with("AWS_"))
            .collect();
        vars.sort();
        for (name, value) in vars {
            let key = name.to_ascii_lowercase();
            if let Ok(parsed) = key.parse::<AmazonS3ConfigKey>()
                && !set.contains(&parsed)
            {
                set.push(parsed);
                options.insert(key, value.to_owned());
            }
        }
    }
    options
}

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file. path=`{path}`")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file, with the environment's settings over it, does not make the settings.
    #[error("cannot parse config file. path=`{path}`: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The error: the key, and the file or environment variable its value came from.
        #[source]
        source: Box<figment::Error>,
    },
    /// The settings parse but break rules; every problem is listed.
    #[error("invalid settings: {}", problems.join("; "))]
    Invalid {
        /// One line per problem.
        problems: Vec<String>,
    },
}

/// The top-level fields of [`Settings`]: the sections environment variables may set.
const SECTIONS: &[&str] = &["pipeline", "kafka", "runtime", "state", "iceberg"];

impl Settings {
    /// Reads settings from a TOML file with the settings variables of `env` over it ([`env`]),
    /// reads the secrets files they name, fills the object-store options in from `env`'s
    /// `AWS_*` variables ([`store_options_with_env`]), and validates them.
    ///
    /// # Errors
    /// [`ConfigError`] when the file is unreadable, does not parse (with the environment), or
    /// breaks a rule.
    pub fn load(path: &Path, env: &EnvVars) -> Result<Self, ConfigError> {
        let settings: Settings = env::load(path, env, SECTIONS)?;
        settings.resolve(env)
    }

    /// Parses and validates settings from TOML text, without the environment.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] or [`ConfigError::Invalid`].
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_toml_with_env(text, &EnvVars::default())
    }

    /// [`Settings::load`] from TOML text.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] or [`ConfigError::Invalid`].
    pub fn from_toml_with_env(text: &str, env: &EnvVars) -> Result<Self, ConfigError> {
        let settings: Settings = env::from_toml(text, env, SECTIONS)?;
        settings.resolve(env)
    }

    fn resolve(mut self, env: &EnvVars) -> Result<Self, ConfigError> {
        if let Err(problem) = self.kafka.security.load_secrets("kafka.security") {
            return Err(ConfigError::Invalid {
                problems: vec![crate::error::Chain(&problem).to_string()],
            });
        }
        if let Some(url) = &self.state.lsm.url {
            self.state.lsm.options = store_options_with_env(url, &self.state.lsm.options, env);
        }
        if let Some(url) = &self.state.memory.url {
            self.state.memory.options =
                store_options_with_env(url, &self.state.memory.options, env);
        }
        if let Some(url) = &self.iceberg.warehouse {
            self.iceberg.options = store_options_with_env(url, &self.iceberg.options, env);
        }
        self.validate()?;
        Ok(self)
    }
}

/// Kafka's rule: 1..=249 bytes of `[A-Za-z0-9._-]`, not `.` or `..`.
fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests;
