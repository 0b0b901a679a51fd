//! [`SstBuilder`]: writes sorted entries into the SST format.

use super::block::{encode_entry, put_varint, seal};
use super::format::{BlockHandle, DEFAULT_BLOCK_SIZE_BYTES, Footer};
use super::{Entry, SstError, filter};
use bytes::Bytes;

/// Builds one SST in memory from entries added in strictly increasing key order.
#[derive(Debug)]
pub struct SstBuilder {
    block_size_bytes: usize,
    compress: bool,
    out: Vec<u8>,
    block: Vec<u8>,
    first_key: Option<Vec<u8>>,
    last_key: Option<Vec<u8>>,
    index: Vec<(Vec<u8>, BlockHandle)>,
    hashes: Vec<u64>,
}

impl Default for SstBuilder {
    fn default() -> Self {
        Self::new(DEFAULT_BLOCK_SIZE_BYTES, true)
    }
}

impl SstBuilder {
    /// A builder cutting data blocks at `block_size_bytes` of raw entries (at least one entry
    /// per block), lz4-compressing them when `compress`.
    pub fn new(block_size_bytes: usize, compress: bool) -> Self {
        Self {
            block_size_bytes: block_size_bytes.max(1),
            compress,
            out: Vec::new(),
            block: Vec::new(),
            first_key: None,
            last_key: None,
            index: Vec::new(),
            hashes: Vec::new(),
        }
    }

    /// Adds one entry.
    ///
    /// # Errors
    /// [`SstError::KeyOrder`] when `key` is not greater than the previous key.
    pub fn add(&mut self, key: &[u8], entry: &Entry) -> Result<(), SstError> {
        if self.last_key.as_deref().is_some_and(|last| key <= last) {
            return Err(SstError::KeyOrder);
        }
        encode_entry(&mut self.block, key, entry);
        self.hashes.push(filter::hash(key));
        if self.first_key.is_none() {
            self.first_key = Some(key.to_vec());
        }
        self.last_key = Some(key.to_vec());
        if self.block.len() >= self.block_size_bytes {
            self.finish_block();
        }
        Ok(())
    }

    /// Entries added so far.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether no entry was added.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The first and last key added, or `None` when empty.
    pub fn key_range(&self) -> Option<(&[u8], &[u8])> {
        Some((self.first_key.as_deref()?, self.last_key.as_deref()?))
    }

    /// Bytes the file would have if finished now, excluding filter, index and footer.
    pub fn data_bytes(&self) -> usize {
        self.out.len() + self.block.len()
    }

    fn finish_block(&mut self) {
        if self.block.is_empty() {
            return;
        }
        let sealed = seal(&self.block, self.compress);
        let handle = self.append(&sealed);
        let last = self
            .last_key
            .clone()
            .expect("a non-empty block has a last key");
        self.index.push((last, handle));
        self.block.clear();
    }

    fn append(&mut self, sealed: &[u8]) -> BlockHandle {
        let handle = BlockHandle {
            offset: self.out.len() as u64,
            len: u32::try_from(sealed.len()).expect("blocks are far smaller than 4 GiB"),
        };
        self.out.extend_from_slice(sealed);
        handle
    }

    /// Writes the last data block, the filter, the index and the footer; returns the file.
    pub fn finish(mut self) -> Bytes {
        self.finish_block();
        let filter = self.append(&seal(&filter::build(&self.hashes), false));
        let mut raw_index = Vec::new();
        for (last_key, handle) in &self.index {
            put_varint(&mut raw_index, last_key.len() as u64);
            raw_index.extend_from_slice(last_key);
            raw_index.extend_from_slice(&handle.offset.to_le_bytes());
            raw_index.extend_from_slice(&handle.len.to_le_bytes());
        }
        let index = self.append(&seal(&raw_index, false));
        let footer = Footer {
            filter,
            index,
            entry_count: self.hashes.len() as u64,
        };
        self.out.extend_from_slice(&footer.encode());
        Bytes::from(self.out)
    }
}
