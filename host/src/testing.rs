//! Helpers of this crate's unit tests.

use std::path::PathBuf;

/// The guest component `{name}.wasm` that the test command builds first
/// (`cargo build --profile guest --target wasm32-wasip2 …`), under `CARGO_TARGET_DIR` or the
/// workspace's `target/`. Panics, naming the build command, when it is missing.
pub(crate) fn guest(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let path = target.join(format!("wasm32-wasip2/guest/{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: build the guests first (`bash deploy/test.sh` does)",
        path.display()
    );
    path
}
