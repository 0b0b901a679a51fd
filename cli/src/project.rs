//! `weir init NAME --lang rust|python` and `weir build [DIR]`: an operator project of one's
//! own, outside this repository.
//!
//! The `weir` binary carries the SDKs' sources — the Rust crate `weir-sdk` with its WIT world,
//! and the Python package `weir` — and `init` writes them into the project's `vendor/`, so that
//! a project depends on nothing but crates.io (Rust) or nothing at all (Python) until the SDKs
//! are on a registry. A project is: its manifest (`Cargo.toml`, standalone, or
//! `pyproject.toml`), an example operator (a per-key counter), a unit test with the SDK's
//! harness (`weir_sdk::testing`, `weir.testing`), a README and `vendor/`.
//!
//! `build` makes the component: for Rust, `cargo build --release --target wasm32-wasip2` (the
//! project's release profile is the guests' one: LTO, one codegen unit, stripped); for Python,
//! componentize-py 0.25.1 from a cached virtualenv (`$WEIR_SERVICES_DIR/python-sdk/venv`, made
//! once) over `app.py`. It prints the component's path.

use anyhow::{Context as _, bail, ensure};
use include_dir::{Dir, include_dir};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Rust SDK's sources.
static RUST_SDK_SRC: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../guest-sdk/src");
/// The Rust SDK's example (its documentation includes it).
static RUST_SDK_EXAMPLES: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../guest-sdk/examples");
/// The `weir:operator` WIT world (the `.wit` files at its top; `legacy/` is not vendored).
static WIT: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../wit");
/// The Python SDK's package.
static PYTHON_SDK: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../guest-sdk/python/src/weir");

/// The SDK's version: this binary's.
const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The componentize-py `weir build` runs for Python projects.
pub const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// An operator project's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// A Rust crate (`Cargo.toml`, `src/lib.rs`, `tests/operator.rs`).
    Rust,
    /// A Python module (`pyproject.toml`, `app.py`, `test_app.py`), built with componentize-py.
    Python,
}

/// `weir init`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct InitOptions {
    /// The project's name and directory (`[a-z][a-z0-9-]*`).
    pub name: String,
    /// The operator's language.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
    /// Where to create the project's directory.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
}

/// `weir build`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct BuildOptions {
    /// The project's directory.
    #[arg(default_value = ".")]
    pub dir: PathBuf,
}

fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.len() <= 64
}

/// Writes every file of `dir` under `to`, keeping its layout; `keep` chooses which (by path
/// relative to `dir`).
fn write_dir(dir: &Dir<'_>, to: &Path, keep: &dyn Fn(&Path) -> bool) -> anyhow::Result<()> {
    for file in dir.files() {
        if keep(file.path()) {
            write(&to.join(file.path()), file.contents())?;
        }
    }
    for sub in dir.dirs() {
        write_dir(sub, to, keep)?;
    }
    Ok(())
}

fn write(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

/// The top-level `.wit` files of the world.
fn wit_file(path: &Path) -> bool {
    path.parent() == Some(Path::new("")) && path.extension().is_some_and(|e| e == "wit")
}

/// Creates the project (see the module) and prints what to do next.
///
/// # Errors
/// A bad name, a directory that exists, or a file that cannot be written.
pub fn init(opts: &InitOptions) -> anyhow::Result<PathBuf> {
    ensure!(
        valid_name(&opts.name),
        "the name must be 1..=64 bytes of [a-z0-9-], starting with a letter. name=`{}`",
        opts.name
    );
    let root = opts.dir.join(&opts.name);
    ensure!(
        !root.exists(),
        "{} exists; choose another name or --dir",
        root.display()
    );
    match opts.lang {
        Lang::Rust => init_rust(&root, &opts.name)?,
        Lang::Python => init_python(&root, &opts.name)?,
    }
    write(&root.join(".gitignore"), b"/target\n/build\n__pycache__/\n")?;
    println!("created {} ({:?})", root.display(), opts.lang);
    println!(
        "next: cd {} && {} && weir build",
        root.display(),
        match opts.lang {
            Lang::Rust => "cargo test",
            Lang::Python => "python3 -m pytest",
        }
    );
    Ok(root)
}

fn init_rust(root: &Path, name: &str) -> anyhow::Result<()> {
    let sdk = root.join("vendor/weir-sdk");
    write_dir(&RUST_SDK_SRC, &sdk.join("src"), &|_| true)?;
    write_dir(&RUST_SDK_EXAMPLES, &sdk.join("examples"), &|_| true)?;
    write_dir(&WIT, &sdk.join("wit"), &wit_file)?;
    write(&sdk.join("Cargo.toml"), sdk_manifest().as_bytes())?;
    let crate_name = name.replace('-', "_");
    write(
        &root.join("Cargo.toml"),
        format!(
            r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

# cdylib: the component (`weir build`); rlib: the unit tests (`cargo test`).
[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
# The Weir SDK, vendored by `weir init` (weir {SDK_VERSION}).
weir-sdk = {{ path = "vendor/weir-sdk" }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"

# What `weir build` builds: small and quick to compile and instantiate.
[profile.release]
debug = false
strip = true
lto = true
codegen-units = 1

# A project of its own, not a member of an enclosing workspace.
[workspace]
"#
        )
        .as_bytes(),
    )?;
    write(
        &root.join("src/lib.rs"),
        format!(
            r#"//! `{name}`: counts records per key and emits `{{"count": n}}` for each one.

use weir_sdk::{{Context, Operator, Record, Reject, StateSpec, ValueState}};

/// The operator.
#[derive(Debug)]
pub struct Counter;

/// The count of the record's key.
pub const COUNT: ValueState<u64> = ValueState::new("count");

impl Operator for Counter {{
    const NAME: &'static str = "{name}";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[COUNT.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {{
        if record.value().is_empty() {{
            return Err(Reject::new("empty value"));
        }}
        let count = ctx.get(&COUNT)?.unwrap_or(0) + 1;
        ctx.set(&COUNT, &count)?;
        ctx.emit_json(record.key(), &serde_json::json!({{ "count": count }}))?;
        Ok(())
    }}
}}

// The component's exports, in the wasm32 build only: a native build (the unit tests) links no
// component exports.
#[cfg(target_arch = "wasm32")]
weir_sdk::export_operator!(Counter);
"#
        )
        .as_bytes(),
    )?;
    write(
        &root.join("tests/operator.rs"),
        format!(
            r##"//! The operator natively, with the SDK's harness: state per key, the host's rules.

use {crate_name}::{{COUNT, Counter}};
use weir_sdk::testing::Harness;

#[test]
fn counts_per_key_and_rejects_an_empty_value() {{
    let mut h = Harness::<Counter>::new();
    assert!(h.send(b"a", b"x").is_ok());
    assert!(h.send(b"b", b"x").is_ok());
    let out = h.send(b"a", b"y");
    assert!(out.is_ok());
    assert_eq!(out.emitted[0].value, br#"{{"count":2}}"#);
    assert_eq!(h.value(b"a", &COUNT), Some(2));
    // A rejected record changes nothing and emits nothing.
    let out = h.send(b"a", b"");
    assert!(!out.is_ok());
    assert!(out.emitted.is_empty());
    assert_eq!(h.value(b"a", &COUNT), Some(2));
}}
"##
        )
        .as_bytes(),
    )?;
    write(
        &root.join("README.md"),
        format!(
            r#"# {name}

A Weir operator in Rust: `src/lib.rs` counts records per key.

```sh
cargo test                              # the unit test (tests/operator.rs), natively
weir build                              # the component: target/wasm32-wasip2/release/{crate_name}.wasm
weir dev --operator target/wasm32-wasip2/release/{crate_name}.wasm --input records.jsonl
weir operator push {name} target/wasm32-wasip2/release/{crate_name}.wasm
```

`vendor/weir-sdk` is the Weir SDK (weir {SDK_VERSION}), written by `weir init`.
"#
        )
        .as_bytes(),
    )?;
    Ok(())
}

/// The vendored SDK crate's manifest: the repository's, with the workspace's settings filled in.
fn sdk_manifest() -> String {
    format!(
        r#"[package]
name = "weir-sdk"
version = "{SDK_VERSION}"
edition = "2024"
description = "Write Weir stream operators in Rust: typed keyed state, emit, log"
license = "Apache-2.0"
# examples/counter.rs is there for the documentation, which includes it.
autoexamples = false

[lib]
doctest = false

[dependencies]
wit-bindgen = {{ version = "0.60", default-features = false, features = ["macros", "realloc", "std"] }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
"#
    )
}

fn init_python(root: &Path, name: &str) -> anyhow::Result<()> {
    write_dir(&PYTHON_SDK, &root.join("vendor/weir"), &|p| {
        p.extension().is_none_or(|e| e != "pyc")
    })?;
    write_dir(&WIT, &root.join("vendor/wit"), &wit_file)?;
    write(
        &root.join("pyproject.toml"),
        format!(
            r#"[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = []

# `python3 -m pytest` finds the vendored SDK (vendor/weir, weir {SDK_VERSION}, written by
# `weir init`) and the operator.
[tool.pytest.ini_options]
pythonpath = [".", "vendor"]
"#
        )
        .as_bytes(),
    )?;
    write(
        &root.join("app.py"),
        format!(
            r#""""`{name}`: counts records per key and emits {{"count": n}} for each one."""

import weir

COUNT = weir.ValueState("count", int)


class Counter(weir.Operator):
    name = "{name}"
    version = "0.1.0"
    states = [COUNT]

    def process(self, ctx, record):
        if not record.value:
            raise weir.Reject("empty value")
        count = ctx.get(COUNT, 0) + 1
        ctx.set(COUNT, count)
        ctx.emit_json(record.key, {{"count": count}})


Operator = weir.export(Counter)
"#
        )
        .as_bytes(),
    )?;
    write(
        &root.join("test_app.py"),
        br#""""The operator in plain CPython, with the SDK's harness: state per key, the host's rules."""

from weir.testing import Harness

from app import COUNT, Counter


def test_counts_per_key_and_rejects_an_empty_value():
    h = Harness(Counter)
    assert h.send("a", b"x").ok
    assert h.send("b", b"x").ok
    out = h.send("a", b"y")
    assert out.ok and out.emitted[0].value == b'{"count":2}'
    assert h.value("a", COUNT) == 2
    out = h.send("a", b"")
    assert not out.ok and out.emitted == []
    assert h.value("a", COUNT) == 2
"#,
    )?;
    write(
        &root.join("README.md"),
        format!(
            r#"# {name}

A Weir operator in Python: `app.py` counts records per key.

```sh
python3 -m pytest                        # the unit test (test_app.py), in plain CPython
weir build                               # the component: build/{name}.wasm (componentize-py)
weir dev --operator build/{name}.wasm --input records.jsonl
weir operator push {name} build/{name}.wasm
```

`vendor/weir` is the Weir SDK and `vendor/wit` its WIT world (weir {SDK_VERSION}), written by
`weir init`. Import everything the operator needs at the top of `app.py`: the component holds
what the module imported when it was built.
"#
        )
        .as_bytes(),
    )?;
    Ok(())
}

/// Builds the project in `opts.dir` and prints the component's path.
///
/// # Errors
/// Not a project `weir init` made, or the build failing (its output is shown).
pub fn build(opts: &BuildOptions) -> anyhow::Result<PathBuf> {
    let dir = &opts.dir;
    let component = if dir.join("Cargo.toml").exists() {
        build_rust(dir)?
    } else if dir.join("app.py").exists() {
        build_python(dir)?
    } else {
        bail!(
            "{} has neither Cargo.toml nor app.py: not an operator project (`weir init NAME`)",
            dir.display()
        );
    };
    let bytes = std::fs::metadata(&component).map_or(0, |m| m.len());
    eprintln!("built {} ({bytes} bytes)", component.display());
    println!("{}", component.display());
    Ok(component)
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {command:?}"))?;
    ensure!(status.success(), "{command:?} failed ({status})");
    Ok(())
}

fn build_rust(dir: &Path) -> anyhow::Result<PathBuf> {
    // The target, once (quiet when present).
    let _ = Command::new("rustup")
        .args(["target", "add", "wasm32-wasip2"])
        .stderr(std::process::Stdio::null())
        .status();
    let output = Command::new("cargo")
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    ensure!(output.status.success(), "cargo build failed");
    // The cdylib's `.wasm` as cargo reports it (wherever CARGO_TARGET_DIR puts it).
    let mut component = None;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && message["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"))
            && let Some(files) = message["filenames"].as_array()
        {
            component = files
                .iter()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(".wasm"))
                .map(PathBuf::from);
        }
    }
    component.context("cargo built no .wasm (is the crate a cdylib?)")
}

/// The cached virtualenv with componentize-py: made once under `$WEIR_SERVICES_DIR`
/// (default `~/.cache/weir/services`), as the test command's own.
fn componentize_py() -> anyhow::Result<PathBuf> {
    let services = std::env::var_os("WEIR_SERVICES_DIR").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/weir/services"),
        PathBuf::from,
    );
    let venv = services.join("python-sdk/venv");
    let tool = venv.join("bin/componentize-py");
    let stamp = venv.join(".weir-spec");
    if tool.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == COMPONENTIZE_PY) {
        return Ok(tool);
    }
    eprintln!(
        "installing {COMPONENTIZE_PY} into {} (once)",
        venv.display()
    );
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(Command::new(&python).args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        COMPONENTIZE_PY,
    ]))?;
    std::fs::write(&stamp, COMPONENTIZE_PY)?;
    Ok(tool)
}

fn build_python(dir: &Path) -> anyhow::Result<PathBuf> {
    let tool = componentize_py()?;
    let dir = &dir
        .canonicalize()
        .with_context(|| format!("cannot open {}", dir.display()))?;
    let name = std::fs::read_to_string(dir.join("pyproject.toml"))
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix("name = \"")?
                    .strip_suffix('"')
                    .map(str::to_owned)
            })
        })
        .unwrap_or_else(|| "operator".into());
    let out = dir.join("build").join(format!("{name}.wasm"));
    std::fs::create_dir_all(dir.join("build"))?;
    // Its chatter to stderr: stdout is the component's path.
    let output = Command::new(tool)
        .args(["-d", "vendor/wit", "-w", "operator-world", "componentize"])
        .args(["-p", ".", "-p", "vendor", "app", "-o"])
        .arg(&out)
        .current_dir(dir)
        .output()
        .context("cannot run componentize-py")?;
    eprint!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success(),
        "componentize-py failed ({})",
        output.status
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vendored_sdk_manifest_asks_for_the_workspaces_dependency_versions() {
        let workspace =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"))
                .expect("the workspace manifest");
        let manifest = sdk_manifest();
        for dependency in ["wit-bindgen", "serde", "serde_json"] {
            let line = workspace
                .lines()
                .find(|l| l.starts_with(&format!("{dependency} = ")))
                .expect("in [workspace.dependencies]");
            assert!(manifest.contains(line), "{line} in\n{manifest}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("demo"));
        assert!(valid_name("my-op2"));
        for bad in ["", "Demo", "2x", "a_b", "a/b"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
