#!/usr/bin/env bash
# Builds a Python operator into a WebAssembly component of the weir:operator world, the way the
# README shows: a virtualenv with componentize-py (pinned) and this SDK (`weir`), then
# componentize-py over the app module. Packages come with uv (deploy/local/uv.sh), as the test
# command's other Python tools. The test command builds examples/flight-delays-py with it.
#
# Usage: bash guest-sdk/python/componentize.sh APP_DIR MODULE OUT.wasm
#   e.g. bash guest-sdk/python/componentize.sh examples/flight-delays-py flight_delays \
#          target/wasm32-wasip2/guest/flight_delays_py.wasm
#
# Layout: $WEIR_SERVICES_DIR/python-sdk/venv (default ~/.cache/weir/services/python-sdk/venv).
# Env: PYTHON (default python3, 3.11 or newer), as deploy/local/py-tool.sh.
set -euo pipefail

[[ $# -eq 3 ]] || { sed -n '/^# Usage:/,/^#          target/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
APP_DIR="$1" MODULE="$2" OUT="$3"
SDK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WIT_DIR="$SDK_DIR/../../wit"
COMPONENTIZE_PY="componentize-py==0.25.1"
# The venv with componentize-py (created once): $WEIR_SERVICES_DIR/python-sdk/venv.
CPY="$(bash "$SDK_DIR/../../deploy/local/py-tool.sh" python-sdk "$COMPONENTIZE_PY" componentize-py | tail -n 1)"
VENV="$(dirname "$(dirname "$CPY")")"

# The SDK as a package, reinstalled each time so the component gets the SDK of this checkout;
# built from a copy, since setuptools builds in the source tree (build/, *.egg-info).
sdk_copy="$(mktemp -d)"
trap 'rm -rf "$sdk_copy"' EXIT
cp -R "$SDK_DIR/pyproject.toml" "$SDK_DIR/README.md" "$SDK_DIR/src" "$sdk_copy/"
UV="$(bash "$SDK_DIR/../../deploy/local/uv.sh" | tail -n 1)"
"$UV" pip install --quiet --python "$VENV/bin/python" --no-deps --reinstall "$sdk_copy" >&2

mkdir -p "$(dirname "$OUT")"
# componentize-py finds installed packages through the active virtualenv.
VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" \
  componentize-py -d "$WIT_DIR" -w operator-world componentize -p "$APP_DIR" "$MODULE" -o "$OUT" >&2
printf 'componentize.sh: built %s (%s bytes)\n' "$OUT" "$(wc -c <"$OUT")" >&2
echo "$OUT"
