//! The numbers that name things across modules, each its own type so that a partition is never
//! passed where a manifest version or an offset is expected (and the compiler says so):
//! [`Partition`] and [`ManifestVersion`]. Both are `Copy`, compare and hash as their number,
//! print as it, and serialize as it (`#[serde(transparent)]`), so every stored and wire
//! format is unchanged.
//!
//! At the edges they meet raw numbers: Kafka clients and the WIT `input-record` type a
//! partition as `i32` (`.0` and [`Partition::from`] convert there), and object names and
//! manifest JSON carry a version as its decimal.

use serde::{Deserialize, Serialize};
use std::fmt;
use utoipa::ToSchema;

/// A Kafka partition of a topic (≥ 0). A pipeline's shard is one partition number of its
/// co-partitioned input topics.
#[derive(
    Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(transparent)]
pub struct Partition(pub i32);

/// As its number, so that logs and reports read as before the type.
impl fmt::Debug for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for Partition {
    type Err = std::num::ParseIntError;

    /// A partition number in decimal, as object names and table properties write it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

/// A map or set of partitions is looked up by the number too (`partitions.get(&0)`): a
/// partition compares, orders and hashes as its number.
impl std::borrow::Borrow<i32> for Partition {
    fn borrow(&self) -> &i32 {
        &self.0
    }
}

impl From<i32> for Partition {
    fn from(n: i32) -> Self {
        Self(n)
    }
}

/// A checkpoint's manifest version: each shard numbers its manifests from 1 upward, each
/// created once (`state::manifest`); a version names a checkpoint in committed offsets'
/// metadata, savepoints and reports.
#[derive(
    Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(transparent)]
pub struct ManifestVersion(pub u64);

/// As its number, so that logs and reports read as before the type.
impl fmt::Debug for ManifestVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for ManifestVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for ManifestVersion {
    type Err = std::num::ParseIntError;

    /// A version in decimal, as manifest object names and offsets' metadata write it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

/// A version compares with its number (`version == 3`); it is still never passed as one.
impl PartialEq<u64> for ManifestVersion {
    fn eq(&self, n: &u64) -> bool {
        self.0 == *n
    }
}

/// A set or map of versions is looked up by the number too: a version compares, orders and
/// hashes as its number.
impl std::borrow::Borrow<u64> for ManifestVersion {
    fn borrow(&self) -> &u64 {
        &self.0
    }
}

/// `n` versions later (the next version is `v + 1`).
impl std::ops::Add<u64> for ManifestVersion {
    type Output = Self;

    fn add(self, n: u64) -> Self {
        Self(self.0 + n)
    }
}

/// `n` versions earlier.
impl std::ops::Sub<u64> for ManifestVersion {
    type Output = Self;

    fn sub(self, n: u64) -> Self {
        Self(self.0 - n)
    }
}

impl From<u64> for ManifestVersion {
    fn from(n: u64) -> Self {
        Self(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_serialize_print_and_order_as_their_numbers() {
        assert_eq!(
            serde_json::to_string(&Partition(3)).expect("serializes"),
            "3"
        );
        assert_eq!(
            serde_json::from_str::<ManifestVersion>("42").expect("parses"),
            ManifestVersion(42)
        );
        assert_eq!(format!("{:05}", Partition(7)), "00007");
        assert_eq!(ManifestVersion(9).to_string(), "9");
        assert!(ManifestVersion(2) < ManifestVersion(10));
    }

    #[test]
    fn a_map_keyed_by_partition_is_the_map_keyed_by_its_number() {
        let map = std::collections::BTreeMap::from([(Partition(0), 5u64), (Partition(12), 7)]);
        let json = serde_json::to_string(&map).expect("serializes");
        assert_eq!(json, r#"{"0":5,"12":7}"#);
        let back: std::collections::BTreeMap<Partition, u64> =
            serde_json::from_str(&json).expect("parses");
        assert_eq!(back, map);
        assert_eq!(map.get(&12), Some(&7));
    }
}
