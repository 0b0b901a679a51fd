#!/usr/bin/env bash
# Installs a command-line tool from PyPI into its own virtualenv (once per spec) and prints the
# path of its command on the last line. The test command uses it for schemathesis (API fuzzing
# from the OpenAPI document) and kubernetes-validate (offline schema check of deploy/k8s).
#
# Usage: bash deploy/local/py-tool.sh NAME PIP_SPEC COMMAND
#   e.g. bash deploy/local/py-tool.sh schemathesis schemathesis==4.32.5 st
#
# Layout: $WEIR_SERVICES_DIR/NAME/venv (default ~/.cache/weir/services/NAME/venv).
# Env: PYTHON (default python3).
set -euo pipefail

[[ $# -eq 3 ]] || { sed -n '/^# Usage:/,/^#   e.g./p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
NAME="$1" SPEC="$2" COMMAND="$3"
SERVICES_DIR="${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}"
VENV="$SERVICES_DIR/$NAME/venv"
PYTHON="${PYTHON:-python3}"

stamp="$VENV/.weir-spec"
if [[ ! -x "$VENV/bin/$COMMAND" || ! -f "$stamp" || "$(cat "$stamp")" != "$SPEC" ]]; then
  printf 'py-tool.sh: creating %s with %s (one-off) ...\n' "$VENV" "$SPEC" >&2
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "$SPEC" >&2
  printf '%s' "$SPEC" >"$stamp"
fi
echo "$VENV/bin/$COMMAND"
