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

/// Brings a value written at an older schema version of a state to its current one: called
/// with the version the value was written at (below the state's) and the value as JSON, and
/// returns it as the current version's JSON, or why it cannot. Values are upgraded lazily, as
/// they are read (as Kafka Streams' KIP-258), and stored at the current version by the next
/// write; nothing rewrites the whole state at a deploy.
pub type Upgrade =
    fn(from_version: u32, value: serde_json::Value) -> Result<serde_json::Value, String>;

/// The declaration of a named state, as listed in [`Operator::STATES`](crate::Operator::STATES).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSpec {
    /// The state's name: 1..=64 bytes of `[a-z0-9_-]`.
    pub name: &'static str,
    /// Value or map.
    pub kind: StateKind,
    /// Time to live in ms of processing time since the entry's last write; `None` keeps it.
    pub ttl_ms: Option<u64>,
    /// The schema version of its values: 0 (plain values), or the version given to
    /// [`ValueState::versioned`] / [`MapState::versioned`].
    pub version: u32,
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
            version: self.version,
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
    upgrade: Option<Upgrade>,
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
                version: 0,
            },
            upgrade: None,
            _value: PhantomData,
        }
    }

    /// The same state at schema `version` (1 and up): values it writes carry the version, and
    /// values written at an older one (a plain value is version 0) go through `upgrade` as they
    /// are read. The host refuses a switch to an operator whose version of the state is lower
    /// than the running one's.
    pub const fn versioned(mut self, version: u32, upgrade: Upgrade) -> Self {
        self.spec.version = version;
        self.upgrade = Some(upgrade);
        self
    }

    /// How the state reads and writes its values' versions.
    pub(crate) const fn schema(&self) -> Schema {
        Schema::of(self.spec, self.upgrade)
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
    upgrade: Option<Upgrade>,
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
                version: 0,
            },
            upgrade: None,
            _entry: PhantomData,
        }
    }

    /// The same state at schema `version` (1 and up), for its values (map keys are never
    /// versioned): as [`ValueState::versioned`].
    pub const fn versioned(mut self, version: u32, upgrade: Upgrade) -> Self {
        self.spec.version = version;
        self.upgrade = Some(upgrade);
        self
    }

    /// How the state reads and writes its values' versions.
    pub(crate) const fn schema(&self) -> Schema {
        Schema::of(self.spec, self.upgrade)
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

/// A state's value schema: its name (for errors), version and upgrade.
#[derive(Clone, Copy)]
pub(crate) struct Schema {
    pub name: &'static str,
    pub version: u32,
    pub upgrade: Option<Upgrade>,
}

/// The first byte of a value stored at a schema version of 1 or above; no JSON text starts
/// with it, so a value without it was written at version 0 (wit/types.wit, `state-descriptor`).
const VERSIONED: u8 = 0;

impl Schema {
    const fn of(spec: StateSpec, upgrade: Option<Upgrade>) -> Self {
        Self {
            name: spec.name,
            version: spec.version,
            upgrade,
        }
    }

    /// `value` as stored: JSON, behind the version header when the version is 1 or above.
    pub fn encode<T: serde::Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        if self.version > 0 {
            out.push(VERSIONED);
            out.extend_from_slice(&self.version.to_be_bytes());
        }
        serde_json::to_writer(&mut out, value).map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// A stored value as `T`: at this version decoded as it is; at an older one decoded as
    /// JSON, upgraded, then decoded; at a newer one refused (older code cannot read it).
    pub fn decode<T: serde::de::DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, String> {
        let (version, payload) = match bytes {
            [VERSIONED, a, b, c, d, payload @ ..] => {
                (u32::from_be_bytes([*a, *b, *c, *d]), payload)
            }
            [VERSIONED, ..] => return Err("a version header cut short".to_owned()),
            plain => (0, plain),
        };
        if version == self.version {
            return serde_json::from_slice(payload).map_err(|e| e.to_string());
        }
        if version > self.version {
            return Err(format!(
                "the value is at schema version {version}; this operator reads up to {}",
                self.version
            ));
        }
        let upgrade = self.upgrade.ok_or_else(|| {
            format!("the value is at schema version {version} and there is no upgrade")
        })?;
        let old: serde_json::Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        let new = upgrade(version, old)
            .map_err(|e| format!("upgrading from schema version {version}: {e}"))?;
        serde_json::from_value(new).map_err(|e| format!("the upgraded value: {e}"))
    }
}
