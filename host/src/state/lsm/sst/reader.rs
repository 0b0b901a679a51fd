//! [`SstReader`]: point lookups and ordered iteration over an SST.
//!
//! Opening reads the footer, filter and index; data blocks are read and verified one at a time,
//! by [`BlockHandle`], so the LSM layer can serve them from its caches or fetch each with one
//! range read.

use super::block::{BlockIter, get_varint, unseal};
use super::format::{BlockHandle, FOOTER_BYTES, Footer};
use super::{Entry, SstError, filter};
use bytes::Bytes;

/// An open SST held in memory.
#[derive(Debug, Clone)]
pub struct SstReader {
    file: Bytes,
    footer: Footer,
    filter: Bytes,
    /// (last key of the block, where the block is), in key order.
    index: Vec<(Bytes, BlockHandle)>,
}

impl SstReader {
    /// Opens an SST from its bytes, verifying the footer, filter and index.
    ///
    /// # Errors
    /// [`SstError::Checksum`] or [`SstError::Malformed`] for corrupt or foreign bytes.
    pub fn open(file: Bytes) -> Result<Self, SstError> {
        if file.len() < FOOTER_BYTES {
            return Err(SstError::malformed("shorter than a footer"));
        }
        let footer = Footer::decode(&file[file.len() - FOOTER_BYTES..])?;
        let filter = unseal(&slice(&file, footer.filter, "filter")?, "filter")?;
        let raw_index = unseal(&slice(&file, footer.index, "index")?, "index")?;
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
            index.push((key, BlockHandle { offset, len }));
            pos = end;
        }
        Ok(Self {
            file,
            footer,
            filter,
            index,
        })
    }

    /// Entries in the table, tombstones included.
    pub fn entry_count(&self) -> u64 {
        self.footer.entry_count
    }

    /// The data blocks, as (last key, handle), in key order.
    pub fn blocks(&self) -> &[(Bytes, BlockHandle)] {
        &self.index
    }

    /// Reads and verifies one data block, returning its raw entries.
    ///
    /// # Errors
    /// [`SstError::Checksum`] or [`SstError::Malformed`].
    pub fn read_block(&self, handle: BlockHandle) -> Result<Bytes, SstError> {
        unseal(&slice(&self.file, handle, "data")?, "data")
    }

    /// The entry of `key` (a value or a tombstone), or `None` when the table has none. Reads
    /// at most one data block, none when the filter rules the key out.
    ///
    /// # Errors
    /// [`SstError::Checksum`] or [`SstError::Malformed`] from the block read.
    pub fn get(&self, key: &[u8]) -> Result<Option<Entry>, SstError> {
        if !filter::may_contain(&self.filter, key) {
            return Ok(None);
        }
        let i = self.index.partition_point(|(last, _)| last.as_ref() < key);
        let Some((_, handle)) = self.index.get(i) else {
            return Ok(None);
        };
        for item in BlockIter::new(self.read_block(*handle)?) {
            let (k, entry) = item?;
            match k.as_ref().cmp(key) {
                std::cmp::Ordering::Less => continue,
                std::cmp::Ordering::Equal => return Ok(Some(entry)),
                std::cmp::Ordering::Greater => return Ok(None),
            }
        }
        Ok(None)
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
        let first = self
            .index
            .partition_point(|(last, _)| last.as_ref() < start);
        self.index[first..]
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

fn slice(file: &Bytes, handle: BlockHandle, part: &'static str) -> Result<Bytes, SstError> {
    let range = handle.range();
    if range.end > file.len().saturating_sub(FOOTER_BYTES) || range.start > range.end {
        return Err(SstError::malformed(format!(
            "{part} block lies outside the file"
        )));
    }
    Ok(file.slice(range))
}
