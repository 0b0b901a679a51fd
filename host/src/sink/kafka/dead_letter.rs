//! Dead letters: a failed input record with the `weir.*` headers naming why and where it was
//! read, cut to fit its topic when it is too large ([`fit_dead_letter`]).

use super::limits::{
    ERROR_HEADER_BYTES_MAX, HEADER_ORIGINAL_HEADERS_BYTES, HEADER_ORIGINAL_KEY_BYTES,
    HEADER_ORIGINAL_VALUE_BYTES, HEADER_TRUNCATED, cap, fit_dead_letter,
};
use super::{
    DeadLetterKind, HEADER_ERROR, HEADER_ERROR_KIND, HEADER_SOURCE_OFFSET, HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC, HEADER_STAGE,
};
use crate::ids::Partition;
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};

/// Where a dead-lettered record was read.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeadLetterSource<'a> {
    pub topic: &'a str,
    pub partition: Partition,
    pub offset: i64,
    /// The stage whose operator failed it, in a pipeline of stages.
    pub stage: Option<&'a str>,
}

/// The key, value and headers of a dead letter of a record with `key`, `value` and
/// `headers`: the original headers, then the `weir.*` headers (`weir.error` capped at
/// [`ERROR_HEADER_BYTES_MAX`]; `weir.stage` last, for a stage); cut to `limit` bytes by [`fit_dead_letter`], with the
/// truncation headers when anything was cut.
pub(super) fn dead_letter_parts<'a>(
    source: DeadLetterSource<'_>,
    kind: DeadLetterKind,
    error: &str,
    headers: &[(&str, &[u8])],
    key: &'a [u8],
    value: &'a [u8],
    limit: u64,
) -> (&'a [u8], &'a [u8], OwnedHeaders) {
    let partition = source.partition.to_string();
    let offset = source.offset.to_string();
    let weir: [(&str, &[u8]); 6] = [
        (HEADER_ERROR, cap(error, ERROR_HEADER_BYTES_MAX).as_bytes()),
        (HEADER_ERROR_KIND, kind.as_str().as_bytes()),
        (HEADER_SOURCE_TOPIC, source.topic.as_bytes()),
        (HEADER_SOURCE_PARTITION, partition.as_bytes()),
        (HEADER_SOURCE_OFFSET, offset.as_bytes()),
        (HEADER_STAGE, source.stage.unwrap_or_default().as_bytes()),
    ];
    let named = if source.stage.is_some() { 6 } else { 5 };
    cut_again(&weir[..named], headers, key, value, limit)
}

/// Cuts a record with the `weir.*` headers `weir` (kept whole) and the original `headers`,
/// `key` and `value` to `limit` bytes; returns the kept key and value and every header.
pub(super) fn cut_again<'a>(
    weir: &[(&str, &[u8])],
    headers: &[(&str, &[u8])],
    key: &'a [u8],
    value: &'a [u8],
    limit: u64,
) -> (&'a [u8], &'a [u8], OwnedHeaders) {
    let weir_bytes: u64 = weir.iter().map(|(n, v)| (n.len() + v.len()) as u64).sum();
    let sizes: Vec<u64> = headers
        .iter()
        .map(|(n, v)| (n.len() + v.len()) as u64)
        .collect();
    let cut = fit_dead_letter(
        limit,
        weir_bytes,
        weir.len() as u64,
        &sizes,
        key.len(),
        value.len(),
    );
    let kept = headers.len() - cut.headers_dropped;
    let mut out = OwnedHeaders::new_with_capacity(kept + weir.len() + 4);
    for (name, v) in headers[..kept].iter().chain(weir) {
        out = out.insert(KafkaHeader {
            key: name,
            value: Some(*v),
        });
    }
    if cut.truncated {
        let mut what = Vec::new();
        if cut.headers_dropped > 0 {
            what.push("headers");
        }
        if cut.key_kept < key.len() {
            what.push("key");
        }
        if cut.value_kept < value.len() {
            what.push("value");
        }
        let original_headers: u64 = sizes.iter().sum();
        for (name, v) in [
            (HEADER_TRUNCATED, what.join(",")),
            (HEADER_ORIGINAL_KEY_BYTES, key.len().to_string()),
            (HEADER_ORIGINAL_VALUE_BYTES, value.len().to_string()),
            (HEADER_ORIGINAL_HEADERS_BYTES, original_headers.to_string()),
        ] {
            out = out.insert(KafkaHeader {
                key: name,
                value: Some(v.as_bytes()),
            });
        }
    }
    (&key[..cut.key_kept], &value[..cut.value_kept], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::kafka::limits::ERROR_HEADER_BYTES_MAX;
    use rdkafka::message::Headers;

    fn header<'a>(headers: &'a OwnedHeaders, name: &str) -> Option<&'a [u8]> {
        headers.iter().find(|h| h.key == name).and_then(|h| h.value)
    }

    #[test]
    fn a_dead_letter_keeps_its_weir_headers_with_the_error_capped_at_4_kib() {
        let source = DeadLetterSource {
            topic: "in",
            partition: Partition(3),
            offset: 42,
            stage: None,
        };
        let original = [("trace", b"abc".as_slice())];
        let (key, value, headers) = dead_letter_parts(
            source,
            DeadLetterKind::Trapped,
            &"é".repeat(5_000),
            &original,
            b"k",
            b"v",
            1_000_000,
        );
        assert_eq!((key, value), (b"k".as_slice(), b"v".as_slice()));
        let error = header(&headers, HEADER_ERROR).expect("weir.error");
        assert_eq!(
            error.len(),
            ERROR_HEADER_BYTES_MAX,
            "cut at a character boundary"
        );
        assert_eq!(
            header(&headers, HEADER_SOURCE_OFFSET),
            Some(b"42".as_slice())
        );
        assert_eq!(header(&headers, "trace"), Some(b"abc".as_slice()));
        assert_eq!(header(&headers, HEADER_TRUNCATED), None, "nothing was cut");
        assert_eq!(header(&headers, HEADER_STAGE), None, "not a stage's");
    }

    #[test]
    fn a_stages_dead_letter_names_the_stage() {
        let source = DeadLetterSource {
            topic: "busiest-origin.departures.default.internal",
            partition: Partition(1),
            offset: 9,
            stage: Some("top"),
        };
        let (_, _, headers) = dead_letter_parts(
            source,
            DeadLetterKind::Rejected,
            "no",
            &[],
            b"k",
            b"v",
            1_000_000,
        );
        assert_eq!(header(&headers, HEADER_STAGE), Some(b"top".as_slice()));
        assert_eq!(
            header(&headers, HEADER_SOURCE_TOPIC),
            Some(b"busiest-origin.departures.default.internal".as_slice())
        );
    }

    #[test]
    fn a_dead_letter_too_large_for_its_topic_says_what_was_cut() {
        let source = DeadLetterSource {
            topic: "in",
            partition: Partition(0),
            offset: 7,
            stage: None,
        };
        let key = vec![b'k'; 30_000];
        let original = [("big", vec![b'h'; 20_000])];
        let original: Vec<(&str, &[u8])> =
            original.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let (kept_key, value, headers) = dead_letter_parts(
            source,
            DeadLetterKind::Rejected,
            "too big",
            &original,
            &key,
            b"value",
            10_000,
        );
        assert!(kept_key.len() < key.len());
        assert_eq!(value, b"value", "the value is cut last");
        assert_eq!(header(&headers, "big"), None, "headers go first");
        assert_eq!(
            header(&headers, HEADER_TRUNCATED),
            Some(b"headers,key".as_slice())
        );
        assert_eq!(
            header(&headers, HEADER_ORIGINAL_KEY_BYTES),
            Some(b"30000".as_slice())
        );
        assert_eq!(
            header(&headers, HEADER_ORIGINAL_HEADERS_BYTES),
            Some(b"20003".as_slice())
        );
        assert_eq!(header(&headers, HEADER_ERROR), Some(b"too big".as_slice()));
    }
}
