//! `weir:operator/timers`: keyed timers, scoped to the key of the record (or fired timer) a call
//! names, and the call's view of time.
//!
//! A timer is two state entries in the shard's reserved key space ([`crate::time::keys`]): its
//! per-key entry (domain and time) and its time-index entry. `set` and `clear` stage both like
//! state writes, so they apply only if the record's disposition is `ok` and are checkpointed
//! with the state; the worker follows the applied writes to know the next due timers.

use crate::runtime::batch::{ENTRY_OVERHEAD_BYTES, Staged};
use crate::runtime::bindings::weir::operator::timers::{Host, TimerError};
use crate::runtime::host::HostCtx;
use crate::runtime::{StagedBytesExceeded, TimeDomain};
use crate::state::Shard;
use crate::time::keys;
use bytes::Bytes;

/// Longest timer name, bytes.
pub const TIMER_NAME_BYTES_MAX: usize = 128;

type ImportResult<T> = wasmtime::Result<Result<T, TimerError>>;

impl<S: Shard> HostCtx<S> {
    /// The key of `record` and the per-key entry of its timer `name`, or the guest's error.
    fn timer_of(&self, record: u32, name: &str) -> Result<(Vec<u8>, Vec<u8>), TimerError> {
        if name.is_empty() || name.len() > TIMER_NAME_BYTES_MAX {
            return Err(TimerError::InvalidName(name.to_owned()));
        }
        let record_key = self
            .batch
            .record_key(record)
            .ok_or(TimerError::InvalidRecord(record))?
            .to_vec();
        let per_key = keys::per_key(&record_key, name);
        Ok((record_key, per_key))
    }

    /// Timer `name`'s domain and time as this call's staged changes leave it.
    async fn timer_get(&mut self, per_key: &[u8]) -> wasmtime::Result<Option<(TimeDomain, i64)>> {
        Ok(self
            .read(per_key)
            .await?
            .and_then(|v| keys::decode_per_key_value(&v)))
    }

    /// Stages one timer entry (`None`: removed) for `record`, within the call's staging budget.
    fn stage_timer_entry(
        &mut self,
        record: u32,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    ) -> wasmtime::Result<()> {
        // Timer entries are 9 bytes or empty: not held to the value limit, only to the staging
        // budget (a trap, as for state writes).
        let staged_max = self
            .meta
            .as_ref()
            .map_or(0, |m| m.limits.batch_staged_bytes_max);
        let size = ENTRY_OVERHEAD_BYTES + (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
        if self.batch.staged_bytes().saturating_add(size) > staged_max {
            return Err(wasmtime::Error::new(StagedBytesExceeded {
                limit: staged_max,
            }));
        }
        let staged = Staged {
            value: value.map(Bytes::from),
            expires_at_ms: None,
        };
        self.batch.stage(record, key, staged);
        Ok(())
    }
}

impl<S: Shard> Host for HostCtx<S> {
    async fn set(
        &mut self,
        record: u32,
        name: String,
        at_ms: i64,
        domain: TimeDomain,
    ) -> ImportResult<()> {
        let (record_key, per_key) = match self.timer_of(record, &name) {
            Ok(found) => found,
            Err(err) => return Ok(Err(err)),
        };
        let moved = match self.timer_get(&per_key).await? {
            Some(old) if old == (domain, at_ms) => return Ok(Ok(())),
            Some((old_domain, old_at)) => {
                let old_index = keys::time_index(old_domain, old_at, &record_key, &name);
                self.stage_timer_entry(record, old_index, None)?;
                true
            }
            None => {
                // A new name: the key's timers, counted up to the limit.
                let limit = self
                    .meta
                    .as_ref()
                    .map_or(1024, |m| m.limits.timers_per_key_max);
                let prefix = keys::per_key_prefix(&record_key);
                let existing = self.merged_scan(&prefix, None, limit as usize).await?;
                if existing.len() >= limit as usize {
                    return Ok(Err(TimerError::TooManyTimers(limit)));
                }
                false
            }
        };
        self.stage_timer_entry(record, per_key, Some(keys::per_key_value(domain, at_ms)))?;
        let index = keys::time_index(domain, at_ms, &record_key, &name);
        self.stage_timer_entry(record, index, Some(Vec::new()))?;
        if !moved {
            self.batch.add_timers(1);
        }
        Ok(Ok(()))
    }

    async fn clear(&mut self, record: u32, name: String) -> ImportResult<()> {
        let (record_key, per_key) = match self.timer_of(record, &name) {
            Ok(found) => found,
            Err(err) => return Ok(Err(err)),
        };
        if let Some((domain, at_ms)) = self.timer_get(&per_key).await? {
            self.stage_timer_entry(record, per_key, None)?;
            let index = keys::time_index(domain, at_ms, &record_key, &name);
            self.stage_timer_entry(record, index, None)?;
            self.batch.add_timers(-1);
        }
        Ok(Ok(()))
    }

    async fn get(&mut self, record: u32, name: String) -> ImportResult<Option<(i64, TimeDomain)>> {
        let (_, per_key) = match self.timer_of(record, &name) {
            Ok(found) => found,
            Err(err) => return Ok(Err(err)),
        };
        Ok(Ok(self
            .timer_get(&per_key)
            .await?
            .map(|(domain, at)| (at, domain))))
    }

    async fn watermark(&mut self) -> wasmtime::Result<Option<i64>> {
        Ok(self.batch.watermark)
    }

    async fn current_processing_time(&mut self) -> wasmtime::Result<i64> {
        let now = i64::try_from(self.clock.now_ms()).unwrap_or(i64::MAX);
        Ok(*self.batch.processing_time_ms.get_or_insert(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SharedClock};
    use crate::state::memory::MemoryBackend;
    use crate::state::{ShardId, StateBackend};
    use std::sync::Arc;

    async fn host(timers_per_key_max: u32) -> HostCtx<crate::state::memory::MemoryShard> {
        let clock: SharedClock = Arc::new(ManualClock::new(7));
        let id = ShardId {
            pipeline: "t".into(),
            partition: crate::ids::Partition(0),
        };
        let shard = MemoryBackend::new(clock.clone())
            .open_shard(&id)
            .await
            .expect("opens");
        crate::runtime::imports::test_host(Arc::new(shard), clock, "m", timers_per_key_max)
    }

    #[tokio::test]
    async fn a_new_name_beyond_the_limit_is_refused_and_moving_one_is_not_and_adds_none() {
        let mut ctx = host(2).await;
        for name in ["a", "b"] {
            let set = ctx.set(0, name.into(), 10, TimeDomain::EventTime).await;
            assert!(matches!(set, Ok(Ok(()))));
        }
        let third = ctx.set(0, "c".into(), 10, TimeDomain::EventTime).await;
        assert!(matches!(third, Ok(Err(TimerError::TooManyTimers(2)))));
        let moved = ctx.set(0, "a".into(), 20, TimeDomain::ProcessingTime).await;
        assert!(matches!(moved, Ok(Ok(()))));
        let cleared = ctx.clear(0, "b".into()).await;
        assert!(matches!(cleared, Ok(Ok(()))));
        let now_room = ctx.set(0, "c".into(), 30, TimeDomain::EventTime).await;
        assert!(matches!(now_room, Ok(Ok(()))));
        let a = ctx.get(0, "a".into()).await.expect("no trap");
        assert!(matches!(a, Ok(Some((20, TimeDomain::ProcessingTime)))));
        let b = ctx.get(0, "b".into()).await.expect("no trap");
        assert!(matches!(b, Ok(None)));
        let absent = ctx.clear(0, "zz".into()).await;
        assert!(matches!(absent, Ok(Ok(()))));
        // a, b and c set, a moved, b cleared, an unset name cleared: a and c were added.
        assert_eq!(ctx.batch.timers_added(), 2);
        // One index entry per timer, at its current time, in index order (event time first):
        // c at 30, a at 20 (processing time).
        let (writes, _) = std::mem::take(&mut ctx.batch).into_effects();
        let live: Vec<(i64, String)> = writes
            .iter()
            .filter(|w| w.value.is_some())
            .filter_map(|w| keys::decode_time_index(&w.key))
            .map(|t| (t.time_ms, t.name))
            .collect();
        assert_eq!(live, [(30, "c".to_owned()), (20, "a".to_owned())]);
    }

    #[tokio::test]
    async fn bad_names_and_indexes_are_the_guests_errors_and_time_is_constant_in_a_call() {
        let mut ctx = host(8).await;
        let empty = ctx.set(0, String::new(), 1, TimeDomain::EventTime).await;
        assert!(matches!(empty, Ok(Err(TimerError::InvalidName(_)))));
        let long = ctx.clear(0, "x".repeat(TIMER_NAME_BYTES_MAX + 1)).await;
        assert!(matches!(long, Ok(Err(TimerError::InvalidName(_)))));
        let outside = ctx.get(1, "t".into()).await;
        assert!(matches!(outside, Ok(Err(TimerError::InvalidRecord(1)))));
        assert_eq!(ctx.watermark().await.expect("no trap"), None);
        assert_eq!(ctx.current_processing_time().await.expect("no trap"), 7);
        ctx.batch.set_time(Some(5), 99);
        assert_eq!(ctx.watermark().await.expect("no trap"), Some(5));
        assert_eq!(ctx.current_processing_time().await.expect("no trap"), 99);
    }
}
