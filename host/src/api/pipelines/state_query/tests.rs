//! Unit tests of the state query's parts: page tokens and reads.

use super::*;
use crate::api::problem::ProblemKind;

#[test]
fn a_page_token_round_trips_and_garbage_is_a_bad_request() {
    let token = PageToken {
        v: vec![
            (Partition(0), ManifestVersion(12)),
            (Partition(1), ManifestVersion(9)),
        ],
        a: B64.encode(b"\0\0\0\x02k1\x05count"),
        q: "0011223344556677".to_owned(),
        s: Some("sp".to_owned()),
        l: Some("00ff".to_owned()),
        t: Some("\"etag\"".to_owned()),
    };
    let back = decode_token(&encode_token(&token)).expect("decodes");
    assert_eq!(
        (back.v, back.a, back.s, back.l, back.t),
        (token.v, token.a, token.s, token.l, token.t)
    );
    assert!(matches!(
        decode_token("not a token"),
        Err(e) if e.is(ProblemKind::BadRequest)
    ));
}

#[test]
fn a_read_is_of_a_key_or_a_prefix_within_the_limits() {
    let q = |key: Option<&str>, prefix: Option<&str>, limit: Option<u32>| StateQuery {
        key: key.map(str::to_owned),
        prefix: prefix.map(str::to_owned),
        limit,
        ..StateQuery::default()
    };
    assert!(matches!(
        Read::of(&q(Some("k"), None, None)),
        Ok(Read { kind: ReadKind::Key(k), limit: 100 }) if k == b"k"
    ));
    assert!(matches!(
        Read::of(&q(None, None, Some(1000))),
        Ok(Read { kind: ReadKind::Prefix(p), limit: 1000 }) if p.is_empty()
    ));
    assert!(Read::of(&q(Some("k"), Some("p"), None)).is_err());
    assert!(Read::of(&q(None, None, Some(0))).is_err());
    assert!(Read::of(&q(None, None, Some(1001))).is_err());
    let bad_b64 = StateQuery {
        key_b64: Some("%%".to_owned()),
        ..StateQuery::default()
    };
    assert!(Read::of(&bad_b64).is_err());
    assert!(check_state_name("!timers").is_err());
    assert!(check_state_name("").is_err());
    assert!(check_state_name("count").is_ok());
}
