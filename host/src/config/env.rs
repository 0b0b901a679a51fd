//! Settings from a TOML file with environment variables layered over it (figment), for
//! `weir run` and `weir serve` alike.
//!
//! **The rule:** a setting's path in the file, its parts joined by `__`, upper-cased, after
//! `WEIR_`. `[kafka] bootstrap_servers` is `WEIR_KAFKA__BOOTSTRAP_SERVERS`;
//! `[pipeline] checkpoint_interval` is `WEIR_PIPELINE__CHECKPOINT_INTERVAL=5s`; a top-level
//! setting of `weir serve`, `listen`, is `WEIR_LISTEN`. A variable wins over the file. A value
//! is text, read as a number or a boolean (`true`, `yes`, `on`, `1`…) where the setting is one;
//! lists and tables are written as in TOML (`WEIR_PIPELINE__INPUT_TOPICS=[a, b]`). In librdkafka property maps an `_` stands for a `.`
//! (`WEIR_KAFKA__CONSUMER__GROUP_INSTANCE_ID=host-1` sets `group.instance.id`). Only
//! variables whose first part names a section of the settings are read, so `WEIR_ADMIN_KEY`,
//! `WEIR_API` and the like are not settings. Secrets (`WEIR_KAFKA__SECURITY__SASL_PASSWORD`)
//! need never be in the file.
//!
//! The environment is read once, at the edge ([`EnvVars::from_process`]), and passed down.

use super::ConfigError;
use figment::providers::{Format as _, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::de::DeserializeOwned;
use std::path::Path;

/// Prefix of every settings variable.
pub const PREFIX: &str = "WEIR_";

/// A snapshot of environment variables: `(name, value)` pairs.
#[derive(Debug, Clone, Default)]
pub struct EnvVars(Vec<(String, String)>);

impl EnvVars {
    /// The process's variables (those with UTF-8 names and values).
    pub fn from_process() -> Self {
        Self(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
        )
    }

    /// Just these variables (tests).
    pub fn new<K: Into<String>, V: Into<String>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        Self(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every `(name, value)` pair.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The settings variables among these for settings whose top-level fields are
    /// `sections`, as `(name, dotted path)`, sorted by name so that overlaps apply in a fixed
    /// order.
    fn settings(&self, sections: &[&str]) -> Vec<(String, String, &str)> {
        let mut found: Vec<_> = self
            .0
            .iter()
            .filter_map(|(name, value)| {
                let rest = name.strip_prefix(PREFIX)?;
                let path = rest
                    .split("__")
                    .map(str::to_ascii_lowercase)
                    .collect::<Vec<_>>();
                if !sections.contains(&path[0].as_str()) || path.iter().any(String::is_empty) {
                    return None;
                }
                Some((name.clone(), path.join("."), value.as_str()))
            })
            .collect();
        found.sort();
        found
    }
}

/// One variable as a figment provider, so that an error about its value names it.
struct EnvVar {
    name: String,
    path: String,
    value: Value,
}

impl Provider for EnvVar {
    fn metadata(&self) -> Metadata {
        Metadata::named(format!("environment variable `{}`", self.name))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let dict = figment::util::nest(&self.path, self.value.clone())
            .into_dict()
            .unwrap_or_default();
        Ok(Profile::Default.collect(dict))
    }
}

/// A variable's value: a list (`[a, b]`) or a table (`{k = v}`) as TOML reads them, else the
/// text as it is — numbers and booleans are read from it only where a setting wants one
/// (figment's lossy extraction), so that a password `0042` stays `0042`.
fn parse(value: &str) -> Value {
    if value.starts_with('[') || value.starts_with('{') {
        value.parse().unwrap_or_else(|never| match never {})
    } else {
        Value::from(value.to_owned())
    }
}

/// Reads `path` (TOML) and layers the settings variables of `env` over it; `sections` are
/// the top-level fields of `T`.
///
/// # Errors
/// [`ConfigError::Read`] for an unreadable file, [`ConfigError::Parse`] for TOML or a
/// variable that does not make a `T` (the error names the key and where its value came from).
pub fn load<T: DeserializeOwned>(
    path: &Path,
    env: &EnvVars,
    sections: &[&str],
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    from_toml(&text, env, sections).map_err(|err| match err {
        ConfigError::Parse { source, .. } => ConfigError::Parse {
            path: path.to_owned(),
            source,
        },
        other => other,
    })
}

/// [`load`] from TOML text.
///
/// # Errors
/// [`ConfigError::Parse`].
pub fn from_toml<T: DeserializeOwned>(
    text: &str,
    env: &EnvVars,
    sections: &[&str],
) -> Result<T, ConfigError> {
    let mut figment = Figment::from(Toml::string(text));
    for (name, path, value) in env.settings(sections) {
        figment = figment.merge(EnvVar {
            name,
            path,
            value: parse(value),
        });
    }
    figment
        .extract_lossy()
        .map_err(|source| ConfigError::Parse {
            path: Default::default(),
            source: Box::new(source),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    const FILE: &str = r#"
        [pipeline]
        name = "p"
        operator = "op.wasm"
        input_topics = ["in"]
        output_topic = "out"
        dead_letter_topic = "dlq"
        [kafka]
        bootstrap_servers = "from-file:9092"
        consumer = { "fetch.max.bytes" = "1000" }
    "#;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::from_toml_with_env(FILE, &EnvVars::new(vars.iter().copied()))
    }

    #[test]
    fn variables_override_the_file_by_the_documented_rule() {
        let s = settings(&[
            ("WEIR_KAFKA__BOOTSTRAP_SERVERS", "from-env:9094"),
            ("WEIR_PIPELINE__CHECKPOINT_INTERVAL", "5s"),
            ("WEIR_PIPELINE__IN_FLIGHT_MAX", "64"),
            ("WEIR_PIPELINE__INPUT_TOPICS", "[a, b]"),
            ("WEIR_KAFKA__CONSUMER__GROUP_INSTANCE_ID", "host-1"),
            ("WEIR_KAFKA__CONSUMER__FETCH_MAX_BYTES", "2000"),
            ("WEIR_KAFKA__SECURITY__PROTOCOL", "sasl_ssl"),
            ("WEIR_KAFKA__SECURITY__SASL_MECHANISM", "SCRAM-SHA-256"),
            ("WEIR_KAFKA__SECURITY__SASL_USERNAME", "weir"),
            ("WEIR_KAFKA__SECURITY__SASL_PASSWORD", "0042"),
            ("WEIR_STATE__LSM__OPTIONS__AWS_ALLOW_HTTP", "true"),
            // Not settings: other WEIR_ variables, other prefixes.
            ("WEIR_ADMIN_KEY", "x"),
            ("WEIR_FLIGHTS_CSV", "/tmp/f.csv"),
            ("KAFKA__BOOTSTRAP_SERVERS", "ignored:1"),
        ])
        .expect("settings");
        assert_eq!(s.kafka.bootstrap_servers, "from-env:9094");
        assert_eq!(
            s.pipeline.checkpoint_interval,
            std::time::Duration::from_secs(5)
        );
        assert_eq!(s.pipeline.in_flight_max, 64);
        assert_eq!(s.pipeline.input_topics, ["a", "b"]);
        assert_eq!(s.kafka.consumer["group.instance.id"], "host-1");
        assert_eq!(s.kafka.consumer["fetch.max.bytes"], "2000");
        assert_eq!(s.kafka.security.sasl_password.as_deref(), Some("0042"));
        assert_eq!(s.kafka.security.sasl_username.as_deref(), Some("weir"));
        assert_eq!(s.state.lsm.options["aws_allow_http"], "true");
        // Untouched by the environment.
        assert_eq!(s.pipeline.name, "p");
    }

    #[test]
    fn a_bad_variable_is_named_in_the_error() {
        let err = settings(&[("WEIR_PIPELINE__IN_FLIGHT_MAX", "lots")])
            .expect_err("not a number")
            .to_string();
        let source = match settings(&[("WEIR_PIPELINE__IN_FLIGHT_MAX", "lots")]) {
            Err(ConfigError::Parse { source, .. }) => source.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(err.starts_with("cannot parse config"), "{err}");
        assert!(
            source.contains("environment variable `WEIR_PIPELINE__IN_FLIGHT_MAX`"),
            "{source}"
        );
        let unknown = match settings(&[("WEIR_PIPELINE__NAMEE", "q")]) {
            Err(ConfigError::Parse { source, .. }) => source.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(unknown.contains("unknown field"), "{unknown}");
        assert!(unknown.contains("namee"), "{unknown}");
    }
}
