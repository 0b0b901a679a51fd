//! Reading an SST: [`SstIndex`] (footer, filter and index — what must be in memory to find a
//! key) and data blocks verified one at a time, by [`BlockHandle`], so that the LSM layer can
//! serve each block from its caches or fetch it with one range read. [`SstReader`] puts the two
//! together over a file held whole in memory (compaction inputs, tests).

use super::block::{BlockIter, get_varint, unseal};
use super::format::{BlockHandle, FOOTER_BYTES, Footer};
use super::{Entry, SstError, filter};
use bytes::Bytes;

/// Bytes read from the end of an SST by the first metadata read: the footer and, for all but
/// large SSTs, the filter and index too (≈64 KiB holds them for ≈40 000 short keys).
pub const TAIL_READ_BYTES: u64 = 64 << 10;

/// The metadata of an SST: its footer, bloom filter and block index. Kept in memory for as long
/// as the SST is part of an open tree (as RocksDB's `cache_index_and_filter_blocks = false`).
#[derive(Debug, Clone)]
pub struct SstIndex {
    footer: Footer,
    filter: Bytes,
    /// (last key of the block, where the block is), in key order.
    index: Vec<(Bytes, BlockHandle)>,
    file_len: u64,
}

impl SstIndex {
    /// Where the metadata starts, given the footer: the first byte the index needs.
    pub fn metadata_start(footer: &Footer) -> u64 {
        footer.filter.offset.min(footer.index.offset)
    }

    /// Decodes the footer from the last [`FOOTER_BYTES`] of `tail`.
    ///
    /// # Errors
    /// As [`Footer::decode`]; [`SstError::Malformed`] when `tail` is shorter than a footer.
    pub fn footer(tail: &[u8]) -> Result<Footer, SstError> {
        if tail.len() < FOOTER_BYTES {
            return Err(SstError::malformed("shorter than a footer"));
        }
        Footer::decode(&tail[tail.len() - FOOTER_BYTES..])
    }

    /// Opens the metadata from the bytes `[tail_start, file_len)` of the file, which must
    /// cover [`SstIndex::metadata_start`].
    ///
    /// # Errors
    /// [`SstError::Checksum`] or [`SstError::Malformed`] for corrupt or foreign bytes, or a
    /// tail that starts after the metadata.
    pub fn open(tail: Bytes, tail_start: u64) -> Result<Self, SstError> {
        let footer = Self::footer(&tail)?;
        let file_len = tail_start + tail.len() as u64;
        let part = |handle: BlockHandle, part: &'static str| -> Result<Bytes, SstError> {
            let end = handle.offset + u64::from(handle.len);
            if handle.offset < tail_start || end > file_len - FOOTER_BYTES as u64 {
                return Err(SstError::malformed(format!(
                    "{part} block lies outside the bytes read"
                )));
            }
            let start = (handle.offset - tail_start) as usize;
            unseal(&tail.slice(start..start + handle.len as usize), part)
        };
        // Copies: the metadata lives as long as the SST is in the tree and must not pin the
        // buffer it was read from (a whole file, for SSTs this process wrote).
        let filter = Bytes::copy_from_slice(&part(footer.filter, "filter")?);
        let raw_index = Bytes::copy_from_slice(&part(footer.index, "index")?);
        let mut index = Vec::new();
        let mut pos = 0;
        while pos < raw_index.len() {
            let key_len = get_varint(&raw_index, &mut pos)? as usize;
            let end = pos + key_len + 12;
            if end > raw_index.len() {
                return Err(SstError::malformed("index entry runs past the index"));
            }
            let key = raw_index.slice(pos..pos + key_len);
            let at = pos + key_len;
            let offset = u64::from_le_bytes(raw_index[at..at + 8].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(raw_index[at + 8..end].try_into().expect("4 bytes"));
            if offset + u64::from(len) > Self::metadata_start(&footer) {
                return Err(SstError::malformed("data block lies outside the data"));
            }
            index.push((key, BlockHandle { offset, len }));
            pos = end;
        }
        Ok(Self {
            footer,
            filter,
            index,
            file_len,
        })
    }

    /// Entries in the table, tombstones included.
    pub fn entry_count(&self) -> u64 {
        self.footer.entry_count
    }

    /// The file's length, bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Bytes this metadata holds in memory (filter and index keys).
    pub fn memory_bytes(&self) -> usize {
        self.filter.len() + self.index.iter().map(|(k, _)| k.len() + 24).sum::<usize>()
    }

    /// The data blocks, as (last key, handle), in key order.
    pub fn blocks(&self) -> &[(Bytes, BlockHandle)] {
        &self.index
    }

    /// The block that would hold `key`, or `None` when the filter or the index rules it out.
    pub fn block_for(&self, key: &[u8]) -> Option<BlockHandle> {
        if !filter::may_contain(&self.filter, key) {
            return None;
        }
        let i = self.index.partition_point(|(last, _)| last.as_ref() < key);
        self.index.get(i).map(|(_, handle)| *handle)
    }

    /// Index of the first block that may hold keys `>= start`.
    pub fn first_block_from(&self, start: &[u8]) -> usize {
        self.index
            .partition_point(|(last, _)| last.as_ref() < start)
    }
}

/// Verifies and decompresses one sealed data block (as read from the file at its handle).
///
/// # Errors
/// [`SstError::Checksum`] or [`SstError::Malformed`].
pub fn open_block(sealed: &Bytes) -> Result<Bytes, SstError> {
    unseal(sealed, "data")
}

/// Verifies one sealed data block through and through: its checksum, its decompression and
/// every entry it holds (what a scrub or a compaction input check reads).
///
/// # Errors
/// [`SstError::Checksum`] or [`SstError::Malformed`].
pub fn verify_block(sealed: &Bytes) -> Result<(), SstError> {
    let raw = open_block(sealed)?;
    for entry in BlockIter::new(raw) {
        entry?;
    }
    Ok(())
}

/// The entry of `key` in the raw (opened) block `raw`, if present.
///
/// # Errors
/// [`SstError::Malformed`] when the block does not decode.
pub fn find_in_block(raw: Bytes, key: &[u8]) -> Result<Option<Entry>, SstError> {
    super::block::find(&raw, key)
}

/// An open SST held whole in memory.
#[derive(Debug, Clone)]
pub struct SstReader {
    file: Bytes,
    index: SstIndex,
}

impl SstReader {
    /// Opens an SST from its bytes, verifying the footer, filter and index.
    ///
    /// # Errors
    /// [`SstError::Checksum`] or [`SstError::Malformed`] for corrupt or foreign bytes.
    pub fn open(file: Bytes) -> Result<Self, SstError> {
        let index = SstIndex::open(file.clone(), 0)?;
        Ok(Self { file, index })
    }

    /// The metadata.
    pub fn index(&self) -> &SstIndex {
        &self.index
    }

    /// The whole file.
    pub fn file(&self) -> &Bytes {
        &self.file
    }

    /// Entries in the table, tombstones included.
    pub fn entry_count(&self) -> u64 {
        self.index.entry_count()
    }

    /// The data blocks, as (last key, handle), in key order.
    pub fn blocks(&self) -> &[(Bytes, BlockHandle)] {
        self.index.blocks()
    }

    /// Verifies every data block ([`verify_block`]).
    ///
    /// # Errors
    /// The first block's failure.
    pub fn verify_blocks(&self) -> Result<(), SstError> {
        self.index
            .blocks()
            .iter()
            .try_for_each(|(_, handle)| verify_block(&self.file.slice(handle.range())))
    }

    /// Reads and verifies one data block, returning its raw entries.
    ///
    /// # Errors
    /// [`SstError::Checksum`] or [`SstError::Malformed`].
    pub fn read_block(&self, handle: BlockHandle) -> Result<Bytes, SstError> {
        open_block(&self.file.slice(handle.range()))
    }

    /// The entry of `key` (a value or a tombstone), or `None` when the table has none. Reads
    /// at most one data block, none when the filter rules the key out.
    ///
    /// # Errors
    /// [`SstError::Checksum`] or [`SstError::Malformed`] from the block read.
    pub fn get(&self, key: &[u8]) -> Result<Option<Entry>, SstError> {
        match self.index.block_for(key) {
            Some(handle) => find_in_block(self.read_block(handle)?, key),
            None => Ok(None),
        }
    }

    /// Every entry in key order, tombstones included.
    ///
    /// # Errors
    /// The first block that fails verification ends the iteration with its error.
    pub fn iter(&self) -> impl Iterator<Item = Result<(Bytes, Entry), SstError>> + '_ {
        self.iter_from(&[])
    }

    /// Entries with keys `>= start`, in key order, tombstones included; skips the blocks
    /// wholly before `start` without reading them.
    ///
    /// # Errors
    /// As [`SstReader::iter`].
    pub fn iter_from<'a>(
        &'a self,
        start: &'a [u8],
    ) -> impl Iterator<Item = Result<(Bytes, Entry), SstError>> + 'a {
        let first = self.index.first_block_from(start);
        self.index.blocks()[first..]
            .iter()
            .flat_map(move |(_, handle)| {
                let block: Box<dyn Iterator<Item = Result<(Bytes, Entry), SstError>>> =
                    match self.read_block(*handle) {
                        Ok(raw) => Box::new(BlockIter::new(raw)),
                        Err(e) => Box::new(std::iter::once(Err(e))),
                    };
                block
            })
            .filter(move |item| item.as_ref().map_or(true, |(k, _)| k.as_ref() >= start))
    }
}

/// Every entry of an [`SstReader`] it owns, in key order, reading one block at a time.
#[derive(Debug)]
pub struct OwnedIter {
    reader: SstReader,
    next_block: usize,
    current: Option<BlockIter>,
}

impl SstReader {
    /// Consumes the reader into an iterator over every entry, tombstones included.
    pub fn into_entries(self) -> OwnedIter {
        OwnedIter {
            reader: self,
            next_block: 0,
            current: None,
        }
    }
}

impl Iterator for OwnedIter {
    type Item = Result<(Bytes, Entry), SstError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.current.as_mut().and_then(Iterator::next) {
                return Some(item);
            }
            let (_, handle) = *self.reader.blocks().get(self.next_block)?;
            self.next_block += 1;
            match self.reader.read_block(handle) {
                Ok(raw) => self.current = Some(BlockIter::new(raw)),
                Err(e) => {
                    self.next_block = self.reader.blocks().len();
                    return Some(Err(e));
                }
            }
        }
    }
}
