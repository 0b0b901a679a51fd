//! The size a record counts against its output's limits — Kafka's, the output every pipeline
//! writes — computed where the `emit` import checks it before staging, and by the Kafka sink
//! when it reads its topics' limits and cuts dead letters to fit.

/// Bytes a record batch of one record adds to its key, value and headers, at most: the v2
/// batch header (61 bytes, the log overhead included) and the record's own framing
/// (librdkafka's `RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`, 36 bytes).
pub const RECORD_OVERHEAD_BYTES: u64 = 61 + 36;

/// Bytes a header adds to its name and value, at most (two varint lengths).
pub const HEADER_OVERHEAD_BYTES: u64 = 10;

/// The size of a record with `key_bytes`, `value_bytes` and headers of `header_bytes` (their
/// names and values summed) in `headers` headers, as Kafka counts it against its limits, at
/// most: [`RECORD_OVERHEAD_BYTES`] and [`HEADER_OVERHEAD_BYTES`] per header on top.
pub fn record_bytes(key_bytes: u64, value_bytes: u64, header_bytes: u64, headers: u64) -> u64 {
    RECORD_OVERHEAD_BYTES + key_bytes + value_bytes + header_bytes + headers * HEADER_OVERHEAD_BYTES
}
