//! The end-to-end and fault-injection tests against the real broker and S3 server, one module
//! per area (`cargo test -p weir-tests --test end_to_end <module>::` runs one area). The runs
//! over all the flights are in `full_flights.rs`, a binary of their own.

// Tests measure and wait in real time; the host's code reads time only through its clock seam
// (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod api;
mod api_backend_switch;
mod api_memory_state;
mod api_pipelines;
mod api_savepoints;
mod api_schema_evolution;
mod api_stage_repeats;
mod api_stages;
mod api_state_query;
mod api_tables;
mod api_tenant_isolation;
mod bench;
mod checkpoint_recovery;
mod corrupt_checkpoints;
mod dead_letters;
mod disaster_recovery;
mod execution_controller;
mod failure_handling;
mod flights_loader;
mod iceberg_pipeline;
mod iceberg_table;
mod idle_advance;
mod k8s_manifests;
mod kafka_source;
mod partitioning;
mod recovery_outage;
mod runtime_sandbox;
mod s3_conditional_put;
mod secure_kafka;
mod stages;
mod state_outage;
mod status_page;
mod table_inputs;
