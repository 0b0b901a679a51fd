//! `weir pipeline …`: a tenant's pipelines through the API — create (from options or a spec
//! file), status, checkpoints, savepoints, resets, switches and changes, logs, verify.

use super::*;

/// `weir pipeline …`.
#[derive(Debug, Subcommand)]
pub enum PipelineCommand {
    /// Create a pipeline and start it: your topic names (the API scopes them to you).
    Create {
        /// The pipeline's name.
        name: String,
        /// The whole definition from a JSON file, as the API takes it (`POST
        /// /v1/pipelines/{name}`; a pipeline of stages is one: docs/api.md), instead of the
        /// options below.
        #[arg(long, value_name = "FILE", conflicts_with_all = [
            "operator", "inputs", "output", "dead_letter", "checkpoint_interval_ms",
            "in_flight_max", "failure_policy", "delivery", "state_backend", "state_bytes_max",
            "from_savepoint",
        ])]
        spec: Option<std::path::PathBuf>,
        /// `operator:version`, e.g. `counter:1`.
        #[arg(long, required_unless_present = "spec")]
        operator: Option<String>,
        /// An input topic (repeat for co-partitioned topics).
        #[arg(long = "input", required_unless_present = "spec")]
        inputs: Vec<String>,
        /// The output topic.
        #[arg(long, required_unless_present = "spec")]
        output: Option<String>,
        /// The dead-letter topic.
        #[arg(long, required_unless_present = "spec")]
        dead_letter: Option<String>,
        /// Checkpoint interval, ms.
        #[arg(long, default_value_t = 10_000)]
        checkpoint_interval_ms: u64,
        /// Records of one partition in flight at once.
        #[arg(long, default_value_t = 4096)]
        in_flight_max: u64,
        /// What a record whose call fails for good does.
        #[arg(long, value_enum, default_value_t = FailurePolicyArg::DeadLetter)]
        failure_policy: FailurePolicyArg,
        /// What the output guarantees after a failure (state is exactly-once either way).
        #[arg(long, value_enum, default_value_t = DeliveryArg::AtLeastOnce)]
        delivery: DeliveryArg,
        /// Where its keyed state lives.
        #[arg(long, value_enum, default_value_t = StateBackendArg::Lsm)]
        state_backend: StateBackendArg,
        /// The most state a `memory` pipeline may hold, bytes, over all its partitions
        /// (default: the service's `pipeline_state_bytes_max`).
        #[arg(long)]
        state_bytes_max: Option<u64>,
        /// Start from a savepoint of one of your pipelines, `pipeline/savepoint`: its state and
        /// input offsets are copied in first (same topics and partition counts; a savepoint of
        /// the other state backend is converted on the way).
        #[arg(long)]
        from_savepoint: Option<String>,
    },
    /// Take, list or delete a pipeline's savepoints: named copies of a checkpoint of every
    /// partition, kept until deleted, to reset to or to create a pipeline from.
    #[command(subcommand)]
    Savepoint(SavepointCommand),
    /// Reset a stopped pipeline's state and input offsets to a savepoint; start it afterwards.
    Reset {
        /// The pipeline's name.
        name: String,
        /// The savepoint's name.
        #[arg(long)]
        savepoint: String,
        /// The pipeline the savepoint was taken of (default: this one).
        #[arg(long)]
        from: Option<String>,
    },
    /// List your pipelines.
    Ls,
    /// One pipeline's status: state, counters, last checkpoint, per-partition offsets and lag.
    Status {
        /// The pipeline's name.
        name: String,
    },
    /// Check which of a pipeline's stored checkpoints could be restored: each manifest,
    /// each object present and whole, and (unless --quick) every object's checksums. Exits
    /// non-zero when a partition has no restorable checkpoint.
    Verify {
        /// The pipeline's name.
        name: String,
        /// Check presence and sizes only (one listing a partition), not checksums.
        #[arg(long)]
        quick: bool,
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
        /// The stage whose operator switches (a pipeline of stages).
        #[arg(long)]
        stage: Option<String>,
    },
    /// Change a pipeline's settings, keeping its state (hosts drain, checkpoint and resume).
    Set {
        /// The pipeline's name.
        name: String,
        /// Change this stage's own settings (a pipeline of stages) instead of the pipeline's.
        #[arg(long)]
        stage: Option<String>,
        /// What a record whose call fails for good does.
        #[arg(long, value_enum)]
        failure_policy: Option<FailurePolicyArg>,
        /// Checkpoint interval, ms.
        #[arg(long)]
        checkpoint_interval_ms: Option<u64>,
        /// Records of one partition in flight at once.
        #[arg(long)]
        in_flight_max: Option<u64>,
        /// Move the state to the other backend, live: each partition drains, checkpoints and
        /// is converted on its next open.
        #[arg(long, value_enum)]
        state_backend: Option<StateBackendArg>,
        /// The quota of a `memory` pipeline's state, bytes.
        #[arg(long)]
        state_bytes_max: Option<u64>,
    },
    /// Print the operator's log lines from every host that runs it, oldest first.
    #[command(
        after_help = "Examples:\n  weir pipeline logs counts --tail 50\n  weir pipeline logs counts --since 10m --follow"
    )]
    Logs {
        /// The pipeline's name.
        name: String,
        /// Keep printing new lines as the hosts write them (about a second behind).
        #[arg(long, short)]
        follow: bool,
        /// Print the last this many lines (the API's default is 1000, its maximum 10,000).
        #[arg(long)]
        tail: Option<usize>,
        /// Only lines logged this long ago or later, e.g. `10m`, `2h`.
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
    },
    /// Delete a stopped pipeline with its state.
    Rm {
        /// The pipeline's name.
        name: String,
    },
}

/// `weir pipeline savepoint …`.
#[derive(Debug, Subcommand)]
pub enum SavepointCommand {
    /// Take a savepoint (a running pipeline checkpoints first); prints it once every
    /// partition's is copied.
    Create {
        /// The pipeline's name.
        name: String,
        /// The savepoint's name (default `sp-{ms}`).
        #[arg(long)]
        savepoint: Option<String>,
    },
    /// List a pipeline's savepoints, oldest first.
    Ls {
        /// The pipeline's name.
        name: String,
    },
    /// Export a savepoint in the portable format — per partition, every state's keys and
    /// values, the timers, the watermark and the offsets, as JSON lines in key order — and
    /// download it into DIR/{partition:05}.jsonl (DuckDB: `SELECT * FROM 'DIR/*.jsonl'`).
    Export {
        /// The pipeline's name.
        name: String,
        /// The savepoint's name.
        savepoint: String,
        /// Where to write the files (created if missing).
        #[arg(long, default_value = ".")]
        dir: std::path::PathBuf,
    },
    /// Delete a savepoint.
    Rm {
        /// The pipeline's name.
        name: String,
        /// The savepoint's name.
        savepoint: String,
    },
}

/// Runs `weir pipeline …`.
///
/// # Errors
/// The API's error (its status and message), or a bad option.
pub async fn pipeline(command: PipelineCommand, args: ApiArgs) -> anyhow::Result<()> {
    let client = ApiClient::new(&args.api, &args.key);
    let show = |view: &weir_host::api::pipelines::PipelineView| -> anyhow::Result<()> {
        if args.json {
            outln!("{}", serde_json::to_string_pretty(view)?);
        } else {
            out!("{}", pipeline_status_text(view));
        }
        Ok(())
    };
    match command {
        PipelineCommand::Create {
            name,
            spec: Some(file),
            ..
        } => {
            let text =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let spec: weir_host::api::pipelines::PipelineSpec = serde_json::from_slice(&text)
                .with_context(|| format!("{} is not a pipeline spec", file.display()))?;
            show(&client.create_pipeline(&name, &spec).await?)?;
        }
        PipelineCommand::Create {
            name,
            spec: None,
            operator,
            inputs,
            output,
            dead_letter,
            checkpoint_interval_ms,
            in_flight_max,
            failure_policy,
            delivery,
            state_backend,
            state_bytes_max,
            from_savepoint,
        } => {
            let from_savepoint = match from_savepoint.as_deref() {
                None => None,
                Some(named) => {
                    let (pipeline, savepoint) = named
                        .split_once('/')
                        .context("--from-savepoint takes `pipeline/savepoint`")?;
                    Some(serde_json::json!({ "pipeline": pipeline, "savepoint": savepoint }))
                }
            };
            let operator = operator.unwrap_or_default();
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
                "failure_policy": failure_policy.name(),
                "delivery": delivery.name(),
                "state_backend": state_backend.name(),
                "state_bytes_max": state_bytes_max,
                "from_savepoint": from_savepoint,
            }))
            .context("bad --failure-policy, --delivery or --state-backend")?;
            show(&client.create_pipeline(&name, &spec).await?)?;
        }
        PipelineCommand::Ls => {
            let pipelines = client.pipelines().await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&pipelines)?);
            } else {
                out!("{}", pipelines_table(&pipelines));
            }
        }
        PipelineCommand::Status { name } => show(&client.pipeline(&name).await?)?,
        PipelineCommand::Verify { name, quick } => {
            let verified = client.verify_pipeline(&name, !quick).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&verified)?);
            } else {
                out!(
                    "{}",
                    weir_host::api::pipelines::verify::verify_text(&verified)
                );
            }
            anyhow::ensure!(
                verified.restorable,
                "pipeline `{name}` has a partition without a restorable checkpoint"
            );
        }
        PipelineCommand::Logs {
            name,
            follow,
            tail,
            since,
        } => {
            let since_ms = since.map(|d| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                now.saturating_sub(d).as_millis() as u64
            });
            let json = args.json;
            let mut unwritten = None;
            client
                .pipeline_logs(&name, tail, since_ms, follow, |entry| {
                    let line = if json {
                        serde_json::to_string(&entry).unwrap_or_default()
                    } else {
                        log_line(&entry)
                    };
                    let written = writeln!(std::io::stdout(), "{line}");
                    unwritten = written.err();
                    unwritten.is_none()
                })
                .await?;
            match unwritten {
                // The reader went away (`weir pipeline logs … | head`): done, as other tools.
                Some(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {}
                Some(err) => return Err(anyhow::Error::new(err).context("cannot print the log")),
                None => {}
            }
        }
        PipelineCommand::Savepoint(SavepointCommand::Create { name, savepoint }) => {
            let taken = client.create_savepoint(&name, savepoint.as_deref()).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&taken)?);
            } else {
                out!("{}", savepoints_table(&[taken]));
            }
        }
        PipelineCommand::Savepoint(SavepointCommand::Ls { name }) => {
            let found = client.savepoints(&name).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&found)?);
            } else {
                out!("{}", savepoints_table(&found));
            }
        }
        PipelineCommand::Savepoint(SavepointCommand::Export {
            name,
            savepoint,
            dir,
        }) => {
            let exported = client.export_savepoint(&name, &savepoint).await?;
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            for part in &exported {
                let file = dir.join(format!("{:05}.jsonl", part.partition));
                let bytes = client.download(&part.download, &file).await?;
                outln!(
                    "partition {}: {} ({bytes} bytes)",
                    part.partition,
                    file.display()
                );
            }
        }
        PipelineCommand::Savepoint(SavepointCommand::Rm { name, savepoint }) => {
            client.delete_savepoint(&name, &savepoint).await?;
            outln!("savepoint {savepoint} of {name} deleted");
        }
        PipelineCommand::Reset {
            name,
            savepoint,
            from,
        } => {
            let restored = client
                .reset_pipeline(&name, &savepoint, from.as_deref())
                .await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&restored)?);
            } else {
                for shard in &restored.shards {
                    let stage = shard
                        .stage
                        .as_ref()
                        .map(|s| format!("stage {s} "))
                        .unwrap_or_default();
                    outln!(
                        "{stage}partition {}: checkpoint {} at offsets {:?} ({} bytes copied)",
                        shard.partition,
                        shard.version,
                        shard.offsets,
                        shard.bytes_copied
                    );
                }
                outln!(
                    "{name} reset to savepoint {} of {}; `weir pipeline start {name}` resumes from it",
                    restored.savepoint,
                    restored.from_pipeline
                );
            }
        }
        PipelineCommand::Start { name } => show(&client.pipeline_action(&name, "start").await?)?,
        PipelineCommand::Stop { name } => show(&client.pipeline_action(&name, "stop").await?)?,
        PipelineCommand::Switch {
            name,
            version,
            stage,
        } => {
            let switched = client
                .switch_operator(&name, version, stage.as_deref())
                .await?;
            show(&switched)?
        }
        PipelineCommand::Checkpoint { name, list: false } => {
            let requested = client.trigger_checkpoint(&name).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&requested)?);
            } else {
                outln!(
                    "checkpoint {} of {name} requested at {} ms; `weir pipeline checkpoint {name} --list` shows it when committed",
                    requested.request,
                    requested.requested_ms
                );
            }
        }
        PipelineCommand::Checkpoint { name, list: true } => {
            let checkpoints = client.checkpoints(&name).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&checkpoints)?);
            } else {
                // A pipeline of stages: `{stage}/{partition}`.
                outln!(
                    "{:>9} {:>8} {:>15} {:>8} {:>12} {:>12}",
                    "PARTITION",
                    "VERSION",
                    "COMMITTED MS",
                    "TOOK MS",
                    "UPLOADED",
                    "STATE BYTES"
                );
                for c in checkpoints {
                    let partition = match &c.stage {
                        Some(stage) => format!("{stage}/{}", c.partition),
                        None => c.partition.to_string(),
                    };
                    outln!(
                        "{:>9} {:>8} {:>15} {:>8} {:>12} {:>12}",
                        partition,
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
            stage,
            failure_policy,
            checkpoint_interval_ms,
            in_flight_max,
            state_backend,
            state_bytes_max,
        } => {
            let change = serde_json::from_value(serde_json::json!({
                "stage": stage,
                "failure_policy": failure_policy.map(FailurePolicyArg::name),
                "checkpoint_interval_ms": checkpoint_interval_ms,
                "in_flight_max": in_flight_max,
                "state_backend": state_backend.map(StateBackendArg::name),
                "state_bytes_max": state_bytes_max,
            }))
            .context("bad --failure-policy or --state-backend")?;
            show(&client.change_pipeline(&name, &change).await?)?;
        }
        PipelineCommand::Rm { name } => {
            client.delete_pipeline(&name).await?;
            if !args.json {
                outln!("deleted pipeline {name} and its state");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `weir pipeline …` alone.
    #[derive(Debug, Parser)]
    struct Pipeline {
        #[command(subcommand)]
        command: PipelineCommand,
    }

    fn parse(args: &[&str]) -> Result<PipelineCommand, clap::Error> {
        Pipeline::try_parse_from(std::iter::once("pipeline").chain(args.iter().copied()))
            .map(|p| p.command)
    }

    #[test]
    fn a_pipeline_is_created_from_a_spec_file_or_from_options_never_both() {
        assert!(matches!(
            parse(&["create", "p", "--spec", "spec.json"]),
            Ok(PipelineCommand::Create {
                spec: Some(_),
                operator: None,
                ..
            })
        ));
        let options = [
            "create",
            "p",
            "--operator",
            "c:1",
            "--input",
            "a",
            "--output",
            "b",
            "--dead-letter",
            "d",
        ];
        assert!(matches!(
            parse(&options),
            Ok(PipelineCommand::Create { spec: None, .. })
        ));
        let both = parse(&[
            "create",
            "p",
            "--spec",
            "spec.json",
            "--checkpoint-interval-ms",
            "500",
        ]);
        assert_eq!(
            both.map(|_| ()).map_err(|e| e.kind()),
            Err(clap::error::ErrorKind::ArgumentConflict)
        );
        let neither = parse(&["create", "p"]);
        assert_eq!(
            neither.map(|_| ()).map_err(|e| e.kind()),
            Err(clap::error::ErrorKind::MissingRequiredArgument)
        );
    }
}
