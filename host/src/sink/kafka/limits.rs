//! How large a record each destination takes, and dead letters cut to fit.
//!
//! Kafka refuses a record in two places: librdkafka, before sending, when its wire size is
//! over the producer's `message.max.bytes` (default 1,000,000); the broker, when the batch
//! holding it is over the topic's `max.message.bytes`. Either refusal used to stop a pipeline
//! for good (every restart met the same record). So every record is sized before it is sent
//! ([`record_bytes`], an upper bound of both counts) against the smaller of the two limits,
//! read when the pipeline starts ([`read_limits`]): an emit over it fails its record like any
//! emit over the limit (dead-lettered, effects discarded), and a dead letter over it is cut to
//! fit ([`fit_dead_letter`]). The producer's `batch.size` is held at the smallest topic limit
//! too, so that batches of small records never exceed it.

pub use crate::config::PRODUCER_MESSAGE_BYTES_DEFAULT;
use crate::config::Settings;
pub use crate::runtime::record_size::{HEADER_OVERHEAD_BYTES, RECORD_OVERHEAD_BYTES, record_bytes};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use std::time::Duration;

/// Longest `weir.error` header of a dead letter, bytes.
pub const ERROR_HEADER_BYTES_MAX: usize = 4096;

/// How long reading the topics' limits may take.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest record, sized by [`record_bytes`], each destination of a pipeline takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLimits {
    /// The output topics': the smallest of their limits.
    pub output_bytes_max: u64,
    /// The dead-letter topic's.
    pub dead_letter_bytes_max: u64,
}

impl RecordLimits {
    /// Limits of a producer's `message.max.bytes` alone (topics not read).
    pub fn producer_only(settings: &Settings) -> Self {
        let producer = producer_message_bytes_max(settings);
        Self {
            output_bytes_max: producer,
            dead_letter_bytes_max: producer,
        }
    }

    /// The smaller of the two: the producer's `batch.size`.
    pub fn smallest(&self) -> u64 {
        self.output_bytes_max.min(self.dead_letter_bytes_max)
    }
}

/// The producer's `message.max.bytes` (`kafka.producer`; librdkafka's default otherwise).
pub fn producer_message_bytes_max(settings: &Settings) -> u64 {
    settings
        .kafka
        .producer
        .get("message.max.bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(PRODUCER_MESSAGE_BYTES_DEFAULT)
}

/// Reads the output topics' (`output_topic` and `outputs`) and the dead-letter topic's
/// `max.message.bytes` and returns the limits: each the smaller of it and the producer's
/// `message.max.bytes`, the output topics' the smallest of theirs. A topic whose configuration
/// cannot be read (missing, not authorised to describe) gets the producer's limit, with a
/// warning: sending to it fails later anyway, and is retried.
pub async fn read_limits(settings: &Settings) -> RecordLimits {
    let producer = producer_message_bytes_max(settings);
    let p = &settings.pipeline;
    // The dead-letter topic first; then the output topics, if the emits go to any.
    let topics: Vec<&str> = std::iter::once(p.dead_letter_topic.as_str())
        .chain(p.output_topic.as_deref())
        .chain(p.outputs.values().map(String::as_str))
        .collect();
    let read = topics_message_bytes_max(settings, &topics).await;
    let limit = |i: usize| match &read {
        Ok(found) => found[i].map_or(producer, |topic| topic.min(producer)),
        Err(_) => producer,
    };
    if let Err(error) = &read {
        tracing::warn!(%error, "cannot read the output topics' max.message.bytes; sizing records by the producer's message.max.bytes alone");
    }
    let limits = RecordLimits {
        // Emits only to a table: bounded by `runtime.emit_bytes_per_record_max` alone.
        output_bytes_max: (1..topics.len()).map(limit).min().unwrap_or(u64::MAX),
        dead_letter_bytes_max: limit(0),
    };
    tracing::info!(
        output_bytes_max = limits.output_bytes_max,
        dead_letter_bytes_max = limits.dead_letter_bytes_max,
        "record size limits"
    );
    limits
}

/// Each topic's `max.message.bytes`, `None` for one the broker would not describe.
async fn topics_message_bytes_max(
    settings: &Settings,
    topics: &[&str],
) -> Result<Vec<Option<u64>>, rdkafka::error::KafkaError> {
    let mut config = settings.kafka.client_config();
    for (k, v) in &settings.kafka.producer {
        // Only connection settings matter to an admin client; producer tuning would be
        // refused by it.
        if k.starts_with("security.") || k.starts_with("sasl.") || k.starts_with("ssl.") {
            config.set(k, v);
        }
    }
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let specifiers: Vec<ResourceSpecifier<'_>> =
        topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    let options = AdminOptions::new().request_timeout(Some(DESCRIBE_TIMEOUT));
    let results = admin.describe_configs(&specifiers, &options).await?;
    Ok(results
        .into_iter()
        .map(|result| {
            result.ok().and_then(|resource| {
                resource
                    .get("max.message.bytes")
                    .and_then(|e| e.value.as_deref())
                    .and_then(|v| v.parse().ok())
            })
        })
        .collect())
}

/// What cutting a dead letter to fit removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cut {
    /// Original headers dropped (from the last), how many.
    pub headers_dropped: usize,
    /// Bytes of the key kept (all of it when not cut).
    pub key_kept: usize,
    /// Bytes of the value kept.
    pub value_kept: usize,
    /// Whether anything was cut.
    pub truncated: bool,
}

/// Cuts a dead letter to at most `limit` bytes ([`record_bytes`]): `weir_header_bytes` /
/// `weir_headers` are the `weir.*` headers, always kept (with [`TRUNCATION_HEADERS_BYTES`]
/// reserved for the ones saying what was cut); then the original headers (`original_headers`:
/// each one's name and value bytes, in order), the key and the value are cut, in that order,
/// only as far as needed.
pub fn fit_dead_letter(
    limit: u64,
    weir_header_bytes: u64,
    weir_headers: u64,
    original_headers: &[u64],
    key_bytes: usize,
    value_bytes: usize,
) -> Cut {
    let header_bytes: u64 = original_headers.iter().sum();
    let whole = record_bytes(
        key_bytes as u64,
        value_bytes as u64,
        weir_header_bytes + header_bytes,
        weir_headers + original_headers.len() as u64,
    );
    if whole <= limit {
        return Cut {
            headers_dropped: 0,
            key_kept: key_bytes,
            value_kept: value_bytes,
            truncated: false,
        };
    }
    // Room for the original parts once the weir.* headers and the truncation headers are in.
    let fixed = record_bytes(
        0,
        0,
        weir_header_bytes + TRUNCATION_HEADERS_BYTES,
        weir_headers + TRUNCATION_HEADERS,
    );
    let mut room = limit.saturating_sub(fixed);
    let mut kept_headers = original_headers.len();
    let size_of = |n: usize| -> u64 {
        original_headers[..n]
            .iter()
            .map(|b| b + HEADER_OVERHEAD_BYTES)
            .sum()
    };
    let (key, value) = (key_bytes as u64, value_bytes as u64);
    while kept_headers > 0 && size_of(kept_headers) + key + value > room {
        kept_headers -= 1;
    }
    room = room.saturating_sub(size_of(kept_headers));
    let key_kept = key.min(room.saturating_sub(value)) as usize;
    let key_kept = if key + value <= room {
        key_bytes
    } else {
        key_kept
    };
    let value_kept = value.min(room.saturating_sub(key_kept as u64)) as usize;
    Cut {
        headers_dropped: original_headers.len() - kept_headers,
        key_kept,
        value_kept,
        truncated: true,
    }
}

/// Headers a cut dead letter gains: `weir.truncated` and `weir.original.{key,value,headers}.bytes`.
pub const TRUNCATION_HEADERS: u64 = 4;

/// Bytes reserved for them: their names, and their longest values (`headers,key,value`; 20
/// digits each).
pub const TRUNCATION_HEADERS_BYTES: u64 = (HEADER_TRUNCATED.len()
    + HEADER_ORIGINAL_KEY_BYTES.len()
    + HEADER_ORIGINAL_VALUE_BYTES.len()
    + HEADER_ORIGINAL_HEADERS_BYTES.len()
    + "headers,key,value".len()
    + 3 * 20) as u64;

/// Header of a cut dead letter naming what was cut: `headers`, `key`, `value`, comma-separated.
pub const HEADER_TRUNCATED: &str = "weir.truncated";
/// Header of a cut dead letter: the original key's length, bytes (decimal).
pub const HEADER_ORIGINAL_KEY_BYTES: &str = "weir.original.key.bytes";
/// Header of a cut dead letter: the original value's length, bytes (decimal).
pub const HEADER_ORIGINAL_VALUE_BYTES: &str = "weir.original.value.bytes";
/// Header of a cut dead letter: the original headers' names and values, bytes (decimal).
pub const HEADER_ORIGINAL_HEADERS_BYTES: &str = "weir.original.headers.bytes";

/// The first `max` bytes of `text`, cut at a character boundary.
pub fn cap(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_that_fits_is_not_cut() {
        let cut = fit_dead_letter(1_000_000, 200, 5, &[10, 20], 100, 1000);
        assert!(!cut.truncated);
        assert_eq!(
            (cut.key_kept, cut.value_kept, cut.headers_dropped),
            (100, 1000, 0)
        );
    }

    #[test]
    fn headers_go_first_then_the_key_then_the_value() {
        let weir = (200, 5);
        // Dropping the big header is enough.
        let cut = fit_dead_letter(10_000, weir.0, weir.1, &[100, 50_000], 1000, 1000);
        assert_eq!(
            (cut.headers_dropped, cut.key_kept, cut.value_kept),
            (1, 1000, 1000)
        );
        // A 2 MiB key: every header goes, the key is cut, the value stays.
        let cut = fit_dead_letter(1_000_000, weir.0, weir.1, &[100], 2 << 20, 1000);
        assert_eq!(cut.headers_dropped, 1);
        assert_eq!(cut.value_kept, 1000);
        assert!(
            cut.key_kept < 1_000_000 && cut.key_kept > 990_000,
            "{cut:?}"
        );
        // A 20 MiB value: the key is cut before the value is (it goes first), then the value.
        let cut = fit_dead_letter(1_000_000, weir.0, weir.1, &[], 100, 20 << 20);
        assert_eq!(cut.key_kept, 0);
        assert!(
            cut.value_kept > 990_000 && cut.value_kept < 1_000_000,
            "{cut:?}"
        );
    }

    #[test]
    fn a_cut_dead_letter_fits_its_limit_with_its_truncation_headers() {
        for (limit, headers, key, value) in [
            (1_000_000u64, vec![10u64, 5000], 2usize << 20, 3usize << 20),
            (50_000, vec![], 100, 1 << 20),
            (2_000, vec![100; 30], 5000, 5000),
        ] {
            let cut = fit_dead_letter(limit, 300, 5, &headers, key, value);
            let kept = &headers[..headers.len() - cut.headers_dropped];
            let size = record_bytes(
                cut.key_kept as u64,
                cut.value_kept as u64,
                300 + TRUNCATION_HEADERS_BYTES + kept.iter().sum::<u64>(),
                5 + TRUNCATION_HEADERS + kept.len() as u64,
            );
            assert!(size <= limit, "{size} > {limit}: {cut:?}");
        }
    }

    #[test]
    fn a_capped_error_ends_on_a_character_boundary() {
        assert_eq!(cap("héllo", 2), "h");
        assert_eq!(cap("hello", 10), "hello");
    }
}
