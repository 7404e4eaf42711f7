//! The pipeline roles: the extraction worker and the bbox worker, each a
//! [`RecordHandler`](crate::kafka::RecordHandler) run by the consumer runtime.
//!
//! Every role claims before it works (a duplicate delivery loses the claim and is
//! skipped), completes with the claim's fencing token, and publishes one
//! `ExtractionEvent` per transition it won. A record counts as delivered only
//! after all of that was acknowledged.

mod bbox_worker;
mod worker;

pub use bbox_worker::BboxWorker;
pub use worker::ExtractionWorker;

use std::sync::Arc;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::Transition;
use crate::events::{decode, Event, ExtractionEvent, PublishReason};
use crate::kafka::consumer::{ConsumerError, ConsumerRuntime};
use crate::kafka::{ConsumerSpec, HandlerError, Publisher, Record, RecordHandler};
use crate::metrics::Metrics;
use crate::store::{self, Extraction};

/// What every role shares: settings, the pool, the producer and the metrics.
#[derive(Clone)]
pub struct Services {
    /// Settings of this process.
    pub settings: Arc<Settings>,
    /// Postgres pool.
    pub pool: PgPool,
    /// The process's producer.
    pub publisher: Publisher,
    /// The process's metrics.
    pub metrics: Metrics,
}

impl Services {
    /// Publishes the `ExtractionEvent` of a won transition and waits for its ack.
    pub async fn emit(
        &self,
        transition: Transition,
        row: &Extraction,
        token: Option<i32>,
        reason: PublishReason,
    ) -> Result<(), HandlerError> {
        let event = ExtractionEvent::of(transition, row, token, reason);
        let topic = self.settings.topic(&self.settings.topic_events);
        self.publisher
            .publish(&topic, row.id.to_string().as_bytes(), &event)
            .await
            .map_err(|e| HandlerError::Transient(e.to_string()))
    }

    /// Tells a duplicate delivery (a claim loser: skipped) from an event about a
    /// row that does not exist (poison).
    async fn lost_claim(&self, claim: &'static str, id: Uuid) -> Result<(), HandlerError> {
        match store::get(&self.pool, id).await.map_err(transient)? {
            Some(row) => {
                self.metrics.claim_losers.with_label_values(&[claim]).inc();
                tracing::debug!(%id, claim, status = %row.status, "claim lost; delivery skipped");
                Ok(())
            }
            None => Err(HandlerError::Poison {
                kind: "missing_row",
                reason: format!("no extraction {id}"),
            }),
        }
    }

    /// Runs `handler` on `topic` as a member of `group` until `shutdown`.
    pub async fn consume<H: RecordHandler>(
        &self,
        group: &str,
        topic: &str,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<(), ConsumerError> {
        let settings = &self.settings;
        let spec = ConsumerSpec {
            brokers: settings.kafka_brokers.clone(),
            group: settings.group(group),
            topic: settings.topic(topic),
            dlq_topic: settings.topic(&settings.topic_dlq),
            max_in_flight: settings.consumer_max_in_flight,
            drain_timeout: settings.subscriber_drain_timeout(),
        };
        let runtime = ConsumerRuntime::new(
            spec,
            Arc::new(handler),
            self.publisher.clone(),
            self.metrics.clone(),
        )?;
        runtime.run(shutdown).await
    }
}

/// Decodes a record's value as `E` and its extraction id; failures are poison.
fn decode_record<E: Event>(
    record: &Record,
    id_of: impl Fn(&E) -> &str,
) -> Result<(E, Uuid), HandlerError> {
    let payload = record.payload.as_deref().unwrap_or_default();
    let event: E = decode(payload).map_err(|e| HandlerError::Poison {
        kind: e.kind(),
        reason: e.to_string(),
    })?;
    let id = Uuid::parse_str(id_of(&event)).map_err(|e| HandlerError::Poison {
        kind: "undecodable",
        reason: format!("extraction_id is not a UUID: {e}"),
    })?;
    Ok((event, id))
}

fn transient(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::Transient(e.to_string())
}
