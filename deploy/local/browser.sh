#!/usr/bin/env bash
# Installs what the status-page test drives: Debian's Chromium (headless) and Playwright's
# driver library (npm `playwright-core`, which uses that Chromium and downloads no browser of
# its own). Prints the path of the `playwright-core` package on the last line.
#
# Usage: bash deploy/local/browser.sh
#
# Layout: $WEIR_SERVICES_DIR/browser/node_modules (default ~/.cache/weir/services/browser).
# Env: WEIR_CHROMIUM (default /usr/bin/chromium): a Chromium already installed elsewhere.
set -euo pipefail

PLAYWRIGHT_SPEC="playwright-core@1.65.1"
SERVICES_DIR="${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}"
DIR="$SERVICES_DIR/browser"
CHROMIUM="${WEIR_CHROMIUM:-/usr/bin/chromium}"

if [[ ! -x "$CHROMIUM" ]]; then
  printf 'browser.sh: installing Debian chromium (one-off) ...\n' >&2
  sudo_cmd=()
  [[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends chromium >&2
fi
"$CHROMIUM" --version >&2

stamp="$DIR/.weir-spec"
if [[ ! -f "$DIR/node_modules/playwright-core/package.json" || ! -f "$stamp" || "$(cat "$stamp")" != "$PLAYWRIGHT_SPEC" ]]; then
  printf 'browser.sh: installing %s into %s (one-off) ...\n' "$PLAYWRIGHT_SPEC" "$DIR" >&2
  rm -rf "$DIR"
  mkdir -p "$DIR"
  (cd "$DIR" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund "$PLAYWRIGHT_SPEC" >&2)
  printf '%s' "$PLAYWRIGHT_SPEC" >"$stamp"
fi
echo "$DIR/node_modules/playwright-core"
