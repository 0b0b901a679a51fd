//! The snapshot object's format (module docs of `snapshot`): written whole by [`encode`],
//! read whole by [`decode`], or checked as it streams past by [`StreamCheck`] (`weir pipeline
//! verify`, which never holds a partition's whole state). Frozen: every stored `memory`
//! checkpoint is one of these.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::collections::BTreeMap;

const MAGIC: &[u8; 8] = b"WEIRSNP1";
const NO_EXPIRY: u64 = u64::MAX;
/// One entry of a snapshot: key → (value, expiry ms).
pub type SnapshotEntries = BTreeMap<Vec<u8>, (Bytes, Option<u64>)>;

/// Encodes `entries` as a snapshot object.
pub fn encode<'a>(
    entries: impl ExactSizeIterator<Item = (&'a [u8], &'a Bytes, Option<u64>)>,
) -> Bytes {
    let mut out = BytesMut::new();
    out.put_slice(MAGIC);
    out.put_u64_le(entries.len() as u64);
    for (key, value, expires_at_ms) in entries {
        out.put_u32_le(key.len() as u32);
        out.put_slice(key);
        out.put_u32_le(value.len() as u32);
        out.put_slice(value);
        out.put_u64_le(expires_at_ms.unwrap_or(NO_EXPIRY));
    }
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out.freeze()
}

/// A snapshot object's checksum checked as its bytes stream past (`weir pipeline verify`):
/// nothing but the last four bytes is held.
#[derive(Debug, Default)]
pub struct StreamCheck {
    crc: u32,
    /// The last (up to) four bytes seen: the trailer, once the stream ends.
    tail: Vec<u8>,
    len: u64,
    head: Vec<u8>,
}

impl StreamCheck {
    /// Takes the next bytes of the object.
    pub fn update(&mut self, chunk: &[u8]) {
        if self.head.len() < MAGIC.len() {
            let take = (MAGIC.len() - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..take]);
        }
        self.len += chunk.len() as u64;
        // Everything but the last four bytes seen so far goes through the CRC.
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > 4 {
            let body = self.tail.len() - 4;
            self.crc = crc32c::crc32c_append(self.crc, &self.tail[..body]);
            self.tail.drain(..body);
        }
    }

    /// Whether the object was a whole snapshot: its magic, and the CRC-32C of all before the
    /// trailer equal to the trailer.
    ///
    /// # Errors
    /// What is wrong, as [`decode`] says it.
    pub fn finish(self) -> Result<(), SnapshotError> {
        if self.len < (MAGIC.len() + 8 + 4) as u64 || self.head != MAGIC {
            return Err(SnapshotError::Magic);
        }
        let stored = u32::from_le_bytes(
            self.tail
                .try_into()
                .map_err(|_| SnapshotError::ShortTrailer)?,
        );
        if self.crc != stored {
            return Err(SnapshotError::Checksum);
        }
        Ok(())
    }
}

/// Why bytes are not a whole snapshot object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Too short, or it does not start with the format's magic.
    #[error("not a snapshot (magic)")]
    Magic,
    /// The CRC-32C trailer is cut.
    #[error("short trailer")]
    ShortTrailer,
    /// The CRC-32C of the bytes before the trailer is not the trailer.
    #[error("snapshot checksum mismatch")]
    Checksum,
    /// An entry ends past the object's end.
    #[error("truncated entry")]
    Truncated,
    /// Bytes follow the last of the entries the header counts.
    #[error("bytes after the last entry")]
    TrailingBytes,
}

/// Decodes a snapshot object.
///
/// # Errors
/// What is wrong: magic, checksum or a truncated entry.
pub fn decode(object: &Bytes) -> Result<SnapshotEntries, SnapshotError> {
    if object.len() < MAGIC.len() + 8 + 4 || &object[..MAGIC.len()] != MAGIC {
        return Err(SnapshotError::Magic);
    }
    let (body, trailer) = object.split_at(object.len() - 4);
    let stored = u32::from_le_bytes(
        trailer
            .try_into()
            .map_err(|_| SnapshotError::ShortTrailer)?,
    );
    if crc32c::crc32c(body) != stored {
        return Err(SnapshotError::Checksum);
    }
    let mut buf = object.slice(MAGIC.len()..object.len() - 4);
    let count = buf.get_u64_le();
    let mut entries = BTreeMap::new();
    for _ in 0..count {
        let key = take(&mut buf)?;
        let value = take(&mut buf)?;
        if buf.remaining() < 8 {
            return Err(SnapshotError::Truncated);
        }
        let expires = buf.get_u64_le();
        entries.insert(
            key.to_vec(),
            (value, (expires != NO_EXPIRY).then_some(expires)),
        );
    }
    if buf.has_remaining() {
        return Err(SnapshotError::TrailingBytes);
    }
    Ok(entries)
}

fn take(buf: &mut Bytes) -> Result<Bytes, SnapshotError> {
    if buf.remaining() < 4 {
        return Err(SnapshotError::Truncated);
    }
    let len = buf.get_u32_le() as usize;
    if buf.remaining() < len {
        return Err(SnapshotError::Truncated);
    }
    Ok(buf.split_to(len))
}
