//! [`Marker`]: the record an upstream stage's shard writes to every partition of an internal
//! topic at its checkpoints, carrying its watermark and idleness to the stage downstream
//! (docs/topologies.md, "Event time across an edge"); [`super::watermark`] takes them in.

/// The header that makes a record of an internal topic a watermark marker (its value: see
/// [`Marker::encode`]). Markers are never written to a user's topic.
pub const MARKER_HEADER: &str = "weir.watermark";

/// A watermark marker: upstream shard `shard`'s watermark was `watermark_ms` at one of its
/// checkpoints, and whether its inputs were idle then (docs/topologies.md, "Event time across an
/// edge").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// The upstream shard (its partition number).
    pub shard: i32,
    /// Its watermark, ms since the Unix epoch; [`i64::MIN`] when it has none yet (an idle
    /// shard that never had a record).
    pub watermark_ms: i64,
    /// Its inputs were idle: until its next marker, it holds no downstream watermark back.
    pub idle: bool,
}

impl Marker {
    /// The header value: `{shard}:{watermark_ms}` in decimal, and `:idle` for an idle shard.
    pub fn encode(&self) -> String {
        if self.idle {
            format!("{}:{}:idle", self.shard, self.watermark_ms)
        } else {
            format!("{}:{}", self.shard, self.watermark_ms)
        }
    }

    /// The marker a record's headers hold, if its first header is [`MARKER_HEADER`] with a
    /// well-formed value.
    pub fn decode<'a>(mut headers: impl Iterator<Item = (&'a str, &'a [u8])>) -> Option<Self> {
        let (name, value) = headers.next()?;
        if name != MARKER_HEADER {
            return None;
        }
        let (shard, rest) = std::str::from_utf8(value).ok()?.split_once(':')?;
        let (watermark_ms, idle) = match rest.split_once(':') {
            Some((watermark_ms, "idle")) => (watermark_ms, true),
            Some(_) => return None,
            None => (rest, false),
        };
        Some(Self {
            shard: shard.parse().ok().filter(|s: &i32| *s >= 0)?,
            watermark_ms: watermark_ms.parse().ok()?,
            idle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_is_the_first_header_of_its_record() {
        let m = Marker {
            shard: 3,
            watermark_ms: 1_700_000_000_123,
            idle: false,
        };
        let value = m.encode();
        assert_eq!(value, "3:1700000000123");
        let headers = [
            (MARKER_HEADER, value.as_bytes()),
            ("other", b"x".as_slice()),
        ];
        assert_eq!(Marker::decode(headers.iter().copied()), Some(m));
        let idle = Marker {
            shard: 4,
            watermark_ms: i64::MIN,
            idle: true,
        };
        assert_eq!(idle.encode(), "4:-9223372036854775808:idle");
        let encoded = idle.encode();
        let headers = [(MARKER_HEADER, encoded.as_bytes())];
        assert_eq!(Marker::decode(headers.iter().copied()), Some(idle));
        let odd = [(MARKER_HEADER, b"4:5:busy".as_slice())];
        assert_eq!(Marker::decode(odd.iter().copied()), None);
        for bad in [
            vec![
                ("other", value.as_bytes()),
                (MARKER_HEADER, value.as_bytes()),
            ],
            vec![(MARKER_HEADER, b"3".as_slice())],
            vec![(MARKER_HEADER, b"-1:5".as_slice())],
            vec![(MARKER_HEADER, b"x:5".as_slice())],
            vec![],
        ] {
            assert_eq!(Marker::decode(bad.iter().copied()), None, "{bad:?}");
        }
    }
}
