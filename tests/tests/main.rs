//! The end-to-end and fault-injection tests against the real broker and S3 server, one module
//! per area (`cargo test -p weir-tests <module>::` runs one area).

mod airport_end_to_end;
mod api;
mod api_pipelines;
mod bench;
mod checkpoint_recovery;
mod dead_letters;
mod execution_controller;
mod failure_handling;
mod flights_end_to_end;
mod flights_loader;
mod k8s_manifests;
mod recovery_outage;
mod runtime_sandbox;
mod s3_conditional_put;
mod state_outage;
mod status_page;
