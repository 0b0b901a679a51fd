//! `weir:operator/tables`: the stage's global tables (docs/topologies.md, "Global tables"), read
//! by any key from memory; never suspends.

use crate::runtime::bindings::weir::operator::tables::Host;
use crate::runtime::bindings::weir::operator::types::StateError as WitStateError;
use crate::runtime::host::HostCtx;
use crate::state::Shard;

impl<S: Shard> Host for HostCtx<S> {
    async fn get(
        &mut self,
        name: String,
        key: Vec<u8>,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, WitStateError>> {
        let key_max = self
            .meta
            .as_ref()
            .map_or(u64::MAX, |m| m.limits.state_map_key_bytes_max);
        if key.len() as u64 > key_max {
            return Ok(Err(WitStateError::TooLarge(key_max)));
        }
        let Some(table) = self.batch.call.global_tables.get(&name) else {
            return Ok(Err(WitStateError::UnknownState(name)));
        };
        Ok(Ok(table.get(&key).map(|v| v.to_vec())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SharedClock};
    use crate::runtime::CallSettings;
    use crate::runtime::imports::test_host;
    use crate::state::global_table::GlobalTable;
    use crate::state::memory::MemoryBackend;
    use crate::state::{ShardId, StateBackend};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_lookup_reads_any_key_of_a_global_table_and_names_an_unknown_one() {
        let clock: SharedClock = Arc::new(ManualClock::new(0));
        let backend = MemoryBackend::new(clock.clone());
        let id = ShardId {
            pipeline: "t".into(),
            partition: crate::ids::Partition(0),
        };
        let shard = Arc::new(backend.open_shard(&id).await.expect("opens"));
        let mut ctx = test_host(shard, clock, "m", 8);
        let planes = Arc::new(GlobalTable::default());
        planes.apply(&[crate::runtime::InputRecord {
            key: b"N101".to_vec(),
            value: b"boeing".to_vec(),
            timestamp_ms: 0,
            headers: Vec::new(),
            topic: "planes".into(),
            partition: 3,
            offset: 0,
            input: 0,
        }]);
        ctx.batch.call = Arc::new(CallSettings {
            global_tables: Arc::new([("planes".to_owned(), planes)].into()),
            ..(*ctx.batch.call).clone()
        });
        let found = ctx
            .get("planes".into(), b"N101".to_vec())
            .await
            .expect("no trap");
        assert_eq!(
            found,
            Ok(Some(b"boeing".to_vec())),
            "a key not the record's"
        );
        let missing = ctx
            .get("planes".into(), b"N999".to_vec())
            .await
            .expect("no trap");
        assert_eq!(missing, Ok(None));
        let unknown = ctx
            .get("engines".into(), b"N101".to_vec())
            .await
            .expect("no trap");
        assert_eq!(unknown, Err(WitStateError::UnknownState("engines".into())));
        let long = ctx
            .get("planes".into(), vec![0; 5000])
            .await
            .expect("no trap");
        assert_eq!(long, Err(WitStateError::TooLarge(4 << 10)));
    }
}

#[cfg(test)]
mod import_tests {
    /// The names of the component `name`'s imports.
    fn imports(engine: &wasmtime::Engine, name: &str) -> Vec<String> {
        let component =
            wasmtime::component::Component::from_file(engine, crate::testing::guest(name))
                .expect("compiles");
        component
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_owned())
            .collect()
    }

    /// docs/wasm-runtime.md: `tables` was added within 0.3.0, so a Rust operator that does not
    /// look anything up must not import it (and keeps running on 0.3 hosts without it).
    #[test]
    fn a_rust_component_imports_tables_only_when_it_looks_something_up() {
        let engine = wasmtime::Engine::default();
        let counter = imports(&engine, "weir_test_counter");
        assert!(
            counter
                .iter()
                .all(|n| !n.starts_with("weir:operator/tables")),
            "{counter:?}"
        );
        assert!(counter.contains(&"weir:operator/state@0.3.0".to_owned()));
        let join = imports(&engine, "weir_test_join");
        assert!(
            join.contains(&"weir:operator/tables@0.3.0".to_owned()),
            "{join:?}"
        );
    }
}
