#!/usr/bin/env python3
"""Diagnostic: do conditional PUTs behave atomically on the local S3 endpoint?

Checks, against ${S3_ENDPOINT:-http://127.0.0.1:9000} (dummy credentials):
  1. create-only race: 16 concurrent PUTs with If-None-Match: * to one new key
     -> exactly one succeeds, every loser gets 412 (or 409), and the stored
     body is the winner's. Repeated ROUNDS times (default 20) to catch races.
  2. sequential create-only on an existing key -> 412.
  3. If-Match with the current ETag -> succeeds; with a stale ETag -> 412.
  4. compare-and-swap race: 16 concurrent PUTs with If-Match: <current ETag>
     -> exactly one succeeds, the rest fail with 412 (or 409).
Prints the status codes seen and exits non-zero if any check fails.

Usage: deploy/local/s3_conditional_put_check.py [--rounds N] [--writers N]
Needs boto3 (the moto venv of deploy/local/s3.sh has it:
  $WEIR_SERVICES_DIR/s3/venv/bin/python deploy/local/s3_conditional_put_check.py).
"""

import argparse
import collections
import os
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

OK = "ok"


def make_client(endpoint, pool):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="weir-test",
        aws_secret_access_key="weir-test",
        config=Config(
            max_pool_connections=pool,
            retries={"max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
        ),
    )


def outcome(fn):
    """Run fn(); return ("ok", result) or (f"{status} {code}", None)."""
    try:
        return OK, fn()
    except ClientError as e:
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = e.response.get("Error", {}).get("Code")
        return f"{status} {code}", None


def race(s3, bucket, key, writers, extra_kwargs):
    """writers threads PUT distinct bodies to key at the same instant."""
    barrier = threading.Barrier(writers)

    def one(i):
        body = f"writer-{i}-{uuid.uuid4()}".encode()
        barrier.wait()
        res, resp = outcome(lambda: s3.put_object(Bucket=bucket, Key=key, Body=body, **extra_kwargs))
        return res, body, resp

    with ThreadPoolExecutor(max_workers=writers) as pool:
        return list(pool.map(one, range(writers)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--endpoint", default=os.environ.get("S3_ENDPOINT", "http://127.0.0.1:9000"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--writers", type=int, default=16)
    args = ap.parse_args()

    s3 = make_client(args.endpoint, args.writers * 2)
    bucket = f"weir-cond-check-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    failures = []
    loser_codes = collections.Counter()
    allowed_loser = ("412", "409")

    try:
        # 1. create-only race
        for r in range(args.rounds):
            key = f"create-only/{r}"
            results = race(s3, bucket, key, args.writers, {"IfNoneMatch": "*"})
            winners = [body for res, body, _ in results if res == OK]
            for res, _, _ in results:
                if res != OK:
                    loser_codes[res] += 1
            bad = [res for res, _, _ in results if res != OK and not res.startswith(allowed_loser)]
            stored = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            if len(winners) != 1:
                failures.append(f"create-only round {r}: {len(winners)} PUTs succeeded (want exactly 1)")
            elif stored != winners[0]:
                failures.append(f"create-only round {r}: stored body is not the winner's")
            if bad:
                failures.append(f"create-only round {r}: unexpected loser statuses {sorted(set(bad))}")
        print(f"[1] create-only race: {args.rounds} rounds x {args.writers} writers; "
              f"loser statuses: {dict(loser_codes)}")

        # 2. create-only on an existing key
        res, _ = outcome(lambda: s3.put_object(Bucket=bucket, Key="create-only/0", Body=b"x", IfNoneMatch="*"))
        print(f"[2] If-None-Match: * on existing key -> {res}")
        if not res.startswith(allowed_loser):
            failures.append(f"If-None-Match on existing key returned {res} (want 412/409)")

        # 3. If-Match: current vs stale ETag
        key = "cas/seq"
        e1 = s3.put_object(Bucket=bucket, Key=key, Body=b"v1")["ETag"]
        res_cur, resp = outcome(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"v2", IfMatch=e1))
        res_stale, _ = outcome(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"v3", IfMatch=e1))
        res_missing, _ = outcome(lambda: s3.put_object(Bucket=bucket, Key="cas/absent", Body=b"v", IfMatch=e1))
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        print(f"[3] If-Match current ETag -> {res_cur}; stale ETag -> {res_stale}; "
              f"missing key -> {res_missing}; final body {body!r}")
        if res_cur != OK:
            failures.append(f"If-Match with current ETag failed: {res_cur}")
        if not res_stale.startswith("412"):
            failures.append(f"If-Match with stale ETag returned {res_stale} (want 412)")
        if body != b"v2":
            failures.append(f"after stale If-Match the body is {body!r} (want b'v2')")

        # 4. compare-and-swap race
        cas_codes = collections.Counter()
        for r in range(args.rounds):
            key = f"cas/race-{r}"
            etag = s3.put_object(Bucket=bucket, Key=key, Body=b"base")["ETag"]
            results = race(s3, bucket, key, args.writers, {"IfMatch": etag})
            winners = [body for res, body, _ in results if res == OK]
            for res, _, _ in results:
                if res != OK:
                    cas_codes[res] += 1
            bad = [res for res, _, _ in results if res != OK and not res.startswith(allowed_loser)]
            stored = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            if len(winners) != 1:
                failures.append(f"CAS round {r}: {len(winners)} If-Match PUTs succeeded (want exactly 1)")
            elif stored != winners[0]:
                failures.append(f"CAS round {r}: stored body is not the winner's")
            if bad:
                failures.append(f"CAS round {r}: unexpected loser statuses {sorted(set(bad))}")
        print(f"[4] If-Match CAS race: {args.rounds} rounds x {args.writers} writers; "
              f"loser statuses: {dict(cas_codes)}")
    finally:
        try:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for obj in page.get("Contents", []):
                    s3.delete_object(Bucket=bucket, Key=obj["Key"])
            s3.delete_bucket(Bucket=bucket)
        except ClientError as e:  # cleanup only
            print(f"(cleanup of {bucket} failed: {e})", file=sys.stderr)

    if failures:
        print(f"FAIL: {len(failures)} problem(s):")
        for f in failures[:20]:
            print(f"  - {f}")
        if len(failures) > 20:
            print(f"  ... and {len(failures) - 20} more")
        return 1
    print("PASS: conditional PUTs are atomic on " + args.endpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
