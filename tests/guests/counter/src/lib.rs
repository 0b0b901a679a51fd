//! `counter`, the shared test fixture of SCENARIOS.md: `count[key] += 1`, emitting
//! `{"count": n, "offset": o}` per record. Poison values trigger failures on purpose:
//! - `poison:trap` panics (a trap);
//! - `poison:loop` loops forever (hits the CPU deadline);
//! - `poison:reject` is rejected by the operator;
//! - `poison:write-then-reject` writes state and emits, then rejects (effects must vanish);
//! - `poison:alloc` allocates 1 GiB (hits the instance memory cap);
//! - `poison:sleep` sleeps for an hour in a WASI timer (outside wasm, so only the host's
//!   wall-clock cap can end it);
//! - `poison:recurse` recurses without end (exhausts the wasm stack: a trap);
//! - `poison:emit-flood` emits 100 MB for one record in 1 MiB pieces (the host's emit limit
//!   refuses it, long before memory runs out: the piece is reused);
//! - `probe:sandbox` emits what the guest can see of its environment, as JSON;
//! - `probe:time` emits `{"watermark": …, "now": …}` as the call sees them;
//! - `log:MESSAGE` logs MESSAGE at info level and emits nothing (nor is it counted);
//! - `forward:REST` emits REST under the record's key and is not counted (a first stage that
//!   sends the next one its commands, docs/topologies.md).
//!
//! With the parameter `rekey_modulo` = M (a stage's `parameters`), it counts nothing: every
//! record goes out unchanged under the key `fnv1a32(key) mod M` in decimal — the first stage of
//! `bench/kstreams-compare`'s re-key-and-count job, whose second stage is a plain counter.
//!
//! Timers (neither counted nor emitted for):
//! - `timer:event:NAME:AT` / `timer:processing:NAME:AT` sets timer NAME of the key at AT ms;
//! - `timer:clear:NAME` clears it.
//!
//! A fired timer emits `{"fired": NAME, "time": AT, "domain": …, "watermark": …, "now": …,
//! "count": n}` under its key; a timer named `trap…` panics instead, one named `reject…` is
//! rejected, and one named `again…` also sets itself again 1000 ms later.

use serde::Serialize;
use std::cell::OnceCell;
use weir_sdk::{
    Context, LogLevel, Operator, Record, Reject, StateSpec, TimeDomain, Timer, ValueState,
};

/// The operator.
#[derive(Debug)]
pub struct Counter;

const COUNT: ValueState<u64> = ValueState::new("count");

#[derive(Serialize)]
struct Output {
    count: u64,
    offset: i64,
}

impl Operator for Counter {
    const NAME: &'static str = "counter";
    const VERSION: &'static str = "0.1.0";
    const STATES: &'static [StateSpec] = &[COUNT.spec()];

    fn process(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
        if let Some(modulo) = rekey_modulo(ctx)? {
            let mut digits = [0u8; 10];
            let key = decimal(fnv1a32(record.key()) % modulo, &mut digits);
            return ctx.emit(key, record.value());
        }
        match record.value() {
            b"poison:trap" => panic!("poison record at offset {}", record.offset()),
            b"poison:loop" =>
            {
                #[allow(clippy::empty_loop)]
                loop {}
            }
            b"poison:reject" => return Err(Reject::new("poison record rejected")),
            b"poison:write-then-reject" => {
                ctx.set(&COUNT, &1_000_000)?;
                ctx.emit(record.key(), b"must not appear")?;
                return Err(Reject::new("rejected after writing"));
            }
            b"poison:sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                return Err(Reject::new("woke up"));
            }
            b"poison:alloc" => {
                let big = vec![1u8; 1 << 30];
                return Err(Reject::new(format!("allocated {} bytes", big.len())));
            }
            b"poison:recurse" => {
                let depth = recurse(std::hint::black_box(u64::MAX));
                return Err(Reject::new(format!("recursed {depth} deep")));
            }
            b"poison:emit-flood" => {
                let piece = vec![b'x'; 1 << 20];
                for _ in 0..100 {
                    ctx.emit(record.key(), &piece)?;
                }
                return Err(Reject::new("emitted 100 MB"));
            }
            b"probe:sandbox" => return probe_sandbox(ctx, record),
            b"probe:time" => {
                let time = serde_json::json!({
                    "watermark": ctx.watermark(),
                    "now": ctx.processing_time(),
                });
                return ctx.emit_json(record.key(), &time);
            }
            value if value.starts_with(b"timer:") => return timer_command(ctx, value),
            value if value.starts_with(b"forward:") => {
                return ctx.emit(record.key(), &value[b"forward:".len()..]);
            }
            value if value.starts_with(b"log:") => {
                ctx.log(LogLevel::Info, &String::from_utf8_lossy(&value[4..]));
                return Ok(());
            }
            _ => {}
        }
        let count = ctx.get(&COUNT)?.unwrap_or(0) + 1;
        ctx.set(&COUNT, &count)?;
        ctx.emit_json(
            record.key(),
            &Output {
                count,
                offset: record.offset(),
            },
        )
    }

    fn on_timer(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        Counter::fired(ctx, timer)
    }
}

#[cfg(target_arch = "wasm32")]
weir_sdk::export_operator!(Counter);

/// The `rekey_modulo` parameter, read once per instance (an instance serves one stage, whose
/// parameters do not change while it runs; per thread, so that native tests do not share it).
fn rekey_modulo(ctx: &Context) -> Result<Option<u32>, Reject> {
    thread_local! {
        static REKEY_MODULO: OnceCell<Result<Option<u32>, String>> = const { OnceCell::new() };
    }
    REKEY_MODULO.with(|cell| {
        cell.get_or_init(|| match ctx.parameter("rekey_modulo") {
            None => Ok(None),
            Some(text) => match text.parse::<u32>() {
                Ok(modulo) if modulo > 0 => Ok(Some(modulo)),
                _ => Err(format!(
                    "rekey_modulo `{text}` is not a positive 32-bit number"
                )),
            },
        })
        .clone()
        .map_err(Reject::new)
    })
}

/// FNV-1a, 32 bits (the Java side of the benchmark computes the same).
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// `n` in decimal ASCII, written at the end of `digits`, without allocating.
fn decimal(mut n: u32, digits: &mut [u8; 10]) -> &[u8] {
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[start..];
        }
    }
}

/// Recurses `n` deep, each frame holding 256 bytes the optimiser cannot remove.
fn recurse(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let frame = std::hint::black_box([n as u8; 256]);
    recurse(n - 1) + u64::from(frame[n as usize % 256])
}

/// Emits what the sandbox shows: environment, arguments, clock, filesystem and network.
// Reads the sandbox's clock on purpose: the host must give it none.
#[allow(clippy::disallowed_methods)]
fn probe_sandbox(ctx: &mut Context, record: &Record) -> Result<(), Reject> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(-1, |d| d.as_millis() as i64);
    let probe = serde_json::json!({
        "env_vars": std::env::vars().count(),
        "args": std::env::args().count(),
        "now_ms": now_ms,
        "root_readable": std::fs::read_dir("/").is_ok(),
        "cwd_readable": std::fs::read_dir(".").is_ok(),
        "tcp_connect": std::net::TcpStream::connect("127.0.0.1:9092").is_ok(),
    });
    println!("sandbox probe from the guest's stdout");
    ctx.emit_json(record.key(), &probe)
}

/// What a fired timer emits.
#[derive(Serialize)]
struct Fired<'a> {
    fired: &'a str,
    time: i64,
    domain: &'static str,
    watermark: Option<i64>,
    now: i64,
    count: u64,
}

impl Counter {
    fn fired(ctx: &mut Context, timer: &Timer) -> Result<(), Reject> {
        if timer.name.starts_with("trap") {
            panic!("timer {} trapped", timer.name);
        }
        if timer.name.starts_with("reject") {
            ctx.set(&COUNT, &1_000_000)?;
            return Err(Reject::new(format!("timer {} rejected", timer.name)));
        }
        if timer.name.starts_with("again") && ctx.timer(&timer.name)?.is_none() {
            ctx.set_timer(&timer.name, timer.time_ms + 1000, timer.domain)?;
        }
        let count = ctx.get(&COUNT)?.unwrap_or(0);
        let domain = match timer.domain {
            TimeDomain::EventTime => "event",
            TimeDomain::ProcessingTime => "processing",
        };
        let (watermark, now) = (ctx.watermark(), ctx.processing_time());
        ctx.emit_json(
            &timer.key,
            &Fired {
                fired: &timer.name,
                time: timer.time_ms,
                domain,
                watermark,
                now,
                count,
            },
        )
    }
}

/// `timer:event:NAME:AT`, `timer:processing:NAME:AT` or `timer:clear:NAME`.
fn timer_command(ctx: &mut Context, value: &[u8]) -> Result<(), Reject> {
    let text = std::str::from_utf8(value).map_err(|_| Reject::new("timer command is not UTF-8"))?;
    let parts: Vec<&str> = text.split(':').collect();
    match parts.as_slice() {
        ["timer", "clear", name] => ctx.clear_timer(name),
        ["timer", domain, name, at] => {
            let domain = match *domain {
                "event" => TimeDomain::EventTime,
                "processing" => TimeDomain::ProcessingTime,
                other => return Err(Reject::new(format!("unknown time domain `{other}`"))),
            };
            let at = at
                .parse()
                .map_err(|_| Reject::new(format!("bad timer time `{at}`")))?;
            ctx.set_timer(name, at, domain)
        }
        _ => Err(Reject::new(format!("bad timer command `{text}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_sdk::testing::Harness;

    /// With `rekey_modulo`, a record goes out unchanged under `fnv1a32(key) mod M` and
    /// nothing is counted (fnv1a32("key-000042") = 2,803,713,957, computed apart).
    #[test]
    fn rekey_modulo_sends_each_record_under_its_hash_modulo_m_uncounted() {
        let mut h = Harness::<Counter>::new().with_parameters(&[("rekey_modulo", "10000")]);
        let out = h.send(b"key-000042", b"{\"order\":1}");
        assert!(out.is_ok());
        assert_eq!(out.emitted.len(), 1);
        assert_eq!(out.emitted[0].key, b"3957");
        assert_eq!(out.emitted[0].value, b"{\"order\":1}");
        assert_eq!(h.value(b"key-000042", &COUNT), None);
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(decimal(0, &mut [0; 10]), b"0");
        assert_eq!(decimal(u32::MAX, &mut [0; 10]), b"4294967295");
    }

    /// A `rekey_modulo` that is not a positive number rejects every record, naming it.
    #[test]
    fn a_rekey_modulo_that_is_no_number_rejects_each_record() {
        let mut h = Harness::<Counter>::new().with_parameters(&[("rekey_modulo", "0")]);
        let out = h.send(b"k", b"v");
        assert!(out.reason.is_some_and(|r| r.contains("rekey_modulo `0`")));
    }

    /// Without the parameter it counts, as ever.
    #[test]
    fn without_rekey_modulo_it_counts() {
        let mut h = Harness::<Counter>::new();
        h.send(b"k", b"v");
        let out = h.send(b"k", b"v");
        assert_eq!(
            out.emitted[0].value,
            br#"{"count":2,"offset":1}"#.as_slice()
        );
    }
}
