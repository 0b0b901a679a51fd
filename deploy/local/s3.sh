#!/usr/bin/env bash
# deploy/local/s3.sh - an S3-compatible server (moto) for local tests.
#
# Serves S3 on http://127.0.0.1:9000 (path-style; any access key/secret works,
# region us-east-1). It is moto's own server app (PyPI moto 5.x, pinned below;
# the app `moto_server` runs), started through deploy/local/s3_server.py, which
# applies requests one at a time so that conditional PUTs (If-None-Match: * and
# If-Match) are atomic; stock moto_server has a check-then-write race there.
# State is in memory: a restart starts empty (POST /moto-api/reset also wipes it).
# s3_server.py --access-key ID --secret-key SECRET runs a second server that accepts only
# requests signed with that one key pair, as real S3 does (cli/tests/settings_from_env.rs).
#
# Usage:
#   deploy/local/s3.sh start     start (idempotent: reuses a server that already answers
#                                on 127.0.0.1:9000), waits until it answers HTTP
#   deploy/local/s3.sh stop      stop the server started by this script
#   deploy/local/s3.sh status    exit 0 if an S3 endpoint answers, 3 if not
#   deploy/local/s3.sh check     run s3_conditional_put_check.py against it
#
# Where things live ($WEIR_SERVICES_DIR defaults to ~/.cache/weir/services):
#   $WEIR_SERVICES_DIR/s3/venv/         virtualenv with moto[s3], flask (and boto3)
#   $WEIR_SERVICES_DIR/s3/logs/moto.log server log
#   $WEIR_SERVICES_DIR/s3/moto.pid      pid of the server
#
# Environment knobs: S3_START_TIMEOUT (seconds, default 60), PYTHON (default python3),
#   WEIR_MOTO_SPEC (space-separated pip requirements, default below),
#   WEIR_S3_SERIALIZE=0 (stock moto, no request lock); a second server beside the shared one
#   (`weir soak --own-services`): WEIR_S3_PORT (default 9000) and WEIR_S3_DIR (its logs and
#   pid; default $WEIR_SERVICES_DIR/s3; the virtualenv is always the shared one).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERVICES_DIR="${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}"
SDIR="${WEIR_S3_DIR:-$SERVICES_DIR/s3}"
VENV="$SERVICES_DIR/s3/venv"
LOGS="$SDIR/logs"
PIDFILE="$SDIR/moto.pid"
HOST=127.0.0.1
PORT="${WEIR_S3_PORT:-9000}"
URL="http://$HOST:$PORT"
# moto[s3] + flask/flask-cors is all the S3 server needs; moto[server] would pull
# every service's deps (~320 MB venv, ~40 s install vs ~140 MB, ~12 s).
MOTO_SPEC="${WEIR_MOTO_SPEC:-moto[s3]==5.2.5 flask flask-cors}"
PYTHON="${PYTHON:-python3}"
START_TIMEOUT="${S3_START_TIMEOUT:-60}"

log() { printf 's3.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
  sed -n '/^# Usage:/,/^#   deploy.*check/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# True if an S3 endpoint answers ListBuckets on $URL.
s3_answers() {
  "$PYTHON" - "$URL" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/", timeout=3) as r:
    sys.exit(0 if r.status == 200 and b"ListAllMyBucketsResult" in r.read() else 1)
EOF
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

live_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 's3_server\.py' || return 1
  echo "$pid"
}

# The virtualenv with moto (deploy/local/py-tool.sh: once per spec, with uv).
ensure_venv() {
  command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (need Python >= 3.9)"
  bash "$HERE/py-tool.sh" s3 "$MOTO_SPEC" python >/dev/null || die "installing '$MOTO_SPEC' failed"
}

wait_ready() {
  local pid="$1" t0=$SECONDS
  while ((SECONDS - t0 < START_TIMEOUT)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$LOGS/moto.log" >&2 || true
      die "moto server (pid $pid) exited during startup"
    fi
    if s3_answers; then
      log "up on $URL (pid $pid, ready after $((SECONDS - t0)) s)"
      return 0
    fi
    sleep 0.3
  done
  tail -n 40 "$LOGS/moto.log" >&2 || true
  die "moto server (pid $pid) did not answer on $URL within ${START_TIMEOUT}s"
}

cmd_start() {
  mkdir -p "$SDIR"
  exec 9>"$SDIR/.lock"
  flock 9
  local pid=""
  pid="$(live_pid || true)"
  if s3_answers; then
    log "already running on $URL${pid:+ (pid $pid)} - reusing it"
    return 0
  fi
  if [[ -n "$pid" ]]; then
    log "server pid $pid is starting - waiting for it"
    wait_ready "$pid"
    return 0
  fi
  port_open "$HOST" "$PORT" && die "port $PORT on $HOST is taken by something that is not an S3 endpoint"
  ensure_venv

  mkdir -p "$LOGS"
  [[ -f "$LOGS/moto.log" ]] && mv -f "$LOGS/moto.log" "$LOGS/moto.log.prev"
  local extra=()
  [[ "${WEIR_S3_SERIALIZE:-1}" == 0 ]] && extra+=(--no-serialize)
  rm -f "$PIDFILE"
  # setsid: own session, so the server outlives this shell and its process group.
  # shellcheck disable=SC2016
  setsid nohup bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
    "$VENV/bin/python" -u "$HERE/s3_server.py" -H "$HOST" -p "$PORT" "${extra[@]}" \
    >"$LOGS/moto.log" 2>&1 </dev/null 9>&- &
  local t=0
  while [[ ! -s "$PIDFILE" ]] && ((t < 50)); do sleep 0.1; t=$((t + 1)); done
  pid="$(cat "$PIDFILE")"
  log "started moto pid $pid (log: $LOGS/moto.log), waiting for it to answer ..."
  wait_ready "$pid"
}

cmd_stop() {
  mkdir -p "$SDIR"
  exec 9>"$SDIR/.lock"
  flock 9
  local pid
  if ! pid="$(live_pid)"; then
    rm -f "$PIDFILE"
    if port_open "$HOST" "$PORT"; then
      log "no server started by this script is running (but something listens on $HOST:$PORT - not touched)"
    else
      log "not running"
    fi
    return 0
  fi
  log "stopping moto pid $pid ..."
  kill -TERM "$pid" 2>/dev/null || true
  local t=0
  while kill -0 "$pid" 2>/dev/null && ((t < 100)); do sleep 0.1; t=$((t + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$PIDFILE"
  log "stopped"
}

cmd_status() {
  local pid=""
  pid="$(live_pid || true)"
  if s3_answers; then
    echo "s3: up on $URL${pid:+ (pid $pid)}"
    return 0
  fi
  if [[ -n "$pid" ]]; then
    echo "s3: pid $pid running but not answering on $URL (see $LOGS/moto.log)"
  else
    echo "s3: down"
  fi
  return 3
}

cmd_check() {
  ensure_venv
  S3_ENDPOINT="$URL" "$VENV/bin/python" "$HERE/s3_conditional_put_check.py" "$@"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  check) shift; cmd_check "$@" ;;
  *) usage ;;
esac
