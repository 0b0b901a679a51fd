#!/usr/bin/env python3
"""Weir against Kafka Streams on three jobs, on the local broker (bench/kstreams-compare).

Produces one input topic (--records records over --keys keys, --partitions partitions, values of
about 115 bytes of JSON), then runs on it, one after another in each repeat, each job (--shapes):
- `counter`: Kafka Streams' keyed counter (Processor API, in-memory and RocksDB store, one and
  two stream threads, record cache on and off) and `weir run` with the counter guest;
- `rekey`: re-key by fnv1a32(key) mod 10,000 and count, emitting every update: Kafka Streams'
  `groupBy(newKey).count()` (record cache off) through its repartition topic, and `weir run`
  with two stages of the counter guest (the first with `rekey_modulo`) through an internal topic;
- `enrich` (only when named in --shapes): each order left-joined with its key's row of a
  co-partitioned customers table and its item's row of a global items table: Kafka Streams'
  stream.leftJoin(KTable).leftJoin(GlobalKTable), and `weir run` with the join guest's `enrich`;
- `window-join` (only when named in --shapes): auctions joined with bids of the same key in 10 s
  tumbling windows, every pair emitted: Kafka Streams' KStream#join with JoinWindows (on an input
  whose event times make its sliding windows pair exactly the records of each tumbling window)
  and `weir run` with the join guest's `window-bytes`; its events are the join results;
Weir on the `memory` backend with file:// snapshots and on `lsm` on a file:// store, in
at-least-once and exactly-once mode. Every run starts a fresh consumer group and output topic and
is measured from outside by the same code (Measure.java): events/s and CPU µs per event of the
engine process between its first output (of the first step, for `rekey`) and its --records-th
output, and, in the first repeat, its CPU over --idle-secs once caught up. Prints the settings
of both sides and a Markdown table of the medians per job (also written to --out).

    python3 bench/kstreams-compare/run.py                 # 2,000,000 records, 3 repeats
    python3 bench/kstreams-compare/run.py --smoke         # ~20 k records, 1 repeat, every
                                                          # `counter` row, four `rekey` rows
                                                          # (two rows at a time)

Needs java >= 17 and mvn (Kafka Streams from Maven Central), cargo; starts the broker with
deploy/local/kafka.sh. --weir and --operator skip building them (the test command passes its
debug build: the smoke checks that the comparison runs, not how fast).
"""

import argparse
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "bench" / "kstreams-compare"
BOOTSTRAP = "127.0.0.1:9092"
# Commit / checkpoint interval per job, both engines. In exactly-once mode a record crosses a
# repartition or internal topic once its transaction commits (in both engines), so the `rekey`
# job's last outputs wait up to one interval after its first step is done: at 10 s that wait
# would be most of what is measured.
INTERVAL_S = {"counter": 10, "rekey": 1, "enrich": 10, "window-join": 10}
# The `rekey` job's new key: fnv1a32(key) mod this.
REKEY_MODULO = 10_000
# The `enrich` job's global table of items: this many rows (`sku-00000`…); an order's item is
# one of 50,000, so one order in five finds its item.
ITEMS = 10_000
# The `window-join` job's tumbling windows, and the part of each that its records' event times
# fill (ProduceJoin.java): two records of a key are in one window exactly when their event times
# differ by less than the spread, so Kafka Streams' JoinWindows of that difference pair the same.
WINDOW_MS = 10_000
SPREAD_MS = 5_000


@dataclass(frozen=True)
class Engine:
    """One row of the table."""

    engine: str  # "kafka-streams" | "weir"
    store: str  # "memory" | "rocksdb" | "lsm"
    threads: int  # stream threads (Kafka Streams); 0 for Weir
    delivery: str  # "at_least_once" | "exactly_once"
    cache: bool = True  # Kafka Streams' record cache (Weir has none)
    shape: str = "counter"  # the job: "counter" | "rekey" | "enrich" | "window-join"

    @property
    def label(self) -> str:
        threads = f"-{self.threads}t" if self.threads else ""
        cache = "-nocache" if self.engine == "kafka-streams" and not self.cache else ""
        mode = "alo" if self.delivery == "at_least_once" else "eos"
        job = "" if self.shape == "counter" else f"{self.shape}-"
        return f"{job}{self.engine}-{self.store}{threads}{cache}-{mode}"

    @property
    def first_step_topic_suffix(self) -> str:
        """What the first step of a two-step job writes, after the run's name ("" for one step)."""
        if self.shape != "rekey":
            return ""
        return "-rekey-repartition" if self.engine == "kafka-streams" else ".rekey.default.internal"


@dataclass
class Runs:
    events_per_s: list = field(default_factory=list)
    cpu_us_per_event: list = field(default_factory=list)
    idle_cpu_pct: list = field(default_factory=list)


def engines(shapes: list) -> list:
    rows = []
    for shape in shapes:
        # `rekey` runs Kafka Streams with its record cache off only: with it on, `count()`
        # emits only what a flush lets through, another job than Weir's.
        caches = (True, False) if shape == "counter" else (False,)
        # (`enrich`: the cache only delays a KTable's updates, a cost without a saving here.)
        for delivery in ("at_least_once", "exactly_once"):
            for store in ("memory", "rocksdb"):
                for cache in caches:
                    for threads in (1, 2):
                        rows.append(Engine("kafka-streams", store, threads, delivery, cache, shape))
            for store in ("memory", "lsm"):
                rows.append(Engine("weir", store, 0, delivery, shape=shape))
    return rows


# The `rekey` rows of the smoke run: each store kind and delivery of each engine once, paired
# so that the ratio lines run too (the other rows differ from these only in settings the
# counter's rows cover).
SMOKE_REKEY = {"rekey-kafka-streams-memory-1t-nocache-eos", "rekey-weir-memory-eos",
               "rekey-kafka-streams-rocksdb-2t-nocache-alo", "rekey-weir-lsm-alo"}


def log(msg: str) -> None:
    print(f"kstreams-compare: {msg}", file=sys.stderr, flush=True)


def sh(*cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def java_cp() -> str:
    return f"{HERE / 'target' / 'classes'}:{HERE / 'target' / 'dependency'}/*"


# Extra JVM options of every java process. The smoke run (which checks that the comparison runs,
# not how fast) sets SMOKE_JAVA_OPTS: the JIT's first tier only and the serial collector, which
# start and warm up on a fraction of the CPU; the measured runs keep the JVM's defaults.
JAVA_OPTS: list = []
SMOKE_JAVA_OPTS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:CICompilerCount=1"]


def tool(*args, capture=False) -> str:
    out = sh("java", *JAVA_OPTS, "-Xmx512m", "-cp", java_cp(), "dev.weir.kscompare.Main", *args,
             capture_output=capture, text=True)
    return out.stdout if capture else ""


def table_topics(input_topic: str) -> tuple:
    """The `enrich` job's table topics: customers (co-partitioned with the input), items."""
    return f"{input_topic}-customers", f"{input_topic}-items"


def join_topics(input_topic: str) -> tuple:
    """The `window-join` job's inputs: auctions (the left side), bids (co-partitioned)."""
    return f"{input_topic}-auctions", f"{input_topic}-bids"


def weir_config(e: Engine, name: str, args, input_topic: str, state: Path) -> str:
    store_url = f"file://{state}"
    table = "memory" if e.store == "memory" else "lsm"
    operator = args.operator
    if e.shape == "enrich":
        # The join guest's `enrich`: the customer's row from the co-partitioned table (value
        # state `c`), the item's from the global table `items`.
        customers, items = table_topics(input_topic)
        job = f"""operator = "{args.join_operator}"
input_topics = ["{input_topic}", "{customers}"]
output_topic = "{name}-out"
tables = {{ "{customers}" = "c" }}
global_tables = {{ "{items}" = "items" }}
parameters = {{ join = "enrich" }}
"""
    elif e.shape == "window-join":
        auctions, bids = join_topics(input_topic)
        job = f"""operator = "{args.join_operator}"
input_topics = ["{auctions}", "{bids}"]
output_topic = "{name}-out"
parameters = {{ join = "window-bytes", size_ms = "{WINDOW_MS}" }}
"""
    elif e.shape == "counter":
        job = f"""operator = "{operator}"
input_topics = ["{input_topic}"]
output_topic = "{name}-out"
"""
    else:
        # Two stages of the same guest; the internal topic between them is Weir's
        # (`{name}.rekey.default.internal`, as many partitions as the input).
        job = f"""
[[pipeline.stages]]
name = "rekey"
operator = "{operator}"
inputs = [{{ topic = "{input_topic}" }}]
parameters = {{ rekey_modulo = "{REKEY_MODULO}" }}

[[pipeline.stages]]
name = "count"
operator = "{operator}"
inputs = [{{ stage = "rekey" }}]
outputs = {{ default = {{ topic = "{name}-out" }} }}
"""
    return f"""[pipeline]
name = "{name}"
dead_letter_topic = "{name}-dlq"
checkpoint_interval = "{INTERVAL_S[e.shape]}s"
delivery = "{e.delivery}"
{job}
[kafka]
bootstrap_servers = "{BOOTSTRAP}"

[state]
backend = "{table}"
[state.{table}]
url = "{store_url}"
"""


def start(e: Engine, name: str, args, input_topic: str, work: Path, log_file,
          go: Path) -> subprocess.Popen:
    """Starts the engine's process, whose command waits until `go` exists (Measure creates it
    after its first poll), then becomes the engine (same pid)."""
    state = work / name
    state.mkdir()
    if e.engine == "weir":
        config = work / f"{name}.toml"
        config.write_text(weir_config(e, name, args, input_topic, state))
        cmd = [str(args.weir), "run", "--config", str(config)]
    else:
        guarantee = "at_least_once" if e.delivery == "at_least_once" else "exactly_once_v2"
        first_input = join_topics(input_topic)[0] if e.shape == "window-join" else input_topic
        cmd = ["java", *JAVA_OPTS, "-cp", java_cp(), "dev.weir.kscompare.Main", e.shape,
               "--bootstrap", BOOTSTRAP, "--input", first_input, "--output", f"{name}-out",
               "--app-id", name, "--state-dir", str(state), "--store", e.store,
               "--threads", str(e.threads), "--guarantee", guarantee,
               "--commit-ms", str(INTERVAL_S[e.shape] * 1000), "--cache", "on" if e.cache else "off",
               "--modulo", str(REKEY_MODULO)]
        if e.shape == "enrich":
            customers, items = table_topics(input_topic)
            cmd += ["--customers", customers, "--items", items]
        elif e.shape == "window-join":
            cmd += ["--right", join_topics(input_topic)[1], "--difference-ms", str(SPREAD_MS)]
    return subprocess.Popen([sys.executable, "-c", WAIT_FOR_GO, str(go), *cmd], stdout=log_file,
                            stderr=subprocess.STDOUT, cwd=ROOT)


# Polls for the go file every 5 ms, then becomes the engine (same pid). In one interpreter, not
# a shell loop: that forked `sleep` 100 times a second for as long as Measure's JVM took to
# start, which under the test command's load is seconds per row.
WAIT_FOR_GO = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.005)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def stop(e: Engine, proc: subprocess.Popen) -> None:
    # Weir drains on SIGINT (Ctrl-C); Kafka Streams closes in its SIGTERM shutdown hook.
    proc.send_signal(signal.SIGINT if e.engine == "weir" else signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


RESULT = re.compile(r"result (.*)")


def measure_one(e: Engine, repeat: int, args, input_topic: str, run_id: str, work: Path) -> dict:
    name = f"{run_id}-{e.label}-{repeat}"
    if not args.smoke:  # the smoke run made every run's topics at once
        tool("topics", "--bootstrap", BOOTSTRAP, "--create", f"{name}-out,{name}-dlq",
             "--partitions", str(args.partitions))
    log_path = work / f"{name}.log"
    with open(log_path, "w") as log_file:
        go = work / f"{name}.go"
        proc = start(e, name, args, input_topic, work, log_file, go)
        try:
            idle = args.idle_secs if repeat == 1 else 0
            start_topic = (["--start-topic", name + e.first_step_topic_suffix]
                           if e.first_step_topic_suffix else [])
            outputs = args.join_results if e.shape == "window-join" else args.records
            out = tool("measure", "--bootstrap", BOOTSTRAP, "--topic", f"{name}-out",
                       "--records", str(outputs), "--pid", str(proc.pid),
                       "--idle-secs", str(idle), "--go-file", str(go), *start_topic,
                       capture=True)
        except subprocess.CalledProcessError:
            log(f"{name} failed; its log:\n{log_path.read_text()[-4000:]}")
            raise
        finally:
            stop(e, proc)
    if e.engine == "kafka-streams" and repeat == 1 and e.threads == 1:
        cache = "cache on" if e.cache else "cache off"
        for line in log_path.read_text().splitlines():
            if line.startswith(("settings ", "effective ")):
                args.settings.setdefault(f"{e.shape}, {e.store}-{e.delivery}, {cache}", []).append(line)
    if not args.smoke:  # (a full run's outputs take gigabytes; the smoke's go at the end)
        tool("topics", "--bootstrap", BOOTSTRAP, "--delete-prefix", name)
    shutil.rmtree(work / name, ignore_errors=True)
    match = RESULT.search(out)
    if not match:
        raise SystemExit(f"measure printed no result for {name}: {out!r}")
    return dict(kv.split("=", 1) for kv in match.group(1).split())


def build(args) -> None:
    log("building the Kafka Streams side (mvn)")
    sh("mvn", "-q", "-B", "compile", "dependency:copy-dependencies", cwd=HERE)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if args.operator is None:
        log("building the counter guest")
        sh("rustup", "target", "add", "wasm32-wasip2", capture_output=True)
        sh("cargo", "build", "--profile", "guest", "--target", "wasm32-wasip2",
           "-p", "weir-test-counter", cwd=ROOT)
        args.operator = target / "wasm32-wasip2" / "guest" / "weir_test_counter.wasm"
    if {"enrich", "window-join"} & set(args.shapes):
        log("building the join guest (the `enrich` and `window-join` jobs' Weir operator)")
        sh("cargo", "build", "--profile", "guest", "--target", "wasm32-wasip2",
           "-p", "weir-test-join", cwd=ROOT)
        args.join_operator = (target / "wasm32-wasip2" / "guest" / "weir_test_join.wasm").resolve()
    if args.weir is None:
        log("building weir (release)")
        sh("cargo", "build", "--release", "-p", "weir-cli", "--bin", "weir", cwd=ROOT)
        args.weir = target / "release" / "weir"
    args.operator = Path(args.operator).resolve()
    args.weir = Path(args.weir).resolve()


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def table(args, results: dict) -> str:
    medians = {e: (statistics.median(r.events_per_s), statistics.median(r.cpu_us_per_event))
               for e, r in results.items()}
    parts = []
    for shape in args.shapes:
        rows = ["| engine | store | stream threads | record cache | delivery | events/s | CPU µs/event | idle CPU (% of a core) | runs |",
                "|---|---|---|---|---|---:|---:|---:|---:|"]
        for e, runs in results.items():
            if e.shape != shape:
                continue
            eps, cpu = medians[e]
            idle = runs.idle_cpu_pct[0] if runs.idle_cpu_pct else float("nan")
            cache = ("on" if e.cache else "off") if e.engine == "kafka-streams" else "–"
            rows.append(f"| {e.engine} | {e.store} | {e.threads or '–'} | {cache} | {e.delivery} | "
                        f"{fmt_int(eps)} | {cpu:.2f} | {idle:.2f} | {len(runs.events_per_s)} |")
        caches = "record cache on and off" if shape == "counter" else "record cache off"
        lines = [f"### `{shape}`", "", "\n".join(rows), "",
                 f"Weir against Kafka Streams' best row (by events/s, among 1 and 2 stream threads, "
                 f"{caches}) for the same store kind and delivery:", ""]
        for delivery in ("at_least_once", "exactly_once"):
            for weir_store, ks_store in (("memory", "memory"), ("lsm", "rocksdb")):
                w = Engine("weir", weir_store, 0, delivery, shape=shape)
                best = best_kafka_streams(medians, shape, ks_store, delivery)
                if w not in medians or best is None:
                    continue  # (a run of some rows only: --only)
                we, be = medians[w], medians[best]
                lines.append(f"- {delivery}, Weir `{weir_store}` / Kafka Streams {ks_store} "
                             f"(best: `{best.label}`): {we[0] / be[0]:.2f}× the events/s, "
                             f"{we[1] / be[1]:.2f}× the CPU µs/event")
        if shape == "rekey":
            lines += ["", f"What the `{shape}` job's edge (internal or repartition topic) costs: "
                      "each engine's row against its `counter` row, same input, store and delivery:", ""]
            for delivery in ("at_least_once", "exactly_once"):
                for weir_store, ks_store in (("memory", "memory"), ("lsm", "rocksdb")):
                    one = Engine("weir", weir_store, 0, delivery)
                    two = Engine("weir", weir_store, 0, delivery, shape=shape)
                    if one in medians and two in medians:
                        lines.append(edge_cost(f"Weir `{weir_store}`", delivery, medians[one],
                                               medians[two]))
                    one = best_kafka_streams(medians, "counter", ks_store, delivery, cache=False)
                    two = best_kafka_streams(medians, shape, ks_store, delivery)
                    if one and two:
                        lines.append(edge_cost(f"Kafka Streams {ks_store} (`{two.label}` / "
                                               f"`{one.label}`)", delivery, medians[one], medians[two]))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def best_kafka_streams(medians: dict, shape: str, store: str, delivery: str, cache=None):
    """Kafka Streams' row with the most events/s for the job, store and delivery (and record
    cache, when given), or None when none ran."""
    rows = [e for e in medians if e.engine == "kafka-streams" and e.shape == shape
            and e.store == store and e.delivery == delivery and cache in (None, e.cache)]
    return max(rows, key=lambda e: medians[e][0]) if rows else None


def edge_cost(who: str, delivery: str, one: tuple, two: tuple) -> str:
    return (f"- {delivery}, {who}: {two[0] / one[0]:.2f}× the events/s, {two[1] / one[1]:.2f}× "
            f"the CPU µs/event ({two[1] - one[1]:+.2f} µs)")


def settings_text(args, input_bytes: int) -> str:
    weir_version = subprocess.run([str(args.weir), "--version"], capture_output=True,
                                  text=True).stdout.strip()
    lines = [
        f"Input: {args.records:,} records over {args.keys:,} keys, {args.partitions} partitions, "
        f"{input_bytes / args.records:.0f} bytes of key and value per record on average; "
        f"{args.repeats} repeat(s), medians; idle CPU over {args.idle_secs} s in the first repeat.",
        f"Broker: deploy/local/kafka.sh (Apache Kafka 4.1.1, one KRaft node) on {BOOTSTRAP}.",
        "Both: commit / checkpoint interval "
        + ", ".join(f"{INTERVAL_S[shape]} s for `{shape}`" for shape in args.shapes)
        + "; producer linger.ms 5, batch.size 1000000, "
        "compression lz4; consumer fetch.min.bytes 1, fetch wait 500 ms, fetch.max.bytes 52428800, "
        "max.partition.fetch.bytes 1048576 (librdkafka's and the Java client's defaults).",
        "Kafka Streams 4.1.1, Processor API, KeyValueStore<Bytes, Long> with changelog, record "
        "cache on (10 MiB, as a DSL count()) and off (statestore.cache.max.bytes 0) (shipped "
        "defaults otherwise, JVM defaults); exactly-once = exactly_once_v2. `rekey`: the DSL's "
        f"groupBy(fnv1a32(key) mod {REKEY_MODULO:,}).count(), cache off, same store kinds.",
        f"Weir: {weir_version} ({args.weir}), operator {args.operator}, shipped defaults: "
        "`memory` snapshots and `lsm` store on file:// in a temporary directory; exactly-once = "
        "delivery = \"exactly_once\". `rekey`: two stages of the counter guest, the first with "
        f"`rekey_modulo = {REKEY_MODULO}`, through an internal topic of {args.partitions} partitions.",
        f"`enrich`: each order left-joined with its key's row of a {args.keys:,}-row customers "
        f"table (co-partitioned) and its item's row of a {ITEMS:,}-row global table of items; "
        "Kafka Streams: the DSL's stream.leftJoin(KTable).leftJoin(GlobalKTable), stores of the "
        "row's kind, cache off, topology.optimization=all (the KTable's source topic is its "
        "changelog); Weir: one stage of the join guest (`join = \"enrich\"`), the customers a "
        "`tables` input, the items a `global_tables` one. Both emit every order, "
        "`{\"o\":order,\"c\":row,\"i\":row}`, concatenated bytes.",
    ]
    if "window-join" in args.shapes:
        lines.append(
            f"`window-join`: {args.records:,} records (auctions and bids, even odds, same "
            f"{args.keys:,} keys, co-partitioned) whose event times fill the first {SPREAD_MS:,} ms of "
            f"each of {args.join_windows} consecutive {WINDOW_MS:,} ms windows; "
            f"{args.join_results:,} join results, the job's events. Kafka Streams: the DSL's "
            f"auctions.join(bids, JoinWindows.ofTimeDifferenceWithNoGrace({SPREAD_MS:,} ms)), "
            "window stores of the row's kind (dsl.store.suppliers.class), changelog on; Weir: one "
            f"stage of the join guest (`join = \"window-bytes\"`, `size_ms = {WINDOW_MS}`: tumbling "
            "windows, state cleared by event-time timers). Both emit every pair as "
            "`{\"l\":auction,\"r\":bid}`, concatenated bytes.")
    for key, settings in sorted(args.settings.items()):
        for line in settings:
            lines.append(f"Kafka Streams {key}: {line}")
    return "\n".join(f"- {line}" for line in lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--idle-secs", type=int, default=60)
    p.add_argument("--shapes", default="counter,rekey",
                   help="the jobs, comma-separated: counter, rekey, enrich, window-join")
    p.add_argument("--only", default="", help="comma-separated labels to run (e.g. weir-memory-alo)")
    p.add_argument("--weir", help="the weir binary (default: cargo build --release)")
    p.add_argument("--operator", help="the counter guest (default: built here)")
    p.add_argument("--out", help="also write the report here")
    p.add_argument("--smoke", action="store_true",
                   help="20,000 records over 2,000 keys, 1 repeat, 1 s idle: checks that every "
                        "`counter` row and one `rekey` row per engine, store and delivery runs")
    args = p.parse_args()
    if args.smoke:
        args.records, args.keys, args.repeats, args.idle_secs = 20_000, 2_000, 1, 1
        JAVA_OPTS.extend(SMOKE_JAVA_OPTS)
    args.settings = {}
    args.shapes = [shape for shape in args.shapes.split(",") if shape]
    if not args.shapes or set(args.shapes) - set(INTERVAL_S):
        raise SystemExit(f"--shapes: some of {', '.join(INTERVAL_S)}")

    sh("bash", str(ROOT / "deploy" / "local" / "kafka.sh"), "start")
    build(args)
    rows = [e for e in engines(args.shapes) if not args.only or e.label in args.only.split(",")]
    if args.smoke and not args.only:
        rows = [e for e in rows if e.shape == "counter" or e.label in SMOKE_REKEY]
    run_id = f"kscmp-{int(time.time())}"
    input_topic = f"{run_id}-in"
    work = Path(tempfile.mkdtemp(prefix="kstreams-compare-"))
    try:
        # The smoke run (part of the test command, beside the tests) creates every run's
        # topics in one call: a JVM per call is most of its CPU.
        made = [input_topic] + ([f"{run_id}-{e.label}-1-{t}" for e in rows for t in ("out", "dlq")]
                                if args.smoke else [])
        tool("topics", "--bootstrap", BOOTSTRAP, "--create", ",".join(made),
             "--partitions", str(args.partitions))
        log(f"producing {args.records:,} records to {input_topic}")
        produced = tool("produce", "--bootstrap", BOOTSTRAP, "--topic", input_topic,
                        "--records", str(args.records), "--keys", str(args.keys), capture=True)
        input_bytes = int(produced.split()[-1])
        if "enrich" in args.shapes:
            customers, items = table_topics(input_topic)
            tool("topics", "--bootstrap", BOOTSTRAP, "--create", f"{customers},{items}",
                 "--partitions", str(args.partitions))
            log(f"producing the tables: {args.keys:,} customers, {ITEMS:,} items")
            for topic, kind, keys in ((customers, "customers", args.keys), (items, "items", ITEMS)):
                tool("produce-table", "--bootstrap", BOOTSTRAP, "--topic", topic, "--table", kind,
                     "--keys", str(keys), capture=True)
        args.join_windows, args.join_results = 0, 0
        if "window-join" in args.shapes:
            auctions, bids = join_topics(input_topic)
            tool("topics", "--bootstrap", BOOTSTRAP, "--create", f"{auctions},{bids}",
                 "--partitions", str(args.partitions))
            # About two records of each side per key and window: about as many results as
            # records.
            args.join_windows = max(1, args.records // (4 * args.keys))
            log(f"producing the window join's {args.records:,} auctions and bids over "
                f"{args.join_windows} windows")
            produced = tool("produce-join", "--bootstrap", BOOTSTRAP, "--left", auctions,
                            "--right", bids, "--records", str(args.records), "--keys",
                            str(args.keys), "--windows", str(args.join_windows), "--window-ms",
                            str(WINDOW_MS), "--spread-ms", str(SPREAD_MS), "--now-ms",
                            str(int(time.time() * 1000)), capture=True)
            args.join_results = int(produced.split()[-1])
        results = {e: Runs() for e in rows}
        for repeat in range(1, args.repeats + 1):
            def run(e: Engine, repeat=repeat) -> None:
                log(f"repeat {repeat}/{args.repeats}: {e.label}")
                r = measure_one(e, repeat, args, input_topic, run_id, work)
                log(f"  {e.label}: {float(r['events_per_s']):,.0f} events/s, "
                    f"{r['cpu_us_per_event']} µs/event")
                if not all(math.isfinite(float(r[k])) for k in ("events_per_s", "cpu_us_per_event")):
                    raise SystemExit(f"{e.label}: the measurement is not a number: {r}")
                results[e].events_per_s.append(float(r["events_per_s"]))
                results[e].cpu_us_per_event.append(float(r["cpu_us_per_event"]))
                if repeat == 1 and args.idle_secs > 0:
                    results[e].idle_cpu_pct.append(float(r["idle_cpu_pct"]))
            # Measured runs one at a time; the smoke's (whose speed means nothing) two at once,
            # the test command's tail having both cores to itself.
            with ThreadPoolExecutor(max_workers=2 if args.smoke else 1) as pool:
                for done in [pool.submit(run, e) for e in rows]:
                    done.result()
        report = settings_text(args, input_bytes) + "\n\n" + table(args, results)
        print(report)
        if args.out:
            Path(args.out).write_text(report + "\n")
    finally:
        tool("topics", "--bootstrap", BOOTSTRAP, "--delete-prefix", run_id)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
