#!/usr/bin/env bash
# Installs schemathesis (property-based testing of an API from its OpenAPI document) from PyPI
# into a virtualenv and prints the path of its `st` command on the last line.
#
# Usage: bash deploy/local/schemathesis.sh
#
# Layout: $WEIR_SERVICES_DIR/schemathesis/venv (default ~/.cache/weir/services/...).
# Env: WEIR_SCHEMATHESIS_SPEC (pip requirement, default below), PYTHON (default python3).
set -euo pipefail

SERVICES_DIR="${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}"
VENV="$SERVICES_DIR/schemathesis/venv"
SPEC="${WEIR_SCHEMATHESIS_SPEC:-schemathesis==4.32.5}"
PYTHON="${PYTHON:-python3}"

log() { printf 'schemathesis.sh: %s\n' "$*" >&2; }

stamp="$VENV/.weir-spec"
if [[ ! -x "$VENV/bin/st" || ! -f "$stamp" || "$(cat "$stamp")" != "$SPEC" ]]; then
  log "creating $VENV with $SPEC (one-off, ~30 s) ..."
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "$SPEC" >&2
  printf '%s' "$SPEC" >"$stamp"
fi
"$VENV/bin/st" --version >&2
echo "$VENV/bin/st"
