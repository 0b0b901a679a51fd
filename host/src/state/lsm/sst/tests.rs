//! Tests of the SST format: round trips against a `BTreeMap` model, corruption detection, the
//! filter's false-positive rate, and a snapshot that freezes the encoded bytes.

use super::format::{FOOTER_BYTES, Footer};
use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn put(v: &[u8]) -> Entry {
    Entry::Put {
        value: Bytes::copy_from_slice(v),
        expires_at_ms: None,
    }
}

fn build(entries: &BTreeMap<Vec<u8>, Entry>, block_size: usize, compress: bool) -> Bytes {
    let mut b = SstBuilder::new(block_size, compress);
    for (k, e) in entries {
        b.add(k, e).expect("keys come sorted from the map");
    }
    b.finish()
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|v| put(&v)),
        (proptest::collection::vec(any::<u8>(), 0..40), any::<u64>()).prop_map(|(v, at)| {
            Entry::Put {
                value: Bytes::from(v),
                expires_at_ms: Some(at),
            }
        }),
        Just(Entry::Tombstone),
    ]
}

proptest! {
    /// Whatever the entries, block size and compression, reading back gives exactly the model:
    /// every key by `get`, absent keys as `None`, and `iter` in order.
    #[test]
    fn sst_round_trips_against_a_btreemap_model(
        model in proptest::collection::btree_map(proptest::collection::vec(0u8..6, 0..6), entry(), 0..80),
        absent in proptest::collection::vec(proptest::collection::vec(0u8..8, 0..7), 0..20),
        block_size in 1usize..300,
        compress in any::<bool>(),
    ) {
        let reader = SstReader::open(build(&model, block_size, compress)).expect("opens");
        prop_assert_eq!(reader.entry_count(), model.len() as u64);
        for (k, e) in &model {
            prop_assert_eq!(reader.get(k).expect("reads"), Some(e.clone()));
        }
        for k in absent.iter().filter(|k| !model.contains_key(*k)) {
            prop_assert_eq!(reader.get(k).expect("reads"), None);
        }
        let all: Vec<(Vec<u8>, Entry)> = reader
            .iter()
            .map(|r| r.map(|(k, e)| (k.to_vec(), e)))
            .collect::<Result<_, _>>()
            .expect("iterates");
        let want: Vec<(Vec<u8>, Entry)> = model.into_iter().collect();
        prop_assert_eq!(all, want);
    }
}

#[test]
fn keys_out_of_order_are_refused() {
    let mut b = SstBuilder::default();
    b.add(b"b", &put(b"1")).expect("first key");
    assert!(matches!(b.add(b"a", &put(b"2")), Err(SstError::KeyOrder)));
    assert!(matches!(b.add(b"b", &put(b"2")), Err(SstError::KeyOrder)));
}

#[test]
fn a_flipped_byte_in_a_data_block_is_reported_as_a_checksum_error() {
    let model: BTreeMap<Vec<u8>, Entry> = (0u32..200)
        .map(|i| {
            (
                i.to_be_bytes().to_vec(),
                put(format!("value {i}").as_bytes()),
            )
        })
        .collect();
    let file = build(&model, 256, true);
    let reader = SstReader::open(file.clone()).expect("opens");
    let (_, first) = reader.blocks()[0];
    let mut corrupt = file.to_vec();
    corrupt[first.offset as usize + 3] ^= 0x40;
    let reader =
        SstReader::open(Bytes::from(corrupt)).expect("footer, filter and index are intact");
    let err = reader
        .get(&0u32.to_be_bytes())
        .expect_err("the block is corrupt");
    assert!(
        matches!(err, SstError::Checksum { part: "data", .. }),
        "{err}"
    );
    assert!(reader.iter().any(|r| r.is_err()));
}

#[test]
fn a_corrupt_or_foreign_footer_is_refused() {
    let model: BTreeMap<Vec<u8>, Entry> = [(b"k".to_vec(), put(b"v"))].into();
    let file = build(&model, 64, false);
    let mut bad_crc = file.to_vec();
    let n = bad_crc.len();
    bad_crc[n - FOOTER_BYTES] ^= 1;
    assert!(matches!(
        SstReader::open(Bytes::from(bad_crc)),
        Err(SstError::Checksum { part: "footer", .. })
    ));
    let mut bad_magic = file.to_vec();
    bad_magic[n - 1] ^= 1;
    assert!(matches!(
        SstReader::open(Bytes::from(bad_magic)),
        Err(SstError::Malformed { .. })
    ));
    assert!(matches!(
        SstReader::open(Bytes::from_static(b"short")),
        Err(SstError::Malformed { .. })
    ));
    let footer = Footer::decode(&file[n - FOOTER_BYTES..]).expect("decodes");
    assert_eq!(footer.entry_count, 1);
}

#[test]
fn the_filter_rules_out_most_absent_keys() {
    let present: Vec<Vec<u8>> = (0u32..10_000)
        .map(|i| format!("present-{i}").into_bytes())
        .collect();
    let hashes: Vec<u64> = present.iter().map(|k| filter::hash(k)).collect();
    let f = filter::build(&hashes);
    assert!(
        present.iter().all(|k| filter::may_contain(&f, k)),
        "no false negatives"
    );
    let false_positives = (0u32..10_000)
        .filter(|i| filter::may_contain(&f, format!("absent-{i}").as_bytes()))
        .count();
    // ≈0.8 % expected at 10 bits per key and 7 probes.
    assert!(
        false_positives < 200,
        "{false_positives} false positives in 10,000"
    );
}

#[test]
fn the_encoded_bytes_are_frozen() {
    let model: BTreeMap<Vec<u8>, Entry> = [
        (b"apple".to_vec(), put(b"red")),
        (b"banana".to_vec(), Entry::Tombstone),
        (
            b"cherry".to_vec(),
            Entry::Put {
                value: Bytes::from_static(b"dark"),
                expires_at_ms: Some(1_700_000_000_000),
            },
        ),
    ]
    .into();
    let file = build(&model, 16, false);
    let hex: Vec<String> = file
        .chunks(16)
        .map(|row| {
            row.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    insta::assert_snapshot!(hex.join("\n"));
}
