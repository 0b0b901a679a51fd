#!/usr/bin/env bash
# The Python side of the test command: the Python SDK's pytest suite (and the example's), the
# Python operators built into components with componentize-py (examples/flight-delays-py and
# examples/airport-py, and the SDK probe the end-to-end tests load), and mypy --strict over the SDK, the example and the
# probe against the WIT bindings componentize-py generates. Needs no Rust build, so
# deploy/test.sh runs it in the background while the code compiles.
#
# Usage: bash deploy/python-checks.sh GUESTS_DIR   (where the components go)
# Tools come from PyPI into $WEIR_SERVICES_DIR (deploy/local/py-tool.sh, componentize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

[[ $# -eq 1 ]] || { sed -n '/^# Usage:/p' "${BASH_SOURCE[0]}" | sed 's/^# //' >&2; exit 2; }
guests="$1"

PYTEST="$(bash deploy/local/py-tool.sh pytest pytest==9.2.0 pytest | tail -n 1)"
"$PYTEST" -q -p no:cacheprovider guest-sdk/python/tests examples/flight-delays-py examples/airport-py
bash guest-sdk/python/componentize.sh examples/flight-delays-py flight_delays "$guests/flight_delays_py.wasm"
bash guest-sdk/python/componentize.sh tests/guests/python sdk_probe "$guests/sdk_probe_py.wasm"
bash guest-sdk/python/componentize.sh examples/airport-py airport_hours "$guests/airport_hours_py.wasm"
bash guest-sdk/python/componentize.sh examples/airport-py airport_sessions "$guests/airport_sessions_py.wasm"

MYPY="$(bash deploy/local/py-tool.sh mypy mypy==1.18.2 mypy | tail -n 1)"
bindings="$(mktemp -d)"
trap 'rm -rf "$bindings"' EXIT
"${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}/python-sdk/venv/bin/componentize-py" \
  -d wit -w operator-world bindings "$bindings" >/dev/null
MYPYPATH="$bindings:guest-sdk/python/src" "$MYPY" --strict --cache-dir=/dev/null \
  guest-sdk/python/src/weir examples/flight-delays-py/flight_delays.py tests/guests/python/sdk_probe.py \
  examples/airport-py/airport_hours.py examples/airport-py/airport_sessions.py
echo "python-checks.sh: pytest, componentize-py and mypy passed"
