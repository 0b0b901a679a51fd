//! `weir operator|pipeline|tenant`: the HTTP API's command-line client (tables, or `--json`).

use anyhow::Context as _;
use clap::Subcommand;
use std::io::Write as _;
use std::path::PathBuf;

/// `println!` for a command's output: a reader gone (`weir … | head`) ends the command
/// quietly, as `cat` does, instead of panicking on the broken pipe.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::client::write_out(format_args!($($arg)*), true) };
}

/// `print!` for a command's output, as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::client::write_out(format_args!($($arg)*), false) };
}

/// Writes `args` (and a newline) to stdout; a closed pipe exits the process with success,
/// any other write error with 1.
pub(crate) fn write_out(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_fmt(args).and_then(|()| {
        if newline {
            stdout.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            std::process::exit(1);
        }
    }
}

pub mod api;
mod pipeline;
mod state;
mod text;
pub use api::{ApiClient, ClientError};
pub use pipeline::{PipelineCommand, SavepointCommand, pipeline};
pub use state::{StateCommand, state};
pub use text::{
    log_line, operators_table, pipeline_status_text, pipelines_table, savepoints_table,
    tenants_table, versions_table,
};

/// Where the API is and which key to use.
#[derive(Debug, clap::Args)]
pub struct ApiArgs {
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

/// `weir operator …`.
#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
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

/// `--failure-policy`: what a record whose call fails for good (it trapped, broke a limit or
/// ran past its deadline, alone in its call) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum FailurePolicyArg {
    /// Send it to the dead-letter topic with the error, and go on.
    DeadLetter,
    /// Drop it (counted), and go on.
    Skip,
    /// Stop the pipeline (it is failed, with the record named).
    Fail,
}

/// `--delivery`: what the output guarantees after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum DeliveryArg {
    /// Outputs since the last checkpoint may repeat after a failure.
    AtLeastOnce,
    /// Kafka transactions: `read_committed` consumers see each output once.
    ExactlyOnce,
}

/// The name of a value as the command line and the API spell it.
fn value_name(value: &impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// `--state-backend`: where the pipeline's keyed state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum StateBackendArg {
    /// In the RAM of the hosts that run it, within `--state-bytes-max`; each checkpoint
    /// writes a full snapshot.
    Memory,
    /// The LSM tree on object storage, RAM and disk as caches: state of any size.
    Lsm,
}

impl StateBackendArg {
    fn name(self) -> String {
        value_name(&self)
    }
}

impl FailurePolicyArg {
    fn name(self) -> String {
        value_name(&self)
    }
}

impl DeliveryArg {
    fn name(self) -> String {
        value_name(&self)
    }
}

/// `weir tenant …`.
#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant.
    Create {
        /// The tenant id (1..=32 bytes of [a-z0-9-]).
        id: String,
        /// A display name.
        #[arg(long)]
        name: Option<String>,
    },
    /// List the tenants.
    Ls,
    /// Create an API key for a tenant; it is printed once.
    Key {
        /// The tenant id.
        id: String,
    },
}

/// Runs `weir operator …`.
///
/// # Errors
/// The API's error (its status and message), or a file that cannot be read.
pub async fn operator(command: OperatorCommand, args: ApiArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(&args.api, &args.key);
    match command {
        OperatorCommand::Push { name, file } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let version = client.push_operator(&name, bytes).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&version)?);
            } else {
                out!("{}", versions_table(std::slice::from_ref(&version)));
            }
        }
        OperatorCommand::Ls { name: None } => {
            let operators = client.operators().await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&operators)?);
            } else {
                out!("{}", operators_table(&operators));
            }
        }
        OperatorCommand::Ls { name: Some(name) } => {
            let versions = client.operator_versions(&name).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&versions)?);
            } else {
                out!("{}", versions_table(&versions));
            }
        }
        OperatorCommand::Rm { name, version } => {
            client.delete_operator_version(&name, version).await?;
            if !args.json {
                outln!("deleted {name} version {version}");
            }
        }
    }
    Ok(())
}

/// Runs `weir tenant …`.
///
/// # Errors
/// The API's error (its status and message).
pub async fn tenant(command: TenantCommand, args: ApiArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(&args.api, &args.key);
    match command {
        TenantCommand::Create { id, name } => {
            let tenant = client.create_tenant(&id, name.as_deref()).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&tenant)?);
            } else {
                outln!("created tenant {} ({})", tenant.id, tenant.name);
            }
        }
        TenantCommand::Ls => {
            let tenants = client.tenants().await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&tenants)?);
            } else {
                out!("{}", tenants_table(&tenants));
            }
        }
        TenantCommand::Key { id } => {
            let key = client.create_api_key(&id).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&key)?);
            } else {
                outln!("{}", key.key);
                eprintln!(
                    "API key {} for tenant {id}; it is shown only now",
                    key.record.key_id
                );
            }
        }
    }
    Ok(())
}
