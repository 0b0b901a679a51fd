//! The numbers that name things across modules, each its own type so that a partition is never
//! passed where a manifest version or an offset is expected (and the compiler says so):
//! [`Partition`], [`Offset`] and [`ManifestVersion`]. Each is `Copy`, compares and hashes as
//! its number, prints as it, and serializes as it (`#[serde(transparent)]`), so every stored
//! and wire format is unchanged.
//!
//! At the edges they meet raw numbers: Kafka clients and the WIT `input-record` type a
//! partition as `i32` and an offset as `i64` (`.0` and `From` convert there), and object names
//! and manifest JSON carry a version or an offset as its decimal.

use serde::{Deserialize, Serialize};
use std::fmt;
use utoipa::ToSchema;

/// What every id here shares with its number `$n`: it prints (`{:05}` too), parses, compares,
/// orders and hashes as the number; a map or set of ids is looked up by the number
/// (`partitions.get(&0)`); and the number converts into it.
macro_rules! number_id {
    ($id:ident, $n:ty) => {
        /// As its number, so that logs and reports read as before the type.
        impl fmt::Debug for $id {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl fmt::Display for $id {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        /// The number in decimal, as object names, metadata and table properties write it.
        impl std::str::FromStr for $id {
            type Err = std::num::ParseIntError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.parse().map(Self)
            }
        }

        impl std::borrow::Borrow<$n> for $id {
            fn borrow(&self) -> &$n {
                &self.0
            }
        }

        /// It compares with its number (`version == 3`); it is still never passed as one.
        impl PartialEq<$n> for $id {
            fn eq(&self, n: &$n) -> bool {
                self.0 == *n
            }
        }

        impl From<$n> for $id {
            fn from(n: $n) -> Self {
                Self(n)
            }
        }
    };
}

/// A Kafka partition of a topic (≥ 0). A pipeline's shard is one partition number of its
/// co-partitioned input topics.
#[derive(
    Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(transparent)]
pub struct Partition(pub i32);

number_id!(Partition, i32);

/// A record's position in its partition (≥ 0), Kafka's offset. A *committed* or *next* offset
/// is, as in Kafka, the offset of the next record to read: the last processed plus one.
#[derive(
    Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(transparent)]
pub struct Offset(pub i64);

number_id!(Offset, i64);

/// `n` records later (the next offset to read after the record at `o` is `o + 1`).
impl std::ops::Add<i64> for Offset {
    type Output = Self;

    fn add(self, n: i64) -> Self {
        Self(self.0 + n)
    }
}

/// `n` records earlier (the last processed record is the next offset `- 1`).
impl std::ops::Sub<i64> for Offset {
    type Output = Self;

    fn sub(self, n: i64) -> Self {
        Self(self.0 - n)
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

number_id!(ManifestVersion, u64);

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
        assert_eq!("17".parse::<Offset>().expect("parses") + 1, Offset(18));
        assert_eq!(Offset(5), 5);
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
