//! Reading what a component is: the newest `weir:operator` world it exports, and its
//! `describe`, read through that world's bindings and checked (names, states, outputs).

use super::bindings::{self, OperatorInfo, OperatorWorld, OperatorWorldPre, StateKind, v0_1, v0_2};
use super::host::{CallLimits, HostCtx, OperatorMeta};
use super::instance::InstanceKind;
use super::{ON_TIMERS, Operator, PROCESS_BATCH, RuntimeError, WorldVersion};
use crate::config::RuntimeSettings;
use crate::state::Shard;
use std::collections::HashMap;
use wasmtime::component::{Component, ComponentExportIndex, InstancePre};

/// The description of a component of an older world as 0.3 says it: no named outputs, and
/// its states at `$version` (a 0.1 state has none: 0).
macro_rules! older_info {
    ($info:expr, $world:ident, |$state:ident| $version:expr) => {{
        use $world::weir::operator::types::StateKind as OlderKind;
        let info = $info;
        OperatorInfo {
            name: info.name,
            version: info.version,
            states: info
                .states
                .into_iter()
                .map(|$state| bindings::StateDescriptor {
                    kind: match $state.kind {
                        OlderKind::Value => StateKind::Value,
                        OlderKind::Map => StateKind::Map,
                    },
                    ttl_ms: $state.ttl_ms,
                    version: $version,
                    name: $state.name,
                })
                .collect(),
            outputs: Vec::new(),
        }
    }};
}

/// The newest operator world `component` exports (the generated `…Pre` checks its exports'
/// types, against `instance_pre`), and the indexes of its `process-batch` and `on-timers`
/// (0.2 and later).
///
/// # Errors
/// [`RuntimeError::WrongWorld`] for a component of another world.
pub(super) fn world_exports<S: Shard>(
    component: &Component,
    instance_pre: &InstancePre<HostCtx<S>>,
) -> Result<
    (
        WorldVersion,
        ComponentExportIndex,
        Option<ComponentExportIndex>,
    ),
    RuntimeError,
> {
    let wrong = |e: wasmtime::Error| RuntimeError::WrongWorld {
        reason: format!("{e:#}"),
    };
    // The newest world the component exports; the generated `…Pre` checks its exports'
    // types.
    let world = WorldVersion::ALL
        .into_iter()
        .find(|w| {
            component
                .get_export_index(None, w.operator_interface())
                .is_some()
        })
        .ok_or_else(|| RuntimeError::WrongWorld {
            reason: "exports no `weir:operator/operator` of 0.3.0, 0.2.0 or 0.1.0".into(),
        })?;
    match world {
        WorldVersion::V0_3 => drop(OperatorWorldPre::new(instance_pre.clone()).map_err(wrong)?),
        WorldVersion::V0_2 => {
            drop(v0_2::OperatorWorldPre::new(instance_pre.clone()).map_err(wrong)?);
        }
        WorldVersion::V0_1 => {
            drop(v0_1::OperatorWorldPre::new(instance_pre.clone()).map_err(wrong)?);
        }
    }
    let interface = component
        .get_export_index(None, world.operator_interface())
        .expect("found above");
    let export = |name: &str| {
        component
            .get_export_index(Some(&interface), name)
            .ok_or_else(|| RuntimeError::WrongWorld {
                reason: format!("no `{name}` in `{}`", world.operator_interface()),
            })
    };
    let process_batch = export(PROCESS_BATCH)?;
    let on_timers = match world {
        WorldVersion::V0_3 | WorldVersion::V0_2 => Some(export(ON_TIMERS)?),
        WorldVersion::V0_1 => None,
    };
    Ok((world, process_batch, on_timers))
}

/// What `operator` (of `world`) describes of itself, from an instance of its own.
///
/// # Errors
/// [`RuntimeError::Instantiate`] when it cannot be instantiated or `describe` traps.
pub(super) async fn describe<S: Shard>(
    operator: &Operator<S>,
    world: WorldVersion,
) -> Result<OperatorInfo, RuntimeError> {
    let probe = operator.instantiate(None, "describe".into()).await?;
    let InstanceKind::Wasm {
        mut store,
        instance,
        ..
    } = probe.kind
    else {
        unreachable!("a Wasm operator makes Wasm instances")
    };
    let info = match world {
        WorldVersion::V0_3 => OperatorWorld::new(&mut store, &instance)
            .map_err(RuntimeError::Instantiate)?
            .weir_operator_operator()
            .call_describe(&mut store)
            .await
            .map_err(RuntimeError::Instantiate)?,
        WorldVersion::V0_2 => older_info!(
            v0_2::OperatorWorld::new(&mut store, &instance)
                .map_err(RuntimeError::Instantiate)?
                .weir_operator_operator()
                .call_describe(&mut store)
                .await
                .map_err(RuntimeError::Instantiate)?,
            v0_2,
            |state| state.version
        ),
        WorldVersion::V0_1 => older_info!(
            v0_1::OperatorWorld::new(&mut store, &instance)
                .map_err(RuntimeError::Instantiate)?
                .weir_operator_operator()
                .call_describe(&mut store)
                .await
                .map_err(RuntimeError::Instantiate)?,
            v0_1,
            |state| 0
        ),
    };
    Ok(info)
}

/// Checks `describe`'s answer and indexes its states.
pub(super) fn check_description(
    info: bindings::OperatorInfo,
    world: WorldVersion,
    settings: &RuntimeSettings,
) -> Result<OperatorMeta, RuntimeError> {
    let invalid = |reason: String| RuntimeError::InvalidDescription { reason };
    if info.name.is_empty() || info.name.len() > 64 {
        return Err(invalid(format!(
            "name must be 1..=64 bytes. name=`{}`",
            info.name
        )));
    }
    if info.version.len() > 64 {
        return Err(invalid("version must be at most 64 bytes".into()));
    }
    let mut states = HashMap::new();
    let mut value_states = Vec::new();
    for state in info.states {
        let name_ok = !state.name.is_empty()
            && state.name.len() <= 64
            && state
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(invalid(format!(
                "state names must be 1..=64 bytes of [a-z0-9_-]. name=`{}`",
                state.name
            )));
        }
        if state.kind == StateKind::Value {
            value_states.push(state.name.clone());
        }
        if let Some(dup) = states.insert(state.name.clone(), state) {
            return Err(invalid(format!(
                "state declared twice. name=`{}`",
                dup.name
            )));
        }
    }
    let outputs = check_outputs(info.outputs).map_err(invalid)?;
    Ok(OperatorMeta {
        name: info.name,
        version: info.version,
        world,
        states,
        value_states,
        outputs,
        limits: CallLimits {
            state_value_bytes_max: settings.state_value_bytes_max,
            state_map_key_bytes_max: settings.state_map_key_bytes_max,
            emit_bytes_per_record_max: settings.emit_bytes_per_record_max,
            batch_staged_bytes_max: settings.batch_staged_bytes_max,
            timers_per_key_max: settings.timers_per_key_max,
        },
    })
}

/// Most named outputs an operator may declare.
pub const OUTPUTS_MAX: usize = 16;

/// The named outputs `describe` declared, checked: at most [`OUTPUTS_MAX`], each a valid name
/// (`crate::topology::valid_name`), none `default`, none twice.
fn check_outputs(outputs: Vec<String>) -> Result<Vec<String>, String> {
    use crate::topology::{DEFAULT_OUTPUT, valid_name};
    if outputs.len() > OUTPUTS_MAX {
        return Err(format!(
            "at most {OUTPUTS_MAX} named outputs. count={}",
            outputs.len()
        ));
    }
    for (i, name) in outputs.iter().enumerate() {
        if !valid_name(name) || name == DEFAULT_OUTPUT {
            return Err(format!(
                "output names must be 1..=64 bytes of [a-z0-9_-], not `{DEFAULT_OUTPUT}`. name=`{name}`"
            ));
        }
        if outputs[..i].contains(name) {
            return Err(format!("output declared twice. name=`{name}`"));
        }
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Declared outputs are valid names, never `default`, never twice, at most
    /// [`OUTPUTS_MAX`]; every problem names the output.
    #[test]
    fn declared_outputs_are_checked_by_name_and_count() {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            check_outputs(names(&["late", "audit-2"])),
            Ok(names(&["late", "audit-2"]))
        );
        for (bad, says) in [
            (names(&["default"]), "not `default`"),
            (names(&["Late"]), "name=`Late`"),
            (names(&["late", "late"]), "declared twice"),
            (names(&[""]), "name=``"),
        ] {
            let err = check_outputs(bad).expect_err("refused");
            assert!(err.contains(says), "{err}");
        }
        let many: Vec<String> = (0..=OUTPUTS_MAX).map(|i| format!("o{i}")).collect();
        assert!(
            check_outputs(many)
                .expect_err("too many")
                .contains("at most 16")
        );
    }
}
