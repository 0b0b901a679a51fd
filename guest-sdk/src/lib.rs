//! Write Weir stream operators in Rust.
//!
//! An operator is a plain Rust type implementing [`Operator`], exported with
//! [`export_operator!`] and built for `wasm32-wasip2`. The host calls it with batches of records
//! of one Kafka partition; the SDK hands them to [`Operator::process`] one at a time with a
//! [`Context`] through which the operator reads and writes *keyed state* (scoped to the record's
//! key), *emits* records to its default output or to the named outputs it declares in
//! [`Operator::OUTPUTS`], and reads its stage's parameters ([`Context::parameter`]). The generated WIT bindings stay
//! inside this crate.
//!
//! # State
//! Declare each named state once as a constant, list it in [`Operator::STATES`], and use it
//! through the context:
//! - [`ValueState<T>`]: one value per key (as Flink's `ValueState`);
//! - [`MapState<K, V>`]: an ordered map per key (as Flink's `MapState`).
//!
//! **Byte encoding.** State values, map values and map keys are stored as JSON
//! (`serde_json`), so state is readable from any language. Map keys are iterated in ascending
//! order of their *encoded bytes*: for strings that is byte order of the JSON text (quotes
//! included), for non-negative integers it is *not* numeric order (`"10" < "9"`).
//!
//! **Memory is scratch.** An instance's linear memory may be discarded between any two batches
//! (after a trap, on rebalance, on restart, or simply because the host runs several instances):
//! keep nothing you need in statics or in the operator value; everything that must persist goes
//! through state.
//!
//! **Atomicity.** A record's state writes and emits take effect only if the record is
//! processed: returning `Err(Reject)` or panicking discards them. A panic traps the instance;
//! the host re-runs the batch in halves until the record that panics stands alone, applying
//! the others' effects once, in order, and dead-letters only that record.
//!
//! # Time and windows
//! [`Context::set_timer`] sets a named timer of the current key in event or processing time and
//! [`Operator::on_timer`] runs when it fires; [`Context::watermark`] and
//! [`Context::processing_time`] say where time is (docs/time.md). [`window`] builds tumbling,
//! hopping and session windows with an allowed lateness on map state and timers, storing the
//! same bytes as the Python SDK's `weir.windows`.
//! [`join`] joins a stage's two inputs — in tumbling windows, or within an interval of each
//! other — storing the same bytes as the Python SDK's `weir.joins`.
//!
//! # Testing
//! In a native build (`cargo test`), [`testing::Harness`] runs an operator with state and
//! timers in memory and the host's rules, and moves time only when the test says.
//!
//! **No clock.** The guest's clocks read 0: `SystemTime::now()` is the Unix epoch and `Instant`
//! never advances (the sandbox grants no time). An operator that waits for time to pass spins
//! until its CPU deadline ends the call and the record is dead-lettered as `deadline`; take time
//! from the records' timestamps ([`Record::timestamp_ms`]) and the host's clock
//! ([`Context::processing_time`]).
//!
//! # A whole operator
//! This is `examples/counter.rs`, which the README's test command builds for `wasm32-wasip2`.
#![doc = concat!("```ignore\n", include_str!("../examples/counter.rs"), "```")]
#![deny(missing_docs)]

mod context;
mod host;
pub mod join;
mod operator;
mod record;
mod state;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub mod window;

pub use context::{Context, LogLevel, TimeDomain, Timer};
pub use operator::{Operator, Reject};
pub use record::{Header, Record};
pub use state::{MapState, StateKind, StateSpec, Upgrade, ValueState};

#[doc(hidden)]
pub mod __private {
    //! Used by [`export_operator!`](crate::export_operator); not part of the API.
    pub use crate::operator::{describe, on_timers, process_batch};
    pub use crate::wit::exports::weir::operator::operator::{
        Disposition, FiredTimer, Guest, InputRecord, OperatorInfo,
    };
}

/// The generated bindings. Hidden: operator authors use the types re-exported above.
#[doc(hidden)]
#[allow(missing_docs, unsafe_code, clippy::all)]
pub mod wit {
    wit_bindgen::generate!({
        // `wit/` is a link to the repository's `wit/` (inside the crate, so that it packages).
        path: "wit",
        world: "weir:operator/operator-world@0.3.0",
        pub_export_macro: true,
        export_macro_name: "__export_operator_world",
        default_bindings_module: "weir_sdk::wit",
    });
}

/// Exports `$ty` (a type implementing [`Operator`]) as the component's `weir:operator` world.
///
/// Use it once per crate, at the top level of the crate that builds the `.wasm`.
#[macro_export]
macro_rules! export_operator {
    ($ty:ident) => {
        impl $crate::__private::Guest for $ty {
            fn describe() -> $crate::__private::OperatorInfo {
                $crate::__private::describe::<$ty>()
            }
            fn process_batch(
                records: ::std::vec::Vec<$crate::__private::InputRecord>,
            ) -> ::std::vec::Vec<$crate::__private::Disposition> {
                $crate::__private::process_batch::<$ty>(records)
            }
            fn on_timers(
                timers: ::std::vec::Vec<$crate::__private::FiredTimer>,
            ) -> ::std::vec::Vec<$crate::__private::Disposition> {
                $crate::__private::on_timers::<$ty>(timers)
            }
        }
        $crate::wit::__export_operator_world!($ty with_types_in $crate::wit);
    };
}
