//! Encoding of state keys: how (record key, state name, map key) become one byte string.
//!
//! ```text
//! u32 BE  len(record key) ║ record key ║ u8 len(state name) ║ state name ║ map key (maps only)
//! ```
//! The length prefixes make the encoding unambiguous and keep all entries of one map state of
//! one record key contiguous and in map-key byte order, so a map is a prefix scan. A value
//! state is the same encoding with an empty map key; value and map states never share a name.
//! State names are stored (not numbered) so that renumbering states between operator versions
//! cannot alias them. Frozen by the tests below: changing it breaks every stored shard.

/// Appends the prefix shared by every entry of state `name` of `record_key` to `out`.
///
/// `name` is at most 255 bytes (the runtime checks declared names are ≤ 64).
pub fn encode_prefix(out: &mut Vec<u8>, record_key: &[u8], name: &str) {
    debug_assert!(name.len() <= usize::from(u8::MAX));
    let key_len = u32::try_from(record_key.len()).expect("record keys are capped far below 4 GiB");
    let name_len = u8::try_from(name.len()).expect("state names are capped at 64 bytes");
    out.reserve(4 + record_key.len() + 1 + name.len());
    out.extend_from_slice(&key_len.to_be_bytes());
    out.extend_from_slice(record_key);
    out.push(name_len);
    out.extend_from_slice(name.as_bytes());
}

/// The key of value state `name` of `record_key`.
pub fn value_key(record_key: &[u8], name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_prefix(&mut out, record_key, name);
    out
}

/// The key of entry `map_key` of map state `name` of `record_key`.
pub fn map_key(record_key: &[u8], name: &str, map_key: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_prefix(&mut out, record_key, name);
    out.extend_from_slice(map_key);
    out
}

/// Splits an encoded state key into (record key, state name, map key — empty for a value
/// state); `None` when `key` is not one (a reserved key, or not an encoding).
pub fn decode(key: &[u8]) -> Option<(&[u8], &str, &[u8])> {
    let (len, rest) = key.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
    if rest.len() < len {
        return None;
    }
    let (record_key, rest) = rest.split_at(len);
    let (&name_len, rest) = rest.split_first()?;
    let name_len = usize::from(name_len);
    if rest.len() < name_len {
        return None;
    }
    let (name, map_key) = rest.split_at(name_len);
    Some((record_key, std::str::from_utf8(name).ok()?, map_key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encoding_is_frozen() {
        assert_eq!(value_key(b"k1", "count"), b"\0\0\0\x02k1\x05count".to_vec());
        assert_eq!(map_key(b"", "m", b"x"), b"\0\0\0\0\x01mx".to_vec());
    }

    proptest! {
        /// Distinct (key, name, map key) triples never encode to the same bytes, and map
        /// entries keep map-key order under their prefix.
        #[test]
        fn encoding_is_injective_and_ordered(
            k1 in proptest::collection::vec(any::<u8>(), 0..8),
            k2 in proptest::collection::vec(any::<u8>(), 0..8),
            n1 in "[a-z]{1,4}", n2 in "[a-z]{1,4}",
            m1 in proptest::collection::vec(any::<u8>(), 0..8),
            m2 in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let a = map_key(&k1, &n1, &m1);
            let b = map_key(&k2, &n2, &m2);
            prop_assert_eq!(decode(&a), Some((&k1[..], n1.as_str(), &m1[..])));
            prop_assert_eq!(a == b, k1 == k2 && n1 == n2 && m1 == m2);
            if k1 == k2 && n1 == n2 {
                prop_assert_eq!(a.cmp(&b), m1.cmp(&m2));
                let mut prefix = Vec::new();
                encode_prefix(&mut prefix, &k1, &n1);
                prop_assert!(a.starts_with(&prefix) && b.starts_with(&prefix));
            }
        }
    }
}
