//! Constants and the footer of the SST format (see the module docs of [`super`]).

use super::SstError;

/// The format version written in every footer.
pub const FORMAT_VERSION: u32 = 1;
/// Magic number at the very end of every SST: "WEIRSST1" read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"WEIRSST1");
/// Footer length in bytes.
pub const FOOTER_BYTES: usize = 64;
/// Default target size of a data block before compression, bytes (as RocksDB's `block_size`).
pub const DEFAULT_BLOCK_SIZE_BYTES: usize = 64 << 10;

/// A byte range of an SST file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHandle {
    /// Offset from the start of the file, bytes.
    pub offset: u64,
    /// Length on disk (compression byte, payload and checksum included), bytes.
    pub len: u32,
}

impl BlockHandle {
    /// The handle as a `Range<usize>` into the file bytes.
    pub fn range(&self) -> std::ops::Range<usize> {
        let start = self.offset as usize;
        start..start + self.len as usize
    }
}

/// The footer: where the filter and index live, how many entries, which version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    /// The filter block.
    pub filter: BlockHandle,
    /// The index block.
    pub index: BlockHandle,
    /// Entries in the table, tombstones included.
    pub entry_count: u64,
}

impl Footer {
    /// Encodes the footer into exactly [`FOOTER_BYTES`].
    pub fn encode(&self) -> [u8; FOOTER_BYTES] {
        let mut out = [0u8; FOOTER_BYTES];
        out[0..8].copy_from_slice(&self.filter.offset.to_le_bytes());
        out[8..12].copy_from_slice(&self.filter.len.to_le_bytes());
        out[12..20].copy_from_slice(&self.index.offset.to_le_bytes());
        out[20..24].copy_from_slice(&self.index.len.to_le_bytes());
        out[24..32].copy_from_slice(&self.entry_count.to_le_bytes());
        out[32..36].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        let crc = crc32c::crc32c(&out[0..36]);
        out[36..40].copy_from_slice(&crc.to_le_bytes());
        out[56..64].copy_from_slice(&MAGIC.to_le_bytes());
        out
    }

    /// Decodes the last [`FOOTER_BYTES`] of an SST.
    ///
    /// # Errors
    /// [`SstError::Malformed`] for a wrong length, magic or version; [`SstError::Checksum`]
    /// when the footer's checksum does not match.
    pub fn decode(bytes: &[u8]) -> Result<Self, SstError> {
        if bytes.len() != FOOTER_BYTES {
            return Err(SstError::malformed(format!(
                "footer is {} bytes, not {FOOTER_BYTES}",
                bytes.len()
            )));
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        if u64_at(56) != MAGIC {
            return Err(SstError::malformed("bad magic: not a Weir SST"));
        }
        let expected = u32_at(36);
        let actual = crc32c::crc32c(&bytes[0..36]);
        if expected != actual {
            return Err(SstError::Checksum {
                part: "footer",
                expected,
                actual,
            });
        }
        let version = u32_at(32);
        if version != FORMAT_VERSION {
            return Err(SstError::malformed(format!(
                "unsupported format version {version}"
            )));
        }
        Ok(Footer {
            filter: BlockHandle {
                offset: u64_at(0),
                len: u32_at(8),
            },
            index: BlockHandle {
                offset: u64_at(12),
                len: u32_at(20),
            },
            entry_count: u64_at(24),
        })
    }
}
