#!/usr/bin/env bash
# Installs uv (https://docs.astral.sh/uv/, pinned) once and prints its path on the last line.
# The Python tools the tests use (deploy/local/py-tool.sh, s3.sh, flights.sh and the Python
# SDK's componentize.sh) get their virtualenvs and packages from it: a cold set-up spent ~110
# CPU-seconds in pip (ensurepip in each of eight virtualenvs, bytecode compiled for every module
# installed, a build environment per SDK install), which uv does in a few.
#
# Usage: bash deploy/local/uv.sh
# Layout: $WEIR_SERVICES_DIR/uv/venv (default ~/.cache/weir/services/uv/venv): a virtualenv
# that holds uv alone, made with pip once.
# Env: PYTHON (default python3).
set -euo pipefail

UV_SPEC="uv==0.13.10"
SERVICES_DIR="${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}"
VENV="$SERVICES_DIR/uv/venv"
PYTHON="${PYTHON:-python3}"

stamp="$VENV/.weir-spec"
# Several scripts may ask at once (deploy/test.sh starts them side by side): one installs.
mkdir -p "$SERVICES_DIR/uv"
exec 9>"$SERVICES_DIR/uv/install.lock"
flock 9
if [[ ! -x "$VENV/bin/uv" || ! -f "$stamp" || "$(cat "$stamp")" != "$UV_SPEC" ]]; then
  printf 'uv.sh: installing %s into %s (one-off) ...\n' "$UV_SPEC" "$VENV" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-compile "$UV_SPEC" >&2
  printf '%s' "$UV_SPEC" >"$stamp"
fi
echo "$VENV/bin/uv"
