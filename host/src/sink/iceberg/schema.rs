//! A table's columns as a pipeline spec gives them, and the operator's JSON emits turned into
//! Arrow rows of that schema.
//!
//! The mapping is strict, as a table sink's should be: every emit is one JSON object whose
//! fields are columns of the table (a field the table has no column for fails the emit rather
//! than being dropped), a required column must be present and not `null`, and each value must
//! fit its column's type. [`TableSchema::check`] is what the `emit` import runs, so that an
//! emit that does not fit fails its record there (dead-lettered, its effects discarded), as a
//! `too-large` emit does; [`RowBuffer::push`] appends a checked emit.
//!
//! JSON → Iceberg type (Iceberg's primitive type names, as in the table spec):
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

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder, Int32Builder,
    Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

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

impl ColumnType {
    fn iceberg(self) -> PrimitiveType {
        match self {
            ColumnType::Boolean => PrimitiveType::Boolean,
            ColumnType::Int => PrimitiveType::Int,
            ColumnType::Long => PrimitiveType::Long,
            ColumnType::Float => PrimitiveType::Float,
            ColumnType::Double => PrimitiveType::Double,
            ColumnType::String => PrimitiveType::String,
            ColumnType::Date => PrimitiveType::Date,
            ColumnType::Timestamp => PrimitiveType::Timestamp,
            ColumnType::Timestamptz => PrimitiveType::Timestamptz,
        }
    }
}

/// Checks a table's or namespace's name: 1..=128 bytes of `[a-z0-9_]` (a tenant's names
/// never make a path or an identifier of another shape).
///
/// # Errors
/// What is wrong, naming `field`.
pub fn check_table_name(field: &str, name: &str) -> Result<(), String> {
    let ok = (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{field} must be 1..=128 bytes of [a-z0-9_]. name=`{name}`"
        ))
    }
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

/// A table's columns: the Iceberg schema (field ids 1..=n in spec order) and its Arrow form
/// (with the field ids the Parquet writer needs).
#[derive(Debug, Clone)]
pub struct TableSchema {
    columns: Vec<ColumnSpec>,
    iceberg: Arc<Schema>,
    arrow: SchemaRef,
}

impl TableSchema {
    /// The schema of `columns`.
    ///
    /// # Errors
    /// [`SchemaError`] for a bad name, a duplicate or a bad column count.
    pub fn new(columns: &[ColumnSpec]) -> Result<Self, SchemaError> {
        validate(columns)?;
        let fields = columns
            .iter()
            .zip(1..)
            .map(|(column, id)| {
                let kind = Type::Primitive(column.kind.iceberg());
                Arc::new(if column.required {
                    NestedField::required(id, &column.name, kind)
                } else {
                    NestedField::optional(id, &column.name, kind)
                })
            })
            .collect::<Vec<_>>();
        let iceberg = Schema::builder()
            .with_schema_id(0)
            .with_fields(fields)
            .build()
            .expect("validated names are unique, and primitive fields always convert");
        let arrow = iceberg::arrow::schema_to_arrow_schema(&iceberg)
            .expect("every primitive type listed here has an Arrow type");
        Ok(Self {
            columns: columns.to_vec(),
            iceberg: Arc::new(iceberg),
            arrow: Arc::new(arrow),
        })
    }

    /// The columns as given.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// The Iceberg schema.
    pub fn iceberg(&self) -> &Arc<Schema> {
        &self.iceberg
    }

    /// The Arrow schema, with each field's Iceberg id in its metadata.
    pub fn arrow(&self) -> &SchemaRef {
        &self.arrow
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
    /// missing optional one), after checking that `object` has no other field.
    fn each_cell(
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

fn parse(value: &[u8]) -> Result<serde_json::Map<String, Value>, RowError> {
    match serde_json::from_slice::<Value>(value) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(RowError::NotObject),
        Err(e) => Err(RowError::NotJson(e.to_string())),
    }
}

/// A non-null JSON value as its column stores it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cell<'a> {
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

fn convert<'a>(column: &ColumnSpec, value: &'a Value) -> Result<Cell<'a>, RowError> {
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

/// Rows of one table appended as emits arrive, taken as an Arrow batch when a data file is
/// written. Bounded by its caller (the sink writes a batch every `rows_per_batch_max` rows).
pub struct RowBuffer {
    schema: TableSchema,
    builders: Vec<Box<dyn ArrayBuilder>>,
    rows: usize,
}

impl std::fmt::Debug for RowBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowBuffer")
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl RowBuffer {
    /// An empty buffer of `schema`'s rows.
    pub fn new(schema: TableSchema) -> Self {
        let builders = schema
            .arrow
            .fields()
            .iter()
            .zip(&schema.columns)
            .map(|(field, column)| builder(column.kind, field.data_type()))
            .collect();
        Self {
            schema,
            builders,
            rows: 0,
        }
    }

    /// Rows appended since the last [`RowBuffer::take`].
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends the row `value` is. Nothing is appended when it fails.
    ///
    /// # Errors
    /// [`RowError`], as [`TableSchema::check`].
    pub fn push(&mut self, value: &[u8]) -> Result<(), RowError> {
        let object = parse(value)?;
        // Checked whole first, so that a failing row leaves no column longer than the others.
        self.schema.each_cell(&object, |_, _, _| Ok(()))?;
        let builders = &mut self.builders;
        self.schema.each_cell(&object, |index, column, value| {
            let cell = (!value.is_null())
                .then(|| convert(column, value))
                .transpose()?;
            append(builders[index].as_any_mut(), cell);
            Ok(())
        })?;
        self.rows += 1;
        Ok(())
    }

    /// The rows appended so far as one batch; the buffer is empty after.
    pub fn take(&mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = self.builders.iter_mut().map(|b| b.finish()).collect();
        self.rows = 0;
        RecordBatch::try_new(self.schema.arrow.clone(), columns)
            .expect("each builder was made for its field's type and has one value per row")
    }
}

fn builder(kind: ColumnType, data_type: &arrow_schema::DataType) -> Box<dyn ArrayBuilder> {
    match kind {
        ColumnType::Boolean => Box::new(BooleanBuilder::new()),
        ColumnType::Int => Box::new(Int32Builder::new()),
        ColumnType::Long => Box::new(Int64Builder::new()),
        ColumnType::Float => Box::new(Float32Builder::new()),
        ColumnType::Double => Box::new(Float64Builder::new()),
        ColumnType::String => Box::new(StringBuilder::new()),
        ColumnType::Date => Box::new(Date32Builder::new()),
        // The Arrow type carries the zone (`+00:00`) for `timestamptz`.
        ColumnType::Timestamp | ColumnType::Timestamptz => {
            Box::new(TimestampMicrosecondBuilder::new().with_data_type(data_type.clone()))
        }
    }
}

fn append(builder: &mut dyn std::any::Any, cell: Option<Cell<'_>>) {
    macro_rules! put {
        ($builder:ty, $value:expr) => {
            builder
                .downcast_mut::<$builder>()
                .expect("each column's builder matches its type")
                .append_option($value)
        };
    }
    match cell {
        Some(Cell::Boolean(v)) => put!(BooleanBuilder, Some(v)),
        Some(Cell::Int(v)) => put!(Int32Builder, Some(v)),
        Some(Cell::Long(v)) => put!(Int64Builder, Some(v)),
        Some(Cell::Float(v)) => put!(Float32Builder, Some(v)),
        Some(Cell::Double(v)) => put!(Float64Builder, Some(v)),
        Some(Cell::String(v)) => put!(StringBuilder, Some(v)),
        Some(Cell::Date(v)) => put!(Date32Builder, Some(v)),
        Some(Cell::Micros(v)) => put!(TimestampMicrosecondBuilder, Some(v)),
        None => append_null(builder),
    }
}

fn append_null(builder: &mut dyn std::any::Any) {
    macro_rules! null {
        ($($builder:ty),*) => {
            $(if let Some(b) = builder.downcast_mut::<$builder>() {
                return b.append_null();
            })*
        };
    }
    null!(
        BooleanBuilder,
        Int32Builder,
        Int64Builder,
        Float32Builder,
        Float64Builder,
        StringBuilder,
        Date32Builder,
        TimestampMicrosecondBuilder
    );
    unreachable!("every builder kind is listed above");
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Date32Type, Int64Type, TimestampMicrosecondType};

    fn column(name: &str, kind: ColumnType, required: bool) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            kind,
            required,
        }
    }

    fn flights() -> TableSchema {
        TableSchema::new(&[
            column("route", ColumnType::String, true),
            column("flights", ColumnType::Long, true),
            column("delay_max", ColumnType::Long, false),
            column("delay_mean", ColumnType::Double, false),
            column("day", ColumnType::Date, false),
            column("at", ColumnType::Timestamptz, false),
        ])
        .expect("a valid schema")
    }

    #[test]
    fn rows_of_every_type_become_one_batch_with_nulls_for_missing_optional_columns() {
        let mut rows = RowBuffer::new(flights());
        rows.push(br#"{"route":"JFK-LAX","flights":3,"delay_max":40,"delay_mean":12.5,"day":"2013-01-02","at":"2013-01-02T05:30:00+01:00"}"#)
            .expect("fits");
        rows.push(br#"{"route":"EWR-SFO","flights":1,"delay_max":null,"at":1000}"#)
            .expect("fits");
        let batch = rows.take();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(rows.rows(), 0);
        let routes = batch.column(0).as_string::<i32>();
        assert_eq!((routes.value(0), routes.value(1)), ("JFK-LAX", "EWR-SFO"));
        let max = batch.column(2).as_primitive::<Int64Type>();
        assert_eq!((max.value(0), max.is_null(1)), (40, true));
        assert!(batch.column(3).is_null(1));
        let day = batch.column(4).as_primitive::<Date32Type>();
        assert_eq!(day.value(0), 15_707); // 2013-01-02
        let at = batch.column(5).as_primitive::<TimestampMicrosecondType>();
        assert_eq!(at.value(0), 1_357_101_000_000_000); // 04:30 UTC
        assert_eq!(at.value(1), 1_000_000);
    }

    #[test]
    fn emits_that_do_not_fit_name_the_column_and_append_nothing() {
        let schema = flights();
        let cases: &[(&[u8], RowError)] = &[
            (b"not json", RowError::NotJson(String::new())),
            (b"[1]", RowError::NotObject),
            (
                br#"{"route":"a","flights":1,"extra":1}"#,
                RowError::UnknownField("extra".into()),
            ),
            (br#"{"flights":1}"#, RowError::Missing("route".into())),
            (
                br#"{"route":"a","flights":null}"#,
                RowError::Missing("flights".into()),
            ),
            (
                br#"{"route":"a","flights":1.5}"#,
                RowError::Type {
                    column: "flights".into(),
                    kind: ColumnType::Long,
                    reason: "not an integer in i64",
                },
            ),
            (
                br#"{"route":7,"flights":1}"#,
                RowError::Type {
                    column: "route".into(),
                    kind: ColumnType::String,
                    reason: "not a string",
                },
            ),
            (
                br#"{"route":"a","flights":1,"day":"2013-02-30"}"#,
                RowError::Type {
                    column: "day".into(),
                    kind: ColumnType::Date,
                    reason: "not a `YYYY-MM-DD` date",
                },
            ),
        ];
        let mut rows = RowBuffer::new(schema.clone());
        for (value, expected) in cases {
            let checked = schema.check(value).expect_err("does not fit");
            let pushed = rows.push(value).expect_err("does not fit");
            assert_eq!(checked, pushed);
            match (expected, &checked) {
                (RowError::NotJson(_), RowError::NotJson(_)) => {}
                _ => assert_eq!(&checked, expected),
            }
        }
        assert_eq!(rows.rows(), 0);
        assert_eq!(rows.take().num_rows(), 0);
    }

    #[test]
    fn an_int_column_refuses_a_value_past_i32() {
        let schema = TableSchema::new(&[column("n", ColumnType::Int, true)]).expect("valid");
        assert!(schema.check(br#"{"n":2147483647}"#).is_ok());
        assert!(schema.check(br#"{"n":2147483648}"#).is_err());
    }

    #[test]
    fn bad_column_lists_are_refused() {
        assert_eq!(TableSchema::new(&[]).err(), Some(SchemaError::Count(0)));
        for name in ["", "1a", "a-b", "a b", &"x".repeat(129)] {
            assert_eq!(
                TableSchema::new(&[column(name, ColumnType::Long, false)]).err(),
                Some(SchemaError::Name(name.into())),
            );
        }
        let twice = [
            column("a", ColumnType::Long, false),
            column("a", ColumnType::Int, false),
        ];
        assert_eq!(
            TableSchema::new(&twice).err(),
            Some(SchemaError::Duplicate("a".into()))
        );
    }

    #[test]
    fn field_ids_follow_the_spec_order() {
        let schema = flights();
        let ids: Vec<i32> = schema
            .iceberg()
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.id)
            .collect();
        assert_eq!(ids, [1, 2, 3, 4, 5, 6]);
        let arrow_ids: Vec<&str> = schema
            .arrow()
            .fields()
            .iter()
            .map(|f| f.metadata()["PARQUET:field_id"].as_str())
            .collect();
        assert_eq!(arrow_ids, ["1", "2", "3", "4", "5", "6"]);
    }
}
