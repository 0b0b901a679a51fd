#!/usr/bin/env bash
# The main job on embedded defaults: builds the flight-delays operator, fetches the flights
# table, and runs `weir dev` — librdkafka's mock cluster, the flights in, per-route delay
# statistics out, and a summary. Extra arguments go to `weir dev` (for example
# `--bootstrap-servers 127.0.0.1:9092` to use the local broker from deploy/local/kafka.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2
bash deploy/local/build-deps.sh
cargo build --profile guest --target wasm32-wasip2 -p flight-delays
csv="$(bash deploy/local/flights.sh | tail -n 1)"
operator="${CARGO_TARGET_DIR:-target}/wasm32-wasip2/guest/flight_delays.wasm"
cargo run --release -p weir-cli --bin weir -- dev --operator "$operator" --flights "$csv" "$@"
