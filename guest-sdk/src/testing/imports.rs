//! The WIT imports' signatures over the [`MemoryHost`] of the current call: what
//! `crate::host` gives `Context` in a native build.

use super::{MemoryHost, with_host};
use crate::context::TimeDomain;
use crate::wit::weir::operator::types::{StateError, TimeDomain as WitTimeDomain};

fn state_slot(
    host: &MemoryHost,
    record: u32,
    name: &str,
    kind: crate::state::StateKind,
) -> Result<super::Slot, StateError> {
    if record != 0 {
        return Err(StateError::InvalidRecord(record));
    }
    match host.kinds.get(name) {
        None => Err(StateError::UnknownState(name.to_owned())),
        Some(k) if *k != kind => Err(StateError::WrongKind(name.to_owned())),
        Some(_) => Ok((host.key.clone(), name.to_owned())),
    }
}

pub(crate) mod state {
    use super::super::{MAP_KEY_BYTES_MAX, MAP_PAGE_MAX, Undo, VALUE_BYTES_MAX};
    use super::{state_slot, with_host};
    use crate::state::StateKind;
    use crate::wit::weir::operator::state::MapPage;
    use crate::wit::weir::operator::types::StateError;

    fn limit(bytes: &[u8], max: u64) -> Result<(), StateError> {
        if bytes.len() as u64 > max {
            Err(StateError::TooLarge(max))
        } else {
            Ok(())
        }
    }

    pub(crate) fn value_get(record: u32, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        with_host(|h| {
            let slot = state_slot(h, record, name, StateKind::Value)?;
            Ok(h.values.get(&slot).cloned())
        })
    }

    pub(crate) fn get_many(
        record: u32,
        names: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        names.iter().map(|n| value_get(record, n)).collect()
    }

    pub(crate) fn value_set(record: u32, name: &str, value: &[u8]) -> Result<(), StateError> {
        with_host(|h| {
            let slot = state_slot(h, record, name, StateKind::Value)?;
            limit(value, VALUE_BYTES_MAX)?;
            let old = h.values.insert(slot.clone(), value.to_vec());
            h.undo.push(Undo::Value(slot, old));
            Ok(())
        })
    }

    pub(crate) fn value_clear(record: u32, name: &str) -> Result<(), StateError> {
        with_host(|h| {
            let slot = state_slot(h, record, name, StateKind::Value)?;
            let old = h.values.remove(&slot);
            h.undo.push(Undo::Value(slot, old));
            Ok(())
        })
    }

    pub(crate) fn map_get(
        record: u32,
        name: &str,
        map_key: &[u8],
    ) -> Result<Option<Vec<u8>>, StateError> {
        with_host(|h| {
            let slot = state_slot(h, record, name, StateKind::Map)?;
            limit(map_key, MAP_KEY_BYTES_MAX)?;
            Ok(h.maps.get(&slot).and_then(|m| m.get(map_key)).cloned())
        })
    }

    pub(crate) fn map_put(
        record: u32,
        name: &str,
        map_key: &[u8],
        value: &[u8],
    ) -> Result<(), StateError> {
        with_host(|h| {
            let slot = state_slot(h, record, name, StateKind::Map)?;
            limit(map_key, MAP_KEY_BYTES_MAX)?;
            limit(value, VALUE_BYTES_MAX)?;
            let old = h
                .maps
                .entry(slot.clone())
                .or_default()
                .insert(map_key.to_vec(), value.to_vec());
            h.undo.push(Undo::Map(slot, map_key.to_vec(), old));
            Ok(())
        })
    }

    pub(crate) fn map_remove(record: u32, name: &str, map_key: &[u8]) -> Result<(), StateError> {
        with_host(|h| {
            let slot = state_slot(h, record, name, StateKind::Map)?;
            limit(map_key, MAP_KEY_BYTES_MAX)?;
            let old = h.maps.get_mut(&slot).and_then(|m| m.remove(map_key));
            if h.maps.get(&slot).is_some_and(|m| m.is_empty()) {
                h.maps.remove(&slot);
            }
            h.undo.push(Undo::Map(slot, map_key.to_vec(), old));
            Ok(())
        })
    }

    pub(crate) fn map_iterate(
        record: u32,
        name: &str,
        start_after: Option<&[u8]>,
        page_size: u32,
    ) -> Result<MapPage, StateError> {
        with_host(|h| {
            let slot = state_slot(h, record, name, StateKind::Map)?;
            let Some(map) = h.maps.get(&slot) else {
                return Ok(MapPage {
                    entries: Vec::new(),
                    next: None,
                });
            };
            let page = page_size.clamp(1, MAP_PAGE_MAX) as usize;
            let mut rest: Box<dyn Iterator<Item = (&Vec<u8>, &Vec<u8>)>> = match start_after {
                None => Box::new(map.iter()),
                Some(after) => Box::new(map.range::<[u8], _>((
                    std::ops::Bound::Excluded(after),
                    std::ops::Bound::Unbounded,
                ))),
            };
            let entries: Vec<(Vec<u8>, Vec<u8>)> = rest
                .by_ref()
                .take(page)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let next = match rest.next() {
                Some(_) => entries.last().map(|(k, _)| k.clone()),
                None => None,
            };
            Ok(MapPage { entries, next })
        })
    }
}

pub(crate) mod emit {
    use super::super::{EMIT_BYTES_MAX, OUTPUT_RECORD_BYTES_MAX, Output};
    use super::with_host;
    use crate::wit::weir::operator::emit::EmitError;
    use crate::wit::weir::operator::types::Header;

    pub(crate) fn emit(
        record: u32,
        key: &[u8],
        value: &[u8],
        headers: &[Header],
    ) -> Result<(), EmitError> {
        emit_to(record, "default", key, value, headers, None)
    }

    pub(crate) fn emit_to(
        record: u32,
        output: &str,
        key: &[u8],
        value: &[u8],
        headers: &[Header],
        timestamp_ms: Option<i64>,
    ) -> Result<(), EmitError> {
        with_host(|h| {
            if record != 0 {
                return Err(EmitError::InvalidRecord(record));
            }
            if output != "default" && !h.outputs.iter().any(|o| o == output) {
                return Err(EmitError::UnknownOutput(output.to_owned()));
            }
            let wire = 97
                + key.len()
                + value.len()
                + headers
                    .iter()
                    .map(|x| 10 + x.name.len() + x.value.len())
                    .sum::<usize>();
            if wire as u64 > OUTPUT_RECORD_BYTES_MAX {
                return Err(EmitError::TooLarge(OUTPUT_RECORD_BYTES_MAX));
            }
            let size = 64
                + key.len()
                + value.len()
                + headers
                    .iter()
                    .map(|x| 64 + x.name.len() + x.value.len())
                    .sum::<usize>();
            if h.emitted_bytes + size as u64 > EMIT_BYTES_MAX {
                return Err(EmitError::TooLarge(EMIT_BYTES_MAX));
            }
            h.emitted_bytes += size as u64;
            h.emitted.push(Output {
                output: output.to_owned(),
                key: key.to_vec(),
                value: value.to_vec(),
                headers: headers
                    .iter()
                    .map(|x| (x.name.clone(), x.value.clone()))
                    .collect(),
                timestamp_ms,
            });
            Ok(())
        })
    }
}

pub(crate) mod parameters {
    use super::with_host;

    pub(crate) fn get(name: &str) -> Option<String> {
        with_host(|h| h.parameters.get(name).cloned())
    }

    pub(crate) fn entries() -> Vec<(String, String)> {
        with_host(|h| {
            h.parameters
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
    }
}

pub(crate) mod tables {
    use super::super::MAP_KEY_BYTES_MAX;
    use super::with_host;
    use crate::wit::weir::operator::types::StateError;

    pub(crate) fn get(name: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        if key.len() as u64 > MAP_KEY_BYTES_MAX {
            return Err(StateError::TooLarge(MAP_KEY_BYTES_MAX));
        }
        with_host(|h| match h.global_tables.get(name) {
            None => Err(StateError::UnknownState(name.to_owned())),
            Some(rows) => Ok(rows.get(key).cloned()),
        })
    }
}

pub(crate) mod log {
    use super::with_host;
    use crate::wit::weir::operator::log::Level;

    pub(crate) fn log(level: Level, message: &str) {
        let level = match level {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        };
        let mut end = message.len().min(4096);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        with_host(|h| h.logs.push((level, message[..end].to_owned())));
    }
}

pub(crate) mod timers {
    use super::super::{TIMER_NAME_BYTES_MAX, TIMERS_PER_KEY_MAX, Undo};
    use super::{TimeDomain, WitTimeDomain, with_host};
    use crate::wit::weir::operator::timers::TimerError;

    fn slot(key: &[u8], record: u32, name: &str) -> Result<super::super::Slot, TimerError> {
        if record != 0 {
            return Err(TimerError::InvalidRecord(record));
        }
        if name.is_empty() || name.len() > TIMER_NAME_BYTES_MAX {
            return Err(TimerError::InvalidName(name.to_owned()));
        }
        Ok((key.to_vec(), name.to_owned()))
    }

    pub(crate) fn set(
        record: u32,
        name: &str,
        at_ms: i64,
        domain: WitTimeDomain,
    ) -> Result<(), TimerError> {
        with_host(|h| {
            let slot = slot(&h.key, record, name)?;
            if !h.timers.contains_key(&slot) {
                let of_key = h.timers.keys().filter(|(k, _)| *k == slot.0).count();
                if of_key >= TIMERS_PER_KEY_MAX as usize {
                    return Err(TimerError::TooManyTimers(TIMERS_PER_KEY_MAX));
                }
            }
            let domain = match domain {
                WitTimeDomain::EventTime => TimeDomain::EventTime,
                WitTimeDomain::ProcessingTime => TimeDomain::ProcessingTime,
            };
            let old = h.timers.insert(slot.clone(), (at_ms, domain));
            h.undo.push(Undo::Timer(slot, old));
            Ok(())
        })
    }

    pub(crate) fn clear(record: u32, name: &str) -> Result<(), TimerError> {
        with_host(|h| {
            let slot = slot(&h.key, record, name)?;
            let old = h.timers.remove(&slot);
            h.undo.push(Undo::Timer(slot, old));
            Ok(())
        })
    }

    pub(crate) fn get(record: u32, name: &str) -> Result<Option<(i64, WitTimeDomain)>, TimerError> {
        with_host(|h| {
            let slot = slot(&h.key, record, name)?;
            Ok(h.timers.get(&slot).map(|(at, d)| (*at, d.to_wit())))
        })
    }

    pub(crate) fn watermark() -> Option<i64> {
        with_host(|h| h.watermark_ms)
    }

    pub(crate) fn current_processing_time() -> i64 {
        with_host(|h| h.now_ms)
    }
}
