//! The Kafka clients of the CLI's tools — the flights loader, `weir dev`, the benchmarks:
//! their brokers come from `--bootstrap-servers`, their TLS and SASL from the environment by
//! `weir run`'s rule (`WEIR_KAFKA__SECURITY__PROTOCOL=sasl_ssl`, …; see
//! `weir_host::config::env`), read and checked once at start ([`init`]).

use rdkafka::ClientConfig;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use weir_host::config::{ConfigError, EnvVars, KafkaSecurity, KafkaSettings};

static SECURITY: OnceLock<KafkaSecurity> = OnceLock::new();

/// Reads the tools' Kafka security settings from `env`; without this call (tests, embedding)
/// clients are plaintext.
///
/// # Errors
/// As [`KafkaSecurity::from_env`].
pub fn init(env: &EnvVars) -> Result<(), ConfigError> {
    let security = KafkaSecurity::from_env(env)?;
    let _ = SECURITY.set(security);
    Ok(())
}

/// Kafka settings for `bootstrap` with the tools' security and no extra properties.
pub fn settings(bootstrap: &str) -> KafkaSettings {
    KafkaSettings {
        bootstrap_servers: bootstrap.to_owned(),
        security: SECURITY.get().cloned().unwrap_or_default(),
        consumer: BTreeMap::new(),
        producer: BTreeMap::new(),
    }
}

/// A librdkafka configuration for `bootstrap` with the tools' security: the base of every
/// client a tool creates.
pub fn client(bootstrap: &str) -> ClientConfig {
    settings(bootstrap).client_config()
}
