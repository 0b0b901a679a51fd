//! A table's row schema as the runtime checks emits against it, whatever sink writes the
//! table (today the Iceberg sink, `sink::iceberg`): the columns a pipeline spec gives
//! ([`ColumnSpec`], [`ColumnType`]), why an emit does not fit them ([`RowError`]), and the
//! check ([`RowSchema::check`]), which the `emit` import runs so that an emit that does not fit
//! fails its record there (dead-lettered, its effects discarded), as a `too-large` emit does.
//!
//! The mapping is strict, as a table sink's should be: every emit is one JSON object whose
//! fields are columns of the table (a field the table has no column for fails the emit rather
//! than being dropped), a required column must be present and not `null`, and each value must
//! fit its column's type:
//!
//! | column type   | JSON value                                                        |
//! |---------------|-------------------------------------------------------------------|
//! | `boolean`     | `true` / `false`                                                  |
//! | `int`         | an integer in i32                                                 |
//! | `long`        | an integer in i64                                                 |
//! | `float`       | a number (stored as f32)                                          |
//! | `double`      | a number                                                          |
//! | `string`      | a string                                                          |
//! | `date`        | `"YYYY-MM-DD"`                                                    |
//! | `timestamp`   | RFC 3339 text (its offset applied, stored as UTC without zone), or integer milliseconds since the epoch |
//! | `timestamptz` | the same, stored as UTC with zone                                 |
//!
//! Not supported (the docs say so): decimals, binary, nested types (struct, list, map).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most columns a table spec may have.
pub const COLUMNS_MAX: usize = 256;

/// A column's type: Iceberg's primitive type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    /// `true` or `false`.
    Boolean,
    /// 32-bit signed integer.
    Int,
    /// 64-bit signed integer.
    Long,
    /// 32-bit IEEE 754 float.
    Float,
    /// 64-bit IEEE 754 float.
    Double,
    /// UTF-8 text.
    String,
    /// A calendar date without time or zone.
    Date,
    /// Microseconds since the epoch, without zone.
    Timestamp,
    /// Microseconds since the epoch, UTC.
    Timestamptz,
}

/// One column of a table spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    /// The column's name, which is the emitted JSON field's: 1..=128 bytes of
    /// `[A-Za-z0-9_]`, not starting with a digit.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub kind: ColumnType,
    /// Whether every row must have a value (not `null`, not missing); default false.
    #[serde(default)]
    pub required: bool,
}

/// Why a table spec's columns are not a schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// No columns, or more than [`COLUMNS_MAX`].
    #[error("a table has 1..={COLUMNS_MAX} columns. columns=`{0}`")]
    Count(usize),
    /// A column name is not `[A-Za-z_][A-Za-z0-9_]{0,127}`.
    #[error(
        "a column name is 1..=128 bytes of `[A-Za-z0-9_]`, not starting with a digit. name=`{0}`"
    )]
    Name(String),
    /// Two columns share a name.
    #[error("column names must differ. name=`{0}`")]
    Duplicate(String),
}

/// Why an emit does not fit the table: the record that emitted it fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// The emit's value is not JSON.
    #[error("the emit is not JSON: {0}")]
    NotJson(String),
    /// The emit's value is JSON but not an object.
    #[error("the emit is not a JSON object")]
    NotObject,
    /// A field the table has no column for.
    #[error("the table has no column `{0}`")]
    UnknownField(String),
    /// A required column is missing or `null`.
    #[error("the required column `{0}` is missing or null")]
    Missing(String),
    /// A value that does not fit its column's type.
    #[error("column `{column}` is {kind:?}: {reason}")]
    Type {
        /// The column.
        column: String,
        /// Its type.
        kind: ColumnType,
        /// What is wrong with the value.
        reason: &'static str,
    },
}

/// A table's columns, checked: names valid and distinct, 1..=[`COLUMNS_MAX`] of them.
#[derive(Debug, Clone)]
pub struct RowSchema {
    columns: Vec<ColumnSpec>,
}

impl RowSchema {
    /// The schema of `columns`.
    ///
    /// # Errors
    /// [`SchemaError`] for a bad name, a duplicate or a bad column count.
    pub fn new(columns: &[ColumnSpec]) -> Result<Self, SchemaError> {
        validate(columns)?;
        Ok(Self {
            columns: columns.to_vec(),
        })
    }

    /// The columns as given.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// Whether `value` (an emit's value) is a row of this table.
    ///
    /// # Errors
    /// [`RowError`] naming the first column that does not fit.
    pub fn check(&self, value: &[u8]) -> Result<(), RowError> {
        let object = parse(value)?;
        self.each_cell(&object, |_, _, _| Ok(()))
    }

    /// Calls `cell(index, column, value)` for every column in order (`Value::Null` for a
    /// missing optional one), after checking that `object` has no other field and every
    /// value fits its column.
    ///
    /// # Errors
    /// [`RowError`] naming the first column that does not fit, or `cell`'s.
    pub(crate) fn each_cell(
        &self,
        object: &serde_json::Map<String, Value>,
        mut cell: impl FnMut(usize, &ColumnSpec, &Value) -> Result<(), RowError>,
    ) -> Result<(), RowError> {
        if let Some(unknown) = object
            .keys()
            .find(|k| !self.columns.iter().any(|c| &c.name == *k))
        {
            return Err(RowError::UnknownField(unknown.clone()));
        }
        for (index, column) in self.columns.iter().enumerate() {
            let value = object.get(&column.name).unwrap_or(&Value::Null);
            if value.is_null() {
                if column.required {
                    return Err(RowError::Missing(column.name.clone()));
                }
            } else {
                convert(column, value)?;
            }
            cell(index, column, value)?;
        }
        Ok(())
    }
}

fn validate(columns: &[ColumnSpec]) -> Result<(), SchemaError> {
    if columns.is_empty() || columns.len() > COLUMNS_MAX {
        return Err(SchemaError::Count(columns.len()));
    }
    for (i, column) in columns.iter().enumerate() {
        let name = column.name.as_bytes();
        let ok = (1..=128).contains(&name.len())
            && !name[0].is_ascii_digit()
            && name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_');
        if !ok {
            return Err(SchemaError::Name(column.name.clone()));
        }
        if columns[..i].iter().any(|c| c.name == column.name) {
            return Err(SchemaError::Duplicate(column.name.clone()));
        }
    }
    Ok(())
}

/// `value` as a JSON object.
pub(crate) fn parse(value: &[u8]) -> Result<serde_json::Map<String, Value>, RowError> {
    match serde_json::from_slice::<Value>(value) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(RowError::NotObject),
        Err(e) => Err(RowError::NotJson(e.to_string())),
    }
}

/// A non-null JSON value as its column stores it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cell<'a> {
    Boolean(bool),
    Int(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    String(&'a str),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since the epoch.
    Micros(i64),
}

/// `value` (not null) as `column` stores it.
pub(crate) fn convert<'a>(column: &ColumnSpec, value: &'a Value) -> Result<Cell<'a>, RowError> {
    let wrong = |reason| RowError::Type {
        column: column.name.clone(),
        kind: column.kind,
        reason,
    };
    Ok(match column.kind {
        ColumnType::Boolean => Cell::Boolean(value.as_bool().ok_or(wrong("not a boolean"))?),
        ColumnType::Int => Cell::Int(
            value
                .as_i64()
                .and_then(|v| i32::try_from(v).ok())
                .ok_or(wrong("not an integer in i32"))?,
        ),
        ColumnType::Long => Cell::Long(value.as_i64().ok_or(wrong("not an integer in i64"))?),
        ColumnType::Float => {
            let v = value.as_f64().ok_or(wrong("not a number"))?;
            if v.is_finite() && (v as f32).is_infinite() {
                return Err(wrong("out of f32's range"));
            }
            Cell::Float(v as f32)
        }
        ColumnType::Double => Cell::Double(value.as_f64().ok_or(wrong("not a number"))?),
        ColumnType::String => Cell::String(value.as_str().ok_or(wrong("not a string"))?),
        ColumnType::Date => {
            let text = value.as_str().ok_or(wrong("not a `YYYY-MM-DD` string"))?;
            let date = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .map_err(|_| wrong("not a `YYYY-MM-DD` date"))?;
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a valid date");
            let days = (date - epoch).num_days();
            Cell::Date(i32::try_from(days).map_err(|_| wrong("out of range"))?)
        }
        ColumnType::Timestamp | ColumnType::Timestamptz => {
            let micros = if let Some(ms) = value.as_i64() {
                ms.checked_mul(1000)
            } else if let Some(text) = value.as_str() {
                let t = chrono::DateTime::parse_from_rfc3339(text)
                    .map_err(|_| wrong("not RFC 3339 text or epoch milliseconds"))?;
                Some(t.timestamp_micros())
            } else {
                return Err(wrong("not RFC 3339 text or epoch milliseconds"));
            };
            Cell::Micros(micros.ok_or(wrong("out of range"))?)
        }
    })
}
