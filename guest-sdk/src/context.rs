//! [`Context`]: the operator's handle to keyed state, emit and log for the current record.

use crate::host::{
    emit as wit_emit, log as wit_log, parameters as wit_parameters, state as wit_state,
    tables as wit_tables, timers as wit_timers,
};
use crate::operator::Reject;
use crate::state::{MapState, Schema, ValueState};
use crate::wit::weir::operator::emit::EmitError;
use crate::wit::weir::operator::log::Level;
use crate::wit::weir::operator::timers::TimerError;
use crate::wit::weir::operator::types::TimeDomain as WitTimeDomain;
use crate::wit::weir::operator::types::{Header as WitHeader, StateError};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Severity of a [`Context::log`] line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the operator handled.
    Warn,
    /// Something failed.
    Error,
}

/// The two kinds of time a timer can be set in (as Flink's `TimeDomain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Record timestamps, as the shard's watermark tracks them: an event-time timer fires once
    /// the watermark reaches its time.
    EventTime,
    /// The host's clock: a processing-time timer fires once the clock reaches its time, even
    /// when no record arrives.
    ProcessingTime,
}

impl TimeDomain {
    pub(crate) fn to_wit(self) -> WitTimeDomain {
        match self {
            TimeDomain::EventTime => WitTimeDomain::EventTime,
            TimeDomain::ProcessingTime => WitTimeDomain::ProcessingTime,
        }
    }
}

/// A timer that fired, as [`crate::Operator::on_timer`] receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    /// The key it was set for (the context acts for it).
    pub key: Vec<u8>,
    /// Its name.
    pub name: String,
    /// The time it was set for, ms of its domain.
    pub time_ms: i64,
    /// Its domain.
    pub domain: TimeDomain,
}

/// Access to the current record's (or fired timer's) keyed state and timers, to emit and to
/// log.
///
/// Every state call reads or writes the state of the current record's key; writes become
/// visible to later records at once and durable when the record is processed.
#[derive(Debug)]
pub struct Context {
    record: u32,
}

/// Largest page [`Context::map_entries`] asks the host for.
const MAP_PAGE_SIZE: u32 = 256;

impl Context {
    pub(crate) fn for_record(record: u32) -> Self {
        Self { record }
    }

    /// Reads a value state; `None` when the key has none.
    ///
    /// # Errors
    /// [`Reject`] when the state is undeclared or of the other kind, or its stored bytes do not
    /// decode as `T` (for example after an incompatible change of `T`).
    pub fn get<T: DeserializeOwned>(&mut self, state: &ValueState<T>) -> Result<Option<T>, Reject> {
        let bytes = wit_state::value_get(self.record, state.name()).map_err(state_reject)?;
        bytes.map(|b| decode(state.schema(), &b)).transpose()
    }

    /// Reads a value state's stored bytes as they are, not decoded: a table input's row is its
    /// topic's record value, in whatever format the topic has (docs/topologies.md, "Tables").
    /// `None` when the key has none.
    ///
    /// # Errors
    /// [`Reject`] when the state is undeclared or of the other kind.
    pub fn get_bytes<T>(&mut self, state: &ValueState<T>) -> Result<Option<Vec<u8>>, Reject> {
        wit_state::value_get(self.record, state.name()).map_err(state_reject)
    }

    /// Reads two value states of the current key in one host round trip.
    ///
    /// # Errors
    /// As [`Context::get`].
    pub fn get2<A: DeserializeOwned, B: DeserializeOwned>(
        &mut self,
        a: &ValueState<A>,
        b: &ValueState<B>,
    ) -> Result<(Option<A>, Option<B>), Reject> {
        let names = [a.name().to_owned(), b.name().to_owned()];
        let mut values = wit_state::get_many(self.record, &names).map_err(state_reject)?;
        let vb = values.pop().flatten();
        let va = values.pop().flatten();
        Ok((
            va.map(|v| decode(a.schema(), &v)).transpose()?,
            vb.map(|v| decode(b.schema(), &v)).transpose()?,
        ))
    }

    /// Sets a value state.
    ///
    /// # Errors
    /// [`Reject`] when the state is undeclared or of the other kind, or the encoded value is
    /// larger than the host allows (1 MiB by default).
    pub fn set<T: Serialize>(&mut self, state: &ValueState<T>, value: &T) -> Result<(), Reject> {
        let bytes = encode_value(state.schema(), value)?;
        wit_state::value_set(self.record, state.name(), &bytes).map_err(state_reject)
    }

    /// Clears a value state; clearing an absent value is fine.
    ///
    /// # Errors
    /// [`Reject`] when the state is undeclared or of the other kind.
    pub fn clear<T>(&mut self, state: &ValueState<T>) -> Result<(), Reject> {
        wit_state::value_clear(self.record, state.name()).map_err(state_reject)
    }

    /// Reads one entry of a map state.
    ///
    /// # Errors
    /// [`Reject`] when the state is undeclared or of the other kind, the encoded map key is
    /// too large (4 KiB by default), or the stored value does not decode as `V`.
    pub fn map_get<K: Serialize, V: DeserializeOwned>(
        &mut self,
        state: &MapState<K, V>,
        key: &K,
    ) -> Result<Option<V>, Reject> {
        let key = encode(state.name(), key)?;
        let bytes = wit_state::map_get(self.record, state.name(), &key).map_err(state_reject)?;
        bytes.map(|b| decode(state.schema(), &b)).transpose()
    }

    /// Inserts or replaces one entry of a map state.
    ///
    /// # Errors
    /// As [`Context::map_get`], and when the encoded value is too large.
    pub fn map_put<K: Serialize, V: Serialize>(
        &mut self,
        state: &MapState<K, V>,
        key: &K,
        value: &V,
    ) -> Result<(), Reject> {
        let key = encode(state.name(), key)?;
        let value = encode_value(state.schema(), value)?;
        wit_state::map_put(self.record, state.name(), &key, &value).map_err(state_reject)
    }

    /// Removes one entry of a map state; removing an absent entry is fine.
    ///
    /// # Errors
    /// As [`Context::map_get`].
    pub fn map_remove<K: Serialize, V>(
        &mut self,
        state: &MapState<K, V>,
        key: &K,
    ) -> Result<(), Reject> {
        let key = encode(state.name(), key)?;
        wit_state::map_remove(self.record, state.name(), &key).map_err(state_reject)
    }

    /// Reads every entry of a map state, in ascending order of encoded keys, paging through
    /// the host 256 entries at a time.
    ///
    /// # Errors
    /// As [`Context::map_get`], for any page or entry.
    pub fn map_entries<K: DeserializeOwned, V: DeserializeOwned>(
        &mut self,
        state: &MapState<K, V>,
    ) -> Result<Vec<(K, V)>, Reject> {
        let mut entries = Vec::new();
        let mut start_after: Option<Vec<u8>> = None;
        loop {
            let page = wit_state::map_iterate(
                self.record,
                state.name(),
                start_after.as_deref(),
                MAP_PAGE_SIZE,
            )
            .map_err(state_reject)?;
            for (k, v) in page.entries {
                entries.push((decode_key(state.name(), &k)?, decode(state.schema(), &v)?));
            }
            match page.next {
                Some(next) => start_after = Some(next),
                None => return Ok(entries),
            }
        }
    }

    /// Sets timer `name` of the current key to fire at `at_ms` in `domain`, replacing any
    /// timer of that name (as Flink's named timers: at most one per key and name). Staged like
    /// a state write: it takes effect only if the record is processed. An event-time timer at
    /// or before the current watermark fires in the next round.
    ///
    /// # Errors
    /// [`Reject`] for a name that is empty or longer than 128 bytes, or a new name beyond the
    /// host's limit of timers per key (1,024 by default).
    pub fn set_timer(&mut self, name: &str, at_ms: i64, domain: TimeDomain) -> Result<(), Reject> {
        wit_timers::set(self.record, name, at_ms, domain.to_wit()).map_err(timer_reject)
    }

    /// Removes timer `name` of the current key; removing one that is not set is not an error.
    ///
    /// # Errors
    /// [`Reject`] for an invalid name.
    pub fn clear_timer(&mut self, name: &str) -> Result<(), Reject> {
        wit_timers::clear(self.record, name).map_err(timer_reject)
    }

    /// When timer `name` of the current key fires, and in which domain; `None` when it is not
    /// set.
    ///
    /// # Errors
    /// [`Reject`] for an invalid name.
    pub fn timer(&mut self, name: &str) -> Result<Option<(i64, TimeDomain)>, Reject> {
        let found = wit_timers::get(self.record, name).map_err(timer_reject)?;
        Ok(found.map(|(at, domain)| {
            (
                at,
                match domain {
                    WitTimeDomain::EventTime => TimeDomain::EventTime,
                    WitTimeDomain::ProcessingTime => TimeDomain::ProcessingTime,
                },
            )
        }))
    }

    /// The shard's applied event-time watermark, ms: records with timestamps at or before it
    /// are late. `None` until it is first applied (docs/time.md). Constant within a call.
    pub fn watermark(&self) -> Option<i64> {
        wit_timers::watermark()
    }

    /// The host's clock at the start of the call, ms since the Unix epoch (as Flink's
    /// `currentProcessingTime()`); the guest's own clocks read zero.
    pub fn processing_time(&self) -> i64 {
        wit_timers::current_processing_time()
    }

    /// Emits a record to the default output (the pipeline's output topic, or the next stage)
    /// with the input record's timestamp; an empty key is produced as a null key.
    ///
    /// # Errors
    /// [`Reject`] when the bytes emitted for this input record exceed the host's limit.
    pub fn emit(&mut self, key: &[u8], value: &[u8]) -> Result<(), Reject> {
        wit_emit::emit(self.record, key, value, &[]).map_err(emit_reject)
    }

    /// Emits a record with headers, given as (name, value) pairs.
    ///
    /// # Errors
    /// As [`Context::emit`].
    pub fn emit_with_headers(
        &mut self,
        key: &[u8],
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) -> Result<(), Reject> {
        wit_emit::emit(self.record, key, value, &wit_headers(headers)).map_err(emit_reject)
    }

    /// Emits a record to output `output`: `"default"` or one of [`crate::Operator::OUTPUTS`]
    /// (as Flink's side outputs, or Kafka Streams' `branch`).
    ///
    /// # Errors
    /// As [`Context::emit`], or when the operator does not declare `output`.
    pub fn emit_to(&mut self, output: &str, key: &[u8], value: &[u8]) -> Result<(), Reject> {
        self.emit_to_at(output, key, value, &[], None)
    }

    /// Emits a record to output `output` with headers and, when `timestamp_ms` is given, that
    /// timestamp (ms since the Unix epoch) instead of the input record's: its event time in a
    /// later stage, where one at or below that stage's watermark arrives late.
    ///
    /// # Errors
    /// As [`Context::emit_to`].
    pub fn emit_to_at(
        &mut self,
        output: &str,
        key: &[u8],
        value: &[u8],
        headers: &[(&str, &[u8])],
        timestamp_ms: Option<i64>,
    ) -> Result<(), Reject> {
        let headers = wit_headers(headers);
        wit_emit::emit_to(self.record, output, key, value, &headers, timestamp_ms)
            .map_err(emit_reject)
    }

    /// Emits `value` encoded as JSON to output `output`.
    ///
    /// # Errors
    /// As [`Context::emit_to`], or when `value` cannot be encoded.
    pub fn emit_json_to<T: Serialize + ?Sized>(
        &mut self,
        output: &str,
        key: &[u8],
        value: &T,
    ) -> Result<(), Reject> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| Reject::new(format!("cannot encode output: {e}")))?;
        self.emit_to(output, key, &bytes)
    }

    /// The row of `key` in the stage's global table `name` (an input's `global_table`:
    /// docs/topologies.md, "Global tables"), as its topic's record holds it; `None` when the
    /// table has no row for the key. Any key, not only the record's: the table is whole on
    /// every host. It holds every update the host applied before this call, which may not yet
    /// include one produced just before this record.
    ///
    /// # Errors
    /// [`Reject`] when the stage reads no global table of that name, or the key is longer
    /// than the host allows (4 KiB by default).
    pub fn lookup_bytes(&self, name: &str, key: &[u8]) -> Result<Option<Vec<u8>>, Reject> {
        wit_tables::get(name, key).map_err(|err| match err {
            StateError::UnknownState(name) => Reject::new(format!(
                "table error: the stage reads no global table `{name}`"
            )),
            other => state_reject(other),
        })
    }

    /// [`Context::lookup_bytes`], the row decoded from JSON.
    ///
    /// # Errors
    /// As [`Context::lookup_bytes`], or when the row does not decode as `T`.
    pub fn lookup<T: DeserializeOwned>(&self, name: &str, key: &[u8]) -> Result<Option<T>, Reject> {
        self.lookup_bytes(name, key)?
            .map(|row| {
                serde_json::from_slice(&row).map_err(|e| {
                    Reject::new(format!(
                        "cannot decode the row of global table `{name}`: {e}"
                    ))
                })
            })
            .transpose()
    }

    /// The value of the stage's parameter `name` (the pipeline's `parameters`), or `None`.
    pub fn parameter(&self, name: &str) -> Option<String> {
        wit_parameters::get(name)
    }

    /// Every parameter of the stage as (name, value), in name order.
    pub fn parameters(&self) -> Vec<(String, String)> {
        wit_parameters::entries()
    }

    /// Emits `value` encoded as JSON.
    ///
    /// # Errors
    /// As [`Context::emit`], or when `value` cannot be encoded.
    pub fn emit_json<T: Serialize + ?Sized>(
        &mut self,
        key: &[u8],
        value: &T,
    ) -> Result<(), Reject> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| Reject::new(format!("cannot encode output: {e}")))?;
        self.emit(key, &bytes)
    }

    /// Writes a line to the host's log (rate-limited by the host; never fails).
    pub fn log(&mut self, level: LogLevel, message: &str) {
        let level = match level {
            LogLevel::Trace => Level::Trace,
            LogLevel::Debug => Level::Debug,
            LogLevel::Info => Level::Info,
            LogLevel::Warn => Level::Warn,
            LogLevel::Error => Level::Error,
        };
        wit_log::log(level, message);
    }
}

fn wit_headers(headers: &[(&str, &[u8])]) -> Vec<WitHeader> {
    headers
        .iter()
        .map(|(name, value)| WitHeader {
            name: (*name).to_owned(),
            value: value.to_vec(),
        })
        .collect()
}

fn encode<T: Serialize + ?Sized>(state: &str, value: &T) -> Result<Vec<u8>, Reject> {
    serde_json::to_vec(value)
        .map_err(|e| Reject::new(format!("cannot encode state `{state}`: {e}")))
}

/// A map key (never versioned) from its stored JSON.
fn decode_key<T: DeserializeOwned>(state: &str, bytes: &[u8]) -> Result<T, Reject> {
    serde_json::from_slice(bytes)
        .map_err(|e| Reject::new(format!("cannot decode state `{state}`: {e}")))
}

/// A stored value of the state of `schema`, upgraded when it is of an older schema version.
fn decode<T: DeserializeOwned>(schema: Schema, bytes: &[u8]) -> Result<T, Reject> {
    schema
        .decode(bytes)
        .map_err(|e| Reject::new(format!("cannot decode state `{}`: {e}", schema.name)))
}

/// A value as the state of `schema` stores it.
fn encode_value<T: Serialize + ?Sized>(schema: Schema, value: &T) -> Result<Vec<u8>, Reject> {
    schema
        .encode(value)
        .map_err(|e| Reject::new(format!("cannot encode state `{}`: {e}", schema.name)))
}

fn state_reject(err: StateError) -> Reject {
    Reject::new(match err {
        StateError::UnknownState(name) => format!("state error: undeclared state `{name}`"),
        StateError::WrongKind(name) => format!("state error: state `{name}` is of the other kind"),
        StateError::InvalidRecord(i) => format!("state error: invalid record index {i}"),
        StateError::TooLarge(limit) => {
            format!("state error: larger than the limit of {limit} bytes")
        }
    })
}

fn emit_reject(err: EmitError) -> Reject {
    Reject::new(match err {
        EmitError::InvalidRecord(i) => format!("emit error: invalid record index {i}"),
        EmitError::TooLarge(limit) => {
            format!("emit error: output for this record exceeds the limit of {limit} bytes")
        }
        EmitError::UnknownOutput(name) => {
            format!("emit error: the operator declares no output `{name}`")
        }
    })
}

fn timer_reject(err: TimerError) -> Reject {
    Reject::new(match err {
        TimerError::InvalidRecord(i) => format!("timer error: invalid record index {i}"),
        TimerError::InvalidName(name) => {
            format!("timer error: names are 1..=128 bytes, not `{name}`")
        }
        TimerError::TooManyTimers(limit) => {
            format!("timer error: a key may have at most {limit} timers")
        }
    })
}
