//! A global table's rows on one host (docs/topologies.md, "Global tables"): every partition of
//! a topic, each record setting its key's row to its value (an empty value deletes it), as
//! Kafka Streams' GlobalKTable materialises a topic on every instance. Held in memory — global
//! tables are dimension tables, small by design — and kept as a whole in a snapshot in object
//! storage with the offsets it reflects, so that a host that starts again reads the topic on
//! from those offsets, never from its beginning.
//!
//! Snapshot layout (little-endian): `WGT1`, the partition count `u32`, then per partition
//! `i32` partition and `i64` next offset; the row count `u64`, then per row `u32` key length,
//! key, `u32` value length, value; last the CRC-32C of everything before it, `u32`.

use crate::runtime::InputRecord;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

const MAGIC: &[u8; 4] = b"WGT1";

/// The rows and the offsets they reflect, changed together.
#[derive(Debug, Default)]
struct Rows {
    rows: HashMap<Vec<u8>, Bytes>,
    /// Partition → the next offset to read.
    offsets: BTreeMap<i32, i64>,
    /// Records applied since the last [`GlobalTable::snapshot`].
    unsaved: u64,
}

/// One global table on this host: read by any key from every call of the stage, updated by
/// its reader.
#[derive(Debug, Default)]
pub struct GlobalTable {
    rows: RwLock<Rows>,
}

/// Why a snapshot cannot be read: the table is loaded from the topic's beginning instead.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    /// Not a snapshot of this format.
    #[error("not a global table snapshot (no `WGT1` header)")]
    Format,
    /// Shorter than its contents say.
    #[error("global table snapshot cut short")]
    Truncated,
    /// Its checksum does not match.
    #[error("global table snapshot checksum mismatch")]
    Checksum,
}

impl GlobalTable {
    /// The value of `key`; `None` when the table has no row for it.
    pub fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.read().rows.get(key).cloned()
    }

    /// Up to `limit` rows whose key starts with `prefix`, after `after` when given, in key
    /// order (bytewise), and whether more follow. Sorts the matching keys on each call: global
    /// tables are small dimension tables, and this serves the API's reads of one.
    pub fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> (Vec<(Vec<u8>, Bytes)>, bool) {
        let rows = self.read();
        let mut keys: Vec<&Vec<u8>> = rows
            .rows
            .keys()
            .filter(|k| k.starts_with(prefix) && after.is_none_or(|a| k.as_slice() > a))
            .collect();
        keys.sort_unstable();
        let more = keys.len() > limit;
        let page = keys
            .into_iter()
            .take(limit)
            .map(|k| (k.clone(), rows.rows[k].clone()))
            .collect();
        (page, more)
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.read().rows.len()
    }

    /// Whether it holds no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Partition → the next offset to read: where the reader goes on.
    pub fn offsets(&self) -> BTreeMap<i32, i64> {
        self.read().offsets.clone()
    }

    /// Applies `records` (of any partitions, each partition's in offset order): each sets its
    /// key's row, or deletes it when its value is empty (a tombstone). Records below a
    /// partition's next offset are skipped (delivered again); records without a key only move
    /// the offset.
    pub fn apply(&self, records: &[InputRecord]) {
        let mut rows = self.rows.write().unwrap_or_else(|e| e.into_inner());
        for record in records {
            let next = rows.offsets.entry(record.partition).or_insert(0);
            if record.offset < *next {
                continue;
            }
            *next = record.offset + 1;
            rows.unsaved += 1;
            if record.key.is_empty() {
                continue;
            }
            if record.value.is_empty() {
                rows.rows.remove(&record.key);
            } else {
                rows.rows
                    .insert(record.key.clone(), Bytes::copy_from_slice(&record.value));
            }
        }
    }

    /// Moves `partition`'s next offset to `next` when that is further: the reader passed
    /// records it hands out none of (transaction markers, aborted records).
    pub fn advance(&self, partition: i32, next: i64) {
        let mut rows = self.rows.write().unwrap_or_else(|e| e.into_inner());
        let at = rows.offsets.entry(partition).or_insert(0);
        if next > *at {
            *at = next;
        }
    }

    /// Drops every row and offset (the topic is read again from its beginning); the next
    /// snapshot is due.
    pub fn clear(&self) {
        let mut rows = self.rows.write().unwrap_or_else(|e| e.into_inner());
        rows.rows.clear();
        rows.offsets.clear();
        rows.unsaved += 1;
    }

    /// Records applied since the last snapshot taken.
    pub fn unsaved(&self) -> u64 {
        self.read().unsaved
    }

    /// Counts `applied` records (what [`Self::snapshot`] returned with the snapshot stored)
    /// as saved.
    pub fn saved(&self, applied: u64) {
        let mut rows = self.rows.write().unwrap_or_else(|e| e.into_inner());
        rows.unsaved = rows.unsaved.saturating_sub(applied);
    }

    /// The table as a snapshot (see the module's layout), its rows and offsets of one moment,
    /// and the records applied since the last one saved (for [`Self::saved`]).
    pub fn snapshot(&self) -> (Vec<u8>, u64) {
        let rows = self.read();
        let size: usize = rows.rows.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
        let mut out = Vec::with_capacity(24 + 12 * rows.offsets.len() + size);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(rows.offsets.len() as u32).to_le_bytes());
        for (partition, next) in &rows.offsets {
            out.extend_from_slice(&partition.to_le_bytes());
            out.extend_from_slice(&next.to_le_bytes());
        }
        out.extend_from_slice(&(rows.rows.len() as u64).to_le_bytes());
        for (key, value) in &rows.rows {
            out.extend_from_slice(&(key.len() as u32).to_le_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        (out, rows.unsaved)
    }

    /// The table a snapshot holds.
    ///
    /// # Errors
    /// [`SnapshotError`] when `bytes` is not a whole snapshot of this format.
    pub fn from_snapshot(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let (body, crc) = bytes
            .split_last_chunk::<4>()
            .ok_or(SnapshotError::Truncated)?;
        if !body.starts_with(MAGIC) {
            return Err(SnapshotError::Format);
        }
        if crc32c::crc32c(body) != u32::from_le_bytes(*crc) {
            return Err(SnapshotError::Checksum);
        }
        let mut reader = Reader(&body[MAGIC.len()..]);
        let mut rows = Rows::default();
        for _ in 0..reader.u32()? {
            let partition = i32::from_le_bytes(reader.array()?);
            let next = i64::from_le_bytes(reader.array()?);
            rows.offsets.insert(partition, next);
        }
        let count = u64::from_le_bytes(reader.array()?);
        for _ in 0..count {
            let key = reader.bytes()?.to_vec();
            let value = Bytes::copy_from_slice(reader.bytes()?);
            rows.rows.insert(key, value);
        }
        Ok(Self {
            rows: RwLock::new(rows),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Rows> {
        self.rows.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// A cursor over a snapshot's body.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(SnapshotError::Truncated)?;
        self.0 = rest;
        Ok(*head)
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], SnapshotError> {
        let len = self.u32()? as usize;
        if self.0.len() < len {
            return Err(SnapshotError::Truncated);
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(partition: i32, offset: i64, key: &str, value: &str) -> InputRecord {
        InputRecord {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            timestamp_ms: 0,
            headers: Vec::new(),
            topic: "planes".into(),
            partition,
            offset,
            input: 0,
        }
    }

    #[test]
    fn records_upsert_a_tombstone_deletes_and_a_record_delivered_again_is_skipped() {
        let table = GlobalTable::default();
        table.apply(&[
            record(0, 0, "N1", "boeing"),
            record(1, 0, "N2", "airbus"),
            record(0, 1, "N1", "embraer"),
            record(1, 1, "N2", ""),
        ]);
        assert_eq!(table.get(b"N1").as_deref(), Some(&b"embraer"[..]));
        assert_eq!(table.get(b"N2"), None, "deleted by the tombstone");
        table.apply(&[record(0, 0, "N1", "boeing")]);
        assert_eq!(
            table.get(b"N1").as_deref(),
            Some(&b"embraer"[..]),
            "offset 0 again changes nothing"
        );
        assert_eq!(table.offsets(), BTreeMap::from([(0, 2), (1, 2)]));
        assert_eq!(table.unsaved(), 4);
    }

    #[test]
    fn a_snapshot_holds_the_rows_and_offsets_and_a_damaged_one_is_refused() {
        let table = GlobalTable::default();
        table.apply(&[record(0, 0, "N1", "boeing"), record(2, 7, "N3", "cessna")]);
        table.advance(1, 5);
        let (snapshot, applied) = table.snapshot();
        assert_eq!(applied, 2);
        table.apply(&[record(0, 1, "N4", "piper")]);
        table.saved(applied);
        assert_eq!(
            table.unsaved(),
            1,
            "the record after the snapshot is not saved"
        );
        let back = GlobalTable::from_snapshot(&snapshot).expect("reads back");
        assert_eq!(back.get(b"N1").as_deref(), Some(&b"boeing"[..]));
        assert_eq!(back.get(b"N3").as_deref(), Some(&b"cessna"[..]));
        assert_eq!(back.get(b"N4"), None, "applied after the snapshot");
        assert_eq!(back.len(), 2);
        assert_eq!(back.offsets(), BTreeMap::from([(0, 1), (1, 5), (2, 8)]));

        let mut flipped = snapshot.clone();
        flipped[10] ^= 1;
        assert_eq!(
            GlobalTable::from_snapshot(&flipped).err(),
            Some(SnapshotError::Checksum)
        );
        assert_eq!(
            GlobalTable::from_snapshot(&snapshot[..3]).err(),
            Some(SnapshotError::Truncated)
        );
        assert_eq!(
            GlobalTable::from_snapshot(b"XXXXYYYY").err(),
            Some(SnapshotError::Format)
        );
    }

    #[test]
    fn a_scan_pages_the_rows_of_a_prefix_in_key_order() {
        let table = GlobalTable::default();
        table.apply(&[
            record(0, 0, "N3", "c"),
            record(0, 1, "X1", "x"),
            record(1, 0, "N1", "a"),
            record(2, 0, "N2", "b"),
        ]);
        let keys = |page: &[(Vec<u8>, Bytes)]| -> Vec<String> {
            page.iter()
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                .collect()
        };
        let (first, more) = table.scan(b"N", None, 2);
        assert_eq!((keys(&first), more), (vec!["N1".into(), "N2".into()], true));
        assert_eq!(first[1].1.as_ref(), b"b");
        let (rest, more) = table.scan(b"N", Some(b"N2"), 2);
        assert_eq!((keys(&rest), more), (vec!["N3".to_owned()], false));
        let (all, more) = table.scan(b"", None, 10);
        assert_eq!(keys(&all), ["N1", "N2", "N3", "X1"]);
        assert!(!more);
        assert!(table.scan(b"Z", None, 10).0.is_empty());
    }
}
