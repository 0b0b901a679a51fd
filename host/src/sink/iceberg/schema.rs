//! A table's columns as Iceberg and Arrow schemas ([`TableSchema`], around the neutral
//! [`RowSchema`] the runtime checks emits against), and the operator's checked JSON emits
//! turned into Arrow rows of that schema ([`RowBuffer`]).

use crate::row::{Cell, ColumnSpec, ColumnType, RowError, RowSchema, SchemaError, convert, parse};
use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder, Int32Builder,
    Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use std::sync::Arc;

/// A column type as Iceberg's primitive type.
fn iceberg_type(kind: ColumnType) -> PrimitiveType {
    match kind {
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

/// Checks a table's or namespace's name: 1..=128 bytes of `[a-z0-9_]` (a tenant's names
/// never make a path or an identifier of another shape).
///
/// # Errors
/// [`TableNameError`], naming `field`.
pub fn check_table_name(field: &str, name: &str) -> Result<(), TableNameError> {
    let ok = (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(TableNameError {
            field: field.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// A table's or namespace's name that is not 1..=128 bytes of `[a-z0-9_]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be 1..=128 bytes of [a-z0-9_]. name=`{name}`")]
pub struct TableNameError {
    /// The field that names it.
    pub field: String,
    /// The name.
    pub name: String,
}

/// A table's columns: the row schema the runtime checks emits against, the Iceberg schema
/// (field ids 1..=n in spec order) and its Arrow form (with the field ids the Parquet writer
/// needs).
#[derive(Debug, Clone)]
pub struct TableSchema {
    row: Arc<RowSchema>,
    iceberg: Arc<Schema>,
    arrow: SchemaRef,
}

impl TableSchema {
    /// The schema of `columns`.
    ///
    /// # Errors
    /// [`SchemaError`] for a bad name, a duplicate or a bad column count.
    pub fn new(columns: &[ColumnSpec]) -> Result<Self, SchemaError> {
        let row = RowSchema::new(columns)?;
        let fields = columns
            .iter()
            .zip(1..)
            .map(|(column, id)| {
                let kind = Type::Primitive(iceberg_type(column.kind));
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
            row: Arc::new(row),
            iceberg: Arc::new(iceberg),
            arrow: Arc::new(arrow),
        })
    }

    /// The columns as given.
    pub fn columns(&self) -> &[ColumnSpec] {
        self.row.columns()
    }

    /// The row schema the `emit` import checks emits against.
    pub fn row(&self) -> &Arc<RowSchema> {
        &self.row
    }

    /// The Iceberg schema.
    pub fn iceberg(&self) -> &Arc<Schema> {
        &self.iceberg
    }

    /// The Arrow schema, with each field's Iceberg id in its metadata.
    pub fn arrow(&self) -> &SchemaRef {
        &self.arrow
    }

    /// Whether `value` (an emit's value) is a row of this table, as [`RowSchema::check`].
    ///
    /// # Errors
    /// [`RowError`] naming the first column that does not fit.
    pub fn check(&self, value: &[u8]) -> Result<(), RowError> {
        self.row.check(value)
    }
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
            .zip(schema.columns())
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
        self.schema.row.each_cell(&object, |_, _, _| Ok(()))?;
        let builders = &mut self.builders;
        self.schema.row.each_cell(&object, |index, column, value| {
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
