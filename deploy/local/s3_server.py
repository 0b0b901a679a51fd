#!/usr/bin/env python3
"""moto's S3-compatible server, with requests applied one at a time.

Same app and werkzeug server as `moto_server` (moto 5.x), plus one thing:
every request runs under a process-wide lock. Stock moto checks If-None-Match /
If-Match and then stores the object as two separate steps, so two concurrent
conditional PUTs can both pass the check (only GIL timing usually hides it;
with a small sys.setswitchinterval it shows up within ~20 rounds of
s3_conditional_put_check.py). Serialising requests makes conditional PUTs
atomic, like real S3. Connections are still handled on separate threads.

Started by deploy/local/s3.sh, which runs it with the venv's python:
  $WEIR_SERVICES_DIR/s3/venv/bin/python deploy/local/s3_server.py -H 127.0.0.1 -p 9000
--no-serialize gives stock moto behaviour; --switch-interval SECONDS sets
sys.setswitchinterval (tiny values make races easy to reproduce).

--access-key ID --secret-key SECRET: accept only requests signed (AWS Signature
Version 4) with this one key pair, as real S3 does; anything else gets S3's 403
(InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied). Stock moto accepts
any key. --create-bucket NAME (repeatable) creates buckets before serving, since
in this mode an unsigned CreateBucket is refused.
"""

import argparse
import io
import os
import signal
import sys
import threading


def sigv4_only(app, access_key, secret_key):
    """`app` behind a check of each request's AWS Signature Version 4 (header
    form) against one key pair: S3's 403 error document otherwise."""
    import hashlib
    import hmac
    import urllib.parse

    def deny(start_response, code, message):
        body = ('<?xml version="1.0" encoding="UTF-8"?>'
                f"<Error><Code>{code}</Code><Message>{message}</Message></Error>").encode()
        start_response("403 Forbidden", [("Content-Type", "application/xml"),
                                         ("Content-Length", str(len(body)))])
        return [body]

    def enc(text):
        return urllib.parse.quote(urllib.parse.unquote(text), safe="-_.~")

    def header(environ, name):
        if name == "content-type":
            value = environ.get("CONTENT_TYPE", "")
        elif name == "content-length":
            value = environ.get("CONTENT_LENGTH", "")
        else:
            value = environ.get("HTTP_" + name.upper().replace("-", "_"), "")
        return " ".join(value.strip().split())

    def checked(environ, start_response):
        auth = environ.get("HTTP_AUTHORIZATION", "")
        scheme = "AWS4-HMAC-SHA256 "
        if not auth.startswith(scheme):
            return deny(start_response, "AccessDenied",
                        "Only requests signed with AWS Signature Version 4 are accepted.")
        try:
            fields = dict(part.strip().split("=", 1) for part in auth[len(scheme):].split(","))
            credential = fields["Credential"].split("/")
            signed = fields["SignedHeaders"].split(";")
            signature = fields["Signature"]
        except (KeyError, ValueError):
            return deny(start_response, "AccessDenied", "Malformed Authorization header.")
        if credential[0] != access_key:
            return deny(start_response, "InvalidAccessKeyId",
                        "The AWS Access Key Id you provided does not exist in our records.")
        uri = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
        path, _, query = uri.partition("?")
        params = sorted((enc(k), enc(v)) for k, _, v in
                        (p.partition("=") for p in query.split("&") if p))
        canonical = "\n".join([
            environ["REQUEST_METHOD"],
            path,
            "&".join(f"{k}={v}" for k, v in params),
            "".join(f"{h}:{header(environ, h)}\n" for h in signed),
            ";".join(signed),
            environ.get("HTTP_X_AMZ_CONTENT_SHA256", "UNSIGNED-PAYLOAD"),
        ])
        to_sign = "\n".join([
            "AWS4-HMAC-SHA256",
            environ.get("HTTP_X_AMZ_DATE", ""),
            "/".join(credential[1:]),
            hashlib.sha256(canonical.encode()).hexdigest(),
        ])
        key = ("AWS4" + secret_key).encode()
        for part in credential[1:]:
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            return deny(start_response, "SignatureDoesNotMatch",
                        "The request signature we calculated does not match the signature "
                        "you provided. Check your key and signing method.")
        return app(environ, start_response)

    return checked


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-H", "--host", default="127.0.0.1")
    ap.add_argument("-p", "--port", type=int, default=9000)
    ap.add_argument("--no-serialize", action="store_true", help="stock moto: no request lock")
    ap.add_argument("--switch-interval", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--access-key", help="accept only requests signed with this access key id")
    ap.add_argument("--secret-key", help="... and this secret key")
    ap.add_argument("--log-requests", action="store_true",
                    help="log every request (default: only those answered with an error)")
    ap.add_argument("--create-bucket", action="append", default=[], help="create this bucket first")
    args = ap.parse_args()
    if bool(args.access_key) != bool(args.secret_key):
        ap.error("--access-key and --secret-key go together")

    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    os.environ.setdefault("MOTO_PORT", str(args.port))

    from werkzeug.serving import run_simple
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )

    # Every request is S3's: the S3 app is called directly. moto's domain dispatcher (kept for
    # /moto-api) works out the service of each request anew, listing moto's ~200 package
    # directories each time: profiled (py-spy) under the test command, that was ~15 % of the
    # server's CPU, and the server answers every test binary's requests one at a time.
    dispatcher = DomainDispatcherApplication(create_backend_app)
    s3_app = create_backend_app("s3")

    def app(environ, start_response):
        if environ.get("PATH_INFO", "").startswith("/moto-api"):
            return dispatcher(environ, start_response)
        return s3_app(environ, start_response)

    if args.no_serialize:
        served = app
    else:
        lock = threading.Lock()

        def served(environ, start_response):
            # Read the request body before taking the lock: a client that sends
            # headers and then stalls (or drops the request mid-upload and keeps
            # the connection) must not hold every other request up.
            length = environ.get("CONTENT_LENGTH")
            stream = environ["wsgi.input"]
            if length:
                body = stream.read(int(length))
            elif environ.get("wsgi.input_terminated"):
                body = stream.read()
            else:
                body = b""
            environ["wsgi.input"] = io.BytesIO(body)
            # moto builds the whole response inside the app call (the body
            # iterable is only streamed afterwards), so holding the lock for
            # the call covers check + store of a conditional PUT.
            with lock:
                return app(environ, start_response)

    for bucket in args.create_bucket:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends
        s3_backends[DEFAULT_ACCOUNT_ID]["global"].create_bucket(bucket, "us-east-1")
    if args.access_key:
        served = sigv4_only(served, args.access_key, args.secret_key)

    def stop(signum, frame):
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"s3_server: moto on http://{args.host}:{args.port} "
          f"(serialized={'no' if args.no_serialize else 'yes'})", flush=True)
    class Handler(MotoRequestHandler):
        # A connection silent for this long is closed instead of kept forever.
        timeout = 120

        def log_request(self, code="-", size="-"):
            # Only answers that are errors (4xx, 5xx) are logged, unless --log-requests: a line
            # per request was ~12 % of the server's CPU under the test command.
            if args.log_requests or not str(getattr(code, "value", code)).startswith(("1", "2", "3")):
                super().log_request(code, size)

    run_simple(args.host, args.port, served, threaded=True, request_handler=Handler)


if __name__ == "__main__":
    main()
