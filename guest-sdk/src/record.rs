//! A read-only view of one input record.

use crate::wit::exports::weir::operator::operator::InputRecord;

/// One input record, borrowed for the duration of [`Operator::process`](crate::Operator::process).
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    inner: &'a InputRecord,
}

/// One Kafka header of a [`Record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// Header name.
    pub name: &'a str,
    /// Header value, raw bytes.
    pub value: &'a [u8],
}

impl<'a> Record<'a> {
    pub(crate) fn new(inner: &'a InputRecord) -> Self {
        Self { inner }
    }

    /// The record key; empty for a Kafka record with a null key. State is scoped to it.
    pub fn key(&self) -> &'a [u8] {
        &self.inner.key
    }

    /// The record value; empty for a null value.
    pub fn value(&self) -> &'a [u8] {
        &self.inner.value
    }

    /// Timestamp in milliseconds since the Unix epoch, or -1 when the broker gave none.
    pub fn timestamp_ms(&self) -> i64 {
        self.inner.timestamp_ms
    }

    /// The record's Kafka headers, in order.
    pub fn headers(&self) -> impl Iterator<Item = Header<'a>> + 'a {
        self.inner.headers.iter().map(|h| Header {
            name: &h.name,
            value: &h.value,
        })
    }

    /// The input topic.
    pub fn topic(&self) -> &'a str {
        &self.inner.topic
    }

    /// The input partition.
    pub fn partition(&self) -> i32 {
        self.inner.partition
    }

    /// The record's offset in its partition.
    pub fn offset(&self) -> i64 {
        self.inner.offset
    }

    /// Which of the stage's inputs it was read from: the index of its topic in the stage's
    /// `inputs` (a one-operator pipeline's `input_topics`), from 0.
    pub fn input(&self) -> u32 {
        self.inner.input
    }
}
