//! `intake`: consumes `extraction.requests`, where teams that already produce
//! to Kafka submit jobs, and takes each request down the submit path of
//! `POST /v1/extractions`: validated the same way, inserted idempotently by its
//! key, its job published.
//!
//! A record is held to the limits of `POST /v1/extractions`: its
//! `request_json` to the body limit, and the request to every request limit.
//!
//! A record is delivered (its offset may be committed) only once the row and
//! the job's event are durable. A request that can never become a job (it does
//! not decode, is invalid, or reuses a key with another request) is poison: it
//! goes to the DLQ with its reason. A repeat of a key with the same request
//! creates nothing new.
//!
//! Each record names its tenant in the header [`TENANT_HEADER`] and carries
//! one of that tenant's API keys, with the `submit` scope, in
//! [`API_KEY_HEADER`]. A record without a valid pair is dead-lettered as
//! `unauthorized`; a key that cannot be looked up (the database is away) is
//! a passing failure, retried like any other. So is a record of a tenant at
//! its cap on open jobs: it waits (and holds its partition) until there is
//! room. The submit rate is the API's; the intake's pace is the consumer's.

use tokio_util::sync::CancellationToken;

use uuid::Uuid;

use super::submit::{submit_durably, DurableSubmitError};
use super::Services;
use crate::auth::AuthError;
use crate::domain::{
    ExtractionRequest, RequestError, RequestLimits, Scope, MAX_IDEMPOTENCY_KEY_LEN,
};
use crate::events::{decode, ExtractionRequested};
use crate::kafka::{HandlerError, Record, RecordHandler};
use crate::store::{NewExtraction, Refusal, SubmitError};

/// The header that names a record's tenant.
pub const TENANT_HEADER: &str = "docstream-tenant";
/// The header that carries an API key of that tenant, with the `submit` scope.
pub const API_KEY_HEADER: &str = "docstream-api-key";

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

fn unauthorized(reason: String) -> HandlerError {
    HandlerError::Poison {
        kind: "unauthorized",
        reason,
    }
}

/// The tenant a record is submitted for: its key is valid, has the `submit`
/// scope, and belongs to the tenant its header names. Also the tenant's cap
/// on open jobs.
async fn tenant_of(
    services: &Services,
    record: &Record,
) -> Result<(Uuid, Option<i64>), HandlerError> {
    let text = |name: &str| {
        record
            .header(name)
            .and_then(|v| std::str::from_utf8(v).ok())
    };
    let Some(tenant) = text(TENANT_HEADER) else {
        return Err(unauthorized(format!("no {TENANT_HEADER} header")));
    };
    let caller = match services.auth.authenticate(text(API_KEY_HEADER)).await {
        Ok(caller) => caller,
        Err(AuthError::Store(e)) => return Err(HandlerError::Transient(e.to_string())),
        Err(AuthError::Missing) => {
            return Err(unauthorized(format!("no {API_KEY_HEADER} header")));
        }
        Err(e) => return Err(unauthorized(e.to_string())),
    };
    if caller.tenant != tenant {
        return Err(unauthorized(format!(
            "the API key does not belong to tenant {tenant:?}"
        )));
    }
    caller
        .require(Scope::Submit)
        .map_err(|e| unauthorized(e.to_string()))?;
    let quota = caller.quota.over(services.settings.tenant_quota());
    Ok((caller.tenant_id, quota.max_open_jobs))
}

/// The request a record carries and its idempotency key, or why it can
/// never be a job.
fn parse(
    record: &Record,
    body_limit: usize,
) -> Result<(ExtractionRequest, Option<String>), HandlerError> {
    let payload = record.payload.as_deref().unwrap_or_default();
    let requested: ExtractionRequested = decode(payload)?;
    if requested.request_json.len() > body_limit {
        return Err(HandlerError::Poison {
            kind: "limit_exceeded",
            reason: format!(
                "request_json is {} bytes, larger than the body limit of {body_limit} bytes",
                requested.request_json.len()
            ),
        });
    }
    let request: ExtractionRequest = serde_json::from_str(&requested.request_json)
        .map_err(|e| refused(RequestError::from_json(&e)))?;
    Ok((request, Some(requested.idempotency_key)))
}

/// The job `request` asks for, or why it can never be one.
fn checked(
    (request, key): (ExtractionRequest, Option<String>),
    (tenant_id, max_open_jobs): (Uuid, Option<i64>),
    limits: &RequestLimits,
) -> Result<NewExtraction, HandlerError> {
    NewExtraction::checked((tenant_id, max_open_jobs), key, request, limits).map_err(|e| match e {
        Refusal::Request(e) => refused(e),
        Refusal::IdempotencyKey => invalid(format!(
            "idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
        )),
    })
}

/// A request that can never be a job: a dead letter that says why.
fn refused(e: RequestError) -> HandlerError {
    HandlerError::Poison {
        kind: e.code(),
        reason: format!("request_json: {e}"),
    }
}

impl RecordHandler for Intake {
    async fn handle(&self, record: &Record, _stop: &CancellationToken) -> Result<(), HandlerError> {
        let tenant = tenant_of(&self.services, record).await?;
        let settings = &self.services.settings;
        let parsed = parse(record, settings.http_body_limit_bytes)?;
        self.services.learn_patterns(&parsed.0).await;
        let new = checked(parsed, tenant, &settings.request_limits())?;
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
