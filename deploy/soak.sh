#!/usr/bin/env bash
# Weir under many faults at once (issue 41, docs/reliability.md): builds the `counter` guest and
# a release `weir`, and runs `weir soak --own-services` — a broker and an S3 server of its own
# (deploy/local/kafka.sh and s3.sh on ports 19092… and 19000, beside the shared ones), three
# `weir serve` hosts, two pipelines, a fault schedule drawn from the seed, the broker's restart
# among the faults — then prints the faults by kind, the recovery times and the checks.
#
# Usage: bash deploy/soak.sh [--minutes 30] [--seed 1] [weir soak's other options]
# (the soak runs as root to mount the tmpfs its disk-full faults fill).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --profile guest --target wasm32-wasip2 -p weir-test-counter
cargo build --release -p weir-cli
target="${CARGO_TARGET_DIR:-target}"
exec "$target/release/weir" soak --own-services --operator "$target/wasm32-wasip2/guest/weir_test_counter.wasm" "$@"
