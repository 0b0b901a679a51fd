//! Topics on the real broker: creating them, producing to them, reading them (committed records
//! only) and the consumer groups' committed offsets.

use super::{KeyValue, kafka_bootstrap, unique};
use anyhow::{Context as _, bail};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use std::time::{Duration, Instant};

/// The real broker's SASL_SSL listener (`WEIR_KAFKA_SASL_SSL_BOOTSTRAP`, default
/// `127.0.0.1:9094`; deploy/local/kafka.sh).
pub fn kafka_sasl_ssl_bootstrap() -> String {
    std::env::var("WEIR_KAFKA_SASL_SSL_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9094".into())
}

/// The CA that signed the local broker's certificate (made by deploy/local/kafka.sh under
/// `$WEIR_SERVICES_DIR`, default `~/.cache/weir/services`).
pub fn kafka_ca() -> std::path::PathBuf {
    let services = std::env::var("WEIR_SERVICES_DIR").map_or_else(
        |_| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/weir/services")
        },
        std::path::PathBuf::from,
    );
    services.join("kafka/tls/ca.pem")
}

/// Kafka settings for the local broker's SASL_SSL listener with `mechanism` and the SCRAM
/// user deploy/local/kafka.sh creates (`weir`), with `password`, trusting the script's CA.
pub fn kafka_sasl_ssl(
    mechanism: weir_host::config::SaslMechanism,
    password: &str,
) -> weir_host::config::KafkaSettings {
    use weir_host::config::{KafkaSecurity, KafkaSettings, SecurityProtocol};
    KafkaSettings {
        bootstrap_servers: kafka_sasl_ssl_bootstrap(),
        security: KafkaSecurity {
            protocol: SecurityProtocol::SaslSsl,
            sasl_mechanism: Some(mechanism),
            sasl_username: Some("weir".into()),
            sasl_password: Some(password.into()),
            ssl_ca_location: Some(kafka_ca()),
            ..KafkaSecurity::default()
        },
        consumer: Default::default(),
        producer: Default::default(),
    }
}

/// The password of the SCRAM user deploy/local/kafka.sh creates.
pub const KAFKA_SASL_PASSWORD: &str = "weir-secret";

/// Creates topics on the real broker.
///
/// # Errors
/// When the broker is unreachable or refuses.
pub async fn create_topics(topics: &[(&str, i32)]) -> anyhow::Result<()> {
    weir_cli::dev::ensure_topics(&kafka_bootstrap(), topics)
        .await
        .with_context(|| {
            format!(
                "cannot create topics on {}; is the broker up? (deploy/local/kafka.sh start)",
                kafka_bootstrap()
            )
        })
}

/// Creates topic `name` with `partitions` partitions and the topic configuration `config`
/// (for example `max.message.bytes`).
///
/// # Errors
/// When the broker is unreachable or refuses.
pub async fn create_topic_with(
    name: &str,
    partitions: i32,
    config: &[(&str, &str)],
) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()?;
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in config {
        topic = topic.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics([&topic], &opts).await? {
        if let Err((topic, code)) = result {
            bail!("cannot create topic `{topic}`: {code:?}");
        }
    }
    Ok(())
}

/// A topic's configuration entry `name`, as the broker describes it.
///
/// # Errors
/// When the broker is unreachable or does not describe the topic.
pub async fn topic_config(topic: &str, name: &str) -> anyhow::Result<Option<String>> {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()?;
    let described = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await?;
    let resource = described
        .into_iter()
        .next()
        .context("one resource described")?
        .map_err(|code| anyhow::anyhow!("describe `{topic}`: {code:?}"))?;
    Ok(resource.get(name).and_then(|e| e.value.clone()))
}

/// The offsets consumer group `group` has committed for `topic`'s `partitions`
/// (`None`: nothing committed for a partition), read without joining the group.
///
/// # Errors
/// When the broker is unreachable.
pub fn committed_offsets(
    group: &str,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<Vec<Option<i64>>> {
    use rdkafka::consumer::BaseConsumer;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut wanted = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        wanted.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(wanted, Duration::from_secs(10))?;
    Ok((0..partitions)
        .map(
            |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(rdkafka::Offset::Offset(o)) => Some(o),
                _ => None,
            },
        )
        .collect())
}

/// Sets consumer group `group`'s committed offsets of `topic`'s partitions to `offsets` (as
/// `kafka-consumer-groups --reset-offsets` does; the group must have no member).
///
/// # Errors
/// When the broker refuses.
pub fn set_committed_offsets(group: &str, topic: &str, offsets: &[i64]) -> anyhow::Result<()> {
    use rdkafka::consumer::{BaseConsumer, CommitMode};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (p, o) in offsets.iter().enumerate() {
        tpl.add_partition_offset(topic, i32::try_from(p)?, rdkafka::Offset::Offset(*o))?;
    }
    consumer.commit(&tpl, CommitMode::Sync)?;
    Ok(())
}

/// Each partition's high watermark (the offset the next record gets) of `topic`.
///
/// # Errors
/// When the broker is unreachable.
pub fn high_watermarks(topic: &str, partitions: i32) -> anyhow::Result<Vec<i64>> {
    Ok(watermarks(topic, partitions)?
        .into_iter()
        .map(|(_, high)| high)
        .collect())
}

/// Each partition's `(log start, end)` offsets of `topic`: what is left after a purge
/// (`DeleteRecords`), and what was written.
///
/// # Errors
/// When the broker does not answer.
pub fn watermarks(topic: &str, partitions: i32) -> anyhow::Result<Vec<(i64, i64)>> {
    use rdkafka::consumer::BaseConsumer;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()?;
    (0..partitions)
        .map(|p| Ok(consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?))
        .collect()
}

/// Produces `(key, value)` records to partition `partition` of `topic` with a producer whose
/// `message.max.bytes` is `message_bytes_max` (records larger than librdkafka's default).
///
/// # Errors
/// When a delivery fails.
pub async fn produce_large(
    topic: &str,
    partition: i32,
    records: &[KeyValue],
    message_bytes_max: usize,
) -> anyhow::Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("message.max.bytes", message_bytes_max.to_string())
        .set("batch.size", "1000000")
        .create()?;
    for (key, value) in records {
        let record = FutureRecord::to(topic)
            .partition(partition)
            .key(key.as_slice())
            .payload(value.as_slice());
        match producer.send(record, Duration::from_secs(30)).await {
            Ok(_) => {}
            Err((err, _)) => bail!("delivery failed: {err}"),
        }
    }
    Ok(())
}

/// Produces `(key, value)` records to partition `partition` of `topic`, waiting for each ack.
///
/// # Errors
/// When a delivery fails.
pub async fn produce(
    topic: &str,
    partition: i32,
    records: &[(Vec<u8>, Vec<u8>)],
) -> anyhow::Result<()> {
    let records: Vec<_> = records.iter().map(|r| (partition, r)).collect();
    produce_to_partitions(topic, &records).await
}

/// Produces `(partition, (key, value))` records to `topic` with the test binary's producer,
/// waiting for every ack.
pub(crate) async fn produce_to_partitions(
    topic: &str,
    records: &[(i32, &KeyValue)],
) -> anyhow::Result<()> {
    let producer = shared_producer()?;
    let delivered = deliver(&producer, topic, records).await;
    if delivered.is_err() && producer.client().fatal_error().is_some() {
        // An idempotent producer's fatal error fails every later send: the next call makes
        // another.
        *SHARED_PRODUCER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
    delivered
}

/// The producer of [`produce_to_partitions`], shared by every test of a test binary (it is
/// made on first use). One per call cost each call ~0.6 s: an idempotent producer asks for its
/// producer id once a broker connection is up, which at its start none is, so it asks again
/// 500 ms later (librdkafka's `rd_kafka_idemp_pid_fsm`), and closing it took ~0.1 s.
static SHARED_PRODUCER: std::sync::Mutex<Option<FutureProducer>> = std::sync::Mutex::new(None);

fn shared_producer() -> anyhow::Result<FutureProducer> {
    let mut shared = SHARED_PRODUCER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(producer) = shared.as_ref() {
        return Ok(producer.clone());
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    *shared = Some(producer.clone());
    Ok(producer)
}

async fn deliver(
    producer: &FutureProducer,
    topic: &str,
    records: &[(i32, &KeyValue)],
) -> anyhow::Result<()> {
    let mut deliveries = Vec::with_capacity(records.len());
    for (partition, (key, value)) in records {
        let record = FutureRecord::to(topic)
            .partition(*partition)
            .key(key.as_slice())
            .payload(value.as_slice());
        match producer.send_result(record) {
            Ok(d) => deliveries.push(d),
            Err((err, _)) => bail!("cannot enqueue record: {err}"),
        }
    }
    for d in deliveries {
        match d.await {
            Ok(Ok(_)) => {}
            Ok(Err((err, _))) => bail!("delivery failed: {err}"),
            Err(_) => bail!("delivery canceled"),
        }
    }
    Ok(())
}

/// A consumer of `topic` from the beginning, in a group of its own, that sees only committed
/// records (`read_committed`).
pub(crate) fn committed_reader(topic: &str) -> anyhow::Result<StreamConsumer> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    consumer.subscribe(&[topic])?;
    Ok(consumer)
}

/// Reads exactly `expected` records of `topic` from the beginning (read_committed), failing
/// after `timeout`; then waits `settle` more and fails if any further record arrives.
///
/// # Errors
/// When fewer than `expected` arrive in time, or more arrive.
pub async fn read_exactly(
    topic: &str,
    expected: usize,
    timeout: Duration,
    settle: Duration,
) -> anyhow::Result<Vec<OwnedMessage>> {
    let consumer = committed_reader(topic)?;
    let mut out = Vec::with_capacity(expected);
    let deadline = Instant::now() + timeout;
    while out.len() < expected {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, consumer.recv()).await {
            Ok(msg) => out.push(msg?.detach()),
            Err(_) => bail!(
                "read {} of {expected} records of `{topic}` in {timeout:?}",
                out.len()
            ),
        }
    }
    if let Ok(extra) = tokio::time::timeout(settle, consumer.recv()).await {
        let extra = extra?;
        bail!(
            "`{topic}` has more than {expected} records; extra at partition {} offset {}",
            extra.partition(),
            extra.offset()
        );
    }
    Ok(out)
}

/// Reads `topic` from the beginning (read_committed), handing each record to `enough` in
/// order, until `enough` returns true and then no record comes for `quiet`; fails when
/// `enough` has not said so within `timeout`. For outputs whose count is not known in advance
/// (a window's late updates come beside its one final result).
///
/// # Errors
/// When `enough` is not satisfied in time, or a record cannot be read.
pub async fn read_until(
    topic: &str,
    timeout: Duration,
    quiet: Duration,
    mut enough: impl FnMut(&OwnedMessage) -> bool,
) -> anyhow::Result<Vec<OwnedMessage>> {
    let consumer = committed_reader(topic)?;
    let mut out = Vec::new();
    let mut done = false;
    let deadline = Instant::now() + timeout;
    loop {
        let wait = if done {
            quiet
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        match tokio::time::timeout(wait, consumer.recv()).await {
            Ok(msg) => {
                let msg = msg?.detach();
                done = enough(&msg) || done;
                out.push(msg);
            }
            Err(_) if done => return Ok(out),
            Err(_) => bail!(
                "read {} records of `{topic}` in {timeout:?}, not yet enough",
                out.len()
            ),
        }
    }
}

/// The value of header `name` of `msg` as UTF-8, if present.
pub fn header(msg: &OwnedMessage, name: &str) -> Option<String> {
    let headers = msg.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Kafka's `Utils.murmur2` (the Java client's default partitioner's hash): the reference a
/// test checks where Weir's producer placed a key against.
pub fn java_murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, b) in tail.iter().enumerate() {
            h ^= u32::from(*b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `partitions` the Java client's default partitioner gives a record keyed
/// `key`: `(murmur2(key) & 0x7fffffff) % partitions`.
pub fn java_partition(key: &[u8], partitions: i32) -> i32 {
    (java_murmur2(key) & 0x7fff_ffff) % partitions
}
