//! `weir serve`'s config file, with the environment's settings over it.

use crate::config::{ConfigError, EnvVars, RuntimeSettings};
use crate::runner;
use serde::Deserialize;
use std::time::Duration;

/// The config file of `weir serve` (TOML; see deploy/config/serve.toml). The admin key is not
/// in it: `weir serve` reads it from the `WEIR_ADMIN_KEY` environment variable.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSettings {
    /// `host:port` to listen on.
    pub listen: String,
    /// The object store holding the catalog (and, later, pipelines): `file:///absolute/dir`,
    /// `s3://bucket/prefix` or `memory:///`.
    pub store_url: String,
    /// `object_store` options for the URL's scheme (as `state.lsm.options`); for an `s3://`
    /// URL the standard `AWS_*` variables fill in the rest.
    #[serde(default, deserialize_with = "crate::config::string_map")]
    pub store_options: std::collections::BTreeMap<String, String>,
    /// Largest operator component accepted, bytes; default 32 MiB.
    #[serde(default = "default_operator_bytes_max")]
    pub operator_bytes_max: usize,
    /// Limits operators are checked and run with: each pipeline's defaults and the most it
    /// may ask for.
    #[serde(default)]
    pub runtime: RuntimeSettings,
    /// Most pipelines one tenant may have; default 16.
    #[serde(default = "default_pipelines_per_tenant_max")]
    pub pipelines_per_tenant_max: usize,
    /// Most keyed state one pipeline on the `memory` backend may hold, bytes (it lives in the
    /// RAM of the hosts that run it): each such pipeline's default `state_bytes_max` and the
    /// most it may ask for; default 1 GiB.
    #[serde(default = "default_pipeline_state_bytes_max")]
    pub pipeline_state_bytes_max: u64,
    /// How often the status page samples every pipeline's status for its charts; default 5 s.
    #[serde(default = "default_status_sample_interval", with = "humantime_serde")]
    pub status_sample_interval: Duration,
    /// Run pipelines on this host (Kafka, state caches); without it the host serves the API
    /// only.
    #[serde(default)]
    pub pipelines: Option<runner::RunnerConfig>,
}

fn default_status_sample_interval() -> Duration {
    Duration::from_secs(5)
}

fn default_pipelines_per_tenant_max() -> usize {
    16
}

/// Default of [`ServeSettings::pipeline_state_bytes_max`], bytes.
pub const DEFAULT_PIPELINE_STATE_BYTES_MAX: u64 = 1 << 30;

fn default_pipeline_state_bytes_max() -> u64 {
    DEFAULT_PIPELINE_STATE_BYTES_MAX
}

fn default_operator_bytes_max() -> usize {
    32 << 20
}

/// The top-level fields of [`ServeSettings`]: the settings environment variables may set
/// (`WEIR_LISTEN`, `WEIR_STORE_URL`, `WEIR_PIPELINES__BOOTSTRAP_SERVERS`, …; [`crate::config::env`]).
const SERVE_SECTIONS: &[&str] = &[
    "listen",
    "store_url",
    "store_options",
    "operator_bytes_max",
    "runtime",
    "pipelines_per_tenant_max",
    "pipeline_state_bytes_max",
    "status_sample_interval",
    "pipelines",
];

impl ServeSettings {
    /// Reads `weir serve`'s config file with the settings variables of `env` over it, reads
    /// the secrets files it names, fills `store_options` in from `env`'s `AWS_*` variables
    /// ([`crate::config::store_options_with_env`]), and checks the Kafka settings.
    ///
    /// # Errors
    /// [`ConfigError`]: an unreadable file, one that does not parse, or a broken rule.
    pub fn load(path: &std::path::Path, env: &EnvVars) -> Result<Self, ConfigError> {
        crate::config::env::load::<Self>(path, env, SERVE_SECTIONS)?.resolve(env)
    }

    /// [`ServeSettings::load`] from TOML text.
    ///
    /// # Errors
    /// As [`ServeSettings::load`].
    pub fn from_toml_with_env(text: &str, env: &EnvVars) -> Result<Self, ConfigError> {
        crate::config::env::from_toml::<Self>(text, env, SERVE_SECTIONS)?.resolve(env)
    }

    fn resolve(mut self, env: &EnvVars) -> Result<Self, ConfigError> {
        self.store_options =
            crate::config::store_options_with_env(&self.store_url, &self.store_options, env);
        let mut problems = Vec::new();
        if let Some(pipelines) = &mut self.pipelines {
            if let Err(problem) = pipelines.security.load_secrets("pipelines.security") {
                problems.push(crate::error::Chain(&problem).to_string());
            }
            problems.extend(pipelines.kafka().problems("pipelines"));
            if let Some(url) = &pipelines.iceberg.warehouse {
                pipelines.iceberg.options =
                    crate::config::store_options_with_env(url, &pipelines.iceberg.options, env);
            }
            problems.extend(pipelines.iceberg.problems("pipelines.iceberg"));
        }
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(ConfigError::Invalid { problems })
        }
    }
}
