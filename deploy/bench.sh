#!/usr/bin/env bash
# `weir bench` on a fresh machine: starts the local Kafka broker (deploy/local/kafka.sh), builds
# the measured operators (Rust, and the Python port of the aggregation), fetches the flights
# table and runs every workload, implementation (Wasm, native, Python) and state backend end to
# end. Extra arguments go to `weir bench` (for example
# `--json`, `--events 1000000`, `--workloads counter`, `--lsm-cache-mib 256`).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2
bash deploy/local/kafka.sh start
cargo build --profile guest --target wasm32-wasip2 -p flight-delays -p weir-test-counter
guests="${CARGO_TARGET_DIR:-target}/wasm32-wasip2/guest"
bash guest-sdk/python/componentize.sh examples/flight-delays-py flight_delays \
  "$guests/flight_delays_py.wasm"
csv="$(bash deploy/local/flights.sh | tail -n 1)"
cargo run --release -p weir-cli --bin weir -- bench --flights "$csv" \
  --counter-operator "$guests/weir_test_counter.wasm" \
  --aggregate-operator "$guests/flight_delays.wasm" \
  --aggregate-python-operator "$guests/flight_delays_py.wasm" --impl wasm,native,python "$@"
