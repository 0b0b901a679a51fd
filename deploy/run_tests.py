#!/usr/bin/env python3
"""Runs the test binaries that `cargo test --no-run --message-format=json` built, all at once.

`cargo test` runs its test binaries one after another and holds the build directory's lock while
they run, so two cannot overlap: the crash loop (~150 s, mostly waiting on processes it kills)
then waited for the end-to-end binary (~250 s, mostly waiting on the broker). Run side by side
they take as long as the longest. Each binary runs as cargo runs it (in its package's
directory, with its harness's own thread count); its output is printed whole when it ends, so
binaries do not interleave. cargo-nextest does this and more, but it is not on the machine and
building it costs more than it saves here.

Usage: cargo test ... --no-run --message-format=json | python3 deploy/run_tests.py [--beside N CMD]... [-- ARGS]
ARGS go to every test binary (a name filter, `--nocapture`). --beside N CMD runs the shell
command CMD once at most N test binaries are still running, beside the last ones (the test
command's Kafka Streams smoke run beside the last two: started with all the binaries it slowed
the longest one by as long as it saved; the soak beside them too, on a broker listener of its
own). --beside-last CMD is --beside 2 CMD.
Exits 1 if any binary, or command, failed.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time


def test_binaries(lines):
    """(name, executable, package directory) of every test binary in cargo's JSON messages."""
    found = []
    for line in lines:
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        package_dir = os.path.dirname(msg["manifest_path"])
        name = f"{os.path.basename(package_dir)}/{target['name']} ({'/'.join(target['kind'])})"
        found.append((name, msg["executable"], package_dir))
    return found


# A test that returns an `anyhow::Error` prints it with the backtrace captured where it was made,
# which is long and says less than the message above it: RUST_LIB_BACKTRACE=0 keeps the message
# last. A panic still prints its backtrace when RUST_BACKTRACE asks for one.
TEST_ENV = {**os.environ, "RUST_LIB_BACKTRACE": "0"}

# --beside-last starts its command once this many test binaries are still running, or fewer:
# the longest ones end within a minute of each other, and the command (the Kafka Streams smoke
# run, ~1 minute) then overlaps their ends rather than running after them.
BESIDE_LAST_FROM = 2

# How much of a failed test's output `failure_tails` repeats at the end.
TAIL_LINES = 30
LINE_CHARS = 400
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def start(name, argv, cwd, shell=False):
    """Starts one process, its output (stdout and stderr) kept in a temporary file."""
    out = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, shell=shell, env=TEST_ENV
    )
    return (name, proc, out, time.monotonic())


def failure_tails(text):
    """The last lines of each failed test's output in a libtest report, colours removed and long
    lines cut: repeated at the very end, where a log that keeps only its head and tail shows
    them, however much the tests printed before."""
    tails = []
    for m in re.finditer(r"^---- (\S+) stdout ----\n(.*?)(?=^---- \S+ stdout ----$|^failures:$|\Z)",
                         text, re.M | re.S):
        lines = [ANSI.sub("", line)[:LINE_CHARS] for line in m.group(2).rstrip().splitlines()]
        tails.append((m.group(1), lines[-TAIL_LINES:]))
    return tails


def main():
    args = sys.argv[1:]
    # (at most this many binaries running, command), in the order given.
    beside = []
    while True:
        if args[:1] == ["--beside-last"] and len(args) >= 2:
            beside.append((BESIDE_LAST_FROM, args[1]))
            args = args[2:]
        elif args[:1] == ["--beside"] and len(args) >= 3:
            beside.append((int(args[1]), args[2]))
            args = args[3:]
        else:
            break
    if args[:1] == ["--"]:
        args = args[1:]
    binaries = test_binaries(sys.stdin)
    if not binaries:
        print("run_tests.py: no test binaries in the input", file=sys.stderr)
        return 2
    running = [start(name, [executable, *args], cwd) for name, executable, cwd in binaries]
    commands = {cmd for _, cmd in beside}
    passed = failed = 0
    failed_binaries = []
    tails = []
    while running:
        binaries_left = sum(1 for name, *_ in running if name not in commands)
        for entry in [b for b in beside if binaries_left <= b[0]]:
            running.append(start(entry[1], entry[1], None, shell=True))
            beside.remove(entry)
        for entry in list(running):
            name, proc, out, started = entry
            if proc.poll() is None:
                continue
            running.remove(entry)
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
            print(f"\n     Ran {name} in {time.monotonic() - started:.0f} s", flush=True)
            sys.stdout.write(text)
            for m in re.finditer(r"^test result: \w+\. (\d+) passed; (\d+) failed", text, re.M):
                passed += int(m.group(1))
                failed += int(m.group(2))
            if proc.returncode != 0:
                failed_binaries.append(f"{name}: exit {proc.returncode}")
                tails.extend(failure_tails(text))
        time.sleep(0.2)
    if beside:
        # The last binaries ended in the same round, before they started.
        running.extend(start(cmd, cmd, None, shell=True) for _, cmd in beside)
        return finish(running, passed, failed, failed_binaries, tails)
    return report(passed, failed, failed_binaries, tails)


def finish(running, passed, failed, failed_binaries, tails):
    for name, proc, out, started in running:
        proc.wait()
        out.seek(0)
        print(f"\n     Ran {name} in {time.monotonic() - started:.0f} s", flush=True)
        sys.stdout.write(out.read().decode("utf-8", "replace"))
        if proc.returncode != 0:
            failed_binaries.append(f"{name}: exit {proc.returncode}")
    return report(passed, failed, failed_binaries, tails)


def report(passed, failed, failed_binaries, tails):
    for test, lines in tails:
        print(f"\n---- the end of {test}'s output", flush=True)
        print("\n".join(lines), flush=True)
    print(f"\ntest binaries: {passed} passed, {failed} failed", flush=True)
    for line in failed_binaries:
        print(f"FAILED {line}", flush=True)
    return 1 if failed_binaries else 0


if __name__ == "__main__":
    sys.exit(main())
