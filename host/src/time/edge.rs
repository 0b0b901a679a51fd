//! What an edge carries besides the watermark, so that a downstream stage drops what an
//! upstream shard sends again (docs/topologies.md, "Repeats across an edge").
//!
//! Every record an upstream shard emits for an input record says where it came from
//! ([`Origin`], the last header, `weir.origin`: the upstream shard, its input topic — a hash
//! of its name, [`TopicKey`] — and the input offset); each of its markers says how far the
//! checkpoint it was written at got ([`Frontier`], the `weir.frontier` header: per input, the
//! next offset). Every emit of an input record below a marker's frontier was sent before the
//! marker — exactly-once, committed in its transaction or an earlier one; at-least-once,
//! acknowledged before the marker was sent — so a downstream shard that has read the marker
//! drops a record whose origin is below it: a repeat, sent again by an upstream shard that
//! went back to an older checkpoint (its newest unreadable, SCENARIOS.md S15) or that resumed
//! at-least-once from one whose marker it had written. What the downstream knows of its edges
//! — each upstream shard's frontier, watermark and idleness — goes into its checkpoints
//! ([`EdgeState`], under [`EDGES_KEY`]), so a restart of the downstream keeps it.
//!
//! A record with no origin (a fired timer's emit, a record written before origins existed) is
//! never dropped. Inputs are named by their topic, not their place among the stage's inputs:
//! a reset to a savepoint, or a pipeline created from another's, reads internal topics of
//! other names, whose offsets start at 0 again, and a frontier of the old topics never covers
//! a record of the new ones. The headers are Weir's: an emit carrying one fails its record.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The header naming an edge record's [`Origin`]: the record's last.
pub const ORIGIN_HEADER: &str = "weir.origin";

/// The header of a marker record carrying the shard's [`Frontier`] (after
/// [`super::marker::MARKER_HEADER`]).
pub const FRONTIER_HEADER: &str = "weir.frontier";

/// The reserved key of a shard's [`EdgeState`] (beside the others of `time::keys`).
pub const EDGES_KEY: [u8; 5] = [0xFF, 0xFF, 0xFF, 0xFF, b'e'];

/// An input topic of an upstream shard as origins and frontiers name it: the 32-bit FNV-1a
/// hash of its Kafka name. Two topics of one upstream shard with one hash would share a
/// frontier (odds of 2^-32 per pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TopicKey(pub u32);

impl TopicKey {
    /// The key of topic `name`.
    pub fn of(name: &str) -> Self {
        Self(name.bytes().fold(0x811c_9dc5, |hash, byte| {
            (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
        }))
    }
}

/// Where an edge record came from: upstream shard `shard` emitted it for the record at
/// `offset` of its input `input`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The upstream shard (its partition).
    pub shard: i32,
    /// Its input topic the record came from.
    pub input: TopicKey,
    /// The input record's offset.
    pub offset: i64,
}

impl Origin {
    /// The header value: 16 bytes, big-endian — shard (i32), topic key (u32), offset (i64).
    /// On the stack: one per edge record.
    pub fn encode(&self) -> [u8; 16] {
        let mut value = [0u8; 16];
        value[..4].copy_from_slice(&self.shard.to_be_bytes());
        value[4..8].copy_from_slice(&self.input.0.to_be_bytes());
        value[8..].copy_from_slice(&self.offset.to_be_bytes());
        value
    }

    /// The origin a header value holds, if it is 16 bytes.
    pub fn decode(value: &[u8]) -> Option<Self> {
        let value: &[u8; 16] = value.try_into().ok()?;
        let (shard, rest) = value.split_at(4);
        let (input, offset) = rest.split_at(4);
        Some(Self {
            shard: i32::from_be_bytes(shard.try_into().ok()?),
            input: TopicKey(u32::from_be_bytes(input.try_into().ok()?)),
            offset: i64::from_be_bytes(offset.try_into().ok()?),
        })
    }
}

/// How far an upstream shard's checkpoint got: per input topic, the next offset to process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier(pub BTreeMap<TopicKey, i64>);

impl Frontier {
    /// The header value: `{topic key}={offset}` per input, comma-separated, in decimal.
    pub fn encode(&self) -> String {
        let parts: Vec<String> = self.0.iter().map(|(k, o)| format!("{}={o}", k.0)).collect();
        parts.join(",")
    }

    /// The frontier a marker record's headers carry, if one of them is [`FRONTIER_HEADER`]
    /// with a well-formed value.
    pub fn decode<'a>(mut headers: impl Iterator<Item = (&'a str, &'a [u8])>) -> Option<Self> {
        let (_, value) = headers.find(|(name, _)| *name == FRONTIER_HEADER)?;
        let mut frontier = BTreeMap::new();
        for part in std::str::from_utf8(value).ok()?.split(',') {
            if part.is_empty() {
                continue;
            }
            let (key, offset) = part.split_once('=')?;
            frontier.insert(TopicKey(key.parse().ok()?), offset.parse().ok()?);
        }
        Some(Self(frontier))
    }
}

/// What a downstream shard knows of one upstream shard of an edge, as its checkpoint keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamState {
    /// The upstream shard.
    pub shard: i32,
    /// Its highest watermark (ms) and whether its last marker said it was idle; none before
    /// its first marker with a watermark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<(i64, bool)>,
    /// Its highest frontier: per input topic of its, the next offset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frontier: Vec<(TopicKey, i64)>,
}

/// What a downstream shard keeps of its edges in its checkpoints ([`EDGES_KEY`], JSON): per
/// edge (the Kafka name of the internal topic it reads), each upstream shard's
/// [`UpstreamState`]. An edge the stage no longer reads by that name (a reset's next
/// generation) is not restored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeState {
    /// Per edge topic, the upstream shards it heard from.
    pub edges: BTreeMap<String, Vec<UpstreamState>>,
}

impl EdgeState {
    /// The value stored under [`EDGES_KEY`].
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The state a stored value holds; `None` for one that does not decode (the edges then
    /// start as after a first start: every upstream shard's next marker is waited for).
    pub fn from_bytes(value: &[u8]) -> Option<Self> {
        serde_json::from_slice(value).ok()
    }
}

/// A downstream shard's frontiers: per edge input (index among the stage's inputs), per
/// upstream shard, per input topic of that shard, the next offset its last checkpoint named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeFrontiers {
    edges: BTreeMap<u32, BTreeMap<i32, BTreeMap<TopicKey, i64>>>,
}

impl EdgeFrontiers {
    /// Upstream shard `shard` of edge input `edge` wrote a marker with `frontier`: each of its
    /// inputs' frontier moves up to it (never back). An input the marker does not name is
    /// forgotten: the upstream reads it no more (a reset moved it to a topic of another name).
    pub fn advance(&mut self, edge: u32, shard: i32, frontier: &Frontier) {
        let known = self
            .edges
            .entry(edge)
            .or_default()
            .entry(shard)
            .or_default();
        known.retain(|topic, _| frontier.0.contains_key(topic));
        for (input, offset) in &frontier.0 {
            let next = known.entry(*input).or_insert(*offset);
            *next = (*next).max(*offset);
        }
    }

    /// Whether a record of edge input `edge` from `origin` is a repeat: its upstream shard's
    /// frontier for its input is past its offset.
    pub fn is_repeat(&self, edge: u32, origin: &Origin) -> bool {
        self.edges
            .get(&edge)
            .and_then(|shards| shards.get(&origin.shard))
            .and_then(|inputs| inputs.get(&origin.input))
            .is_some_and(|next| origin.offset < *next)
    }

    /// Edge input `edge`'s upstream shards' frontiers, for its checkpointed state.
    pub fn of(&self, edge: u32) -> impl Iterator<Item = (i32, Vec<(TopicKey, i64)>)> + '_ {
        self.edges.get(&edge).into_iter().flat_map(|shards| {
            shards
                .iter()
                .map(|(shard, inputs)| (*shard, inputs.iter().map(|(k, o)| (*k, *o)).collect()))
        })
    }

    /// Restores upstream shard `shard`'s frontier of edge input `edge` from a checkpoint.
    pub fn restore(&mut self, edge: u32, shard: i32, frontier: &[(TopicKey, i64)]) {
        if frontier.is_empty() {
            return;
        }
        self.edges
            .entry(edge)
            .or_default()
            .insert(shard, frontier.iter().copied().collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_sixteen_bytes_and_decodes_to_itself() {
        let origin = Origin {
            shard: 3,
            input: TopicKey(0x0102_0304),
            offset: 1_234_567_890_123,
        };
        let value = origin.encode();
        assert_eq!(&value[..8], &[0, 0, 0, 3, 1, 2, 3, 4]);
        assert_eq!(Origin::decode(&value), Some(origin));
        assert_eq!(Origin::decode(&value[..15]), None, "not an origin");
        // FNV-1a 32 of the empty string and of "a", as published.
        assert_eq!(TopicKey::of(""), TopicKey(0x811c_9dc5));
        assert_eq!(TopicKey::of("a"), TopicKey(0xe40c_292c));
    }

    #[test]
    fn a_frontier_is_a_header_of_its_marker() {
        let frontier = Frontier(BTreeMap::from([(TopicKey(7), 120), (TopicKey(9), 3)]));
        let value = frontier.encode();
        assert_eq!(value, "7=120,9=3");
        let headers = [
            ("weir.watermark", b"0:5".as_slice()),
            (FRONTIER_HEADER, value.as_bytes()),
        ];
        assert_eq!(Frontier::decode(headers.iter().copied()), Some(frontier));
        assert_eq!(
            Frontier::decode([("weir.watermark", b"0:5".as_slice())].into_iter()),
            None
        );
        assert_eq!(
            Frontier::decode([(FRONTIER_HEADER, b"7=x".as_slice())].into_iter()),
            None,
            "malformed"
        );
    }

    #[test]
    fn a_record_below_its_upstream_shards_frontier_is_a_repeat_and_frontiers_never_go_back() {
        let (old, new) = (
            TopicKey::of("p.a.default.internal"),
            TopicKey::of("p.a.default.g1.internal"),
        );
        let mut frontiers = EdgeFrontiers::default();
        let origin = |shard, input, offset| Origin {
            shard,
            input,
            offset,
        };
        assert!(!frontiers.is_repeat(1, &origin(0, old, 5)), "no marker yet");
        frontiers.advance(1, 0, &Frontier(BTreeMap::from([(old, 10)])));
        assert!(frontiers.is_repeat(1, &origin(0, old, 9)));
        assert!(
            !frontiers.is_repeat(1, &origin(0, old, 10)),
            "the frontier is the next offset"
        );
        assert!(
            !frontiers.is_repeat(1, &origin(1, old, 3)),
            "another upstream shard"
        );
        assert!(!frontiers.is_repeat(0, &origin(0, old, 3)), "another edge");
        assert!(!frontiers.is_repeat(1, &origin(0, new, 3)), "another topic");
        frontiers.advance(1, 0, &Frontier(BTreeMap::from([(old, 4)])));
        assert!(frontiers.is_repeat(1, &origin(0, old, 9)), "never back");
        // A reset: the upstream reads its input's next topic, from offset 0 again.
        frontiers.advance(1, 0, &Frontier(BTreeMap::from([(new, 2)])));
        assert!(!frontiers.is_repeat(1, &origin(0, new, 5)));
        assert!(
            !frontiers.is_repeat(1, &origin(0, old, 9)),
            "the topic it reads no more is forgotten"
        );
    }

    #[test]
    fn edge_state_round_trips_through_its_stored_value() {
        let state = EdgeState {
            edges: BTreeMap::from([(
                "t.p.a.default.internal".to_owned(),
                vec![
                    UpstreamState {
                        shard: 0,
                        watermark: Some((5_000, false)),
                        frontier: vec![(TopicKey(7), 10)],
                    },
                    UpstreamState {
                        shard: 2,
                        watermark: Some((i64::MIN, true)),
                        frontier: Vec::new(),
                    },
                ],
            )]),
        };
        assert_eq!(EdgeState::from_bytes(&state.to_bytes()), Some(state));
        assert_eq!(EdgeState::from_bytes(b"not json"), None);
    }
}
