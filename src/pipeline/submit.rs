//! The one submit path (HTTP today; the WebSocket and Kafka intakes later): insert
//! the row idempotently, then hand it to the workers.
//!
//! The row is durable before anything is published, so a failed publish does not
//! fail the submit: the job is then a class-1 orphan (queued, never published),
//! which the extraction reaper revives. Once the broker acknowledged the event,
//! the row is stamped as published, which tells the reaper it is not lost.

use super::Services;
use crate::domain::Transition;
use crate::events::{ExtractionSubmitted, PublishReason};
use crate::failpoints;
use crate::store::{self, Extraction, NewExtraction, StoreError, SubmitError, Submitted};

/// Inserts `new` (or finds the row its idempotency key names) and, when a row
/// was created, publishes it.
pub async fn submit(services: &Services, new: NewExtraction) -> Result<Submitted, SubmitError> {
    let insert = |insert| services.batched.insert.run(insert);
    let submitted = store::submit_with(&services.pool, new, insert).await?;
    if let Submitted::Created(row) = &submitted {
        if let Err(e) = failpoints::hit("submit.after_insert").await {
            let failed = sqlx::Error::Protocol(e.to_string());
            return Err(SubmitError::Store(StoreError::from(failed)));
        }
        publish_submitted(services, row).await;
    }
    Ok(submitted)
}

async fn publish_submitted(services: &Services, row: &Extraction) {
    let topic = services.settings.topic(&services.settings.topic_submitted);
    let event = ExtractionSubmitted::new(row.id, PublishReason::Submit);
    let key = row.id.to_string();
    let (published, emitted) = tokio::join!(
        services.publisher.publish(&topic, key.as_bytes(), &event),
        services.emit(Transition::Submit, row, None, PublishReason::Submit),
    );
    match published {
        Ok(()) => {
            if let Err(e) = services.batched.published.run(row.id).await {
                tracing::warn!(id = %row.id, error = %e, "publish not recorded; the reaper may republish it");
            }
        }
        Err(e) => {
            tracing::error!(id = %row.id, error = %e, "submitted event not published; the reaper will revive it")
        }
    }
    if let Err(e) = emitted {
        tracing::warn!(id = %row.id, error = %e, "lifecycle event not published");
    }
}
