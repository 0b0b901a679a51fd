//! [`Watermarks`]: a shard's event-time watermark, as Flink's bounded-out-of-orderness
//! `WatermarkStrategy` with idleness: per input topic the highest record timestamp admitted,
//! less `max_out_of_orderness` and 1 ms (a watermark `w` says no record at or before `w` is
//! expected any more); the shard's is the lowest of its co-partitioned topics'. A topic with no
//! record for `idle_timeout` stops holding it back; with `idle_advance`, once every topic is
//! idle *and the consumer has caught up* (handed out every record up to the partitions' end)
//! the watermark follows processing time less `max_out_of_orderness`: a consumer stalled
//! mid-input (a slow broker, a busy host) is silent without being idle. The worker reports
//! when Weir itself holds the shard's input back (a full queue, a state outage): no topic goes
//! idle meanwhile.
//!
//! The watermark is *applied* (seen by `timers.watermark`, firing event-time timers, deciding
//! lateness) only when every record admitted before it has finished, and never goes
//! backwards, across restarts included.
//!
//! An *edge* — an internal topic between two stages (docs/topologies.md) — carries its
//! watermark in marker records ([`Marker`]): each upstream shard writes its own to every
//! partition it feeds at each of its checkpoints where it changed. The records' timestamps move
//! nothing there; the edge's watermark is the lowest of its upstream shards' markers (none
//! until each has written one). An upstream shard stops holding it back only when it says so —
//! its last marker is *idle*, written when its own inputs went idle (as Flink propagates an
//! idle `WatermarkStatus` downstream) — never because its markers are slow to come: a busy
//! upstream shard whose checkpoints are far apart still holds every later window. A shard's
//! downstream partitions then close a window only once every upstream shard has passed it,
//! however the internal topic interleaves their records.

use std::time::Duration;

pub use super::marker::{MARKER_HEADER, Marker};

/// Markers of shards at or above this are ignored: no stage has that many (an internal topic
/// has at most 10,000 partitions, `config::stages`).
const MARKER_SHARDS_MAX: usize = 100_000;

/// An edge's upstream shards: each one's highest watermark and whether its last marker said
/// it was idle.
#[derive(Debug, Clone)]
struct Upstream {
    /// Per upstream shard: its watermark and its idleness; `None` until its first marker.
    shards: Vec<Option<(i64, bool)>>,
}

/// How a shard's input goes idle (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Idleness {
    /// A topic with no record for this long stops holding the watermark back; `None`: never.
    pub timeout: Option<Duration>,
    /// Once every topic is idle, the watermark follows processing time.
    pub advance: bool,
}

/// A shard's watermark. See the module docs.
#[derive(Debug)]
pub struct Watermarks {
    /// Per input topic (in the pipeline's order): the highest timestamp admitted (for an edge,
    /// its upstream shards' lowest marker + 1).
    highest: Vec<Option<i64>>,
    /// Per input topic: its upstream shards, if it is an edge.
    edges: Vec<Option<Upstream>>,
    /// Per input topic: processing time (ms) of its last record, or of the last moment Weir
    /// held the input back, or of the start.
    active_at: Vec<i64>,
    topics: Vec<String>,
    out_of_orderness_ms: i64,
    idle_timeout_ms: Option<i64>,
    idle_advance: bool,
    /// Whether the consumer has handed out every record up to the end of the shard's input
    /// partitions (as last reported).
    caught_up: bool,
    applied: Option<i64>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Watermarks {
    /// Watermarks over `topics` (at least one), held `max_out_of_orderness` behind, going idle
    /// as `idleness` says; `now_ms` is processing time now.
    pub fn new(
        topics: &[String],
        max_out_of_orderness: Duration,
        idleness: Idleness,
        now_ms: i64,
    ) -> Self {
        let n = topics.len().max(1);
        Self {
            highest: vec![None; n],
            edges: vec![None; n],
            active_at: vec![now_ms; n],
            topics: topics.to_vec(),
            out_of_orderness_ms: millis(max_out_of_orderness),
            idle_timeout_ms: idleness.timeout.map(millis),
            idle_advance: idleness.advance && idleness.timeout.is_some(),
            caught_up: false,
            applied: None,
        }
    }

    /// Makes `topic` an edge that `upstream_shards` shards write (docs/topologies.md): only
    /// their markers move its watermark. A topic that is not an input is ignored.
    pub fn set_edge(&mut self, topic: &str, upstream_shards: usize) {
        if let Some(i) = self.topics.iter().position(|t| t == topic) {
            self.edges[i] = Some(Upstream {
                shards: vec![None; upstream_shards.max(1)],
            });
        }
    }

    /// The input topics, in the pipeline's order.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Whether `topic` is an edge ([`Self::set_edge`]).
    pub fn is_edge(&self, topic: &str) -> bool {
        self.index(topic).is_some_and(|i| self.edges[i].is_some())
    }

    /// A marker of the edge `topic` came at processing time `now_ms` (ignored for a topic that
    /// is not an edge). An upstream shard's watermark never goes back, and it is idle until a
    /// marker says otherwise; one beyond the shards the edge was set up with (its upstream
    /// gained partitions) joins them.
    pub fn marker(&mut self, topic: &str, marker: Marker, now_ms: i64) {
        let Some(i) = self.index(topic) else { return };
        let Some(upstream) = &mut self.edges[i] else {
            return;
        };
        let shard = usize::try_from(marker.shard).unwrap_or(0);
        if shard >= MARKER_SHARDS_MAX {
            // Not a shard of any stage: no topic has this many partitions.
            return;
        }
        if shard >= upstream.shards.len() {
            upstream.shards.resize(shard + 1, None);
        }
        self.active_at[i] = self.active_at[i].max(now_ms);
        let slot = &mut upstream.shards[shard];
        if slot.is_none() && !marker.idle && marker.watermark_ms == i64::MIN {
            // An active shard with no watermark yet (a marker for its frontier, `time::edge`):
            // it holds the edge as before its first marker. (Once it said it was idle, such a
            // marker makes it active again, below.)
            return;
        }
        let watermark = slot.map_or(marker.watermark_ms, |(w, _)| w.max(marker.watermark_ms));
        *slot = Some((watermark, marker.idle));
    }

    /// Per edge input (its index among the inputs), each upstream shard's watermark and
    /// idleness as its markers left them (`None` before its first): what a checkpoint keeps.
    pub fn edge_watermarks(&self) -> impl Iterator<Item = (usize, &[Option<(i64, bool)>])> {
        self.edges
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((i, e.as_ref()?.shards.as_slice())))
    }

    /// Restores upstream shard `shard`'s watermark and idleness on edge input `i` from a
    /// checkpoint (ignored when `i` is not an edge, or for a shard past any stage's).
    pub fn restore_edge_watermark(&mut self, i: usize, shard: i32, watermark: (i64, bool)) {
        let Some(Some(upstream)) = self.edges.get_mut(i) else {
            return;
        };
        let Some(shard) = usize::try_from(shard)
            .ok()
            .filter(|s| *s < MARKER_SHARDS_MAX)
        else {
            return;
        };
        if shard >= upstream.shards.len() {
            upstream.shards.resize(shard + 1, None);
        }
        upstream.shards[shard] = Some(watermark);
    }

    /// The index of `topic` among the inputs (the only one's, whatever the name, when there is
    /// one).
    fn index(&self, topic: &str) -> Option<usize> {
        if self.topics.len() > 1 {
            self.topics.iter().position(|t| t == topic)
        } else {
            Some(0)
        }
    }

    /// A record of `topic` with `timestamp_ms` was admitted at processing time `now_ms` (a
    /// negative timestamp, none, keeps the topic active but moves nothing; on an edge only
    /// markers move it).
    pub fn admitted(&mut self, topic: &str, timestamp_ms: i64, now_ms: i64) {
        let i = self.index(topic).unwrap_or(0);
        self.active_at[i] = self.active_at[i].max(now_ms);
        if timestamp_ms >= 0 && self.edges[i].is_none() {
            let slot = &mut self.highest[i];
            *slot = Some(slot.map_or(timestamp_ms, |h| h.max(timestamp_ms)));
        }
    }

    /// A record of `topic` reached the worker at `now_ms` (admitted or waiting): the topic is
    /// active.
    pub fn seen(&mut self, topic: &str, now_ms: i64) {
        let i = self.index(topic).unwrap_or(0);
        self.active_at[i] = self.active_at[i].max(now_ms);
    }

    /// What input `i` allows: its highest timestamp, or for an edge the lowest marker of its
    /// upstream shards (+ 1, as a timestamp) that are not idle — none while one has written
    /// none.
    fn highest_at(&self, i: usize) -> Option<i64> {
        let Some(upstream) = &self.edges[i] else {
            return self.highest[i];
        };
        let mut low: Option<i64> = None;
        let mut any = false;
        for shard in &upstream.shards {
            match shard {
                Some((_, true)) => {}
                Some((w, false)) => {
                    any = true;
                    low = Some(low.map_or(*w, |l| l.min(*w)));
                }
                None => return None,
            }
        }
        if !any {
            // Every upstream shard idle: the lowest of their watermarks holds (idleness alone
            // moves nothing, as for topics).
            low = upstream
                .shards
                .iter()
                .flatten()
                .map(|(w, _)| *w)
                .filter(|w| *w > i64::MIN)
                .min();
        }
        low.map(|w| w.saturating_add(1))
    }

    /// Whether this shard's inputs are idle at `now_ms` — every topic silent for
    /// `idle_timeout` *and the consumer caught up* — while its watermark does not follow
    /// processing time: what its markers tell the stage downstream ([`Marker::idle`]). A
    /// consumer stalled mid-input (a slow first fetch, a busy host) is silent with records
    /// still to come: called idle, the stage downstream would close windows those records'
    /// outputs belong to.
    pub fn inputs_idle(&self, now_ms: i64) -> bool {
        let Some(timeout) = self.idle_timeout_ms else {
            return false;
        };
        let all_idle = self
            .active_at
            .iter()
            .all(|at| now_ms.saturating_sub(*at) >= timeout);
        all_idle && self.caught_up && !self.idle_advance
    }

    /// Weir holds the shard's input back at `now_ms` (records wait in its queue, or a state
    /// outage stalls it): no topic may count as idle, whatever arrived last.
    pub fn held(&mut self, now_ms: i64) {
        self.active_at.fill(now_ms);
    }

    /// Whether the consumer has handed out every record up to the end of the shard's input
    /// partitions: only then does `idle_advance` move the watermark with processing time.
    pub fn set_caught_up(&mut self, caught_up: bool) {
        self.caught_up = caught_up;
    }

    /// Whether some topic may go idle, so the worker must look again without records.
    pub fn idles(&self) -> bool {
        self.idle_timeout_ms.is_some()
    }

    /// The watermark the admitted records allow at processing time `now_ms`: what
    /// [`Self::apply`] would make it.
    pub fn candidate(&self, now_ms: i64) -> Option<i64> {
        let idle = |i: usize| {
            self.idle_timeout_ms
                .is_some_and(|t| now_ms.saturating_sub(self.active_at[i]) >= t)
        };
        let topics = 0..self.highest.len();
        let all_idle = topics.clone().all(idle);
        let lowest_of = |among: &mut dyn Iterator<Item = usize>| {
            // One with no timestamp yet holds it back.
            let mut low = i64::MAX;
            for i in among {
                low = low.min(self.highest_at(i)?);
            }
            Some(
                low.saturating_sub(self.out_of_orderness_ms)
                    .saturating_sub(1),
            )
        };
        let computed = if !all_idle {
            // The lowest of the active topics.
            lowest_of(&mut topics.filter(|i| !idle(*i)))
        } else if self.idle_advance && self.caught_up {
            Some(
                now_ms
                    .saturating_sub(self.out_of_orderness_ms)
                    .saturating_sub(1),
            )
        } else {
            // Every topic idle: what the last ones to go idle allowed (so a timer that came
            // due while only they were active is not missed between two looks).
            let latest = self.active_at.iter().copied().max().unwrap_or(i64::MIN);
            lowest_of(&mut topics.filter(|i| self.active_at[*i] == latest))
        };
        match (self.applied, computed) {
            (Some(a), Some(c)) => Some(a.max(c)),
            (a, c) => a.or(c),
        }
    }

    /// Applies the candidate at `now_ms` (every admitted record has finished); returns the new
    /// watermark when it moved.
    pub fn apply(&mut self, now_ms: i64) -> Option<i64> {
        let candidate = self.candidate(now_ms)?;
        if Some(candidate) == self.applied {
            return None;
        }
        self.applied = Some(candidate);
        self.applied
    }

    /// Takes the watermark a checkpoint saved: the applied one never goes below it.
    pub fn restore(&mut self, saved: Option<i64>) {
        self.applied = match (self.applied, saved) {
            (Some(a), Some(s)) => Some(a.max(s)),
            (a, s) => a.or(s),
        };
    }

    /// The applied watermark.
    pub fn applied(&self) -> Option<i64> {
        self.applied
    }

    /// Whether a record with `timestamp_ms` is late: at or before the applied watermark.
    pub fn is_late(&self, timestamp_ms: i64) -> bool {
        timestamp_ms >= 0 && self.applied.is_some_and(|w| timestamp_ms <= w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics() -> [String; 2] {
        ["a".to_owned(), "b".to_owned()]
    }

    #[test]
    fn the_watermark_is_the_slowest_topic_less_the_disorder_and_never_goes_back() {
        let mut w = Watermarks::new(&topics(), Duration::from_millis(10), Idleness::default(), 0);
        w.restore(Some(5));
        w.admitted("a", 100, 0);
        assert_eq!(w.candidate(0), Some(5), "topic b has no timestamp yet");
        w.admitted("b", 50, 0);
        w.admitted("b", -1, 0);
        assert_eq!(w.candidate(0), Some(39), "50 - 10 - 1");
        assert_eq!(w.applied(), Some(5), "not applied until asked");
        assert_eq!(w.apply(0), Some(39));
        assert_eq!(w.apply(0), None, "unchanged");
        assert!(w.is_late(39) && !w.is_late(40) && !w.is_late(-1));
        let mut restored = Watermarks::new(&topics(), Duration::ZERO, Idleness::default(), 0);
        restored.restore(Some(40));
        restored.admitted("a", 20, 0);
        restored.admitted("b", 30, 0);
        assert_eq!(
            restored.candidate(0),
            Some(40),
            "never behind the restored value"
        );
    }

    #[test]
    fn an_idle_topic_stops_holding_the_watermark_unless_weir_held_it_back() {
        let idleness = Idleness {
            timeout: Some(Duration::from_secs(10)),
            advance: false,
        };
        let mut w = Watermarks::new(&topics(), Duration::ZERO, idleness, 0);
        w.admitted("a", 1_000, 1);
        assert_eq!(w.candidate(5_000), None, "b holds it until it is idle");
        assert_eq!(w.candidate(10_000), Some(999), "b idle since the start");
        w.held(10_000);
        assert_eq!(
            w.candidate(15_000),
            None,
            "held back at 10 s: nothing is idle at 15 s"
        );
        w.admitted("a", 2_000, 19_000);
        assert_eq!(
            w.apply(20_000),
            Some(1_999),
            "b idle again 10 s after the hold"
        );
        assert_eq!(
            w.candidate(40_000),
            Some(1_999),
            "all idle, no advance: what the last active topic allowed"
        );
        w.admitted("b", 1_500, 41_000);
        w.admitted("a", 3_000, 42_000);
        assert_eq!(
            w.candidate(60_000),
            Some(2_999),
            "a went idle last: b, idle before it, holds nothing back"
        );
    }

    #[test]
    fn with_idle_advance_a_silent_shard_follows_processing_time() {
        let idleness = Idleness {
            timeout: Some(Duration::from_secs(1)),
            advance: true,
        };
        let mut w = Watermarks::new(&topics()[..1], Duration::from_millis(100), idleness, 0);
        w.set_caught_up(true);
        w.admitted("a", 5_000, 5_000);
        assert_eq!(w.candidate(5_500), Some(4_899));
        assert_eq!(w.candidate(6_000), Some(5_899), "6000 - 100 - 1");
        w.held(6_000);
        assert_eq!(w.candidate(6_500), Some(4_899), "not while held back");
    }

    #[test]
    fn idle_advance_waits_for_the_consumer_to_catch_up() {
        let idleness = Idleness {
            timeout: Some(Duration::from_secs(1)),
            advance: true,
        };
        let mut w = Watermarks::new(&topics()[..1], Duration::from_millis(100), idleness, 0);
        w.admitted("a", 5_000, 5_000);
        assert_eq!(
            w.candidate(60_000),
            Some(4_899),
            "silent, but records wait before the partition's end: what they allowed"
        );
        w.set_caught_up(true);
        assert_eq!(
            w.candidate(60_000),
            Some(59_899),
            "caught up: processing time"
        );
    }

    fn marker(shard: i32, watermark_ms: i64) -> Marker {
        Marker {
            shard,
            watermark_ms,
            idle: false,
        }
    }

    fn idle_marker(shard: i32, watermark_ms: i64) -> Marker {
        Marker {
            idle: true,
            ..marker(shard, watermark_ms)
        }
    }

    #[test]
    fn an_edges_watermark_is_its_slowest_upstream_shards_marker() {
        let mut w = Watermarks::new(&topics(), Duration::ZERO, Idleness::default(), 0);
        w.set_edge("b", 2);
        assert!(w.is_edge("b") && !w.is_edge("a"));
        w.admitted("a", 10_000, 0);
        w.admitted("b", 9_000, 0);
        assert_eq!(w.candidate(0), None, "an edge's records move nothing");
        w.marker("b", marker(1, 5_000), 0);
        assert_eq!(
            w.candidate(0),
            None,
            "upstream shard 0 has written no marker"
        );
        w.marker("b", marker(0, 7_000), 0);
        assert_eq!(w.candidate(0), Some(5_000), "the slowest upstream shard's");
        w.marker("b", marker(1, 4_000), 0);
        assert_eq!(
            w.candidate(0),
            Some(5_000),
            "a shard's watermark never goes back"
        );
        w.marker("b", marker(1, 12_000), 0);
        assert_eq!(w.candidate(0), Some(7_000));
        w.marker("b", marker(2, 6_000), 0);
        assert_eq!(
            w.candidate(0),
            Some(6_000),
            "a shard the edge did not know joins it"
        );
        w.marker("b", marker(0, 15_000), 0);
        w.marker("b", marker(2, 20_000), 0);
        assert_eq!(
            w.candidate(0),
            Some(9_999),
            "then the other input, topic a, is the slowest: 10000 - 1"
        );
    }

    /// An upstream shard holds the edge back however long its next marker takes (a busy
    /// shard's checkpoints can be far apart), until its marker says it is idle; one that
    /// comes back active holds it again.
    #[test]
    fn an_upstream_shard_holds_an_edge_back_until_its_marker_says_it_is_idle() {
        let idleness = Idleness {
            timeout: Some(Duration::from_secs(10)),
            advance: false,
        };
        let mut w = Watermarks::new(&topics()[..1], Duration::from_millis(100), idleness, 0);
        w.set_edge("a", 3);
        w.marker("a", marker(0, 5_000), 1_000);
        w.marker("a", marker(1, 8_000), 1_000);
        assert_eq!(w.candidate(2_000), None, "shard 2 has written nothing yet");
        assert_eq!(
            w.candidate(1_000_000),
            None,
            "nor after any time: silence is not idleness"
        );
        w.marker("a", idle_marker(2, i64::MIN), 1_000_000);
        assert_eq!(
            w.candidate(1_000_000),
            Some(4_900),
            "shard 2 says it is idle: 5000 - 100"
        );
        w.marker("a", idle_marker(0, 5_000), 1_000_000);
        assert_eq!(w.candidate(1_000_000), Some(7_900), "only shard 1 holds it");
        w.marker("a", idle_marker(1, 9_000), 1_000_000);
        assert_eq!(
            w.candidate(1_000_000),
            Some(4_900),
            "every shard idle: the lowest watermark holds (shard 0's 5000 - 100)"
        );
        w.marker("a", marker(0, 6_000), 1_000_000);
        assert_eq!(w.candidate(1_000_000), Some(5_900), "shard 0 is back");
        // Shard 2, idle with no watermark, is active again before its first records: it holds
        // the edge back, though its marker has no watermark (nor do its frontier's markers).
        w.marker("a", marker(2, i64::MIN), 1_000_000);
        assert!(
            w.candidate(1_000_000).is_none_or(|c| c < 0),
            "held by shard 2"
        );
        w.marker("a", marker(2, 7_000), 1_000_000);
        assert_eq!(w.candidate(1_000_000), Some(5_900), "shard 0's 6000 again");
        w.marker("a", marker(5_000_000, 1 << 40), 1_000_000);
        assert_eq!(
            w.candidate(1_000_000),
            Some(5_900),
            "no shard has that number"
        );
    }

    /// A shard's inputs are idle once every topic was silent for the timeout with the
    /// consumer caught up and Weir did not hold them back; a shard whose watermark follows
    /// processing time is not, nor one whose consumer is stalled mid-input.
    #[test]
    fn a_shards_inputs_are_idle_once_silent_and_caught_up_unless_its_watermark_follows_processing_time()
     {
        let idleness = Idleness {
            timeout: Some(Duration::from_secs(10)),
            advance: false,
        };
        let mut w = Watermarks::new(&topics(), Duration::ZERO, idleness, 0);
        w.admitted("a", 1_000, 2_000);
        w.set_caught_up(true);
        assert!(!w.inputs_idle(11_000), "a was active at 2 s");
        assert!(w.inputs_idle(12_000));
        w.set_caught_up(false);
        assert!(
            !w.inputs_idle(12_000),
            "silent with records still to read: stalled, not idle"
        );
        w.set_caught_up(true);
        w.held(12_500);
        assert!(!w.inputs_idle(20_000), "held back at 12.5 s");
        let advancing = Idleness {
            advance: true,
            ..idleness
        };
        let mut w = Watermarks::new(&topics()[..1], Duration::ZERO, advancing, 0);
        assert!(!w.inputs_idle(10_000), "not caught up: stalled, not idle");
        w.set_caught_up(true);
        assert!(!w.inputs_idle(10_000), "follows processing time");
        assert!(
            !Watermarks::new(&topics(), Duration::ZERO, Idleness::default(), 0)
                .inputs_idle(1 << 40)
        );
    }
}
