//! The host's shape, checked: no source file over [`FILE_LINES_MAX`] lines (tests included: a
//! longer one is two subjects), and at most [`LONG_FUNCTIONS_MAX`] functions allowed past
//! clippy's `too_many_lines` (80 lines, clippy.toml; denied in lib.rs), each with a comment
//! right above its `#[allow]` saying why.

use std::path::{Path, PathBuf};

/// The most lines a file of `host/src` may have.
const FILE_LINES_MAX: usize = 600;

/// The most `#[allow(clippy::too_many_lines)]` in `host/src`.
const LONG_FUNCTIONS_MAX: usize = 5;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
    {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn host_files() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    assert!(
        files.len() > 100,
        "the host's sources are found: {}",
        files.len()
    );
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a source file reads");
            (path, text)
        })
        .collect()
}

#[test]
fn no_host_file_is_over_600_lines() {
    let long: Vec<String> = host_files()
        .iter()
        .filter(|(_, text)| text.lines().count() > FILE_LINES_MAX)
        .map(|(path, text)| format!("{} ({} lines)", path.display(), text.lines().count()))
        .collect();
    assert!(long.is_empty(), "split these: {long:?}");
}

#[test]
fn few_functions_are_allowed_past_the_length_limit_and_each_says_why() {
    // Split so that this file's own text is not counted.
    let allow = format!("#[allow(clippy::{})]", "too_many_lines");
    let mut allowed = Vec::new();
    for (path, text) in host_files() {
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            if line.trim() == allow {
                let reason = n > 0 && lines[n - 1].trim_start().starts_with("//");
                assert!(
                    reason,
                    "{}:{}: say why above the allow",
                    path.display(),
                    n + 1
                );
                allowed.push(format!("{}:{}", path.display(), n + 1));
            }
        }
    }
    assert!(
        allowed.len() <= LONG_FUNCTIONS_MAX,
        "{} allowed, at most {LONG_FUNCTIONS_MAX}: {allowed:?}",
        allowed.len()
    );
}
