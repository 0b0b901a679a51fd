//! `weir:operator/state`: keyed value and map state, scoped to the key of the record a call
//! names.
//!
//! Reads look at the batch's staged writes, then the prefetched values, then the shard (which
//! may suspend this instance while it fetches). Writes are staged in the [`BatchCtx`] and reach
//! the shard only after the call succeeds. A shard failure aborts the call with a
//! [`HostAbort`] instead of reaching the guest: an outage is not a record error.
//!
//! [`BatchCtx`]: crate::runtime::batch::BatchCtx

use crate::runtime::batch::{ENTRY_OVERHEAD_BYTES, Staged};
use crate::runtime::bindings::weir::operator::state::{Host, MapPage};
use crate::runtime::bindings::weir::operator::types::{StateError as WitStateError, StateKind};
use crate::runtime::guest_log::GuestLevel;
use crate::runtime::host::{HostCtx, StateLookupError};
use crate::runtime::{HostAbort, StagedBytesExceeded};
use crate::state::{Shard, key};
use bytes::Bytes;

/// Largest page `map-iterate` returns, whatever the guest asks for.
const MAP_PAGE_SIZE_MAX: u32 = 1024;

/// Bytes (keys and values) after which a `map-iterate` page is cut short (it always holds at
/// least one entry); `next` then points at the last entry returned.
const MAP_PAGE_BYTES_MAX: usize = 4 << 20;

type ImportResult<T> = wasmtime::Result<Result<T, WitStateError>>;

impl<S: Shard> HostCtx<S> {
    /// Checks that `name` is a declared state of `kind`, that `record` is in the batch and that
    /// `map_key` (maps only) is within the limit, and returns the encoded state key (for a map
    /// with `map_key = Some(b"")`, the prefix of all its entries) and the state's TTL.
    fn resolve(
        &self,
        record: u32,
        name: &str,
        kind: StateKind,
        map_key: Option<&[u8]>,
    ) -> Result<(Vec<u8>, Option<u64>), WitStateError> {
        let meta = self
            .meta
            .as_ref()
            .ok_or_else(|| WitStateError::UnknownState(name.to_owned()))?;
        let descriptor = meta.state(name, kind).map_err(|e| match e {
            StateLookupError::Unknown => WitStateError::UnknownState(name.to_owned()),
            StateLookupError::WrongKind => WitStateError::WrongKind(name.to_owned()),
        })?;
        let record_key = self
            .batch
            .record_key(record)
            .ok_or(WitStateError::InvalidRecord(record))?;
        let map_key_max = meta.limits.state_map_key_bytes_max;
        let key = match map_key {
            Some(mk) if mk.len() as u64 > map_key_max => {
                return Err(WitStateError::TooLarge(map_key_max));
            }
            Some(mk) => key::map_key(record_key, name, mk),
            None => key::value_key(record_key, name),
        };
        Ok((key, descriptor.ttl_ms))
    }

    /// Stages `value` (or a tombstone) under a resolved key, checking the value size limit
    /// (a guest-visible error) and the call's staging budget (a trap).
    fn stage_value(
        &mut self,
        record: u32,
        (key, ttl): (Vec<u8>, Option<u64>),
        value: Option<Vec<u8>>,
    ) -> ImportResult<()> {
        let (value_max, staged_max) = self.meta.as_ref().map_or((0, 0), |m| {
            (
                m.limits.state_value_bytes_max,
                m.limits.batch_staged_bytes_max,
            )
        });
        if let Some(v) = &value
            && v.len() as u64 > value_max
        {
            return Ok(Err(WitStateError::TooLarge(value_max)));
        }
        let size =
            ENTRY_OVERHEAD_BYTES + key.len() as u64 + value.as_ref().map_or(0, |v| v.len() as u64);
        // A shard with a quota (`memory` state under `state_bytes_max`): this write's growth
        // must fit beside what the shard holds and what calls in flight (this one included)
        // have reserved. The growth of an overwrite is what the new value is longer than the
        // old one (as the call sees it: staged, prefetched, else stored); of a new entry, the
        // whole entry. Deletes always pass.
        if let Some(v) = &value
            && let Some(quota) = self.shard.as_ref().and_then(|s| s.quota())
        {
            let stored = match self.batch.local_get(&key) {
                Some(seen) => seen.map(|old| old.len() as u64),
                None => self.shard.as_ref().and_then(|s| s.stored_value_len(&key)),
            };
            let growth = match stored {
                Some(old) => (v.len() as u64).saturating_sub(old),
                None => size,
            };
            // A write that does not grow the state always fits, even past the quota (lowered,
            // or passed by timers, which are not refused).
            let reserved = if growth == 0 {
                None
            } else {
                Some(quota.try_reserve(growth))
            };
            match reserved {
                None => {}
                Some(Some(reservation)) => self.batch.hold_quota(reservation),
                Some(None) => {
                    self.log.line(
                        GuestLevel::Warn,
                        &format!(
                            "weir: a state write failed its record with too-large: this partition's share of the pipeline's state quota (state_bytes_max) is {} bytes and it holds {}",
                            quota.max_bytes(),
                            quota.used_bytes()
                        ),
                    );
                    return Ok(Err(WitStateError::TooLarge(quota.max_bytes())));
                }
            }
        }
        if self.batch.staged_bytes().saturating_add(size) > staged_max {
            return Err(wasmtime::Error::new(StagedBytesExceeded {
                limit: staged_max,
            }));
        }
        let staged = Staged {
            expires_at_ms: value.as_ref().and(self.expiry(ttl)),
            value: value.map(Bytes::from),
        };
        self.batch.stage(record, key, staged);
        Ok(Ok(()))
    }

    fn expiry(&self, ttl_ms: Option<u64>) -> Option<u64> {
        ttl_ms.map(|ttl| self.clock.now_ms().saturating_add(ttl))
    }

    /// Reads one encoded key through the staging area, prefetch and shard.
    pub(super) async fn read(&mut self, state_key: &[u8]) -> wasmtime::Result<Option<Bytes>> {
        if let Some(local) = self.batch.local_get(state_key) {
            return Ok(local);
        }
        let Some(shard) = self.shard.clone() else {
            return Ok(None);
        };
        self.waiting_on_state = true;
        let value = shard.get(state_key).await;
        self.waiting_on_state = false;
        value.map_err(|e| wasmtime::Error::new(HostAbort::State(e)))
    }

    /// Collects up to `page + 1` live entries under `prefix` after `cursor`, merging the shard's
    /// entries with this batch's staged writes (staged wins; staged tombstones hide entries).
    pub(super) async fn merged_scan(
        &mut self,
        prefix: &[u8],
        mut cursor: Option<Vec<u8>>,
        page: usize,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Bytes)>> {
        let shard = self.shard.clone();
        let mut out: Vec<(Vec<u8>, Bytes)> = Vec::new();
        loop {
            let want = page + 1 - out.len();
            let from_shard = match &shard {
                Some(s) => {
                    self.waiting_on_state = true;
                    let scanned = s.scan(prefix, cursor.as_deref(), want).await;
                    self.waiting_on_state = false;
                    scanned.map_err(|e| wasmtime::Error::new(HostAbort::State(e)))?
                }
                None => Vec::new(),
            };
            let exhausted = from_shard.len() < want;
            let upper = if exhausted {
                None
            } else {
                from_shard.last().map(|(k, _)| k.clone())
            };
            let staged = self
                .batch
                .staged_range(prefix, cursor.as_deref(), upper.as_deref());
            merge_into(&mut out, from_shard, staged);
            if exhausted || out.len() > page {
                return Ok(out);
            }
            cursor = upper;
        }
    }
}

/// Merges two key-ordered runs into `out`: `staged` overrides `shard` on equal keys and a staged
/// `None` (tombstone) drops the entry.
fn merge_into(
    out: &mut Vec<(Vec<u8>, Bytes)>,
    shard: Vec<(Vec<u8>, Bytes)>,
    staged: Vec<(Vec<u8>, Option<Bytes>)>,
) {
    let mut shard = shard.into_iter().peekable();
    let mut staged = staged.into_iter().peekable();
    loop {
        let take_staged = match (shard.peek(), staged.peek()) {
            (None, None) => return,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some((sk, _)), Some((tk, _))) => tk <= sk,
        };
        if take_staged {
            let Some((k, v)) = staged.next() else { return };
            if shard.peek().is_some_and(|(sk, _)| *sk == k) {
                shard.next();
            }
            if let Some(v) = v {
                out.push((k, v));
            }
        } else if let Some(entry) = shard.next() {
            out.push(entry);
        }
    }
}

/// Returns a guest-visible error from an import early.
macro_rules! guest_try {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        }
    };
}

impl<S: Shard> Host for HostCtx<S> {
    async fn value_get(&mut self, record: u32, name: String) -> ImportResult<Option<Vec<u8>>> {
        let (key, _) = guest_try!(self.resolve(record, &name, StateKind::Value, None));
        Ok(Ok(self.read(&key).await?.map(|b| b.to_vec())))
    }

    async fn get_many(
        &mut self,
        record: u32,
        names: Vec<String>,
    ) -> ImportResult<Vec<Option<Vec<u8>>>> {
        let mut keys = Vec::with_capacity(names.len());
        for name in &names {
            keys.push(guest_try!(self.resolve(record, name, StateKind::Value, None)).0);
        }
        let mut values: Vec<Option<Option<Bytes>>> =
            keys.iter().map(|k| self.batch.local_get(k)).collect();
        let missing: Vec<usize> = (0..keys.len()).filter(|i| values[*i].is_none()).collect();
        if let (false, Some(shard)) = (missing.is_empty(), self.shard.clone()) {
            let wanted: Vec<Vec<u8>> = missing.iter().map(|i| keys[*i].clone()).collect();
            self.waiting_on_state = true;
            let fetched = shard.get_many(&wanted).await;
            self.waiting_on_state = false;
            let fetched = fetched.map_err(|e| wasmtime::Error::new(HostAbort::State(e)))?;
            for (i, v) in missing.into_iter().zip(fetched) {
                values[i] = Some(v);
            }
        }
        Ok(Ok(values
            .into_iter()
            .map(|v| v.flatten().map(|b| b.to_vec()))
            .collect()))
    }

    async fn value_set(&mut self, record: u32, name: String, value: Vec<u8>) -> ImportResult<()> {
        let resolved = guest_try!(self.resolve(record, &name, StateKind::Value, None));
        self.stage_value(record, resolved, Some(value))
    }

    async fn value_clear(&mut self, record: u32, name: String) -> ImportResult<()> {
        let resolved = guest_try!(self.resolve(record, &name, StateKind::Value, None));
        self.stage_value(record, resolved, None)
    }

    async fn map_get(
        &mut self,
        record: u32,
        name: String,
        map_key: Vec<u8>,
    ) -> ImportResult<Option<Vec<u8>>> {
        let (key, _) = guest_try!(self.resolve(record, &name, StateKind::Map, Some(&map_key)));
        Ok(Ok(self.read(&key).await?.map(|b| b.to_vec())))
    }

    async fn map_put(
        &mut self,
        record: u32,
        name: String,
        map_key: Vec<u8>,
        value: Vec<u8>,
    ) -> ImportResult<()> {
        let resolved = guest_try!(self.resolve(record, &name, StateKind::Map, Some(&map_key)));
        self.stage_value(record, resolved, Some(value))
    }

    async fn map_remove(
        &mut self,
        record: u32,
        name: String,
        map_key: Vec<u8>,
    ) -> ImportResult<()> {
        let resolved = guest_try!(self.resolve(record, &name, StateKind::Map, Some(&map_key)));
        self.stage_value(record, resolved, None)
    }

    async fn map_iterate(
        &mut self,
        record: u32,
        name: String,
        start_after: Option<Vec<u8>>,
        page_size: u32,
    ) -> ImportResult<MapPage> {
        let (prefix, _) = guest_try!(self.resolve(record, &name, StateKind::Map, Some(b"")));
        let page = page_size.clamp(1, MAP_PAGE_SIZE_MAX) as usize;
        let cursor = start_after.map(|after| {
            let mut k = prefix.clone();
            k.extend_from_slice(&after);
            k
        });
        let mut entries = self.merged_scan(&prefix, cursor, page).await?;
        let mut more = entries.len() > page;
        entries.truncate(page);
        let mut bytes = 0;
        if let Some(cut) = entries.iter().position(|(k, v)| {
            bytes += k.len() + v.len();
            bytes > MAP_PAGE_BYTES_MAX
        }) {
            more |= cut.max(1) < entries.len();
            entries.truncate(cut.max(1));
        }
        let entries: Vec<(Vec<u8>, Vec<u8>)> = entries
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_vec(), v.to_vec()))
            .collect();
        let next = if more {
            entries.last().map(|(k, _)| k.clone())
        } else {
            None
        };
        Ok(Ok(MapPage { entries, next }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn merge_prefers_staged_and_drops_tombstones() {
        let mut out = Vec::new();
        let shard = vec![
            (b"a".to_vec(), b("1")),
            (b"b".to_vec(), b("2")),
            (b"d".to_vec(), b("4")),
        ];
        let staged = vec![
            (b"b".to_vec(), None),
            (b"c".to_vec(), Some(b("3"))),
            (b"d".to_vec(), Some(b("44"))),
        ];
        merge_into(&mut out, shard, staged);
        assert_eq!(
            out,
            vec![
                (b"a".to_vec(), b("1")),
                (b"c".to_vec(), b("3")),
                (b"d".to_vec(), b("44")),
            ]
        );
    }

    /// A shard with a quota: writes that fit are staged, the first that would take the
    /// shard past it fails with `too-large` (the quota), an overwrite that does not grow and a
    /// delete still pass; the call's reservations hold the quota until its writes are applied,
    /// and then the shard counts what they hold.
    #[test]
    fn a_write_past_the_shards_quota_fails_with_too_large_and_deletes_pass() {
        use crate::clock::{ManualClock, SharedClock};
        use crate::state::memory::MemoryBackend;
        use crate::state::{ShardId, StateBackend};
        use std::sync::Arc;
        const QUOTA: u64 = 1_000;
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let backend = MemoryBackend::new(clock.clone()).with_shard_bytes_max(QUOTA);
        let id = ShardId {
            pipeline: "t".into(),
            partition: crate::ids::Partition(0),
        };
        let shard = Arc::new(futures::executor::block_on(backend.open_shard(&id)).expect("opens"));
        let mut ctx = crate::runtime::imports::test_host(shard.clone(), clock.clone(), "m", 1024);
        let entry = ENTRY_OVERHEAD_BYTES + key::map_key(b"k", "m", b"0").len() as u64 + 100;
        let fit = QUOTA / entry;
        futures::executor::block_on(async {
            for i in 0..fit {
                let put = ctx.map_put(0, "m".into(), i.to_string().into_bytes(), vec![7; 100]);
                assert!(matches!(put.await, Ok(Ok(()))), "write {i} fits");
            }
            let over = ctx
                .map_put(0, "m".into(), b"x".to_vec(), vec![7; 100])
                .await;
            assert!(
                matches!(over, Ok(Err(WitStateError::TooLarge(QUOTA)))),
                "{over:?}"
            );
            let same = ctx
                .map_put(0, "m".into(), b"1".to_vec(), vec![8; 100])
                .await;
            assert!(
                matches!(same, Ok(Ok(()))),
                "an overwrite of a seen value that does not grow fits: {same:?}"
            );
            let delete = ctx.map_remove(0, "m".into(), b"0".to_vec()).await;
            assert!(matches!(delete, Ok(Ok(()))));
        });
        let quota = shard.quota().expect("a quota");
        assert_eq!(quota.used_bytes(), 0, "nothing applied yet");
        assert!(
            quota.try_reserve(QUOTA - fit * entry + 1).is_none(),
            "the call's reservations hold the quota"
        );
        let mut batch = std::mem::replace(
            &mut ctx.batch,
            crate::runtime::batch::BatchCtx::new(Arc::new(Vec::new())),
        );
        let held = batch.take_quota();
        let (writes, _) = batch.into_effects();
        futures::executor::block_on(shard.apply(writes)).expect("applies");
        drop(held);
        assert_eq!(
            quota.used_bytes(),
            (fit - 1) * entry,
            "every write but the deleted one"
        );
        assert!(quota.try_reserve(QUOTA - (fit - 1) * entry).is_some());
        assert!(quota.try_reserve(QUOTA - (fit - 1) * entry + 1).is_none());

        // A later call overwrites stored entries it never read: an equal value fits however
        // full the shard is; one that grows past the quota does not.
        let mut later = crate::runtime::imports::test_host(shard.clone(), clock, "m", 1024);
        let _full = quota.try_reserve(QUOTA - (fit - 1) * entry);
        futures::executor::block_on(async {
            let same = later
                .map_put(0, "m".into(), b"1".to_vec(), vec![9; 100])
                .await;
            assert!(matches!(same, Ok(Ok(()))), "{same:?}");
            let grows = later
                .map_put(0, "m".into(), b"2".to_vec(), vec![9; 101])
                .await;
            assert!(
                matches!(grows, Ok(Err(WitStateError::TooLarge(QUOTA)))),
                "{grows:?}"
            );
        });
    }

    mod paging {
        use super::super::*;
        use crate::clock::{ManualClock, SharedClock};
        use crate::state::memory::{MemoryBackend, MemoryShard};
        use crate::state::{ShardId, StateBackend, StateWrite};
        use proptest::prelude::*;
        use std::collections::BTreeMap;
        use std::sync::Arc;

        const MAP: &str = "m";

        fn host(shard: Arc<MemoryShard>, clock: SharedClock) -> HostCtx<MemoryShard> {
            crate::runtime::imports::test_host(shard, clock, MAP, 1024)
        }

        proptest! {
            /// Paging a map with `map-iterate` at any page size returns exactly the entries of a
            /// `BTreeMap` model of stored entries overlaid with this call's staged puts and
            /// removes, in order, each once, and ends with `next = none`.
            #[test]
            fn map_iterate_pages_agree_with_a_model(
                stored in proptest::collection::btree_map(0u8..16, 0u8..255, 0..12),
                staged in proptest::collection::vec((0u8..16, proptest::option::of(0u8..255)), 0..12),
                page_size in 1u32..5,
            ) {
                let clock: SharedClock = Arc::new(ManualClock::new(0));
                let backend = MemoryBackend::new(clock.clone());
                let id = ShardId { pipeline: "t".into(), partition: crate::ids::Partition(0) };
                let shard = Arc::new(futures::executor::block_on(backend.open_shard(&id)).expect("opens"));
                let writes = stored.iter().map(|(k, v)| StateWrite {
                    key: crate::state::key::map_key(b"k", MAP, &[*k]),
                    value: Some(Bytes::from(vec![*v])),
                    expires_at_ms: None,
                }).collect();
                futures::executor::block_on(shard.apply(writes)).expect("applies");
                let mut model: BTreeMap<Vec<u8>, Vec<u8>> =
                    stored.iter().map(|(k, v)| (vec![*k], vec![*v])).collect();
                let mut ctx = host(shard, clock);
                let pages = futures::executor::block_on(async {
                    for (k, v) in &staged {
                        let r = match v {
                            Some(v) => ctx.map_put(0, MAP.into(), vec![*k], vec![*v]).await,
                            None => ctx.map_remove(0, MAP.into(), vec![*k]).await,
                        };
                        assert!(matches!(r, Ok(Ok(()))));
                    }
                    let mut seen = Vec::new();
                    let mut cursor = None;
                    loop {
                        let page = ctx.map_iterate(0, MAP.into(), cursor.clone(), page_size).await;
                        let Ok(Ok(page)) = page else { panic!("map-iterate failed") };
                        assert!(page.entries.len() <= page_size as usize);
                        seen.extend(page.entries);
                        match page.next {
                            Some(next) => cursor = Some(next),
                            None => return seen,
                        }
                    }
                });
                for (k, v) in &staged {
                    match v {
                        Some(v) => { model.insert(vec![*k], vec![*v]); }
                        None => { model.remove(&vec![*k]); }
                    }
                }
                let want: Vec<(Vec<u8>, Vec<u8>)> = model.into_iter().collect();
                prop_assert_eq!(pages, want);
            }
        }
    }
}
