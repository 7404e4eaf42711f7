//! The one place records are produced. Every publish waits for the broker's
//! acknowledgement (idempotent producer, acks=all): a caller that got `Ok` may
//! treat the record as durable, and that is what lets consumers store offsets
//! only after the events a record caused were delivered.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::events::{encode, CodecError, Event};
use crate::metrics::Metrics;

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
}

/// A shared producer; cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer,
    metrics: Metrics,
}

impl Publisher {
    /// A producer on `brokers` that gives up on a record after `timeout`.
    pub fn new(brokers: &str, timeout: Duration, metrics: Metrics) -> Result<Self, KafkaError> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // A few ms of batching: many records per request under load, little latency.
            .set("linger.ms", "5")
            .set("message.timeout.ms", timeout.as_millis().to_string())
            .create()?;
        Ok(Self { producer, metrics })
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
        self.publish_bytes(topic, Some(key), &payload).await
    }

    /// Produces raw bytes; for callers that already hold an encoded record.
    pub async fn publish_bytes(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        match self.producer.send(record, Timeout::Never).await {
            Ok(_) => {
                self.metrics
                    .events_produced
                    .with_label_values(&[topic])
                    .inc();
                Ok(())
            }
            Err((source, _)) => {
                self.metrics
                    .publish_failures
                    .with_label_values(&[topic])
                    .inc();
                Err(PublishError::Kafka {
                    topic: topic.to_owned(),
                    source,
                })
            }
        }
    }

    /// Waits up to `timeout` for every queued record to be acknowledged.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer.flush(timeout)
    }
}
