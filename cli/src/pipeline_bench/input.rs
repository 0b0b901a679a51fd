//! `weir bench`'s input: Nexmark bids or flights, traps spread among them, produced to the
//! broker.

use super::{PipelineBenchError, PipelineBenchOptions, Workload};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::time::{Duration, Instant};

/// One input event.
pub(super) struct Event {
    pub(super) key: Vec<u8>,
    pub(super) value: Vec<u8>,
}

/// `events` with the fraction `trap_rate` of their values replaced by `poison:trap` (the
/// `counter` guest panics on it), spread evenly: event `i` traps when `⌊(i+1)·rate⌋` passes
/// `⌊i·rate⌋`, so exactly `⌊n·rate⌋` of `n` do.
pub(super) fn with_traps(events: &[Event], trap_rate: f64) -> Vec<Event> {
    let rate = trap_rate.clamp(0.0, 1.0);
    events
        .iter()
        .enumerate()
        .map(|(i, event)| {
            let traps = ((i + 1) as f64 * rate).floor() > (i as f64 * rate).floor();
            Event {
                key: event.key.clone(),
                value: if traps {
                    b"poison:trap".to_vec()
                } else {
                    event.value.clone()
                },
            }
        })
        .collect()
}

/// `n` Nexmark bids over `keys` auctions (key: the auction id), from bid `first`. The value is
/// the bid as CSV (`auction,bidder,price,channel,url,date_time,extra`).
pub(super) fn nexmark_bids(n: u64, keys: u64, first: u64) -> Vec<Event> {
    use nexmark::config::NexmarkConfig;
    use nexmark::event::{Event as Nexmark, EventType};
    let config = NexmarkConfig {
        in_flight_auctions: keys.max(1) as usize,
        // No hot auctions: bids spread over the `keys` auctions in flight.
        hot_auction_ratio: 1,
        ..NexmarkConfig::default()
    };
    nexmark::EventGenerator::new(config)
        .with_type_filter(EventType::Bid)
        .with_offset(first)
        .filter_map(|event| match event {
            Nexmark::Bid(bid) => Some(Event {
                key: bid.auction.to_string().into_bytes(),
                value: format!(
                    "{},{},{},{},{},{},{}",
                    bid.auction,
                    bid.bidder,
                    bid.price,
                    bid.channel,
                    bid.url,
                    bid.date_time,
                    bid.extra
                )
                .into_bytes(),
            }),
            _ => None,
        })
        .take(n as usize)
        .collect()
}

pub(super) fn flights(opts: &PipelineBenchOptions) -> Result<Vec<Event>, PipelineBenchError> {
    let path = opts
        .flights_csv
        .as_ref()
        .ok_or(PipelineBenchError::NoFlights)?;
    Ok(crate::flights::read_csv(path)?
        .into_iter()
        .map(|f| Event {
            key: f.key.into_bytes(),
            value: f.json,
        })
        .collect())
}

/// The events of a latency phase: new bids (`counter`) or flights again (`aggregate`).
pub(super) fn latency_events(
    opts: &PipelineBenchOptions,
    workload: Workload,
    events: &[Event],
) -> Vec<Event> {
    // One more second: the warm-up.
    let n = opts.latency_rate * (opts.latency_duration.as_secs().max(1) + 1);
    match workload {
        Workload::Counter => nexmark_bids(n, opts.keys, opts.events),
        Workload::Aggregate => events
            .iter()
            .cycle()
            .take(n as usize)
            .map(|e| Event {
                key: e.key.clone(),
                value: e.value.clone(),
            })
            .collect(),
    }
}

pub(super) fn producer(bootstrap: &str) -> Result<FutureProducer, KafkaError> {
    crate::kafka::client(bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "1")
        .set("batch.size", "1000000")
        .create()
}

/// Produces `events` with the current time as their timestamps; with `rate`, at that many
/// events/s (in 1 ms steps), else as fast as the broker takes them. Waits for every delivery.
pub(super) async fn produce(
    producer: &FutureProducer,
    topic: &str,
    events: &[Event],
    rate: Option<u64>,
) -> Result<(), KafkaError> {
    let started = Instant::now();
    let mut deliveries = crate::flights::Deliveries::default();
    for (i, event) in events.iter().enumerate() {
        if let Some(rate) = rate {
            let due = started + Duration::from_secs_f64(i as f64 / rate.max(1) as f64);
            if due > Instant::now() {
                tokio::time::sleep_until(due.into()).await;
            }
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let record = FutureRecord::to(topic)
            .key(event.key.as_slice())
            .payload(event.value.as_slice())
            .timestamp(now_ms);
        deliveries.send(producer, record).await?;
    }
    deliveries.finish().await
}

/// Records in `topic` now: the sum of its partitions' high watermarks.
pub(super) fn high_watermarks(bootstrap: &str, topic: &str) -> Result<Vec<(i32, i64)>, KafkaError> {
    let consumer: rdkafka::consumer::BaseConsumer = crate::kafka::client(bootstrap).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut out = Vec::new();
    for t in metadata.topics() {
        for p in t.partitions() {
            let (_, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
            out.push((p.id(), high));
        }
    }
    Ok(out)
}
