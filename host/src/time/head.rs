//! [`TimerHead`]: the next timers due of one shard, in memory, so that deciding whether a timer
//! is due never scans the store.
//!
//! Per domain it holds the first entries of the time index (encoded keys, so in firing order)
//! up to a *horizon*: every stored timer at or before the horizon is in the head; beyond it,
//! only the store knows. Writes the worker applies keep it exact (an index entry set at or
//! before the horizon joins, a removed one leaves); when the head has run empty below a horizon
//! it is refilled by one bounded scan from there, and when writes have grown it past twice its
//! size the latest entries are let go and the horizon moves back.

use super::keys::{StoredTimer, decode_time_index, domain_prefix};
use crate::runtime::TimeDomain;
use crate::state::{Shard, StateError, StateWrite};
use std::collections::BTreeSet;

/// Entries loaded per domain by one scan, and half the most held.
const HEAD_ENTRIES: usize = 1024;

/// The head of one domain's time index.
#[derive(Debug, Default)]
struct DomainHead {
    entries: BTreeSet<Vec<u8>>,
    /// `None`: every stored entry of the domain is in `entries`. `Some(k)`: those up to `k`.
    horizon: Option<Vec<u8>>,
    /// Loaded at least once.
    loaded: bool,
}

impl DomainHead {
    fn covers(&self, key: &[u8]) -> bool {
        self.horizon.as_deref().is_none_or(|h| key <= h)
    }

    fn needs_load(&self) -> bool {
        !self.loaded || (self.entries.is_empty() && self.horizon.is_some())
    }

    fn trim(&mut self) {
        while self.entries.len() > HEAD_ENTRIES {
            self.entries.pop_last();
        }
        self.horizon = self.entries.last().cloned();
    }
}

/// The next due timers of a shard, per domain. See the module docs.
#[derive(Debug, Default)]
pub struct TimerHead {
    event: DomainHead,
    processing: DomainHead,
}

impl TimerHead {
    fn domain(&self, domain: TimeDomain) -> &DomainHead {
        match domain {
            TimeDomain::EventTime => &self.event,
            TimeDomain::ProcessingTime => &self.processing,
        }
    }

    fn domain_mut(&mut self, domain: TimeDomain) -> &mut DomainHead {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Loads what a domain's head lacks from `shard`: the first entries after the horizon when
    /// the head ran empty below one, or from the start when never loaded.
    ///
    /// # Errors
    /// [`StateError`] from the scan; the head is unchanged.
    pub async fn load<S: Shard>(&mut self, shard: &S) -> Result<(), StateError> {
        for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
            let head = self.domain(domain);
            if !head.needs_load() {
                continue;
            }
            let after = head.horizon.clone();
            let scanned = shard
                .scan(&domain_prefix(domain), after.as_deref(), HEAD_ENTRIES)
                .await?;
            let head = self.domain_mut(domain);
            head.loaded = true;
            head.horizon = if scanned.len() < HEAD_ENTRIES {
                None
            } else {
                scanned.last().map(|(k, _)| k.clone())
            };
            head.entries.extend(scanned.into_iter().map(|(k, _)| k));
        }
        Ok(())
    }

    /// Whether a domain must be loaded before its head can be trusted.
    pub fn needs_load(&self) -> bool {
        self.event.needs_load() || self.processing.needs_load()
    }

    /// Follows writes the worker applied to the shard: time-index entries set or removed.
    pub fn applied(&mut self, writes: &[StateWrite]) {
        for write in writes {
            let Some(timer) = decode_time_index(&write.key) else {
                continue;
            };
            let head = self.domain_mut(timer.domain);
            if write.value.is_none() {
                head.entries.remove(&write.key);
            } else if head.covers(&write.key) {
                head.entries.insert(write.key.clone());
                if head.entries.len() > 2 * HEAD_ENTRIES {
                    head.trim();
                }
            }
        }
    }

    /// The time of the first timer of `domain`, if the head has one.
    pub fn next(&self, domain: TimeDomain) -> Option<i64> {
        self.domain(domain)
            .entries
            .first()
            .and_then(|k| decode_time_index(k))
            .map(|t| t.time_ms)
    }

    /// Up to `limit` timers of `domain` due at `now` (time ≤ `now`), in firing order. They stay
    /// in the head until the writes that remove them are [`Self::applied`].
    pub fn due(&self, domain: TimeDomain, now: i64, limit: usize) -> Vec<StoredTimer> {
        self.domain(domain)
            .entries
            .iter()
            .map_while(|k| decode_time_index(k).filter(|t| t.time_ms <= now))
            .take(limit)
            .collect()
    }

    /// Takes the timer at time-index entry `key` of `domain` (one [`Self::due`] gave) out of
    /// the head while it fires beside records (its stored entries stay until the writes that
    /// remove them are applied), so that it is neither due nor fired again meanwhile. The
    /// caller must not [`Self::load`] while a taken timer is still stored: a refill may read it
    /// back (records beside it can trim the head and move its horizon below it). The worker
    /// loads only with nothing in flight.
    pub fn take(&mut self, domain: TimeDomain, key: &[u8]) {
        self.domain_mut(domain).entries.remove(key);
    }

    /// Timers in the head, both domains (a lower bound of those pending when a horizon is set).
    pub fn len(&self) -> usize {
        self.event.entries.len() + self.processing.entries.len()
    }

    /// Whether the head holds no timer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::memory::MemoryBackend;
    use crate::state::{ShardId, StateBackend};
    use crate::time::keys::time_index;
    use bytes::Bytes;

    fn set(time: i64, key: &[u8]) -> StateWrite {
        StateWrite {
            key: time_index(TimeDomain::EventTime, time, key, "t"),
            value: Some(Bytes::new()),
            expires_at_ms: None,
        }
    }

    /// A head that let its latest entries go still fires every stored timer, in time order,
    /// refilling from the store as it runs empty.
    #[tokio::test]
    async fn a_trimmed_head_refills_from_the_store_in_time_order() {
        let backend = MemoryBackend::new(std::sync::Arc::new(crate::clock::ManualClock::new(0)));
        let shard = backend
            .open_shard(&ShardId {
                pipeline: "p".into(),
                partition: crate::ids::Partition(0),
            })
            .await
            .expect("open");
        let mut head = TimerHead::default();
        head.load(&shard).await.expect("load");
        let total = 3 * HEAD_ENTRIES as i64;
        // Latest first, so that trimming drops entries the store keeps.
        let writes: Vec<StateWrite> = (0..total).rev().map(|t| set(t, b"k")).collect();
        shard.apply(writes.clone()).await.expect("apply");
        head.applied(&writes);
        assert!(head.len() <= 2 * HEAD_ENTRIES, "the head stays bounded");
        let mut fired = Vec::new();
        loop {
            head.load(&shard).await.expect("load");
            let due = head.due(TimeDomain::EventTime, i64::MAX, 500);
            if due.is_empty() {
                break;
            }
            let removals: Vec<StateWrite> = due
                .iter()
                .map(|t| StateWrite {
                    key: time_index(t.domain, t.time_ms, &t.key, &t.name),
                    value: None,
                    expires_at_ms: None,
                })
                .collect();
            shard.apply(removals.clone()).await.expect("apply");
            head.applied(&removals);
            fired.extend(due.iter().map(|t| t.time_ms));
        }
        assert_eq!(fired, (0..total).collect::<Vec<_>>());
        assert!(head.is_empty());
    }
}
