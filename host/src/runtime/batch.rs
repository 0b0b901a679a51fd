//! The staging area of one guest call: the batch's records, prefetched state, staged writes and
//! staged emits.
//!
//! Invariant: nothing here reaches the shard or the output until the call has succeeded; a
//! trapped call's `BatchCtx` is dropped whole. Reads see, in order: this batch's staged writes
//! (so record 7 sees what record 3 of the same key wrote), then prefetched values, then the
//! shard.

use super::bindings::{FiredTimer, Header, InputRecord};
use crate::state::{QuotaReservation, StateWrite};
use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// A staged write: the value (or tombstone) and its expiry.
#[derive(Debug, Clone)]
pub(crate) struct Staged {
    pub value: Option<Bytes>,
    pub expires_at_ms: Option<u64>,
}

/// An emit waiting for its record's call to succeed.
#[derive(Debug)]
pub struct StagedEmit {
    /// Index of the input record in the batch it was emitted for.
    pub record: u32,
    /// The output it goes to: 0 for `default`, `i + 1` for the operator's declared
    /// `outputs[i]` ([`super::OperatorMeta::output_index`]).
    pub output: u16,
    /// Its timestamp, ms since the Unix epoch, when the operator set one (`emit-to`); `None`:
    /// the input record's.
    pub timestamp_ms: Option<i64>,
    /// Output key; empty means a null key.
    pub key: Vec<u8>,
    /// Output value.
    pub value: Vec<u8>,
    /// Output headers.
    pub headers: Vec<Header>,
}

/// Bytes an emit counts against the per-record and per-call limits.
pub(crate) fn emit_size(key: &[u8], value: &[u8], headers: &[Header]) -> u64 {
    ENTRY_OVERHEAD_BYTES
        + key.len() as u64
        + value.len() as u64
        + headers
            .iter()
            .map(|h| ENTRY_OVERHEAD_BYTES + (h.name.len() + h.value.len()) as u64)
            .sum::<u64>()
}

/// Staging area of one call. See the module docs.
#[derive(Debug)]
pub struct BatchCtx {
    /// The records of a `process-batch` call (empty for an `on-timers` call).
    pub(crate) records: Arc<Vec<InputRecord>>,
    /// The fired timers of an `on-timers` call (empty for a `process-batch` call).
    pub(crate) timers: Arc<Vec<FiredTimer>>,
    /// The shard's applied event-time watermark, as `timers.watermark` returns it.
    pub(crate) watermark: Option<i64>,
    /// The host's clock at the call's start, as `timers.current-processing-time` returns it;
    /// `None` until the caller sets it (imports then read the clock once and keep it).
    pub(crate) processing_time_ms: Option<i64>,
    prefetched: HashMap<Vec<u8>, Option<Bytes>>,
    overlay: BTreeMap<Vec<u8>, Staged>,
    /// Per record: whether it staged any write or emit.
    touched: Vec<bool>,
    /// Per record: bytes emitted so far.
    pub(crate) emitted_bytes: Vec<u64>,
    emits: Vec<StagedEmit>,
    /// Bytes staged so far (writes and emits, with [`ENTRY_OVERHEAD_BYTES`] each).
    staged_bytes: u64,
    /// What the run gives every call: the largest record the output topics take (a larger
    /// emit is refused as too large), the table every emit to the default output must be a
    /// row of (docs/iceberg.md, "Schema"), the parameters.
    pub(crate) call: Arc<CallSettings>,
    /// Timers the call's `timers` imports added to the shard: +1 per new timer set, −1 per
    /// timer cleared (a move adds none), as the staged changes leave them.
    timers_added: i64,
    /// What the call's staged writes reserved in a shard's quota ([`Self::hold_quota`]).
    quota: Option<QuotaReservation>,
    /// One past the highest record (or timer) index an import named ([`Self::reached`]).
    reached: std::sync::atomic::AtomicU32,
}

/// What a pipeline run gives each call besides its records: what the output takes of an emit
/// (the pipeline's sink says: [`crate::pipeline::ports::ShardSink`]) and the stage's
/// parameters.
#[derive(Debug, Clone)]
pub struct CallSettings {
    /// The largest record the output topics take, as [`record_bytes`](super::record_size::record_bytes)
    /// counts it.
    pub record_bytes_max: u64,
    /// The table every emit to the default output must be a row of, if any.
    pub table: Option<Arc<crate::row::RowSchema>>,
    /// The parameters `weir:operator/parameters` serves.
    pub parameters: Parameters,
    /// The global tables `weir:operator/tables` serves, by name.
    pub global_tables: GlobalTables,
}

/// The settings of a call outside a pipeline run: no size limit but the host's, no table, no
/// parameters.
static UNLIMITED: std::sync::LazyLock<Arc<CallSettings>> = std::sync::LazyLock::new(|| {
    Arc::new(CallSettings {
        record_bytes_max: u64::MAX,
        table: None,
        parameters: Parameters::default(),
        global_tables: GlobalTables::default(),
    })
});

/// A stage's parameters (`pipeline.parameters`, a stage's `parameters`): name → value, shared
/// by every call of the run.
pub type Parameters = Arc<BTreeMap<String, String>>;

/// A stage's global tables (docs/topologies.md, "Global tables"): name → the table on this
/// host, shared by every call of the run.
pub type GlobalTables = Arc<BTreeMap<String, Arc<crate::state::global_table::GlobalTable>>>;

/// Bytes charged per staged write, emit and header on top of its keys and values, so that
/// empty entries are not free.
pub const ENTRY_OVERHEAD_BYTES: u64 = 64;

impl Default for BatchCtx {
    fn default() -> Self {
        Self::new(Arc::new(Vec::new()))
    }
}

impl BatchCtx {
    /// An empty staging area for `records`.
    pub fn new(records: Arc<Vec<InputRecord>>) -> Self {
        Self::of(records, Arc::new(Vec::new()))
    }

    /// An empty staging area for an `on-timers` call over `timers`: index `i` acts for the key
    /// of `timers[i]`.
    pub fn for_timers(timers: Arc<Vec<FiredTimer>>) -> Self {
        Self::of(Arc::new(Vec::new()), timers)
    }

    fn of(records: Arc<Vec<InputRecord>>, timers: Arc<Vec<FiredTimer>>) -> Self {
        let n = records.len().max(timers.len());
        Self {
            records,
            timers,
            watermark: None,
            processing_time_ms: None,
            prefetched: HashMap::new(),
            overlay: BTreeMap::new(),
            touched: vec![false; n],
            emitted_bytes: vec![0; n],
            emits: Vec::new(),
            staged_bytes: 0,
            call: UNLIMITED.clone(),
            timers_added: 0,
            quota: None,
            reached: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// How far the guest got: one past the highest record (or timer) index an import named in
    /// this call, 0 if none did. A guest goes through its records in order, so after a trap
    /// the records before `reached - 1` most likely finished: a hint for isolating the
    /// trapping record (`crate::pipeline`'s isolation), never relied on for what is applied.
    pub fn reached(&self) -> u32 {
        self.reached.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// An import named record `index` of this call.
    pub(crate) fn note_reached(&self, index: u32) {
        self.reached.fetch_max(
            index.saturating_add(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Applies the run's settings to this call: the size of emits as the output topics count
    /// it, the table they must be rows of, the parameters.
    pub fn set_call_settings(&mut self, settings: &Arc<CallSettings>) {
        self.call = settings.clone();
    }

    /// Bytes staged so far by this call (see [`ENTRY_OVERHEAD_BYTES`]).
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes
    }

    /// Sets what `timers.watermark` and `timers.current-processing-time` return during the
    /// call.
    pub fn set_time(&mut self, watermark: Option<i64>, processing_time_ms: i64) {
        self.watermark = watermark;
        self.processing_time_ms = Some(processing_time_ms);
    }

    /// The key of record (or fired timer) `index`, or `None` when the index is outside the
    /// call.
    pub(crate) fn record_key(&self, index: u32) -> Option<&[u8]> {
        let i = usize::try_from(index).ok()?;
        let key = if self.timers.is_empty() {
            self.records.get(i).map(|r| r.key.as_slice())
        } else {
            self.timers.get(i).map(|t| t.key.as_slice())
        };
        if key.is_some() {
            self.note_reached(index);
        }
        key
    }

    /// Timers this call's staged changes add to the shard (negative: remove), not counting
    /// the fired timers' own removals ([`Self::stage_removal`]).
    pub fn timers_added(&self) -> i64 {
        self.timers_added
    }

    /// Counts `delta` timers added (a `timers.set` of a new name: 1; a `clear`: -1).
    pub(crate) fn add_timers(&mut self, delta: i64) {
        self.timers_added += delta;
    }

    /// Keeps `reservation` (a staged write's growth, reserved in the shard's quota) with the
    /// call's other reservations until [`Self::take_quota`].
    pub(crate) fn hold_quota(&mut self, reservation: QuotaReservation) {
        match &mut self.quota {
            Some(held) => held.absorb(reservation),
            None => self.quota = Some(reservation),
        }
    }

    /// The call's quota reservations: the caller drops them once the call's writes are
    /// applied (what they reserved is then counted as held) or dropped.
    pub fn take_quota(&mut self) -> Option<QuotaReservation> {
        self.quota.take()
    }

    /// Records prefetched values of `keys`.
    pub fn add_prefetched(&mut self, keys: Vec<Vec<u8>>, values: Vec<Option<Bytes>>) {
        debug_assert_eq!(keys.len(), values.len());
        self.prefetched.extend(keys.into_iter().zip(values));
    }

    /// The prefetched values (the shard's, before the call), taken out: what a failed call
    /// read can serve the calls that isolate its records ([`crate::pipeline`]'s).
    pub fn take_prefetched(&mut self) -> HashMap<Vec<u8>, Option<Bytes>> {
        std::mem::take(&mut self.prefetched)
    }

    /// The value of `key` as this batch sees it without asking the shard: `Some(staged or
    /// prefetched value)`, or `None` when only the shard knows.
    pub(crate) fn local_get(&self, key: &[u8]) -> Option<Option<Bytes>> {
        if let Some(staged) = self.overlay.get(key) {
            return Some(staged.value.clone());
        }
        self.prefetched.get(key).cloned()
    }

    /// Stages the removal of `key` on the host's behalf (a fired timer's entries, before its
    /// `on-timers` call): not counted as the call's effect, and overwritten by whatever the
    /// call stages under the same key.
    pub fn stage_removal(&mut self, key: Vec<u8>) {
        self.overlay.insert(
            key,
            Staged {
                value: None,
                expires_at_ms: None,
            },
        );
    }

    /// Stages a write for record `index`.
    pub(crate) fn stage(&mut self, index: u32, key: Vec<u8>, staged: Staged) {
        self.touch(index);
        self.staged_bytes += ENTRY_OVERHEAD_BYTES
            + key.len() as u64
            + staged.value.as_ref().map_or(0, |v| v.len() as u64);
        self.overlay.insert(key, staged);
    }

    /// Stages an emit for record `index`.
    pub(crate) fn stage_emit(&mut self, emit: StagedEmit) {
        self.touch(emit.record);
        self.staged_bytes += emit_size(&emit.key, &emit.value, &emit.headers);
        self.emits.push(emit);
    }

    fn touch(&mut self, index: u32) {
        if let Some(t) = usize::try_from(index)
            .ok()
            .and_then(|i| self.touched.get_mut(i))
        {
            *t = true;
        }
    }

    /// Whether record `index` staged any write or emit.
    pub fn touched(&self, index: usize) -> bool {
        self.touched.get(index).copied().unwrap_or(false)
    }

    /// Staged entries with keys in `(lower, upper]` under `prefix`, tombstones included, in key
    /// order. `upper = None` means to the end of the prefix.
    pub(crate) fn staged_range(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        upper: Option<&[u8]>,
    ) -> Vec<(Vec<u8>, Option<Bytes>)> {
        let lower = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Included(prefix),
        };
        self.overlay
            .range::<[u8], _>((lower, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix) && upper.is_none_or(|u| k.as_slice() <= u))
            .map(|(k, s)| (k.clone(), s.value.clone()))
            .collect()
    }

    /// Consumes the staging area: the shard writes and the emits, in staging order.
    pub fn into_effects(self) -> (Vec<StateWrite>, Vec<StagedEmit>) {
        let writes = self
            .overlay
            .into_iter()
            .map(|(key, s)| StateWrite {
                key,
                value: s.value,
                expires_at_ms: s.expires_at_ms,
            })
            .collect();
        (writes, self.emits)
    }
}
