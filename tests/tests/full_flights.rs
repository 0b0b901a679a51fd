//! The end-to-end tests that push all 336,776 flights (or a slice of them, several times)
//! through pipelines on the real broker: a test binary of their own, so that while they take
//! turns (`weir_tests::FULL_FLIGHT_RUNS`: two at once starve each other's output readers) the
//! other end-to-end tests (`end_to_end`) run beside them instead of waiting behind them.
//! `cargo test -p weir-tests --test full_flights <module>::` runs one module.

// Tests measure and wait in real time; the host's code reads time only through its clock seam
// (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod airport_end_to_end;
mod busiest_origin;
mod flight_weather;
mod flights_end_to_end;
