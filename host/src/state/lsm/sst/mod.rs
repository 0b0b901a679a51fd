//! The SST format, version 1: an immutable sorted table of entries, owned and versioned by
//! Weir. Frozen by snapshot tests; a change of layout bumps [`format::FORMAT_VERSION`].
//!
//! # Layout
//! ```text
//! data block 0 | data block 1 | … | filter block | index block | footer (64 bytes)
//! ```
//! 1. **Entries** are sorted by key, keys unique. Each is a put (value, optional expiry in ms of
//!    processing time) or a tombstone. Encoding inside a block:
//!    `varint key_len | key | u8 kind | [u64 LE expires_at_ms if kind = 2] | [varint value_len | value if kind ≠ 1]`
//!    with kind 0 = put, 1 = tombstone, 2 = put with expiry.
//! 2. **Data blocks** hold entries until the raw size reaches `block_size_bytes` (default
//!    64 KiB). On disk a block is `u8 compression (0 none, 1 lz4) | payload | u32 LE crc32c`
//!    where the checksum covers the compression byte and the payload; lz4 payloads carry the
//!    raw length (lz4_flex's size-prepended block format). A block is left uncompressed when lz4
//!    does not make it smaller.
//! 3. **Filter block**: a bloom filter over every key (≈10 bits per key, 7 probes), hashed with
//!    XXH3-64 (seed 0) and double hashing `h1 + i·h2` over the two 32-bit halves; stored as a
//!    block (`u8 probes | bits`), uncompressed, with its checksum.
//! 4. **Index block**: one entry per data block, keyed by the block's last key, valued
//!    `u64 LE offset | u32 LE length` of the block on disk; stored as a block.
//! 5. **Footer**: `u64 filter offset | u32 filter length | u64 index offset | u32 index length |
//!    u64 entry count | u32 format version | u32 crc32c of the preceding 40 bytes |
//!    16 zero bytes reserved | u64 magic`, all little-endian: 64 bytes. The footer is read
//!    first (one range read of the last 64 bytes), then the filter and index, then data blocks
//!    on demand, each one range read.

pub mod block;
pub mod builder;
pub mod filter;
pub mod format;
pub mod reader;

pub use builder::SstBuilder;
pub use reader::{SstIndex, SstReader};

use bytes::Bytes;

/// One entry of an SST: a value with an optional expiry, or a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A live value.
    Put {
        /// The value bytes.
        value: Bytes,
        /// Processing time (ms since the Unix epoch) after which the entry reads as absent.
        expires_at_ms: Option<u64>,
    },
    /// A deletion that hides older versions of the key until compaction drops it.
    Tombstone,
}

/// Why an SST could not be built or read.
#[derive(Debug, thiserror::Error)]
pub enum SstError {
    /// A checksum did not match: the bytes are corrupt.
    #[error(
        "sst checksum mismatch. part=`{part}` expected=`{expected:#010x}` actual=`{actual:#010x}`"
    )]
    Checksum {
        /// Which part (`footer`, `index`, `filter`, `data`).
        part: &'static str,
        /// The stored checksum.
        expected: u32,
        /// The computed checksum.
        actual: u32,
    },
    /// The bytes do not follow the format (bad magic, truncated, unknown version or kind).
    #[error("sst is malformed: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// Keys were added out of order or twice.
    #[error("sst keys must be added in strictly increasing order")]
    KeyOrder,
}

impl SstError {
    pub(crate) fn malformed(reason: impl Into<String>) -> Self {
        SstError::Malformed {
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests;
