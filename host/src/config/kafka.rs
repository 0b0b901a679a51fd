//! How Weir reaches Kafka: the cluster, its security (TLS, SASL) and extra librdkafka
//! properties. Every client Weir creates — consumers, producers, admin and metadata clients,
//! the flights loader, the benchmarks — starts from [`KafkaSettings::client_config`] or
//! [`KafkaSecurity::apply`], so security is set in one place for all of them.
//!
//! Security is host-wide (the platform's cluster, as a Kafka Streams application's
//! `security.protocol` and `sasl.jaas.config`); per-tenant principals are later work. Secrets
//! come from the environment (`WEIR_KAFKA__SECURITY__SASL_PASSWORD`, see [`super::env`]) or a
//! file (`sasl_password_file`, a Kubernetes Secret volume); a config file never has to hold
//! them.

use super::lenient::{client_properties, lenient_string};
use super::{ConfigError, EnvVars};
use rdkafka::ClientConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Kafka connection settings (`[kafka]` of a `weir run` config, `[pipelines]` of `weir serve`'s).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// `host:port[,host:port…]`.
    pub bootstrap_servers: String,
    /// TLS and SASL, for every client.
    #[serde(default)]
    pub security: KafkaSecurity,
    /// Extra librdkafka properties for the consumer (override Weir's defaults). Checked by
    /// librdkafka when the settings load: an unknown property or a bad value is named.
    #[serde(default, deserialize_with = "client_properties")]
    pub consumer: BTreeMap<String, String>,
    /// Extra librdkafka properties for the producer (override Weir's defaults), checked as
    /// `consumer`'s.
    #[serde(default, deserialize_with = "client_properties")]
    pub producer: BTreeMap<String, String>,
}

impl KafkaSettings {
    /// A librdkafka configuration with `bootstrap.servers` and the security settings: the base
    /// of every client of the cluster.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        self.security.apply(&mut config);
        config
    }

    /// Every problem with these settings, each prefixed by `section` (`kafka` or
    /// `pipelines`): an empty bootstrap list, [`KafkaSecurity::problems`], and each client
    /// property librdkafka refuses (an unknown name, a bad value), named.
    pub fn problems(&self, section: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.bootstrap_servers.trim().is_empty() {
            problems.push(format!("{section}.bootstrap_servers is empty"));
        }
        problems.extend(self.security.problems(&format!("{section}.security")));
        for (client, properties) in [("consumer", &self.consumer), ("producer", &self.producer)] {
            for (key, value) in properties {
                let mut config = ClientConfig::new();
                config.set(key, value);
                if let Err(err) = config.create_native_config() {
                    problems.push(format!(
                        "{section}.{client}.\"{key}\" is refused by librdkafka: {err}"
                    ));
                }
            }
        }
        problems
    }
}

/// `security.protocol`: how clients talk to the brokers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    /// No TLS, no authentication (the default; local brokers only).
    #[default]
    Plaintext,
    /// TLS, no SASL (or TLS client certificates).
    Ssl,
    /// SASL over plain TCP.
    SaslPlaintext,
    /// SASL over TLS: what managed Kafka services (MSK, Confluent Cloud, Aiven, Redpanda
    /// Cloud) ask for.
    SaslSsl,
}

impl SecurityProtocol {
    /// librdkafka's name of it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// `sasl.mechanism`: how a SASL client authenticates. GSSAPI (Kerberos) and OAUTHBEARER's
/// OIDC token fetch are not in this build (they need libsasl2 and libcurl).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SaslMechanism {
    /// User name and password in the clear (over TLS only, sensibly).
    #[serde(rename = "PLAIN")]
    Plain,
    /// Salted challenge-response, SHA-256 (RFC 7677).
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// Salted challenge-response, SHA-512.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// librdkafka's name of it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// TLS and SASL settings of every Kafka client (`[kafka.security]`).
///
/// ```toml
/// [kafka.security]
/// protocol = "sasl_ssl"
/// sasl_mechanism = "SCRAM-SHA-512"
/// sasl_username = "weir"
/// sasl_password_file = "/var/run/secrets/kafka/password"   # or WEIR_KAFKA__SECURITY__SASL_PASSWORD
/// ssl_ca_location = "/etc/weir/kafka-ca.pem"               # default: the system's CAs
/// ```
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSecurity {
    /// `security.protocol`; default `plaintext`.
    pub protocol: SecurityProtocol,
    /// `sasl.mechanism`; required with a SASL protocol.
    pub sasl_mechanism: Option<SaslMechanism>,
    /// `sasl.username`.
    #[serde(deserialize_with = "lenient_string")]
    pub sasl_username: Option<String>,
    /// `sasl.password`, best set from the environment (`WEIR_KAFKA__SECURITY__SASL_PASSWORD`);
    /// never printed.
    #[serde(deserialize_with = "lenient_string")]
    pub sasl_password: Option<String>,
    /// A file holding the password (a trailing newline is dropped), read when the settings
    /// load ([`KafkaSecurity::load_secrets`]); exclusive with `sasl_password`.
    pub sasl_password_file: Option<PathBuf>,
    /// `ssl.ca.location`: PEM file of the CAs that sign the brokers' certificates; default
    /// the system's CA store.
    pub ssl_ca_location: Option<PathBuf>,
    /// `ssl.certificate.location`: this client's PEM certificate (TLS client authentication).
    pub ssl_certificate_location: Option<PathBuf>,
    /// `ssl.key.location`: the PEM private key of `ssl_certificate_location` (unencrypted).
    pub ssl_key_location: Option<PathBuf>,
}

impl std::fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSecurity")
            .field("protocol", &self.protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field(
                "sasl_password",
                &self.sasl_password.as_ref().map(|_| "<redacted>"),
            )
            .field("sasl_password_file", &self.sasl_password_file)
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("ssl_certificate_location", &self.ssl_certificate_location)
            .field("ssl_key_location", &self.ssl_key_location)
            .finish()
    }
}

impl KafkaSecurity {
    /// The `kafka.security` settings of `env` alone (`WEIR_KAFKA__SECURITY__…`, the rule of
    /// [`super::env`]) with the password file read and the settings checked: for the tools
    /// that take their brokers from the command line (the flights loader, `weir dev`, the
    /// benchmarks).
    ///
    /// # Errors
    /// [`ConfigError::Parse`] for a variable that does not make the settings,
    /// [`ConfigError::Invalid`] for the problems of [`KafkaSecurity::problems`].
    pub fn from_env(env: &EnvVars) -> Result<Self, ConfigError> {
        /// Only `kafka.security`: other `WEIR_KAFKA__…` variables are not this tool's.
        #[derive(Deserialize)]
        struct Root {
            #[serde(default)]
            kafka: Kafka,
        }
        #[derive(Default, Deserialize)]
        struct Kafka {
            #[serde(default)]
            security: KafkaSecurity,
        }
        let root: Root = super::env::from_toml("", env, &["kafka"])?;
        let mut security = root.kafka.security;
        let mut problems = Vec::new();
        if let Err(problem) = security.load_secrets("kafka.security") {
            problems.push(crate::error::Chain(&problem).to_string());
        }
        problems.extend(security.problems("kafka.security"));
        if problems.is_empty() {
            Ok(security)
        } else {
            Err(ConfigError::Invalid { problems })
        }
    }

    /// Sets these settings on a librdkafka configuration (nothing for the default,
    /// `plaintext`).
    pub fn apply(&self, config: &mut ClientConfig) {
        if self.protocol == SecurityProtocol::Plaintext {
            return;
        }
        config.set("security.protocol", self.protocol.as_str());
        if self.protocol.uses_sasl() {
            if let Some(mechanism) = self.sasl_mechanism {
                config.set("sasl.mechanism", mechanism.as_str());
            }
            if let Some(user) = &self.sasl_username {
                config.set("sasl.username", user);
            }
            if let Some(password) = &self.sasl_password {
                config.set("sasl.password", password);
            }
        }
        if self.protocol.uses_tls() {
            for (key, path) in [
                ("ssl.ca.location", &self.ssl_ca_location),
                ("ssl.certificate.location", &self.ssl_certificate_location),
                ("ssl.key.location", &self.ssl_key_location),
            ] {
                if let Some(path) = path {
                    config.set(key, path.to_string_lossy());
                }
            }
        }
    }

    /// Reads `sasl_password_file` into `sasl_password`.
    ///
    /// # Errors
    /// [`SecretError`]: both are set, or the file cannot be read.
    pub fn load_secrets(&mut self, section: &str) -> Result<(), SecretError> {
        let Some(path) = &self.sasl_password_file else {
            return Ok(());
        };
        if self.sasl_password.is_some() {
            return Err(SecretError::BothSet {
                section: section.to_owned(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Unreadable {
            section: section.to_owned(),
            path: path.clone(),
            source,
        })?;
        self.sasl_password = Some(text.trim_end_matches(['\r', '\n']).to_owned());
        Ok(())
    }

    /// Every problem with these settings, each prefixed by `section`: SASL without its
    /// mechanism, user or password; SASL or TLS settings a protocol without them would
    /// ignore; a TLS file that does not exist.
    pub fn problems(&self, section: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let protocol = self.protocol.as_str();
        if self.protocol.uses_sasl() {
            if self.sasl_mechanism.is_none() {
                problems.push(format!(
                    "{section}.sasl_mechanism is required with protocol = \"{protocol}\" (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
                ));
            }
            if self.sasl_username.is_none() {
                problems.push(format!(
                    "{section}.sasl_username is required with protocol = \"{protocol}\""
                ));
            }
            if self.sasl_password.is_none() && self.sasl_password_file.is_none() {
                problems.push(format!(
                    "{section}.sasl_password (or WEIR_{}__SASL_PASSWORD, or sasl_password_file) is required with protocol = \"{protocol}\"",
                    section.to_ascii_uppercase().replace('.', "__")
                ));
            }
        } else if self.sasl_mechanism.is_some()
            || self.sasl_username.is_some()
            || self.sasl_password.is_some()
            || self.sasl_password_file.is_some()
        {
            problems.push(format!(
                "{section}: SASL settings are set but protocol = \"{protocol}\" does not use SASL (sasl_plaintext or sasl_ssl do)"
            ));
        }
        let tls_files = [
            ("ssl_ca_location", &self.ssl_ca_location),
            ("ssl_certificate_location", &self.ssl_certificate_location),
            ("ssl_key_location", &self.ssl_key_location),
        ];
        for (field, path) in tls_files {
            let Some(path) = path else { continue };
            if !self.protocol.uses_tls() {
                problems.push(format!(
                    "{section}.{field} is set but protocol = \"{protocol}\" does not use TLS (ssl or sasl_ssl do)"
                ));
            } else if !path.is_file() {
                problems.push(format!(
                    "{section}.{field} is not a readable file. path=`{}`",
                    path.display()
                ));
            }
        }
        if self.ssl_certificate_location.is_some() != self.ssl_key_location.is_some() {
            problems.push(format!(
                "{section}.ssl_certificate_location and {section}.ssl_key_location go together"
            ));
        }
        problems
    }
}

/// Why a section's SASL password could not be loaded ([`KafkaSecurity::load_secrets`]).
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// `sasl_password` and `sasl_password_file` are both set.
    #[error("{section}.sasl_password and {section}.sasl_password_file are both set; keep one")]
    BothSet {
        /// The settings section (`kafka.security`, `pipelines.security`).
        section: String,
    },
    /// The password file cannot be read.
    #[error("cannot read {section}.sasl_password_file. path=`{}`", path.display())]
    Unreadable {
        /// The settings section.
        section: String,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(text: &str) -> KafkaSettings {
        toml::from_str(text).expect("kafka settings")
    }

    #[test]
    fn sasl_ssl_sets_every_client_property_and_hides_the_password() {
        let ca = tempfile::NamedTempFile::new().expect("ca file");
        let settings = kafka(&format!(
            r#"
            bootstrap_servers = "b:9094"
            [security]
            protocol = "sasl_ssl"
            sasl_mechanism = "SCRAM-SHA-512"
            sasl_username = "weir"
            sasl_password = 12345
            ssl_ca_location = "{}"
            "#,
            ca.path().display()
        ));
        assert!(settings.problems("kafka").is_empty());
        let config = settings.client_config();
        assert_eq!(config.get("bootstrap.servers"), Some("b:9094"));
        assert_eq!(config.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(config.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(config.get("sasl.username"), Some("weir"));
        // A number in TOML (or an environment variable) is still a password.
        assert_eq!(config.get("sasl.password"), Some("12345"));
        assert_eq!(
            config.get("ssl.ca.location"),
            Some(ca.path().to_string_lossy().as_ref())
        );
        let debug = format!("{settings:?}");
        assert!(!debug.contains("12345"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn plaintext_sets_nothing_but_the_brokers() {
        let config = kafka(r#"bootstrap_servers = "b:9092""#).client_config();
        assert_eq!(config.get("security.protocol"), None);
        assert_eq!(config.get("bootstrap.servers"), Some("b:9092"));
    }

    #[test]
    fn missing_or_misplaced_security_settings_are_each_named() {
        let settings = kafka(
            r#"
            bootstrap_servers = "b:9094"
            [security]
            protocol = "sasl_ssl"
            ssl_ca_location = "/nonexistent/ca.pem"
            "#,
        );
        let problems = settings.problems("kafka").join("\n");
        for expected in [
            "kafka.security.sasl_mechanism is required",
            "kafka.security.sasl_username is required",
            "WEIR_KAFKA__SECURITY__SASL_PASSWORD",
            "kafka.security.ssl_ca_location is not a readable file. path=`/nonexistent/ca.pem`",
        ] {
            assert!(problems.contains(expected), "{expected} in {problems}");
        }
        let plaintext = kafka(
            r#"
            bootstrap_servers = "b:9092"
            [security]
            sasl_username = "weir"
            ssl_ca_location = "/etc/hostname"
            "#,
        );
        let problems = plaintext.problems("kafka").join("\n");
        assert!(problems.contains("does not use SASL"), "{problems}");
        assert!(problems.contains("ssl_ca_location is set but protocol = \"plaintext\""));
    }

    #[test]
    fn a_client_property_librdkafka_refuses_is_named_with_its_reason() {
        let settings = kafka(
            r#"
            bootstrap_servers = "b:9092"
            consumer = { "fetch.max.bytez" = "1", "fetch.max.bytes" = 1048576 }
            producer = { "linger.ms" = "soon" }
            "#,
        );
        let problems = settings.problems("kafka");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("kafka.consumer.\"fetch.max.bytez\" is refused by librdkafka"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("kafka.producer.\"linger.ms\" is refused by librdkafka"),
            "{problems:?}"
        );
        // Numbers are accepted unquoted.
        assert_eq!(settings.consumer["fetch.max.bytes"], "1048576");
    }

    #[test]
    fn the_password_file_is_read_once_and_its_newline_dropped() {
        let file = tempfile::NamedTempFile::new().expect("file");
        std::fs::write(file.path(), "s3cret\n").expect("write");
        let mut security = KafkaSecurity {
            protocol: SecurityProtocol::SaslPlaintext,
            sasl_password_file: Some(file.path().to_owned()),
            ..KafkaSecurity::default()
        };
        security.load_secrets("kafka.security").expect("read");
        assert_eq!(security.sasl_password.as_deref(), Some("s3cret"));
        assert!(
            security
                .load_secrets("kafka.security")
                .expect_err("both set")
                .to_string()
                .contains("both set")
        );
        security.sasl_password = None;
        security.sasl_password_file = Some("/nonexistent/password".into());
        let err = security
            .load_secrets("kafka.security")
            .expect_err("missing")
            .to_string();
        assert!(
            err.starts_with(
                "cannot read kafka.security.sasl_password_file. path=`/nonexistent/password`"
            ),
            "{err}"
        );
    }
}
