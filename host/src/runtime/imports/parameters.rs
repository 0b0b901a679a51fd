//! `weir:operator/parameters`: the stage's parameters, constant for the run.

use crate::runtime::bindings::weir::operator::parameters::Host;
use crate::runtime::host::HostCtx;
use crate::state::Shard;

impl<S: Shard> Host for HostCtx<S> {
    async fn get(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        Ok(self.batch.call.parameters.get(&name).cloned())
    }

    async fn entries(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        Ok(self
            .batch
            .call
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
