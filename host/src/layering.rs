//! The host's dependency direction, checked (lib.rs's map states it): the core — `runtime`,
//! `time`, `state`, `checkpoints`, `pipeline` — names no adapter (`source::kafka`, `sink::kafka`,
//! `sink::iceberg`, the `rdkafka` and `iceberg` crates) and none of the parts that run
//! pipelines (`runner`, `api`, `health`), outside its tests. A pipeline runs over the traits of
//! `pipeline::ports`; `runner::run` wires the adapters in.
//!
//! The catalog (`catalog/`), which the API and the runner share, names neither of them. The
//! backends (`state/`) name none of the tools over stored checkpoints (`checkpoints/`), and the
//! tools name no pipeline.
//!
//! The check reads the source: every line of a core file that is not a comment, outside
//! `#[cfg(test)]` items and test files (`tests.rs`, `tests/`), must not contain a forbidden
//! path.

use std::path::{Path, PathBuf};

/// The core's directories under `host/src`.
const CORE: &[&str] = &["runtime", "time", "state", "checkpoints", "pipeline"];

/// Paths the core must not name: whole, and their tails, which a grouped (`crate::{…}`) or
/// relative path spells.
const FORBIDDEN: &[&str] = &[
    "crate::source",
    "crate::sink",
    "crate::runner",
    "crate::api",
    "crate::health",
    "source::kafka",
    "sink::kafka",
    "sink::iceberg",
    "rdkafka::",
    "iceberg::",
];

/// The `.rs` files under `dir`, test files left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// `text` without its `#[cfg(test)]` items (the attribute's item: on the attribute's own line,
/// or the next one — a line ending in `;` or `,`, or everything to the brace that closes the
/// item's first one) and comment lines. Braces in strings are not told from code: a test item
/// with an unbalanced one would hide what follows (the test below keeps to real shapes).
fn non_test_code(text: &str) -> Vec<(usize, &str)> {
    let mut kept = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        if let Some(rest) = code.strip_prefix("#[cfg(test)]") {
            if !rest.trim().is_empty() {
                // The item is on the attribute's line.
                continue;
            }
            let mut depth = 0usize;
            let mut opened = false;
            for (_, line) in lines.by_ref() {
                for c in line.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                }
                let end = line.trim_end();
                if (opened && depth == 0) || (!opened && (end.ends_with(';') || end.ends_with(',')))
                {
                    break;
                }
            }
            continue;
        }
        kept.push((n + 1, line));
    }
    kept
}

/// How many files are under `dirs` (of `host/src`), and every line of them that names one of
/// `forbidden`, as `file:line: path: code`.
fn named(dirs: &[&str], forbidden: &[&str]) -> (usize, Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for dir in dirs {
        sources(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file reads");
        for (n, line) in non_test_code(&text) {
            for path in forbidden {
                if line.contains(path) {
                    let shown = file.strip_prefix(&root).unwrap_or(file).display();
                    found.push(format!("{shown}:{n}: {path}: {}", line.trim()));
                }
            }
        }
    }
    (files.len(), found)
}

#[test]
fn the_core_names_no_adapter_and_nothing_that_runs_pipelines() {
    let (files, found) = named(CORE, FORBIDDEN);
    assert!(files > 50, "the core's files are found: {files}");
    assert!(
        found.is_empty(),
        "the core names what it must not (host/src/layering.rs):\n{}",
        found.join("\n")
    );
}

/// The backends keep only what a backend is: the tools over stored checkpoints
/// (`checkpoints/`) build on them, never the other way; and the tools know no pipeline.
#[test]
fn the_backends_name_no_checkpoint_tool_and_the_tools_no_pipeline() {
    let (files, mut found) = named(&["state"], &["crate::checkpoints"]);
    assert!(files > 30, "the backends' files are found: {files}");
    let (files, tools) = named(&["checkpoints"], &["crate::pipeline"]);
    assert!(files >= 7, "the tools' files are found: {files}");
    found.extend(tools);
    assert!(
        found.is_empty(),
        "a backend names a checkpoint tool, or a tool a pipeline (host/src/layering.rs):\n{}",
        found.join("\n")
    );
}

/// The catalog is read by the API and the runner; it names neither, nor the HTTP framework.
#[test]
fn the_catalog_names_no_route_and_no_runner() {
    let (files, found) = named(&["catalog"], &["crate::api", "crate::runner", "axum::"]);
    assert!(files >= 6, "the catalog's files are found: {files}");
    assert!(
        found.is_empty(),
        "the catalog names what it must not (host/src/layering.rs):\n{}",
        found.join("\n")
    );
}

#[test]
fn test_items_and_comments_are_left_out_of_the_check() {
    let text = "use crate::state::Shard;\n// crate::sink::iceberg in a comment\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline {\n    use crate::sink::iceberg;\n    fn f() {\n    }\n}\nuse rdkafka::Offset;\n#[cfg(test)] use crate::sink::memory;\nuse crate::{clock, sink::kafka};\nstruct S {\n    #[cfg(test)]\n    probe: u8,\n    kept: u8,\n}\n";
    let kept: Vec<usize> = non_test_code(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(kept, vec![1, 11, 13, 14, 17, 18]);
    let named: Vec<&str> = non_test_code(text)
        .into_iter()
        .flat_map(|(_, line)| FORBIDDEN.iter().copied().filter(|p| line.contains(p)))
        .collect();
    assert_eq!(named, vec!["rdkafka::", "sink::kafka"]);
}
