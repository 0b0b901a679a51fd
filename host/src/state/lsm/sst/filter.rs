//! The bloom filter of an SST: ≈10 bits per key and 7 probes (≈1 % false positives), hashing
//! keys with XXH3-64 (seed 0) and double hashing `h1 + i·h2` (Kirsch & Mitzenmacher, 2006).
//! The hash is part of the format: changing it requires a new format version.

use xxhash_rust::xxh3::xxh3_64;

/// Bits per key.
pub const BITS_PER_KEY: usize = 10;
/// Probes per key.
pub const PROBES: u8 = 7;

/// The filter hash of `key`.
pub fn hash(key: &[u8]) -> u64 {
    xxh3_64(key)
}

fn probes(h: u64, probes: u8, bits: usize) -> impl Iterator<Item = usize> {
    let (h1, h2) = (h as u32, (h >> 32) as u32);
    (0..u32::from(probes)).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) as usize) % bits)
}

/// Builds the raw filter block (`u8 probes | bits`) from the [`hash`]es of the keys.
pub fn build(hashes: &[u64]) -> Vec<u8> {
    let bits = (hashes.len() * BITS_PER_KEY).max(64);
    let mut out = vec![0u8; 1 + bits.div_ceil(8)];
    out[0] = PROBES;
    let bits = (out.len() - 1) * 8;
    for &h in hashes {
        for bit in probes(h, PROBES, bits) {
            out[1 + bit / 8] |= 1 << (bit % 8);
        }
    }
    out
}

/// Whether `key` may be in the table the raw filter block `filter` was built for: `false` means
/// certainly absent.
pub fn may_contain(filter: &[u8], key: &[u8]) -> bool {
    let Some((&k, bitmap)) = filter.split_first() else {
        return true;
    };
    let bits = bitmap.len() * 8;
    if bits == 0 || k == 0 {
        return true;
    }
    probes(hash(key), k, bits).all(|bit| bitmap[bit / 8] & (1 << (bit % 8)) != 0)
}
