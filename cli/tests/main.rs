//! Tests of the host against the real broker and S3 server, most of them running `weir` as
//! separate processes (killed, frozen, rescaled, side by side); one module per scenario.

// Tests measure and wait in real time; the host's code reads time only through its clock seam
// (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod cli_hygiene;
mod crash_loop;
mod dev_input;
mod flight_weather_crash_loop;
mod iceberg_crash_loop;
mod lifecycle;
mod lsm_backend_on_s3;
mod operator_project;
mod readme_quick_start;
mod rescale;
mod serve_hosts;
mod settings_from_env;
mod short_runs;
mod slow_checkpoint;
mod stages_crash_loop;
mod zombie;
