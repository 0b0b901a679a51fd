"""A Python test fixture operator: every part of the Python SDK through the real host imports
(value state, raw bytes, get_many, clear, map state with paging, emit with headers, logging,
rejections, timers and `on_timer`). tests/tests/runtime_sandbox.rs drives it; each record's value is a command."""

import weir

COUNT = weir.ValueState("count", int)
LAST = weir.ValueState("last", codec=weir.RAW)
WORDS = weir.MapState("words", str, int)


class Probe(weir.Operator):
    name = "sdk-probe"
    version = "1.0.0"
    states = [COUNT, LAST, WORDS]

    def process(self, ctx: weir.Context, record: weir.Record) -> None:
        command, _, arg = record.value.decode().partition(" ")
        words = ctx.map(WORDS)
        if command == "add":
            count = ctx.get(COUNT, 0) + 1
            ctx.set(COUNT, count)
            ctx.set(LAST, arg.encode())
            words[arg] = words.get(arg, 0) + 1
            ctx.emit(record.key, str(count), headers=[("word", arg)])
        elif command == "dump":
            count, last = ctx.get_many(COUNT, LAST)
            ctx.emit_json(
                record.key,
                {
                    "count": count,
                    "last": None if last is None else last.decode(),
                    "len": len(words),
                    "first": next(iter(words), None),
                    "items": sum(n for _, n in words.items()),
                    "has": arg in words,
                },
            )
        elif command == "remove":
            del words[arg]
        elif command == "clear":
            ctx.clear(COUNT)
            words.discard(arg)
        elif command == "undeclared":
            ctx.get(weir.ValueState("nope"))
        elif command == "log":
            weir.logger.warning("probe says %s", arg)
        elif command == "big":
            ctx.emit(b"", b"x" * (2 << 20))
        elif command == "lazy-import":
            import decimal  # noqa: F401  (not imported at build time: no filesystem at run time)
        elif command == "forward":
            ctx.emit(None, bytearray(b"forwarded"), headers=record.headers)
        elif command == "bad-emit":
            ctx.emit(b"k", 123)  # type: ignore[arg-type]
        elif command == "levels":
            ctx.log(30, "a logging.WARNING level")
            ctx.log(99, "clamped")
        elif command == "exit":
            raise SystemExit(3)
        elif command == "spin":
            while True:
                pass
        elif command == "timer":
            ctx.set_timer("probe", int(arg))
        elif command == "timer-get":
            found = ctx.timer("probe")
            ctx.emit_json(
                record.key,
                {
                    "timer": None if found is None else [found[0], found[1].value],
                    "watermark": ctx.watermark(),
                    "now": ctx.processing_time(),
                },
            )
        else:
            raise weir.Reject(f"unknown command {command!r}")

    def on_timer(self, ctx: weir.Context, timer: weir.Timer) -> None:
        count = ctx.get(COUNT)
        ctx.set_timer("again", timer.time_ms + 1, weir.PROCESSING_TIME)
        ctx.emit_json(
            timer.key,
            {"fired": timer.name, "at": timer.time_ms, "domain": timer.domain.value,
             "count": count},
        )


Operator = weir.export(Probe)
