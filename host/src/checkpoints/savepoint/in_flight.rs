//! What a savepoint of a pipeline of stages holds beside its shards: the records in flight on
//! each partition of each internal topic when it was taken (docs/topologies.md, "Savepoints and
//! resets of a pipeline of stages"), which a reset seeds into the next generation of the
//! internal topics.
//!
//! # Layout
//! `{data}/edges/{stage}/{output}/{partition:05}/{chunk:05}.records`: the partition's records in
//! offset order, in chunks of about [`CHUNK_BYTES`], each chunk:
//! - the magic `WEIRINF1`;
//! - per record: its offset in the old topic (`i64`), its timestamp (`i64` ms since the Unix
//!   epoch, `i64::MIN` for none), its key and value (each a `u32` length, `u32::MAX` for none,
//!   then the bytes), its headers (a `u32` count, each a `u32`-length name and a value as
//!   above); integers little-endian;
//! - a CRC32C of everything before it (`u32`).

use object_store::path::Path;

/// About how many bytes of records one chunk holds (a record is never split).
pub const CHUNK_BYTES: usize = 8 << 20;
const MAGIC: &[u8; 8] = b"WEIRINF1";
const NONE: u32 = u32::MAX;

/// One record in flight on an internal topic, as Kafka delivered it to a `read_committed`
/// consumer: markers (`weir.watermark` headers) too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightRecord {
    /// Its offset in the topic it was read from.
    pub offset: i64,
    /// Its timestamp, ms since the Unix epoch.
    pub timestamp_ms: Option<i64>,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// Its headers, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl InFlightRecord {
    /// About the bytes it takes in a chunk.
    pub fn size(&self) -> usize {
        let opt = |b: &Option<Vec<u8>>| 4 + b.as_ref().map_or(0, Vec::len);
        24 + opt(&self.key)
            + opt(&self.value)
            + self
                .headers
                .iter()
                .map(|(n, v)| 4 + n.len() + opt(v))
                .sum::<usize>()
    }
}

/// Where chunk `chunk` of partition `partition` of the edge from `stage`'s `output` lies in a
/// savepoint's data directory `data`.
pub fn chunk_path(data: &Path, (stage, output): (&str, &str), partition: i32, chunk: u32) -> Path {
    Path::from(format!(
        "{data}/edges/{stage}/{output}/{partition:05}/{chunk:05}.records"
    ))
}

/// One chunk of `records`, in their order.
pub fn encode(records: &[InFlightRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.iter().map(InFlightRecord::size).sum::<usize>() + 12);
    out.extend_from_slice(MAGIC);
    let put_opt = |out: &mut Vec<u8>, b: &Option<Vec<u8>>| match b {
        Some(b) => {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        None => out.extend_from_slice(&NONE.to_le_bytes()),
    };
    for r in records {
        out.extend_from_slice(&r.offset.to_le_bytes());
        out.extend_from_slice(&r.timestamp_ms.unwrap_or(i64::MIN).to_le_bytes());
        put_opt(&mut out, &r.key);
        put_opt(&mut out, &r.value);
        out.extend_from_slice(&(r.headers.len() as u32).to_le_bytes());
        for (name, value) in &r.headers {
            out.extend_from_slice(&(name.len() as u32).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            put_opt(&mut out, value);
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Why a chunk cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a savepoint's chunk of in-flight records is corrupt: {0}")]
pub struct CorruptChunk(&'static str);

/// The records of a chunk [`encode`] wrote.
///
/// # Errors
/// [`CorruptChunk`]: another magic, a checksum that does not match, a record cut short.
pub fn decode(chunk: &[u8]) -> Result<Vec<InFlightRecord>, CorruptChunk> {
    let body_len = chunk
        .len()
        .checked_sub(4)
        .filter(|n| *n >= MAGIC.len())
        .ok_or(CorruptChunk("shorter than its magic and checksum"))?;
    let (body, crc) = chunk.split_at(body_len);
    if &body[..MAGIC.len()] != MAGIC {
        return Err(CorruptChunk("not a chunk of in-flight records"));
    }
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(CorruptChunk("its checksum does not match"));
    }
    let mut reader = Reader(&body[MAGIC.len()..]);
    let mut records = Vec::new();
    while !reader.0.is_empty() {
        let offset = reader.i64()?;
        let timestamp = reader.i64()?;
        let key = reader.opt()?;
        let value = reader.opt()?;
        let count = reader.u32()?;
        let mut headers = Vec::with_capacity(count.min(64) as usize);
        for _ in 0..count {
            let len = reader.u32()? as usize;
            let name = String::from_utf8(reader.take(len)?.to_vec())
                .map_err(|_| CorruptChunk("a header name is not UTF-8"))?;
            headers.push((name, reader.opt()?));
        }
        records.push(InFlightRecord {
            offset,
            timestamp_ms: (timestamp != i64::MIN).then_some(timestamp),
            key,
            value,
            headers,
        });
    }
    Ok(records)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CorruptChunk> {
        if self.0.len() < n {
            return Err(CorruptChunk("a record is cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, CorruptChunk> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self) -> Result<i64, CorruptChunk> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(i64::from_le_bytes(a))
    }

    fn opt(&mut self) -> Result<Option<Vec<u8>>, CorruptChunk> {
        match self.u32()? {
            NONE => Ok(None),
            len => Ok(Some(self.take(len as usize)?.to_vec())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64) -> InFlightRecord {
        InFlightRecord {
            offset,
            timestamp_ms: Some(1_700_000_000_000 + offset),
            key: Some(format!("k{offset}").into_bytes()),
            value: (offset % 2 == 0).then(|| vec![offset as u8; 3]),
            headers: vec![("weir.watermark".into(), Some(b"3:120".to_vec()))],
        }
    }

    #[test]
    fn a_chunk_gives_back_its_records_in_order_with_their_keys_values_headers_and_timestamps() {
        let mut records: Vec<InFlightRecord> = (5..9).map(record).collect();
        records.push(InFlightRecord {
            offset: 11,
            timestamp_ms: None,
            key: None,
            value: Some(Vec::new()),
            headers: vec![("h".into(), None)],
        });
        assert_eq!(decode(&encode(&records)), Ok(records));
        assert_eq!(decode(&encode(&[])), Ok(Vec::new()));
    }

    #[test]
    fn a_chunk_changed_or_cut_short_is_refused() {
        let mut chunk = encode(&[record(1), record(2)]);
        let mid = chunk.len() / 2;
        chunk[mid] ^= 1;
        assert_eq!(
            decode(&chunk),
            Err(CorruptChunk("its checksum does not match"))
        );
        assert!(decode(&chunk[..6]).is_err());
        assert!(decode(b"WEIRINF2\0\0\0\0").is_err());
    }
}
