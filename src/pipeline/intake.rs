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
//! a passing failure, retried like any other.
//!
//! A valid request of a tenant at its cap on open jobs is *held*
//! (`store::held`) and its record delivered: retried in place, such records
//! filled the consumer's in-flight window and stalled every tenant's records
//! behind one tenant's cap. The releaser ([`release_held`]) submits held
//! requests, each tenant's oldest first, as room appears; while a tenant has
//! requests held, its new ones are held behind them. Past
//! `max_held_requests_per_tenant` a record is dead-lettered as
//! `too_many_open_jobs`. The submit rate is the API's; the intake's pace is
//! the consumer's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use uuid::Uuid;

use sqlx::PgPool;

use super::submit::{DurableSubmitError, Submitter};
use crate::auth::{AuthError, Authenticator};
use crate::config::Settings;
use crate::domain::{
    ExtractionRequest, Quota, RequestError, RequestLimits, Scope, MAX_IDEMPOTENCY_KEY_LEN,
};
use crate::events::{decode, ExtractionRequested};
use crate::events::{DeadLetter, Source};
use crate::kafka::{HandlerError, Publisher, Record, RecordHandler};
use crate::metrics::ConsumerMetrics;
use crate::store::held::{self, Hold, Origin};
use crate::store::letters;
use crate::store::{NewExtraction, Refusal, SubmitError};

/// The header that names a record's tenant.
pub const TENANT_HEADER: &str = "docstream-tenant";
/// The header that carries an API key of that tenant, with the `submit` scope.
pub const API_KEY_HEADER: &str = "docstream-api-key";

/// The intake's record handler, shared with its releaser
/// ([`Intake::release_held`]). A clone is one reference count.
#[derive(Clone)]
pub struct Intake(Arc<Inner>);

struct Inner {
    parts: Parts,
    settings: IntakeSettings,
    /// The tenants whose new requests are held behind their held ones.
    holding: Holding,
}

/// What the intake works with.
pub struct Parts {
    /// The submit path it shares with the API.
    pub submitter: Submitter,
    /// The pool its held requests and tenants' dead letters are kept in.
    pub pool: PgPool,
    /// The records' API keys to their tenants.
    pub auth: Authenticator,
    /// Where a held request refused at its release is dead-lettered.
    pub publisher: Publisher,
    /// The held requests' and dead letters' counters.
    pub metrics: ConsumerMetrics,
}

/// What the intake reads of the settings.
struct IntakeSettings {
    /// Requests held per tenant before a record is dead-lettered.
    max_held: i64,
    /// The quotas of a tenant without its own.
    quota: Quota,
    /// The largest `request_json`, as the API's body limit.
    body_limit: usize,
    /// The API's request limits.
    limits: RequestLimits,
    /// The dead-letter topic, prefixed.
    dlq_topic: String,
    /// How much of a refused record a dead letter quotes.
    dlq_excerpt_bytes: usize,
}

/// The tenants known to have requests held (by any process, as of the
/// releaser's last round, or by this one since).
#[derive(Clone, Default)]
struct Holding(Arc<Mutex<HashSet<Uuid>>>);

impl Holding {
    fn contains(&self, tenant: Uuid) -> bool {
        self.lock().contains(&tenant)
    }

    fn insert(&self, tenant: Uuid) {
        self.lock().insert(tenant);
    }

    fn replace(&self, tenants: HashSet<Uuid>) {
        *self.lock() = tenants;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Uuid>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Intake {
    /// An intake on `parts`, as `settings` describe it.
    pub fn new(settings: &Settings, parts: Parts) -> Self {
        let settings = IntakeSettings {
            max_held: i64::from(settings.max_held_requests_per_tenant),
            quota: settings.tenant_quota(),
            body_limit: settings.http_body_limit_bytes,
            limits: settings.request_limits(),
            dlq_topic: settings.topic(&settings.topic_dlq),
            dlq_excerpt_bytes: settings.dlq_excerpt_bytes,
        };
        let holding = Holding::default();
        Self(Arc::new(Inner {
            parts,
            settings,
            holding,
        }))
    }

    /// Holds `new` until its tenant has room; `Ok` once it is durably held.
    async fn hold(&self, record: &Record, new: &NewExtraction) -> Result<(), HandlerError> {
        let origin = Origin {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
        };
        let max_held = self.0.settings.max_held;
        let pool = &self.0.parts.pool;
        let hold = held::hold(pool, new, &origin, max_held)
            .await
            .map_err(transient)?;
        match hold {
            Hold::Held => {
                self.0.holding.insert(new.tenant_id);
                self.count("held");
                Ok(())
            }
            Hold::Repeat => Ok(()),
            Hold::KeyReused => Err(HandlerError::Poison {
                kind: "key_reused",
                reason: SubmitError::KeyReused.to_string(),
            }),
            Hold::Full => Err(HandlerError::Poison {
                kind: "too_many_open_jobs",
                reason: format!(
                    "the tenant is at its cap on open jobs and has {max_held} requests held \
                     (DOCSTREAM_MAX_HELD_REQUESTS_PER_TENANT)"
                ),
            }),
        }
    }

    fn count(&self, event: &str) {
        let held = &self.0.parts.metrics.intake_held;
        held.with_label_values(&[event]).inc();
    }
}

fn transient(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::Transient(e.to_string())
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
    (auth, default): (&Authenticator, &Quota),
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
    let caller = match auth.authenticate(text(API_KEY_HEADER)).await {
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
    let quota = caller.quota.over(*default);
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
        let keys = (&self.0.parts.auth, &self.0.settings.quota);
        let tenant = tenant_of(keys, record).await?;
        match self.submit(record, tenant).await {
            // The key named the tenant: the letter is the tenant's to see.
            Err(HandlerError::Poison { kind, reason }) => {
                let payload = record.payload.as_deref().unwrap_or_default();
                let requested = decode::<ExtractionRequested>(payload).ok();
                let key = requested.as_ref().map(|r| r.idempotency_key.as_str());
                let request = requested.as_ref().map(|r| r.request_json.as_str());
                let source = (record.topic.as_str(), record.partition, record.offset);
                let pool = &self.0.parts.pool;
                letters::record(pool, tenant.0, source, (key, request), (kind, &reason))
                    .await
                    .map_err(transient)?;
                Err(HandlerError::Poison { kind, reason })
            }
            handled => handled,
        }
    }
}

impl Intake {
    /// Submits the request `record` carries for `tenant`, or holds it.
    async fn submit(
        &self,
        record: &Record,
        tenant: (Uuid, Option<i64>),
    ) -> Result<(), HandlerError> {
        let (submitter, settings) = (&self.0.parts.submitter, &self.0.settings);
        let (body_limit, limits) = (settings.body_limit, settings.limits);
        let parsed = parse(record, body_limit)?;
        submitter.learn_patterns(&parsed.0).await;
        let new = checked(parsed, tenant, &limits)?;
        // Behind the tenant's held requests, not ahead of them.
        if self.0.holding.contains(new.tenant_id) {
            return self.hold(record, &new).await;
        }
        match submitter.submit_durably(new).await {
            Ok(_) => Ok(()),
            // The submit took the request; at the cap (the rare case) it is
            // read again from the record rather than copied for every one.
            Err(DurableSubmitError::Submit(SubmitError::TooManyOpenJobs(_))) => {
                let again = checked(parse(record, body_limit)?, tenant, &limits)?;
                self.hold(record, &again).await
            }
            Err(e) => Err(refusal(e)),
        }
    }
}

/// Why a submit failed, as the consumer takes it: a refusal is poison,
/// anything else passes.
fn refusal(e: DurableSubmitError) -> HandlerError {
    match e {
        DurableSubmitError::Submit(e @ SubmitError::KeyReused) => HandlerError::Poison {
            kind: "key_reused",
            reason: e.to_string(),
        },
        DurableSubmitError::Submit(e @ SubmitError::Erased(_)) => HandlerError::Poison {
            kind: "erased",
            reason: e.to_string(),
        },
        // Room comes back when the tenant deletes, in hours, not seconds.
        DurableSubmitError::Submit(e @ SubmitError::OverQuota { .. }) => HandlerError::Poison {
            kind: "over_quota",
            reason: e.to_string(),
        },
        DurableSubmitError::Submit(
            e @ (SubmitError::WebhookRefused(_)
            | SubmitError::UnknownExtractor(_)
            | SubmitError::NoSuchFile(_)
            | SubmitError::TakesNoFiles(_)),
        ) => HandlerError::Poison {
            kind: "invalid_request",
            reason: e.to_string(),
        },
        e => transient(e),
    }
}

/// How often the releaser looks for room.
const RELEASE_EVERY: Duration = Duration::from_secs(1);

/// Held requests taken at a time.
const RELEASE_BATCH: i64 = 64;

impl Intake {
    /// The intake's releaser, until `stop`: every second, submits each
    /// tenant's held requests, oldest first, until the tenant is at its cap
    /// again; a held request that is refused now (its key was used since,
    /// say) is dead-lettered. Replicas may release the same request at
    /// once: the idempotency key makes one job of it.
    pub async fn release_held(self, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RELEASE_EVERY) => {}
            }
            if let Err(e) = self.release_round(&stop).await {
                tracing::warn!(error = %e, "held requests not released; trying again");
            }
        }
    }

    async fn release_round(&self, stop: &CancellationToken) -> Result<(), String> {
        let pool = &self.0.parts.pool;
        let tenants = held::tenants(pool).await.map_err(|e| e.to_string())?;
        self.0.holding.replace(tenants.iter().copied().collect());
        for tenant in tenants {
            while !stop.is_cancelled() {
                let cap = self.0.settings.quota.max_open_jobs;
                let batch = held::oldest(pool, tenant, cap, RELEASE_BATCH).await;
                let batch = batch.map_err(|e| e.to_string())?;
                let full = batch.len() < RELEASE_BATCH as usize;
                if !self.release_batch(batch).await? || full {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Submits `batch` in order; false once the tenant is at its cap.
    async fn release_batch(&self, batch: Vec<held::Held>) -> Result<bool, String> {
        let parts = &self.0.parts;
        for held in batch {
            let key = held.new.idempotency_key.clone().unwrap_or_default();
            let tenant = held.new.tenant_id;
            match parts.submitter.submit_durably(held.new.clone()).await {
                Ok(_) => {}
                Err(DurableSubmitError::Submit(SubmitError::TooManyOpenJobs(_))) => {
                    return Ok(false)
                }
                Err(e) => match refusal(e) {
                    poison @ HandlerError::Poison { .. } => {
                        dead_letter((parts, &self.0.settings), &held, &poison).await?
                    }
                    other => return Err(format!("{other:?}")),
                },
            }
            held::release(&parts.pool, tenant, &key)
                .await
                .map_err(|e| e.to_string())?;
            self.count("released");
        }
        Ok(true)
    }
}

/// Dead-letters a held request refused at its release, naming its record.
async fn dead_letter(
    (parts, settings): (&Parts, &IntakeSettings),
    held: &held::Held,
    poison: &HandlerError,
) -> Result<(), String> {
    let HandlerError::Poison { kind, reason } = poison else {
        return Err(poison.to_string());
    };
    let (kind, reason) = (*kind, reason.as_str());
    tracing::warn!(topic = %held.origin.topic, partition = held.origin.partition,
        offset = held.origin.offset, error = %poison.for_log(), "held request refused; sent to the DLQ");
    let request = serde_json::to_vec(&held.new.request).unwrap_or_default();
    let key = held.new.idempotency_key.as_deref().map(str::as_bytes);
    let source = Source {
        topic: &held.origin.topic,
        partition: held.origin.partition,
        offset: held.origin.offset,
        key,
        payload: Some(&request),
    };
    let origin = (
        held.origin.topic.as_str(),
        held.origin.partition,
        held.origin.offset,
    );
    let key = held.new.idempotency_key.as_deref();
    let text = String::from_utf8_lossy(&request);
    letters::record(
        &parts.pool,
        held.new.tenant_id,
        origin,
        (key, Some(&text)),
        (kind, reason),
    )
    .await
    .map_err(|e| format!("dead letter not recorded for its tenant: {e}"))?;
    let letter = DeadLetter::new(source, kind, reason, settings.dlq_excerpt_bytes);
    let letter_key = letter.key.clone().unwrap_or_default();
    parts
        .publisher
        .publish(&settings.dlq_topic, &letter_key, &letter)
        .await
        .map_err(|e| format!("dead letter not produced: {e}"))?;
    let dead_letters = &parts.metrics.dead_letters;
    dead_letters.with_label_values(&[kind]).inc();
    Ok(())
}
