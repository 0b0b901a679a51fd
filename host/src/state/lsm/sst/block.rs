//! Blocks: entry encoding inside a block, and sealing a block on disk (compression byte,
//! payload, crc32c). See the layout in [`super`].

use super::{Entry, SstError};
use bytes::Bytes;

const KIND_PUT: u8 = 0;
const KIND_TOMBSTONE: u8 = 1;
const KIND_PUT_EXPIRING: u8 = 2;

const COMPRESSION_NONE: u8 = 0;
const COMPRESSION_LZ4: u8 = 1;

/// Appends `v` as an unsigned LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads an unsigned LEB128 varint at `*pos`, advancing it.
///
/// # Errors
/// [`SstError::Malformed`] when the bytes end or the varint is longer than 10 bytes.
pub fn get_varint(bytes: &[u8], pos: &mut usize) -> Result<u64, SstError> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let b = *bytes
            .get(*pos)
            .ok_or_else(|| SstError::malformed("truncated varint"))?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(SstError::malformed("varint longer than 10 bytes"))
}

/// Appends one entry in block encoding.
pub fn encode_entry(out: &mut Vec<u8>, key: &[u8], entry: &Entry) {
    put_varint(out, key.len() as u64);
    out.extend_from_slice(key);
    match entry {
        Entry::Tombstone => out.push(KIND_TOMBSTONE),
        Entry::Put {
            value,
            expires_at_ms,
        } => {
            match expires_at_ms {
                None => out.push(KIND_PUT),
                Some(at) => {
                    out.push(KIND_PUT_EXPIRING);
                    out.extend_from_slice(&at.to_le_bytes());
                }
            }
            put_varint(out, value.len() as u64);
            out.extend_from_slice(value);
        }
    }
}

fn take<'a>(bytes: &'a [u8], pos: &mut usize, n: usize) -> Result<&'a [u8], SstError> {
    let end = pos
        .checked_add(n)
        .filter(|end| *end <= bytes.len())
        .ok_or_else(|| SstError::malformed("entry runs past the end of its block"))?;
    let out = &bytes[*pos..end];
    *pos = end;
    Ok(out)
}

/// Iterates the entries of a raw (unsealed) block in order; values share the block's buffer.
#[derive(Debug, Clone)]
pub struct BlockIter {
    raw: Bytes,
    pos: usize,
}

impl BlockIter {
    /// An iterator over the entries of `raw`.
    pub fn new(raw: Bytes) -> Self {
        Self { raw, pos: 0 }
    }

    fn decode_next(&mut self) -> Result<(Bytes, Entry), SstError> {
        let raw = &self.raw;
        let mut pos = self.pos;
        let key_len = get_varint(raw, &mut pos)? as usize;
        let key_start = pos;
        take(raw, &mut pos, key_len)?;
        let key = raw.slice(key_start..pos);
        let kind = *take(raw, &mut pos, 1)?.first().expect("one byte taken");
        let entry = match kind {
            KIND_TOMBSTONE => Entry::Tombstone,
            KIND_PUT | KIND_PUT_EXPIRING => {
                let expires_at_ms = if kind == KIND_PUT_EXPIRING {
                    let at = take(raw, &mut pos, 8)?;
                    Some(u64::from_le_bytes(at.try_into().expect("8 bytes")))
                } else {
                    None
                };
                let value_len = get_varint(raw, &mut pos)? as usize;
                let value_start = pos;
                take(raw, &mut pos, value_len)?;
                Entry::Put {
                    value: raw.slice(value_start..pos),
                    expires_at_ms,
                }
            }
            other => return Err(SstError::malformed(format!("unknown entry kind {other}"))),
        };
        self.pos = pos;
        Ok((key, entry))
    }
}

impl Iterator for BlockIter {
    type Item = Result<(Bytes, Entry), SstError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.raw.len() {
            return None;
        }
        let item = self.decode_next();
        if item.is_err() {
            // Stop after the first error: nothing after it can be trusted.
            self.pos = self.raw.len();
        }
        Some(item)
    }
}

/// The entry of `key` in the raw block `raw`, if present. Walks the entries without building
/// any of them but the match (no reference-count traffic per entry), stopping at the first key
/// past `key`.
///
/// # Errors
/// [`SstError::Malformed`] when the block does not decode up to the key.
pub fn find(raw: &Bytes, key: &[u8]) -> Result<Option<Entry>, SstError> {
    let bytes: &[u8] = raw;
    let mut pos = 0;
    while pos < bytes.len() {
        let key_len = get_varint(bytes, &mut pos)? as usize;
        let k = take(bytes, &mut pos, key_len)?;
        let kind = *take(bytes, &mut pos, 1)?.first().expect("one byte taken");
        let expires_at_ms = match kind {
            KIND_TOMBSTONE | KIND_PUT => None,
            KIND_PUT_EXPIRING => Some(u64::from_le_bytes(
                take(bytes, &mut pos, 8)?.try_into().expect("8 bytes"),
            )),
            other => return Err(SstError::malformed(format!("unknown entry kind {other}"))),
        };
        let value = if kind == KIND_TOMBSTONE {
            None
        } else {
            let value_len = get_varint(bytes, &mut pos)? as usize;
            let start = pos;
            take(bytes, &mut pos, value_len)?;
            Some(start..pos)
        };
        match k.cmp(key) {
            std::cmp::Ordering::Less => continue,
            std::cmp::Ordering::Greater => return Ok(None),
            std::cmp::Ordering::Equal => {
                return Ok(Some(match value {
                    None => Entry::Tombstone,
                    Some(range) => Entry::Put {
                        value: raw.slice(range),
                        expires_at_ms,
                    },
                }));
            }
        }
    }
    Ok(None)
}

/// Seals a raw block for disk: lz4 when `compress` and it helps, then the checksum.
pub fn seal(raw: &[u8], compress: bool) -> Vec<u8> {
    let compressed = compress.then(|| lz4_flex::block::compress_prepend_size(raw));
    let (kind, payload) = match &compressed {
        Some(c) if c.len() < raw.len() => (COMPRESSION_LZ4, c.as_slice()),
        _ => (COMPRESSION_NONE, raw),
    };
    let mut out = Vec::with_capacity(1 + payload.len() + 4);
    out.push(kind);
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Verifies and opens a sealed block, returning its raw bytes.
///
/// # Errors
/// [`SstError::Checksum`] when the checksum fails, [`SstError::Malformed`] for an unknown
/// compression or a payload that does not decompress.
pub fn unseal(sealed: &Bytes, part: &'static str) -> Result<Bytes, SstError> {
    if sealed.len() < 5 {
        return Err(SstError::malformed(format!(
            "{part} block shorter than 5 bytes"
        )));
    }
    let (body, crc) = sealed.split_at(sealed.len() - 4);
    let expected = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let actual = crc32c::crc32c(body);
    if expected != actual {
        return Err(SstError::Checksum {
            part,
            expected,
            actual,
        });
    }
    match body[0] {
        COMPRESSION_NONE => Ok(sealed.slice(1..body.len())),
        COMPRESSION_LZ4 => lz4_flex::block::decompress_size_prepended(&body[1..])
            .map(Bytes::from)
            .map_err(|e| SstError::malformed(format!("{part} block does not decompress: {e}"))),
        other => Err(SstError::malformed(format!("unknown compression {other}"))),
    }
}
