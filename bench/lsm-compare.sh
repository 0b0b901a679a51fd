#!/usr/bin/env bash
# Runs the same LSM workload on Weir (`weir bench-lsm`) and on SlateDB 0.18
# (bench/slatedb-compare) and prints both tables.
#
# Usage: bench/lsm-compare.sh [--keys N] [--value-bytes N] [--latency-ms N] [--cache F,F,…]
#                              [--batch N] [--sample N] [--json]
# Every argument goes to both sides (so only flags both accept: those above; not --dir, as each
# side keeps its own scratch directory under target/). Extra per-side flags:
#   WEIR_ARGS="--open-sizes-mb 0"    (e.g. skip Weir's open-time measurement)
#   SLATEDB_ARGS="--block-kib 4"     (e.g. SlateDB's default block size instead of Weir's 64 KiB)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

read -r -a weir_args <<< "${WEIR_ARGS:-}"
read -r -a slatedb_args <<< "${SLATEDB_ARGS:-}"

# The SlateDB crate is not a workspace member: it has its own lock file and target directory.
slatedb_target="$root/target/slatedb-compare"
(cd bench/slatedb-compare && CARGO_TARGET_DIR="$slatedb_target" cargo build --release --quiet)
cargo build --release --quiet -p weir-cli

echo "## Weir"
echo
cargo run --release --quiet -p weir-cli -- bench-lsm "$@" "${weir_args[@]}"
echo
echo "## SlateDB"
echo
"$slatedb_target/release/slatedb-compare" "$@" "${slatedb_args[@]}"
