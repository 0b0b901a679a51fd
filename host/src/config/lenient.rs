//! Deserializers that take a number or a boolean where a string is meant: environment
//! variables carry no types ([`super::env`] reads `8080` as a number), and librdkafka's
//! properties are strings even when their values are numbers (`fetch.max.bytes = 1048576`).

use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// A TOML or environment scalar, kept as the text a string field wants.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Bool(bool),
}

impl From<Scalar> for String {
    fn from(scalar: Scalar) -> Self {
        match scalar {
            Scalar::Text(text) => text,
            Scalar::Unsigned(n) => n.to_string(),
            Scalar::Signed(n) => n.to_string(),
            Scalar::Float(n) => n.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

/// An optional string given as any scalar.
pub(crate) fn lenient_string<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    Ok(Option::<Scalar>::deserialize(deserializer)?.map(String::from))
}

/// A map of strings whose values may be given as any scalar (object-store options).
pub(crate) fn string_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(BTreeMap::<String, Scalar>::deserialize(deserializer)?
        .into_iter()
        .map(|(key, value)| (key, value.into()))
        .collect())
}

/// librdkafka properties: values as [`string_map`], and `_` in a name read as `.`, so that
/// `WEIR_KAFKA__CONSUMER__GROUP_INSTANCE_ID` sets `group.instance.id` (librdkafka's property
/// names have no underscores; environment variable names have no dots).
pub(crate) fn client_properties<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(string_map(deserializer)?
        .into_iter()
        .map(|(key, value)| (key.replace('_', "."), value))
        .collect())
}
