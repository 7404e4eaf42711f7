//! The one place records are produced: a bounded queue in front of a single
//! send point (the idempotent producer, `acks=all`). Every publish waits for the
//! broker's acknowledgement, so a caller that got `Ok` may treat the record as
//! durable; that is what lets consumers store offsets only after the events a
//! record caused were delivered.
//!
//! A full queue makes publishers wait (backpressure), never drops. On shutdown
//! the owner calls [`Publisher::drain`]: new publishes are refused, and it waits
//! until every accepted record was acknowledged (or the timeout passed). A
//! publish whose caller gave up waiting (an HTTP client that hung up during a
//! broker outage) leaves the count of pending records all the same, so the
//! drain never waits for a caller that is gone.
//!
//! While the broker is away records wait in librdkafka, which reconnects on
//! its own, for up to the publish timeout. A producer that hit a fatal error
//! (its idempotence can no longer be kept) is replaced by a new one before
//! the next record; the records it held fail, and their callers retry.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::sync::{mpsc, oneshot, Notify};
use uuid::Uuid;

use super::context::Reporting;
use super::lane;
use crate::config::KafkaClient;
use crate::domain::Lane;
use crate::events::{encode, CodecError, Event};
use crate::health::{Dependency, Health};
use crate::metrics::{KafkaStats, Metrics};
use crate::trace;

type KafkaProducer = FutureProducer<Reporting>;

/// Why a record was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The event did not encode (a bug: our own types match our schemas).
    #[error(transparent)]
    Encode(#[from] CodecError),
    /// The broker refused it or it timed out.
    #[error("publish to {topic} failed: {source}")]
    Kafka {
        /// Target topic.
        topic: String,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// The publisher is draining for shutdown and takes no new records.
    #[error("publisher is shutting down")]
    Closed,
}

/// A record on its way to the send point.
struct Outgoing {
    topic: String,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    /// The headers of a record about a job.
    headers: Option<JobHeaders>,
    ack: oneshot::Sender<Result<(), KafkaError>>,
}

/// The headers of a record about a job: its trace context and, for a record
/// that hands it to a stage's workers, its lane.
struct JobHeaders {
    traceparent: String,
    lane: Option<Lane>,
}

impl JobHeaders {
    fn owned(&self) -> OwnedHeaders {
        let headers = OwnedHeaders::new_with_capacity(3).insert(Header {
            key: trace::TRACEPARENT,
            value: Some(self.traceparent.as_str()),
        });
        let Some(lane) = self.lane else {
            return headers;
        };
        let headers = headers.insert(Header {
            key: lane::PRIORITY_HEADER,
            value: Some(lane.priority.as_str()),
        });
        match lane.tenant {
            Some(tenant) => headers.insert(Header {
                key: lane::TENANT_HEADER,
                value: Some(
                    tenant
                        .as_hyphenated()
                        .encode_lower(&mut Uuid::encode_buffer()),
                ),
            }),
            None => headers,
        }
    }
}

/// The producer records are sent through; replaced after a fatal error.
#[derive(Clone)]
struct SendPoint {
    config: ClientConfig,
    context: Reporting,
    producer: Arc<RwLock<KafkaProducer>>,
    metrics: Metrics,
}

impl SendPoint {
    fn current(&self) -> KafkaProducer {
        self.producer.read().expect("producer lock").clone()
    }

    /// The producer to send with: a new one if the current one hit a fatal error.
    fn usable(&self) -> KafkaProducer {
        let producer = self.current();
        let Some((code, reason)) = producer.client().fatal_error() else {
            return producer;
        };
        match self
            .config
            .create_with_context::<_, KafkaProducer>(self.context.clone())
        {
            Ok(fresh) => {
                tracing::error!(?code, %reason, "kafka producer hit a fatal error; replaced by a new one");
                self.metrics.producer.restarts.inc();
                *self.producer.write().expect("producer lock") = fresh.clone();
                fresh
            }
            Err(e) => {
                tracing::error!(?code, %reason, error = %e, "kafka producer hit a fatal error and could not be replaced");
                producer
            }
        }
    }
}

struct Inner {
    queue: mpsc::Sender<Outgoing>,
    send_point: SendPoint,
    metrics: Metrics,
    /// Accepted and not yet acknowledged (queued or at the broker).
    pending: AtomicUsize,
    idle: Notify,
    closed: AtomicBool,
}

/// A shared producer; cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

impl Publisher {
    /// A producer on `brokers` with a queue of `queue_size` records, batching
    /// for `linger_ms`, giving up on a record after `timeout`; it reports the
    /// broker's outages to `health`, and librdkafka's statistics every
    /// `statistics_interval_ms` (0: never). Must be called inside a Tokio
    /// runtime.
    pub fn new(
        kafka: &KafkaClient,
        timeout: Duration,
        (queue_size, linger_ms): (usize, f64),
        statistics_interval_ms: u64,
        metrics: Metrics,
        health: Health,
    ) -> Result<Self, KafkaError> {
        let mut config = super::durability::producer_config(kafka);
        config
            .set("linger.ms", linger_ms.to_string())
            .set("message.timeout.ms", timeout.as_millis().to_string())
            // A job's hops are small requests on a busy connection: without
            // this, Nagle holds each one back until the previous is
            // acknowledged at the TCP level.
            .set("socket.nagle.disable", "true")
            .set("statistics.interval.ms", statistics_interval_ms.to_string());
        super::durability::check_producer(&config)?;
        let stats = KafkaStats::producer(metrics.producer.clone());
        let context = Reporting { health, stats };
        let producer: KafkaProducer = config.create_with_context(context.clone())?;
        let send_point = SendPoint {
            config,
            context,
            producer: Arc::new(RwLock::new(producer)),
            metrics: metrics.clone(),
        };
        let (queue, outgoing) = mpsc::channel(queue_size);
        tokio::spawn(send_records(send_point.clone(), outgoing));
        let inner = Inner {
            queue,
            send_point,
            metrics,
            pending: AtomicUsize::new(0),
            idle: Notify::new(),
            closed: AtomicBool::new(false),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Encodes `event` and produces it to `topic` under `key`; returns once the
    /// broker acknowledged it.
    pub async fn publish<E: Event>(
        &self,
        topic: &str,
        key: &[u8],
        event: &E,
    ) -> Result<(), PublishError> {
        let payload = encode(event)?;
        self.publish_bytes(topic, Some(key), payload).await
    }

    /// Encodes `event`, a record about job `id`, and produces it to `topic`
    /// keyed by the id, with the job's `traceparent` (`trace`); returns once
    /// the broker acknowledged it. Every record of a job's life goes out here.
    pub async fn publish_job<E: Event>(
        &self,
        topic: &str,
        id: Uuid,
        event: &E,
    ) -> Result<(), PublishError> {
        self.publish_job_in(topic, id, None, event).await
    }

    /// [`publish_job`](Self::publish_job) for a record that hands the job to
    /// a stage's workers: it also names the job's `lane` in its headers.
    pub async fn publish_job_in<E: Event>(
        &self,
        topic: &str,
        id: Uuid,
        lane: Option<Lane>,
        event: &E,
    ) -> Result<(), PublishError> {
        let payload = encode(event)?;
        let headers = JobHeaders {
            traceparent: trace::traceparent_for(id).header(),
            lane,
        };
        let key = id.to_string();
        self.send(topic, Some(key.as_bytes()), payload, Some(headers))
            .await
    }

    /// Produces raw bytes; for callers that already hold an encoded record.
    pub async fn publish_bytes(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Vec<u8>,
    ) -> Result<(), PublishError> {
        self.send(topic, key, payload, None).await
    }

    async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Vec<u8>,
        headers: Option<JobHeaders>,
    ) -> Result<(), PublishError> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(PublishError::Closed);
        }
        let pending = Pending::count(inner);
        let metrics = &inner.metrics;
        // Created with the topic's first record, so a topic's first failure
        // is an increase from 0 that `rate()` sees.
        let failures = metrics
            .producer
            .publish_failures
            .with_label_values(&[topic]);
        let started = std::time::Instant::now();
        let outcome = self.enqueue_and_wait(topic, key, payload, headers).await;
        drop(pending);
        match outcome {
            Ok(()) => {
                metrics
                    .producer
                    .events_produced
                    .with_label_values(&[topic])
                    .inc();
                metrics
                    .producer
                    .delivery_seconds
                    .with_label_values(&[topic])
                    .observe(started.elapsed().as_secs_f64());
                Ok(())
            }
            Err(source) => {
                failures.inc();
                Err(PublishError::Kafka {
                    topic: topic.to_owned(),
                    source,
                })
            }
        }
    }

    async fn enqueue_and_wait(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Vec<u8>,
        headers: Option<JobHeaders>,
    ) -> Result<(), KafkaError> {
        let (ack, acked) = oneshot::channel();
        let outgoing = Outgoing {
            topic: topic.to_owned(),
            key: key.map(<[u8]>::to_vec),
            payload,
            headers,
            ack,
        };
        let shut = || KafkaError::Canceled;
        self.inner.queue.send(outgoing).await.map_err(|_| shut())?;
        self.inner.metrics.producer.publisher_queue_depth.inc();
        acked.await.map_err(|_| shut())?
    }

    /// Refuses new records and waits up to `timeout` until every accepted one
    /// was acknowledged; then flushes. True when nothing was left behind.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::SeqCst);
        let idle = async {
            loop {
                let notified = inner.idle.notified();
                if inner.pending.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        let drained = tokio::time::timeout(timeout, idle).await.is_ok();
        let flushed = self.flush(Duration::from_secs(5)).is_ok();
        drained && flushed
    }

    /// Waits up to `timeout` for every record handed to librdkafka to be acknowledged.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.inner.send_point.current().flush(timeout)
    }

    /// Asks the broker for `topic`'s metadata, within `timeout`: the readiness
    /// probe of the Kafka dependency.
    pub async fn probe(&self, topic: &str, timeout: Duration) -> Result<(), KafkaError> {
        let producer = self.inner.send_point.current();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(Some(&topic), timeout)
                .map(drop)
        })
        .await
        .map_err(|_| KafkaError::Canceled)?
    }
}

/// One accepted record in [`Inner::pending`] until dropped, also when its
/// publisher's future is dropped before the acknowledgement came.
struct Pending<'a>(&'a Inner);

impl<'a> Pending<'a> {
    fn count(inner: &'a Inner) -> Self {
        inner.pending.fetch_add(1, Ordering::SeqCst);
        Self(inner)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The single send point: hands each queued record to librdkafka in order and
/// routes the broker's acknowledgement back to its publisher.
async fn send_records(send_point: SendPoint, mut outgoing: mpsc::Receiver<Outgoing>) {
    let metrics = send_point.metrics.clone();
    let health = send_point.context.health.clone();
    while let Some(record) = outgoing.recv().await {
        metrics.producer.publisher_queue_depth.dec();
        let mut retry = Duration::from_millis(1);
        loop {
            let producer = send_point.usable();
            let mut future_record =
                FutureRecord::<[u8], [u8]>::to(&record.topic).payload(&record.payload);
            if let Some(key) = &record.key {
                future_record = future_record.key(key);
            }
            if let Some(headers) = &record.headers {
                future_record = future_record.headers(headers.owned());
            }
            match producer.send_result(future_record) {
                Ok(delivery) => {
                    let ack = record.ack;
                    let health = health.clone();
                    tokio::spawn(async move {
                        let result = match delivery.await {
                            Ok(Ok(_)) => Ok(()),
                            Ok(Err((e, _))) => Err(e),
                            Err(_) => Err(KafkaError::Canceled),
                        };
                        // A failed delivery is not news of an outage: a record
                        // that timed out while the broker was away fails
                        // after it is back. Transport errors and probes say
                        // when the broker is away.
                        if result.is_ok() {
                            health.succeeded(Dependency::Kafka);
                        }
                        let _ = ack.send(result);
                    });
                    break;
                }
                // librdkafka's own buffer is full: wait for acknowledgements to free it.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(Duration::from_millis(100));
                }
                Err((e, _)) => {
                    let _ = record.ack.send(Err(e));
                    break;
                }
            }
        }
    }
}
