//! Compaction: which SSTs to merge next, and the merge itself.
//!
//! # Why leveled
//! Weir's trees live in object storage where a read that misses the caches costs a request of
//! ≈10–50 ms (30 ms in `weir bench lsm`'s throttled store), while a write costs bytes uploaded
//! once per level. Leveled compaction (as RocksDB's default) keeps at most
//! `l0_compaction_trigger` overlapping L0 files plus **one** SST per lower level that can hold
//! a key, so a point read that misses every cache costs at most `4 + levels` block GETs and in
//! practice one (bloom filters, ≈1 % false positives, rule out the rest), and a prefix scan
//! merges `4 + levels` sorted runs. Tiered (size-tiered, as Cassandra's STCS) would write each
//! byte ≈`log_4(n)` times instead of ≈`ratio/2` per level — for 1 GiB of state with a 64 MiB
//! memtable ≈2 vs ≈5×3 = 15 rewrites — but leaves up to ≈4 runs per tier (≈8–12 sorted runs
//! for the same 1 GiB), so a cold read costs several times the GETs and space amplification
//! reaches 2× during a merge versus ≈1.1× leveled. Uploads are cheap and asynchronous (the
//! write path never waits for a compaction unless L0 stalls); cold reads are on the record
//! path and retained checkpoints multiply space. So: leveled, with a size ratio of 10 between
//! levels (L1 = `level_base_bytes`, 256 MiB by default).
//!
//! # What a compaction does
//! - **L0 → L1** when L0 holds `l0_compaction_trigger` SSTs: every L0 SST plus the L1 SSTs
//!   they overlap are merged into new L1 SSTs of `target_file_bytes`.
//! - **Ln → Ln+1** when level n holds more than its target bytes: one SST of level n, chosen
//!   round-robin by key, plus the SSTs of n+1 it overlaps. An SST that overlaps nothing below
//!   and is not going to the bottom moves down without being rewritten.
//! - On equal keys the newest source wins. When no level below the output holds data (the
//!   output is the bottom), tombstones and expired entries are dropped; above it an expired
//!   value becomes a tombstone, since dropping it would let an older value show again.
//!
//! Inputs are read whole (one GET each) and merged on a blocking thread; the merge holds the
//! input files in memory, so it needs up to `l0_compaction_trigger × memtable + overlapped`
//! bytes at once.

use super::sst::{Entry, SstBuilder, SstError, SstReader};
use bytes::Bytes;
use std::iter::Peekable;

type Source = Peekable<Box<dyn Iterator<Item = Result<(Bytes, Entry), SstError>> + Send>>;

/// The new SSTs a merge produced: each file with its first and last key.
#[derive(Debug)]
pub struct MergeOutput {
    /// (file bytes, first key, last key), in key order.
    pub files: Vec<(Bytes, Vec<u8>, Vec<u8>)>,
    /// Entries written.
    pub entries: u64,
}

/// How to merge.
#[derive(Debug, Clone, Copy)]
pub struct MergeSettings {
    /// Whether the output is the bottom of the tree (tombstones and expired entries dropped).
    pub bottom: bool,
    /// Processing time now, ms; entries with `expires_at_ms <= now_ms` are expired.
    pub now_ms: u64,
    /// Roll to a new output SST once this many data bytes are written.
    pub target_file_bytes: u64,
    /// Data block size of the outputs, bytes.
    pub block_size_bytes: usize,
    /// lz4 for the outputs.
    pub compress: bool,
}

/// Merges `inputs` (newest first: on equal keys the earlier input wins) into new SSTs.
///
/// # Errors
/// [`SstError`] when an input block fails verification; nothing is produced then.
pub fn merge(inputs: Vec<SstReader>, settings: MergeSettings) -> Result<MergeOutput, SstError> {
    let mut sources: Vec<Source> = inputs
        .into_iter()
        .map(|reader| {
            let it: Box<dyn Iterator<Item = _> + Send> = Box::new(reader.into_entries());
            it.peekable()
        })
        .collect();
    let mut output = MergeOutput {
        files: Vec::new(),
        entries: 0,
    };
    let mut builder = SstBuilder::new(settings.block_size_bytes, settings.compress);
    while let Some((key, entry)) = next_newest(&mut sources)? {
        let entry = match entry {
            Entry::Tombstone if settings.bottom => continue,
            Entry::Put {
                expires_at_ms: Some(at),
                ..
            } if at <= settings.now_ms => {
                if settings.bottom {
                    continue;
                }
                Entry::Tombstone
            }
            other => other,
        };
        builder
            .add(&key, &entry)
            .expect("the merge yields strictly increasing keys");
        output.entries += 1;
        if builder.data_bytes() as u64 >= settings.target_file_bytes {
            finish(
                &mut output,
                std::mem::replace(&mut builder, fresh(&settings)),
            );
        }
    }
    finish(&mut output, builder);
    Ok(output)
}

fn fresh(settings: &MergeSettings) -> SstBuilder {
    SstBuilder::new(settings.block_size_bytes, settings.compress)
}

fn finish(output: &mut MergeOutput, builder: SstBuilder) {
    let Some((first, last)) = builder.key_range().map(|(f, l)| (f.to_vec(), l.to_vec())) else {
        return;
    };
    output.files.push((builder.finish(), first, last));
}

/// Takes the smallest key across `sources` and returns the entry of the first (newest) source
/// holding it, advancing every source past it.
fn next_newest(sources: &mut [Source]) -> Result<Option<(Bytes, Entry)>, SstError> {
    let mut min: Option<Bytes> = None;
    for source in sources.iter_mut() {
        match source.peek() {
            Some(Ok((k, _))) if min.as_ref().is_none_or(|m| k < m) => min = Some(k.clone()),
            Some(Err(_)) => {
                if let Some(Err(e)) = source.next() {
                    return Err(e);
                }
            }
            _ => {}
        }
    }
    let Some(key) = min else { return Ok(None) };
    let mut newest = None;
    for source in sources.iter_mut() {
        if matches!(source.peek(), Some(Ok((k, _))) if *k == key)
            && let Some(Ok((_, entry))) = source.next()
            && newest.is_none()
        {
            newest = Some(entry);
        }
    }
    Ok(newest.map(|entry| (key, entry)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sst(entries: &[(&[u8], Entry)]) -> SstReader {
        let mut b = SstBuilder::new(64, true);
        for (k, e) in entries {
            b.add(k, e).expect("sorted");
        }
        SstReader::open(b.finish()).expect("opens")
    }

    fn put(v: &[u8], expires_at_ms: Option<u64>) -> Entry {
        Entry::Put {
            value: Bytes::copy_from_slice(v),
            expires_at_ms,
        }
    }

    fn settings(bottom: bool) -> MergeSettings {
        MergeSettings {
            bottom,
            now_ms: 100,
            target_file_bytes: 1 << 20,
            block_size_bytes: 64,
            compress: false,
        }
    }

    fn entries(out: &MergeOutput) -> Vec<(Vec<u8>, Entry)> {
        out.files
            .iter()
            .flat_map(|(file, _, _)| {
                let reader = SstReader::open(file.clone()).expect("opens");
                reader
                    .iter()
                    .map(|r| r.map(|(k, e)| (k.to_vec(), e)).expect("reads"))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn the_newest_input_wins_and_the_bottom_drops_tombstones_and_expired_values() {
        let newer = sst(&[
            (b"a", Entry::Tombstone),
            (b"b", put(b"b2", None)),
            (b"c", put(b"c2", Some(50))),
        ]);
        let older = sst(&[
            (b"a", put(b"a1", None)),
            (b"b", put(b"b1", None)),
            (b"c", put(b"c1", None)),
            (b"d", put(b"d1", Some(500))),
        ]);
        let out = merge(vec![newer.clone(), older.clone()], settings(true)).expect("merges");
        assert_eq!(
            entries(&out),
            vec![
                (b"b".to_vec(), put(b"b2", None)),
                (b"d".to_vec(), put(b"d1", Some(500)))
            ]
        );
        let out = merge(vec![newer, older], settings(false)).expect("merges");
        assert_eq!(
            entries(&out),
            vec![
                (b"a".to_vec(), Entry::Tombstone),
                (b"b".to_vec(), put(b"b2", None)),
                (b"c".to_vec(), Entry::Tombstone),
                (b"d".to_vec(), put(b"d1", Some(500)))
            ],
            "above the bottom, an expired value must still hide c1 below it"
        );
    }

    #[test]
    fn outputs_roll_at_the_target_size_with_disjoint_key_ranges() {
        let keys: Vec<Vec<u8>> = (0u32..200).map(|i| i.to_be_bytes().to_vec()).collect();
        let input: Vec<(&[u8], Entry)> = keys
            .iter()
            .map(|k| (k.as_slice(), put(&[7; 20], None)))
            .collect();
        let out = merge(
            vec![sst(&input)],
            MergeSettings {
                target_file_bytes: 1000,
                ..settings(true)
            },
        )
        .expect("merges");
        assert!(out.files.len() > 3, "{} files", out.files.len());
        for pair in out.files.windows(2) {
            assert!(pair[0].2 < pair[1].1, "ranges overlap");
        }
        assert_eq!(out.entries, 200);
        assert_eq!(entries(&out).len(), 200);
    }
}
