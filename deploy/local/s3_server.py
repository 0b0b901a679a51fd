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
"""

import argparse
import io
import os
import signal
import sys
import threading


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-H", "--host", default="127.0.0.1")
    ap.add_argument("-p", "--port", type=int, default=9000)
    ap.add_argument("--no-serialize", action="store_true", help="stock moto: no request lock")
    ap.add_argument("--switch-interval", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    os.environ.setdefault("MOTO_PORT", str(args.port))

    from werkzeug.serving import run_simple
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )

    app = DomainDispatcherApplication(create_backend_app)

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

    def stop(signum, frame):
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"s3_server: moto on http://{args.host}:{args.port} "
          f"(serialized={'no' if args.no_serialize else 'yes'})", flush=True)
    class Handler(MotoRequestHandler):
        # A connection silent for this long is closed instead of kept forever.
        timeout = 120

    run_simple(args.host, args.port, served, threaded=True, request_handler=Handler)


if __name__ == "__main__":
    main()
