//! The pipeline's Kafka producer: librdkafka's `BaseProducer` whose delivery callback settles
//! each sink's deliveries by count ([`Deliveries`]), and one thread per producer that serves
//! delivery reports while any are outstanding and sleeps otherwise.
//!
//! Compared with rdkafka's `FutureProducer` (a future, a channel and a boxed sender per record,
//! and a thread that wakes every 100 ms for the life of the producer), a record costs one small
//! box (its [`Tag`]) and two atomic counts, and an idle pipeline's producers do not wake at all.

use super::delivery::Destination;
use rdkafka::ClientContext;
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A record whose delivery failed, with what is needed to send it again.
pub(super) struct Refused {
    pub error: KafkaError,
    pub message: OwnedMessage,
    pub destination: Destination,
}

/// One sink's deliveries: how many are outstanding, and those refused since it last looked.
/// The delivery callback (on the producer's polling thread, or a thread flushing it) updates
/// them; the sink awaits [`Deliveries::settled`].
#[derive(Default)]
pub(super) struct Deliveries {
    outstanding: AtomicUsize,
    refused: Mutex<Vec<Refused>>,
    /// Notified when the count reaches zero, when it drops below `room_at`, and on a refusal.
    settled: tokio::sync::Notify,
    /// The count at which a sender waits for room (the sink's bound).
    room_at: usize,
}

impl std::fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliveries")
            .field("outstanding", &self.outstanding())
            .finish_non_exhaustive()
    }
}

impl Deliveries {
    /// Deliveries of a sink that waits for room at `room_at` outstanding.
    pub fn new(room_at: usize) -> Self {
        Self {
            room_at,
            ..Self::default()
        }
    }

    /// Deliveries sent and not yet acknowledged or refused.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Takes the refusals reported since the last call, oldest first.
    pub fn take_refused(&self) -> Vec<Refused> {
        std::mem::take(&mut *self.refused.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Gives back refusals taken and not handled yet, ahead of newer ones.
    pub fn put_back(&self, mut refused: Vec<Refused>) {
        let mut list = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        refused.append(&mut list);
        *list = refused;
    }

    /// Completes after the next change worth looking at (see the field); at once if one came
    /// while nobody waited.
    pub async fn settled(&self) {
        self.settled.notified().await;
    }

    fn settle(&self, refused: Option<Refused>) {
        let was_refused = refused.is_some();
        if let Some(refused) = refused {
            self.refused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(refused);
        }
        let left = self.outstanding.fetch_sub(1, Ordering::AcqRel) - 1;
        if left == 0 || left + 1 == self.room_at || was_refused {
            self.settled.notify_one();
        }
    }
}

/// What a record carries to its delivery report: its sink's deliveries and where it goes.
#[derive(Debug)]
pub struct Tag {
    pub(super) deliveries: Arc<Deliveries>,
    pub(super) destination: Destination,
}

/// A record handed to the producer.
pub(super) type Record<'a> = BaseRecord<'a, [u8], [u8], Box<Tag>>;

/// The producer's context: settles deliveries, and counts those outstanding across the
/// producer's sinks for the polling thread.
#[derive(Debug, Default)]
pub struct DeliveryContext {
    outstanding: AtomicUsize,
    poller: OnceLock<std::thread::Thread>,
}

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<Tag>;

    fn delivery(&self, result: &DeliveryResult<'_>, tag: Box<Tag>) {
        let refused = match result {
            Ok(_) => None,
            Err((error, message)) => Some(Refused {
                error: error.clone(),
                message: message.detach(),
                destination: tag.destination,
            }),
        };
        tag.deliveries.settle(refused);
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long one poll of the delivery reports may block while deliveries are outstanding.
const POLL_TIMEOUT: Duration = Duration::from_millis(100);

/// A Kafka producer whose delivery reports are served by a thread of its own while deliveries
/// are outstanding. Clones share the producer; the thread ends with the last clone.
#[derive(Clone)]
pub struct KafkaProducer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KafkaProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaProducer")
            .field("context", self.inner.producer.context())
            .finish_non_exhaustive()
    }
}

struct Inner {
    producer: Arc<BaseProducer<DeliveryContext>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(poller) = self.producer.context().poller.get() {
            poller.unpark();
        }
    }
}

impl KafkaProducer {
    /// Creates the producer `config` describes and its polling thread.
    ///
    /// # Errors
    /// [`KafkaError`] when librdkafka rejects the configuration.
    pub fn new(config: &ClientConfig) -> KafkaResult<Self> {
        let producer = Arc::new(BaseProducer::from_config_and_context(
            config,
            DeliveryContext::default(),
        )?);
        let stop = Arc::new(AtomicBool::new(false));
        let (polled, stopped) = (producer.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("weir-deliveries".into())
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) {
                    if polled.context().outstanding.load(Ordering::Acquire) == 0 {
                        // Woken by the next send (an unpark before the park makes it return at
                        // once) or by the last clone's drop.
                        std::thread::park();
                        continue;
                    }
                    polled.poll(POLL_TIMEOUT);
                }
            })
            .map_err(|e| KafkaError::ClientCreation(format!("delivery thread: {e}")))?;
        // Set before any send: nothing can be outstanding yet.
        let _ = producer.context().poller.set(thread.thread().clone());
        Ok(Self {
            inner: Arc::new(Inner { producer, stop }),
        })
    }

    /// Hands `record` to librdkafka, counting it outstanding in `deliveries` (its tag's) until
    /// its delivery report. A record librdkafka refuses at once is returned with the refusal
    /// and not counted.
    ///
    /// # Errors
    /// The refusal (`QueueFull` when librdkafka's queue is full: try again after deliveries).
    #[allow(clippy::result_large_err)]
    pub(super) fn send<'a>(&self, record: Record<'a>) -> Result<(), (KafkaError, Record<'a>)> {
        let deliveries = record.delivery_opaque.deliveries.clone();
        deliveries.outstanding.fetch_add(1, Ordering::AcqRel);
        let context = self.inner.producer.context();
        if context.outstanding.fetch_add(1, Ordering::AcqRel) == 0
            && let Some(poller) = context.poller.get()
        {
            poller.unpark();
        }
        self.inner.producer.send(record).inspect_err(|_| {
            deliveries.outstanding.fetch_sub(1, Ordering::AcqRel);
            context.outstanding.fetch_sub(1, Ordering::AcqRel);
        })
    }
}

impl Deref for KafkaProducer {
    type Target = BaseProducer<DeliveryContext>;

    /// The librdkafka producer (transactions, flush).
    fn deref(&self) -> &Self::Target {
        &self.inner.producer
    }
}

/// The message of a record librdkafka refused at once, owned (to be sent again).
pub(super) fn owned(record: &Record<'_>) -> OwnedMessage {
    OwnedMessage::new(
        record.payload.map(<[u8]>::to_vec),
        record.key.map(<[u8]>::to_vec),
        record.topic.to_owned(),
        record.timestamp.map_or(
            rdkafka::Timestamp::NotAvailable,
            rdkafka::Timestamp::CreateTime,
        ),
        record.partition.unwrap_or(-1),
        -1,
        record.headers.clone(),
    )
}
