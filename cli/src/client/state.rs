//! `weir state get|scan`: a pipeline's keyed state through the API
//! (`GET /v1/pipelines/{name}/state/{state}`), as lines of key and value or `--json` pages.

use super::ApiArgs;
use super::ApiClient;
use clap::Subcommand;
use std::io::Write as _;

/// `weir state …`: a pipeline's keyed state as of its newest committed checkpoints (or a
/// savepoint), read from the object store by the API; the pipeline need not be running.
#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// One key's value (a value state), or its entries (a map state).
    Get {
        /// The pipeline's name.
        pipeline: String,
        /// The state's name, as the operator declares it.
        state: String,
        /// The record key (text; see --key-b64).
        #[arg(value_name = "KEY")]
        record_key: String,
        /// KEY is base64 (a key that is not text).
        #[arg(long)]
        key_b64: bool,
        /// Read this savepoint instead.
        #[arg(long)]
        savepoint: Option<String>,
        /// The stage whose state to read (a pipeline of stages).
        #[arg(long)]
        stage: Option<String>,
    },
    /// Every key's entries in key order (by key length, then bytes; a global table's by bytes),
    /// page after page.
    Scan {
        /// The pipeline's name.
        pipeline: String,
        /// The state's name.
        state: String,
        /// Only keys starting with this text.
        #[arg(long)]
        prefix: Option<String>,
        /// Entries per request, 1..=1000.
        #[arg(long, default_value_t = 100)]
        page_size: u32,
        /// Stop after this many entries.
        #[arg(long)]
        max: Option<usize>,
        /// Read this savepoint instead.
        #[arg(long)]
        savepoint: Option<String>,
        /// The stage whose state to read (a pipeline of stages).
        #[arg(long)]
        stage: Option<String>,
    },
}

/// Runs a `weir state` command: entries as a table (key, map key, value), or `--json` pages.
///
/// # Errors
/// When the API refuses or cannot be reached.
pub async fn state(command: StateCommand, args: ApiArgs) -> anyhow::Result<()> {
    use weir_host::api::pipelines::state_query::StateEntry;
    let client = ApiClient::new(&args.api, &args.key);
    let (pipeline, state, mut query, max) = match command {
        StateCommand::Get {
            pipeline,
            state,
            record_key,
            key_b64,
            savepoint,
            stage,
        } => {
            let mut query = vec![(if key_b64 { "key_b64" } else { "key" }, record_key)];
            query.extend(savepoint.map(|s| ("savepoint", s)));
            query.extend(stage.map(|s| ("stage", s)));
            (pipeline, state, query, None)
        }
        StateCommand::Scan {
            pipeline,
            state,
            prefix,
            page_size,
            max,
            savepoint,
            stage,
        } => {
            let mut query = vec![("limit", page_size.to_string())];
            query.extend(prefix.map(|p| ("prefix", p)));
            query.extend(savepoint.map(|s| ("savepoint", s)));
            query.extend(stage.map(|s| ("stage", s)));
            (pipeline, state, query, max)
        }
    };
    let text = |e: &StateEntry| -> String {
        e.key
            .clone()
            .unwrap_or_else(|| format!("b64:{}", e.key_b64.as_deref().unwrap_or_default()))
    };
    let mut shown = 0usize;
    let mut out = std::io::stdout().lock();
    loop {
        if let Some(m) = max {
            // Ask for no more than is left to show: a scan stopped early leaves no lease.
            let left = u32::try_from(m.saturating_sub(shown)).unwrap_or(u32::MAX);
            for (k, v) in query.iter_mut() {
                if *k == "limit" {
                    let asked: u32 = v.parse().unwrap_or(100);
                    *v = asked.min(left.max(1)).to_string();
                }
            }
        }
        let pairs: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let page = client.read_state(&pipeline, &state, &pairs).await?;
        let mut lines = String::new();
        if args.json {
            lines.push_str(&serde_json::to_string(&page)?);
            lines.push('\n');
        }
        for entry in &page.entries {
            if max.is_some_and(|m| shown >= m) {
                break;
            }
            shown += 1;
            if !args.json {
                let map_key = entry
                    .map_key
                    .clone()
                    .or_else(|| entry.map_key_b64.as_ref().map(|b| format!("b64:{b}")));
                let value = entry
                    .value
                    .as_ref()
                    .map_or_else(|| format!("b64:{}", entry.value_b64), ToString::to_string);
                match map_key {
                    Some(m) => lines.push_str(&format!("{}\t{m}\t{value}\n", text(entry))),
                    None => lines.push_str(&format!("{}\t{value}\n", text(entry))),
                }
            }
        }
        if let Err(e) = out.write_all(lines.as_bytes()) {
            // The reader went away (`| head`): done, not an error.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
        match page.next_page_token {
            Some(token) if max.is_none_or(|m| shown < m) => {
                query.retain(|(k, _)| *k != "page_token");
                query.push(("page_token", token));
            }
            _ => break,
        }
    }
    if shown == 0 && !args.json {
        writeln!(out, "(no entries)")?;
    }
    Ok(())
}
