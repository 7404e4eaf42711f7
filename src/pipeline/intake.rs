//! `intake`: consumes `extraction.requests`, where teams that already produce
//! to Kafka submit jobs, and takes each request down the submit path of
//! `POST /v1/extractions`: validated the same way, inserted idempotently by its
//! key, its job published.
//!
//! A record is delivered (its offset may be committed) only once the row and
//! the job's event are durable. A request that can never become a job (it does
//! not decode, is invalid, or reuses a key with another request) is poison: it
//! goes to the DLQ with its reason. A repeat of a key with the same request
//! creates nothing new.

use tokio_util::sync::CancellationToken;

use super::submit::{submit_durably, DurableSubmitError};
use super::Services;
use crate::domain::{idempotency_key_is_valid, ExtractionRequest, MAX_IDEMPOTENCY_KEY_LEN};
use crate::events::{decode, ExtractionRequested};
use crate::kafka::{HandlerError, Record, RecordHandler};
use crate::store::{NewExtraction, SubmitError};

/// The intake's record handler.
pub struct Intake {
    services: Services,
}

impl Intake {
    /// An intake on `services`.
    pub fn new(services: Services) -> Self {
        Self { services }
    }
}

fn invalid(reason: String) -> HandlerError {
    HandlerError::Poison {
        kind: "invalid_request",
        reason,
    }
}

/// The job a record asks for, or why it can never be one.
fn parse(record: &Record) -> Result<NewExtraction, HandlerError> {
    let payload = record.payload.as_deref().unwrap_or_default();
    let requested: ExtractionRequested = decode(payload).map_err(|e| HandlerError::Poison {
        kind: e.kind(),
        reason: e.to_string(),
    })?;
    if !idempotency_key_is_valid(&requested.idempotency_key) {
        return Err(invalid(format!(
            "idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
        )));
    }
    let request: ExtractionRequest = serde_json::from_str(&requested.request_json)
        .map_err(|e| invalid(format!("request_json: {e}")))?;
    request.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(NewExtraction {
        id: crate::domain::new_job_id(),
        idempotency_key: Some(requested.idempotency_key),
        request,
    })
}

impl RecordHandler for Intake {
    async fn handle(&self, record: &Record, _stop: &CancellationToken) -> Result<(), HandlerError> {
        let new = parse(record)?;
        match submit_durably(&self.services, new).await {
            Ok(_) => Ok(()),
            Err(DurableSubmitError::Submit(e @ SubmitError::KeyReused)) => {
                Err(HandlerError::Poison {
                    kind: "key_reused",
                    reason: e.to_string(),
                })
            }
            Err(DurableSubmitError::Submit(
                e @ (SubmitError::WebhookRefused(_) | SubmitError::UnknownExtractor(_)),
            )) => Err(HandlerError::Poison {
                kind: "invalid_request",
                reason: e.to_string(),
            }),
            Err(e) => Err(HandlerError::Transient(e.to_string())),
        }
    }
}
