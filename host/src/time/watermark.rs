//! [`Watermarks`]: a shard's event-time watermark (as Flink's bounded-out-of-orderness
//! `WatermarkStrategy`): per input topic the highest record timestamp admitted, minus
//! `max_out_of_orderness`; the shard's is the lowest of its co-partitioned topics'. It is
//! *applied* (seen by `timers.watermark`, firing event-time timers) only when every record
//! admitted before it has finished, and never goes backwards, across restarts included.

use std::time::Duration;

/// A shard's watermark. See the module docs.
#[derive(Debug)]
pub struct Watermarks {
    /// Per input topic (in the pipeline's order): the highest timestamp admitted.
    highest: Vec<Option<i64>>,
    topics: Vec<String>,
    out_of_orderness_ms: i64,
    applied: Option<i64>,
}

impl Watermarks {
    /// Watermarks over `topics` (at least one), held `max_out_of_orderness` behind, applied
    /// from `restored` (the value a checkpoint saved).
    pub fn new(topics: &[String], max_out_of_orderness: Duration, restored: Option<i64>) -> Self {
        Self {
            highest: vec![None; topics.len().max(1)],
            topics: topics.to_vec(),
            out_of_orderness_ms: i64::try_from(max_out_of_orderness.as_millis())
                .unwrap_or(i64::MAX),
            applied: restored,
        }
    }

    /// A record of `topic` with `timestamp_ms` was admitted (a negative timestamp, none, is
    /// left out).
    pub fn admitted(&mut self, topic: &str, timestamp_ms: i64) {
        if timestamp_ms < 0 {
            return;
        }
        let i = self.topics.iter().position(|t| t == topic).unwrap_or(0);
        let slot = &mut self.highest[i];
        *slot = Some(slot.map_or(timestamp_ms, |h| h.max(timestamp_ms)));
    }

    /// The watermark the admitted records allow: what [`Self::apply`] would make it.
    pub fn candidate(&self) -> Option<i64> {
        let lowest = self
            .highest
            .iter()
            .try_fold(i64::MAX, |low, h| h.map(|h| low.min(h)))?;
        let candidate = lowest.saturating_sub(self.out_of_orderness_ms);
        Some(self.applied.map_or(candidate, |a| a.max(candidate)))
    }

    /// Applies the candidate (every admitted record has finished); returns the new watermark
    /// when it moved.
    pub fn apply(&mut self) -> Option<i64> {
        let candidate = self.candidate()?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_is_the_slowest_topic_less_the_disorder_and_never_goes_back() {
        let topics = ["a".to_owned(), "b".to_owned()];
        let mut w = Watermarks::new(&topics, Duration::from_millis(10), Some(5));
        w.admitted("a", 100);
        assert_eq!(w.candidate(), None, "topic b has no timestamp yet");
        w.admitted("b", 50);
        w.admitted("b", -1);
        assert_eq!(w.candidate(), Some(40));
        assert_eq!(w.applied(), Some(5), "not applied until asked");
        assert_eq!(w.apply(), Some(40));
        assert_eq!(w.apply(), None, "unchanged");
        let mut restored = Watermarks::new(&topics, Duration::ZERO, Some(40));
        restored.admitted("a", 20);
        restored.admitted("b", 30);
        assert_eq!(
            restored.candidate(),
            Some(40),
            "never behind the restored value"
        );
    }
}
