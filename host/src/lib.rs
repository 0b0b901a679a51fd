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
//! - `testing`     (unit tests only) where the tests find the guest components
//!
//! The `weir` binary, its benchmarks and the development tooling (`weir dev`, the flights loader)
//! are the `weir-cli` package (`cli/`).

pub mod api;
pub mod clock;
pub mod config;
pub mod error;
pub mod fail_points;
pub mod health;
pub mod pipeline;
pub mod runtime;
pub mod sink;
pub mod source;
pub mod state;
pub mod telemetry;
#[cfg(test)]
mod testing;
pub mod time;
