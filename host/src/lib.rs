//! Weir host: runs tenants' WebAssembly operators over Kafka with keyed state.
//!
//! - [`api`]       `weir serve`'s multi-tenant HTTP API: the routes for tenants, operators,
//!   pipelines, checkpoints and savepoints, state queries, logs, the status page; problem details
//! - [`runner`]    the reconcile loop of a `weir serve` host: runs the catalog's pipelines (each
//!   a consumer group member), restarts failed and changed ones, reports their status; and
//!   `runner::run` and `runner::run_stages`, which wire a run's adapters in
//! - [`catalog`]   the records every host shares in object storage: tenants, API keys,
//!   operator versions, pipelines' definitions and the hosts' reports, operators' log segments
//! - [`config`]    the settings tree read from TOML; validation reports every problem at once
//! - [`topology`]  a pipeline as a graph of stages: its shape checked, its stages ordered
//! - [`error`]     the crate's error kinds (invalid input, unavailable, corrupt, fenced, guest fault, internal)
//! - [`runtime`]   wasmtime engine, the single `bindgen!` site, instances, limits, WIT imports
//! - [`state`]     the `StateBackend` seam, key encoding, the `memory` backend and the
//!   disaggregated LSM backend (SST format, memtable, caches, tree, compaction, GC, manifest)
//! - [`checkpoints`] tools over stored checkpoints: savepoints, the portable export, the switch
//!   between backends, verify, state queries
//! - [`time`]      keyed timers and event-time watermarks (docs/time.md)
//! - [`pipeline`]  the consumer loop, shard opens and per-partition workers (batch → prefetch →
//!   invoke → emit → checkpoint), over the `Source` and `Output` traits of `pipeline::ports`
//! - [`source`]    the pipeline's source: Kafka consumer group member (rebalances, pause, seek,
//!   committed offsets, a queue per assigned partition), and `source::memory` for tests with no
//!   broker
//! - [`row`]       a table's row schema, as the `emit` import checks emits against it
//! - [`sink`]      the pipeline's outputs: Kafka producers (output and dead-letter topics,
//!   deliveries counted per partition, exactly-once transactions), the Iceberg table sink
//!   (`sink::iceberg`), and `sink::memory` for tests with no broker
//! - [`ids`]       the numbers that cross modules as types of their own: `Partition`,
//!   `Offset`, `ManifestVersion`
//! - [`health`]    `/healthz` and `/readyz`: liveness, readiness and the brokers' state
//! - [`clock`]     the injected clock seam (processing time for TTL)
//! - [`telemetry`] Prometheus metrics: the recorder and the labelled handles of a pipeline run
//! - [`fail_points`] named points where crash tests make the `weir` binary exit (inert unless armed)
//! - `testing`     (unit tests only) where the tests find the guest components
//! - `layering`    (unit tests only) the dependency direction below, checked
//! - `shape`       (unit tests only) no file over 600 lines, few functions over 80, checked
//!
//! Dependencies point one way: the core (`runtime`, `time`, `state`, `checkpoints`,
//! `pipeline`, over `config`, `topology`, `error`, `clock` and `row`) → the adapters
//! (`source`, `sink`) → what runs pipelines (`catalog`, then `runner`, `api`, `health`). The core names no adapter
//! and nothing above it; the backends (`state`) name none of the tools over their checkpoints
//! (`checkpoints`), which a pipeline's shard open calls; a pipeline runs over the traits of
//! `pipeline::ports`, and `runner::run` wires the Kafka and Iceberg adapters in. `layering`
//! checks it.
//!
//! The `weir` binary, its HTTP API client, its benchmarks and the development tooling
//! (`weir dev`, the flights loader) are the `weir-cli` package (`cli/`).

// A function longer than `too-many-lines-threshold` (clippy.toml: 80) does not build: one that
// long is a set of steps that want names. The few allowed say why where they are.
#![deny(clippy::too_many_lines)]

pub mod api;
pub mod catalog;
pub mod checkpoints;
pub mod clock;
pub mod config;
pub mod error;
pub mod fail_points;
pub mod health;
pub mod ids;
#[cfg(test)]
mod layering;
pub mod pipeline;
pub mod row;
pub mod runner;
pub mod runtime;
#[cfg(test)]
mod shape;
pub mod sink;
pub mod source;
pub mod state;
pub mod telemetry;
#[cfg(test)]
mod testing;
pub mod time;
pub mod topology;
