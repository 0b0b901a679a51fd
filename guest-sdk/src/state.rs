//! Typed handles for named state: [`ValueState`] and [`MapState`].
//!
//! A handle is only a name and a type; reads and writes go through
//! [`Context`](crate::Context), which scopes them to the current record's key.

use crate::wit::weir::operator::types::{StateDescriptor, StateKind as WitStateKind};
use std::marker::PhantomData;

/// Whether a named state holds one value or a map per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// One value per key.
    Value,
    /// An ordered map per key.
    Map,
}

/// The declaration of a named state, as listed in [`Operator::STATES`](crate::Operator::STATES).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSpec {
    /// The state's name: 1..=64 bytes of `[a-z0-9_-]`.
    pub name: &'static str,
    /// Value or map.
    pub kind: StateKind,
    /// Time to live in ms of processing time since the entry's last write; `None` keeps it.
    pub ttl_ms: Option<u64>,
}

impl StateSpec {
    pub(crate) fn to_descriptor(self) -> StateDescriptor {
        StateDescriptor {
            name: self.name.to_owned(),
            kind: match self.kind {
                StateKind::Value => WitStateKind::Value,
                StateKind::Map => WitStateKind::Map,
            },
            ttl_ms: self.ttl_ms,
            version: 0,
        }
    }
}

/// A named value state holding one `T` per key, stored as JSON.
///
/// Declare it as a `const` and read or write it with [`Context::get`](crate::Context::get),
/// [`Context::set`](crate::Context::set) and [`Context::clear`](crate::Context::clear).
#[derive(Debug)]
pub struct ValueState<T> {
    spec: StateSpec,
    _value: PhantomData<fn() -> T>,
}

impl<T> ValueState<T> {
    /// A value state named `name` with no TTL.
    pub const fn new(name: &'static str) -> Self {
        Self {
            spec: StateSpec {
                name,
                kind: StateKind::Value,
                ttl_ms: None,
            },
            _value: PhantomData,
        }
    }

    /// The same state with a time to live, in ms since the last write.
    pub const fn with_ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.spec.ttl_ms = Some(ttl_ms);
        self
    }

    /// The declaration to list in [`Operator::STATES`](crate::Operator::STATES).
    pub const fn spec(&self) -> StateSpec {
        self.spec
    }

    /// The state's name.
    pub const fn name(&self) -> &'static str {
        self.spec.name
    }
}

/// A named map state holding an ordered map from `K` to `V` per key; keys and values are
/// stored as JSON and iterated in ascending order of the encoded key bytes.
#[derive(Debug)]
pub struct MapState<K, V> {
    spec: StateSpec,
    _entry: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapState<K, V> {
    /// A map state named `name` with no TTL.
    pub const fn new(name: &'static str) -> Self {
        Self {
            spec: StateSpec {
                name,
                kind: StateKind::Map,
                ttl_ms: None,
            },
            _entry: PhantomData,
        }
    }

    /// The same state with a time to live, in ms since an entry's last write.
    pub const fn with_ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.spec.ttl_ms = Some(ttl_ms);
        self
    }

    /// The declaration to list in [`Operator::STATES`](crate::Operator::STATES).
    pub const fn spec(&self) -> StateSpec {
        self.spec
    }

    /// The state's name.
    pub const fn name(&self) -> &'static str {
        self.spec.name
    }
}
