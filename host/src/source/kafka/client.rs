//! The pipeline's consumer as librdkafka makes it ([`consumer`]: its defaults and what
//! `kafka.consumer` may override) and a fetched message as the WIT `input-record`
//! ([`to_input_record`]).

use super::{SourceConsumer, SourceContext};
use crate::config::Settings;
use crate::runtime::{Header, InputRecord};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use std::sync::Arc;

/// Creates the consumer (not yet subscribed); `ready` is notified when its queue of events
/// (rebalances, errors, statistics, and messages of partitions without a queue of their own)
/// becomes non-empty.
///
/// Defaults: auto-commit and offset store off, `auto.offset.reset=earliest`,
/// `isolation.level=read_committed`, partition EOF events (for [`Source::at_end`]), statistics
/// every second (for lag); `kafka.consumer` settings override them, except
/// `auto.offset.reset`: Weir applies it itself when it seeks a partition that has no
/// checkpoint ([`KafkaSource`]), and librdkafka's own stays `earliest`, so that a lookup of it
/// that overtakes a seek can only go back to records Weir skips, never past records it needs.
///
/// # Errors
/// [`KafkaError`] when librdkafka rejects the configuration.
pub fn consumer(
    settings: &Settings,
    ready: Arc<tokio::sync::Notify>,
) -> Result<(SourceConsumer, SourceContext), KafkaError> {
    let mut config = settings.kafka.client_config();
    config
        .set("group.id", settings.pipeline.group_id())
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        // Reaching a partition's end is reported (KafkaSource::at_end: `idle_advance`).
        .set("enable.partition.eof", "true")
        // Per-partition high watermarks for the pipeline's lag (SourceContext::stats).
        .set("statistics.interval.ms", "1000");
    for (k, v) in &settings.kafka.consumer {
        if k != "auto.offset.reset" {
            config.set(k, v);
        }
    }
    let context = SourceContext::default();
    let mut consumer: SourceConsumer = config.create_with_context(context.clone())?;
    consumer.set_nonempty_callback(move || ready.notify_one());
    Ok((consumer, context))
}

/// Copies a fetched message of `topic` (the pipeline's input `input`) into an `input-record`
/// (one copy, which the guest lowers).
pub fn to_input_record(msg: &BorrowedMessage<'_>, topic: &Arc<str>, input: u32) -> InputRecord {
    let headers = msg
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| Header {
                    name: h.key.to_owned(),
                    value: h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    InputRecord {
        key: msg.key().map(<[u8]>::to_vec).unwrap_or_default(),
        value: msg.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        timestamp_ms: msg.timestamp().to_millis().unwrap_or(-1),
        headers,
        topic: topic.clone(),
        partition: msg.partition(),
        offset: msg.offset(),
        input,
    }
}
