//! Where timers and the watermark live in a shard: a reserved key space of the same ordered map
//! as the state, so both backends store and checkpoint them with everything else.
//!
//! ```text
//! per-key entry   state key of map state "!timers" of the record key, map key = timer name
//!                 → u8 domain ║ i64 BE time
//! time index      FF FF FF FF 't' ║ u8 domain ║ u64 BE (time XOR 2^63) ║ u32 BE len(key) ║ key ║ name
//!                 → (empty)
//! watermark       FF FF FF FF 'w' → i64 BE
//! timers pending  FF FF FF FF 'c' → u64 BE   (written with the watermark, before a checkpoint)
//! table pending   FF FF FF FF 'i' → JSON     (the table sink's data files not yet committed)
//! ```
//! No state key starts with `FF FF FF FF` (a state key starts with its record key's length, and
//! record keys are far below 4 GiB), and no declared state is named `!timers` (names are
//! `[a-z0-9_-]`). The per-key entry answers `get` and finds the index entry a `set` moves or a
//! `clear` removes, in one point read; the time index is what fires, in time order per domain,
//! read by prefix scans from its head. Frozen by the tests below: changing it breaks every
//! stored shard.

use crate::runtime::TimeDomain;
use crate::state::key;

/// The reserved state name of the per-key timer entries.
pub const TIMER_STATE: &str = "!timers";

/// The prefix of every time-index entry.
pub const TIME_INDEX: [u8; 5] = [0xFF, 0xFF, 0xFF, 0xFF, b't'];

/// The key of the shard's applied watermark.
pub const WATERMARK_KEY: [u8; 5] = [0xFF, 0xFF, 0xFF, 0xFF, b'w'];

/// The key of the shard's count of pending timers (time-index entries), as of the last
/// checkpoint: the `weir_timers_pending` gauge starts from it when the shard opens, so that
/// no open scans the time index. Shards written before it was kept have none and are counted
/// once by a scan.
pub const TIMER_COUNT_KEY: [u8; 5] = [0xFF, 0xFF, 0xFF, 0xFF, b'c'];

/// The key of the table sink's pending list: the data files a shard wrote that its table does
/// not hold yet (`sink::iceberg::shard`, docs/iceberg.md). Listed here, with the other reserved
/// keys, so that no two parts of the host claim one key; the export carries its value.
pub const TABLE_PENDING_KEY: [u8; 5] = [0xFF, 0xFF, 0xFF, 0xFF, b'i'];

/// A timer as stored: its key, name, time and domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTimer {
    /// The record key it was set for.
    pub key: Vec<u8>,
    /// Its name.
    pub name: String,
    /// When it fires, ms of its domain.
    pub time_ms: i64,
    /// Its domain.
    pub domain: TimeDomain,
}

/// The domain's byte in keys and values.
pub fn domain_byte(domain: TimeDomain) -> u8 {
    match domain {
        TimeDomain::EventTime => 0,
        TimeDomain::ProcessingTime => 1,
    }
}

fn domain_of(byte: u8) -> Option<TimeDomain> {
    match byte {
        0 => Some(TimeDomain::EventTime),
        1 => Some(TimeDomain::ProcessingTime),
        _ => None,
    }
}

/// The prefix of the time index of `domain`.
pub fn domain_prefix(domain: TimeDomain) -> [u8; 6] {
    let mut prefix = [0; 6];
    prefix[..5].copy_from_slice(&TIME_INDEX);
    prefix[5] = domain_byte(domain);
    prefix
}

/// The per-key entry of timer `name` of `record_key`.
pub fn per_key(record_key: &[u8], name: &str) -> Vec<u8> {
    key::map_key(record_key, TIMER_STATE, name.as_bytes())
}

/// The per-key entries of `record_key` share this prefix.
pub fn per_key_prefix(record_key: &[u8]) -> Vec<u8> {
    key::value_key(record_key, TIMER_STATE)
}

/// A per-key entry's value: the timer's domain and time.
pub fn per_key_value(domain: TimeDomain, time_ms: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    out.push(domain_byte(domain));
    out.extend_from_slice(&time_ms.to_be_bytes());
    out
}

/// Decodes a per-key entry's value; `None` when it is not one.
pub fn decode_per_key_value(value: &[u8]) -> Option<(TimeDomain, i64)> {
    let (&domain, time) = value.split_first()?;
    Some((
        domain_of(domain)?,
        i64::from_be_bytes(time.try_into().ok()?),
    ))
}

/// The time-index entry of a timer.
pub fn time_index(domain: TimeDomain, time_ms: i64, record_key: &[u8], name: &str) -> Vec<u8> {
    let key_len = u32::try_from(record_key.len()).expect("record keys are capped far below 4 GiB");
    let mut out = Vec::with_capacity(6 + 8 + 4 + record_key.len() + name.len());
    out.extend_from_slice(&domain_prefix(domain));
    out.extend_from_slice(&((time_ms as u64) ^ (1 << 63)).to_be_bytes());
    out.extend_from_slice(&key_len.to_be_bytes());
    out.extend_from_slice(record_key);
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decodes a time-index entry; `None` when `bytes` is not one.
pub fn decode_time_index(bytes: &[u8]) -> Option<StoredTimer> {
    let rest = bytes.strip_prefix(&TIME_INDEX)?;
    let (&domain, rest) = rest.split_first()?;
    let (time, rest) = rest.split_first_chunk::<8>()?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
    if rest.len() < len {
        return None;
    }
    let (record_key, name) = rest.split_at(len);
    Some(StoredTimer {
        key: record_key.to_vec(),
        name: String::from_utf8(name.to_vec()).ok()?,
        time_ms: (u64::from_be_bytes(*time) ^ (1 << 63)) as i64,
        domain: domain_of(domain)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encoding_is_frozen() {
        assert_eq!(&WATERMARK_KEY, b"\xFF\xFF\xFF\xFFw");
        assert_eq!(&TIMER_COUNT_KEY, b"\xFF\xFF\xFF\xFFc");
        assert_eq!(
            time_index(TimeDomain::ProcessingTime, 1, b"k", "n"),
            b"\xFF\xFF\xFF\xFFt\x01\x80\0\0\0\0\0\0\x01\0\0\0\x01kn".to_vec()
        );
        assert_eq!(per_key(b"k", "n"), b"\0\0\0\x01k\x07!timersn".to_vec());
        assert_eq!(
            per_key_value(TimeDomain::EventTime, -1),
            b"\0\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF".to_vec()
        );
    }

    proptest! {
        /// Index entries sort by domain, then time (negative times included), and decode back.
        #[test]
        fn the_time_index_orders_by_time_and_round_trips(
            t1 in any::<i64>(), t2 in any::<i64>(),
            k1 in proptest::collection::vec(any::<u8>(), 0..6),
            k2 in proptest::collection::vec(any::<u8>(), 0..6),
            n1 in "[a-z]{1,4}", n2 in "[a-z]{1,4}",
        ) {
            let a = time_index(TimeDomain::EventTime, t1, &k1, &n1);
            let b = time_index(TimeDomain::EventTime, t2, &k2, &n2);
            if t1 != t2 {
                prop_assert_eq!(a.cmp(&b), t1.cmp(&t2));
            }
            let decoded = decode_time_index(&a).expect("decodes");
            prop_assert_eq!(decoded, StoredTimer { key: k1, name: n1, time_ms: t1, domain: TimeDomain::EventTime });
            prop_assert!(a.starts_with(&domain_prefix(TimeDomain::EventTime)));
        }
    }
}
