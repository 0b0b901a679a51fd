//! A worker's edges (docs/topologies.md, "Repeats across an edge"; `crate::time::edge`): as a
//! downstream stage, the markers and origins of its edge inputs — each upstream shard's
//! frontier kept, a record from below it dropped as a repeat, what it knows of its upstream
//! shards saved with each checkpoint and restored at the start; as an upstream stage, the
//! frontier its markers carry.

use super::PartitionWorker;
use crate::ids::Offset;
use crate::pipeline::ports::ShardSink;
use crate::runtime::InputRecord;
use crate::state::{Shard, StateError, StateWrite};
use crate::time::edge::{
    EDGES_KEY, EdgeFrontiers, EdgeState, Frontier, ORIGIN_HEADER, Origin, TopicKey, UpstreamState,
};
use crate::time::watermark::Marker;
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// What a worker keeps of its edges besides their watermarks (those are the timers').
#[derive(Debug, Default)]
pub(crate) struct EdgeTracking {
    /// Each upstream shard's frontier on each edge input.
    pub frontiers: EdgeFrontiers,
    /// The edge state last saved to the shard or restored from it; `None` for a stage with no
    /// edge input, which saves none.
    pub saved: Option<EdgeState>,
    /// The frontier the sink last wrote with a marker.
    pub marked_frontier: Option<Frontier>,
    /// A marker was written since the shard started ([`PartitionWorker::mark_active`]).
    pub announced: bool,
}

impl<S: Shard, K: ShardSink> PartitionWorker<S, K> {
    /// Restores what the shard's checkpoint kept of its edges (`value`, read when it opened):
    /// each upstream shard's watermark and frontier. A value that does not decode is logged
    /// and ignored: the edges then wait for every upstream shard's next marker, as at a first
    /// start, and drop no repeat before it.
    pub(super) fn restore_edges(&mut self, value: Option<&[u8]>) {
        let state = match value.map(EdgeState::from_bytes) {
            None => EdgeState::default(),
            Some(Some(state)) => state,
            Some(None) => {
                tracing::warn!(
                    partition = self.partition.0,
                    "the checkpoint's edge state does not decode; its edges start afresh"
                );
                EdgeState::default()
            }
        };
        for (topic, upstreams) in &state.edges {
            // An edge the stage reads by another name now (a reset's next generation) starts
            // afresh.
            let Some(edge) = self
                .timers
                .watermarks()
                .topics()
                .iter()
                .position(|t| t == topic)
            else {
                continue;
            };
            for upstream in upstreams {
                if let Some(watermark) = upstream.watermark {
                    self.timers.watermarks_mut().restore_edge_watermark(
                        edge,
                        upstream.shard,
                        watermark,
                    );
                }
                let edge = u32::try_from(edge).unwrap_or(u32::MAX);
                self.edges
                    .frontiers
                    .restore(edge, upstream.shard, &upstream.frontier);
            }
        }
        self.edges.saved = Some(state);
    }

    /// What the shard knows of its edges now, as its checkpoint keeps it.
    fn edge_state(&self) -> EdgeState {
        let mut state = EdgeState::default();
        let watermarks = self.timers.watermarks();
        for (index, shards) in watermarks.edge_watermarks() {
            let Some(topic) = watermarks.topics().get(index) else {
                continue;
            };
            let edge = u32::try_from(index).unwrap_or(u32::MAX);
            let mut upstreams: std::collections::BTreeMap<i32, UpstreamState> = shards
                .iter()
                .enumerate()
                .filter_map(|(shard, w)| {
                    let shard = i32::try_from(shard).ok()?;
                    Some((
                        shard,
                        UpstreamState {
                            shard,
                            watermark: Some((*w)?),
                            frontier: Vec::new(),
                        },
                    ))
                })
                .collect();
            for (shard, frontier) in self.edges.frontiers.of(edge) {
                upstreams
                    .entry(shard)
                    .or_insert_with(|| UpstreamState {
                        shard,
                        ..UpstreamState::default()
                    })
                    .frontier = frontier;
            }
            state
                .edges
                .insert(topic.clone(), upstreams.into_values().collect());
        }
        state
    }

    /// Writes what the shard knows of its edges when it changed since the last save, so that
    /// the next checkpoint keeps it (with nothing in flight, before each checkpoint).
    ///
    /// # Errors
    /// [`StateError`] from the write: a checkpoint must not be taken.
    pub(super) async fn save_edges(&mut self) -> Result<(), StateError> {
        let Some(saved) = &self.edges.saved else {
            return Ok(());
        };
        let state = self.edge_state();
        if state == *saved {
            return Ok(());
        }
        self.shard
            .apply(vec![StateWrite {
                key: EDGES_KEY.to_vec(),
                value: Some(Bytes::from(state.to_bytes())),
                expires_at_ms: None,
            }])
            .await?;
        self.edges.saved = Some(state);
        self.dirty = true;
        Ok(())
    }

    /// The watermark marker `record` is, if it is one of an edge's (docs/topologies.md); its
    /// frontier, if it carries one, moves its upstream shard's.
    pub(super) fn marker(&mut self, record: &InputRecord) -> Option<Marker> {
        if record.headers.is_empty() || !self.timers.watermarks().is_edge(&record.topic) {
            return None;
        }
        let headers = || {
            record
                .headers
                .iter()
                .map(|h| (h.name.as_str(), h.value.as_slice()))
        };
        let marker = Marker::decode(headers())?;
        if let Some(frontier) = Frontier::decode(headers()) {
            self.edges
                .frontiers
                .advance(record.input, marker.shard, &frontier);
        }
        Some(marker)
    }

    /// Whether `record`, of an edge, repeats what its upstream shard sent before a frontier
    /// this shard has read: then it is dropped, its offset passed. Its origin header is taken
    /// off either way (the operator never sees it).
    pub(super) fn repeat(&mut self, record: &mut InputRecord) -> bool {
        if record
            .headers
            .last()
            .is_none_or(|h| h.name != ORIGIN_HEADER)
            || !self.timers.watermarks().is_edge(&record.topic)
        {
            return false;
        }
        let origin = record.headers.pop().and_then(|h| Origin::decode(&h.value));
        let repeat = origin.is_some_and(|o| self.edges.frontiers.is_repeat(record.input, &o));
        if repeat {
            self.offsets.advance(&record.topic, Offset(record.offset));
            self.dirty = true;
            self.stats.records_repeated.fetch_add(1, Ordering::Relaxed);
            self.stats.metrics.edge_repeats.increment(1);
        }
        repeat
    }

    /// The frontier the shard's markers carry now: per input topic, the next offset its
    /// state reflects (`None` when no input has one yet).
    pub(super) fn frontier_now(&self) -> Option<Frontier> {
        let frontier: std::collections::BTreeMap<TopicKey, i64> = self
            .offsets
            .iter()
            .map(|(topic, next)| (TopicKey::of(topic), next.0))
            .collect();
        (!frontier.is_empty()).then_some(Frontier(frontier))
    }
}
