//! `/v1/extractions`: submit (idempotent), read, cancel.

use axum::extract::rejection::PathRejection;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

use super::uploads::Uploads;
use super::ApiError;
use crate::admission::Permit;
use crate::auth::Caller;
use crate::domain::{ExtractionRequest, ExtractionStatus, Priority, Scope, Transition};
use crate::events::PublishReason;
use crate::extract::ExtractionOutput;
use crate::pipeline;
use crate::pipeline::jobs::Cancel;
use crate::pipeline::Services;
use crate::store::retention::{self, Erased};
use crate::store::{self, BboxRefinement, Extraction, NewExtraction};

/// Submit, read and cancel. A JSON submit passes the process's admission
/// limit (`admission`) once its caller is known, before its body is read;
/// a multipart submit once its file is stored.
pub(super) fn router(services: &Services) -> Router<Services> {
    let admit = middleware::from_fn_with_state(services.clone(), admit);
    // Large enough for a multipart submit's file; a JSON body is held to the
    // API's own limit (`upload`).
    let limit = DefaultBodyLimit::max(super::upload::multipart_limit(services));
    Router::new()
        .route(
            "/v1/extractions",
            post(submit).layer(limit).route_layer(admit),
        )
        .route("/v1/extractions/{id}", get(read).delete(erase))
        .route("/v1/extractions/{id}/cancel", post(cancel))
        .route("/v1/extractions/{id}/retry", post(retry))
        .route("/v1/extractions/{id}/transitions", get(transitions_of))
}

/// The answer to a submit.
#[derive(Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct Accepted {
    id: Uuid,
    /// `queued` for a new job; a repeated key answers its job's status.
    status: ExtractionStatus,
}

/// A job as `GET /v1/extractions/{id}` answers it (the document itself is
/// not echoed).
#[derive(Serialize, JsonSchema)]
#[schemars(rename = "Extraction", deny_unknown_fields)]
pub(super) struct ExtractionView {
    id: Uuid,
    status: ExtractionStatus,
    /// Claims so far.
    #[schemars(range(min = 0))]
    attempts: i32,
    /// Which waiting work a worker starts first (`normal` unless the request
    /// said).
    priority: Priority,
    idempotency_key: Option<String>,
    submitted_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    /// The extracted values once the job succeeded, else null.
    #[schemars(with = "Option<ExtractionOutput>")]
    result: Option<serde_json::Value>,
    /// Why the job failed or was retried.
    error: Option<String>,
    next_attempt_at: Option<DateTime<Utc>>,
    cancel_requested_at: Option<DateTime<Utc>>,
    /// `bbox_refinement` once the extraction succeeded, else empty.
    post_processing: PostProcessing,
    webhook_url: Option<String>,
    /// The request's `metadata`, unchanged (null without one).
    metadata: Option<serde_json::Value>,
    /// When the job's content was erased (`DELETE`): a tombstone since,
    /// without result, error or metadata. Null for a job that was not.
    erased_at: Option<DateTime<Utc>>,
    /// The request as it was submitted (its document, fields, metadata):
    /// only with `include=request`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    request: Option<ExtractionRequest>,
}

/// The steps after the extraction: its bbox refinement once it succeeded.
#[derive(Serialize, JsonSchema)]
#[schemars(inline, deny_unknown_fields)]
struct PostProcessing {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "BboxRefinement")]
    bbox_refinement: Option<BboxRefinement>,
}

impl From<Extraction> for ExtractionView {
    fn from(row: Extraction) -> Self {
        let post_processing = PostProcessing {
            bbox_refinement: row.bbox_refinement(),
        };
        let (webhook_url, metadata) = row
            .request
            .map(|r| (r.0.webhook_url, r.0.metadata))
            .unwrap_or_default();
        Self {
            id: row.id,
            status: row.status,
            attempts: row.attempts,
            priority: row.priority,
            idempotency_key: row.idempotency_key,
            submitted_at: row.submitted_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
            result: row.result,
            error: row.error,
            next_attempt_at: row.next_attempt_at,
            cancel_requested_at: row.cancel_requested_at,
            post_processing,
            webhook_url,
            metadata,
            erased_at: row.erased_at,
            request: None,
        }
    }
}

/// How long a refused submit's body may take to arrive before the refusal
/// is sent without it (and the connection closed).
const REFUSED_BODY_READ: std::time::Duration = std::time::Duration::from_millis(50);

/// Lets a submit in if the process has room for it, else answers 503
/// `overloaded` at once. Room is the process's admission limit, shared by
/// the tenants' weights (`admission`): the caller is known first (from the
/// key cache, as a rule), and kept for the handler. The admitted submit
/// carries its permit (an [`Admitted`] extension), which it marks when its
/// row is durable. A multipart submit goes in without one: it takes its
/// permit once its file is stored ([`Admitted::readmit`]).
async fn admit(State(services): State<Services>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let caller = match Caller::from_request_parts(&mut parts, &services).await {
        Ok(caller) => caller,
        Err(refused) => return refused.into_response(),
    };
    let admission = &services.admission;
    let permit = match super::upload::is_multipart(&parts.headers) {
        true => Some(None),
        false => admission.try_admit(caller.tenant_id).map(Some),
    };
    parts.extensions.insert(caller);
    let mut request = Request::from_parts(parts, body);
    let response = match permit {
        Some(permit) => {
            let admitted = Admitted(Arc::new(Mutex::new(permit)));
            request.extensions_mut().insert(admitted.clone());
            let response = next.run(request).await;
            // Answered without a row (refused, unauthenticated, failed):
            // the whole request was its work. A no-op if its row was durable.
            admitted.durable();
            response
        }
        None => {
            // The body is read (it is in the socket already, as a rule) and
            // dropped: a body left unread closes the connection, and a
            // client turned away would pay for a new one on its retry.
            let limit = services.settings.http_body_limit_bytes;
            let body = axum::body::to_bytes(request.into_body(), limit);
            let _ = tokio::time::timeout(REFUSED_BODY_READ, body).await;
            overloaded(&services).into_response()
        }
    };
    let (limit, in_flight) = admission.snapshot();
    let http = &services.metrics.http;
    http.admission_limit.set(limit as i64);
    http.submits_in_flight.set(in_flight as i64);
    response
}

/// An admitted submit's permit, while it holds one; it leaves the limit
/// when the request is done.
#[derive(Clone)]
struct Admitted(Arc<Mutex<Option<Permit>>>);

impl Admitted {
    fn permit(&self) -> std::sync::MutexGuard<'_, Option<Permit>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The submit needs no more of the database: its row is durable, or it
    /// was refused or failed.
    fn durable(&self) {
        if let Some(permit) = self.permit().as_mut() {
            permit.durable();
        }
    }

    /// The submit moves a file's bytes now: it leaves the limit, uncounted.
    fn set_aside(&self) {
        if let Some(permit) = self.permit().take() {
            permit.set_aside();
        }
    }

    /// A permit again for a submit of `tenant` whose file is stored, or 503
    /// `overloaded` when the process has no room for it now (the file stays
    /// the tenant's). A no-op while it holds one.
    fn readmit(&self, services: &Services, tenant: Uuid) -> Result<(), ApiError> {
        let mut permit = self.permit();
        if permit.is_some() {
            return Ok(());
        }
        *permit = services.admission.try_admit(tenant);
        match permit.is_some() {
            true => Ok(()),
            false => Err(overloaded(services)),
        }
    }
}

/// A submit refused for want of room, counted.
fn overloaded(services: &Services) -> ApiError {
    services.metrics.http.overload_rejections.inc();
    let message = "this server has no room for another submit now; retry shortly";
    ApiError::Overloaded(message.into())
}

async fn submit(
    Extension(admitted): Extension<Admitted>,
    Extension(uploads): Extension<Uploads>,
    caller: Caller,
    State(services): State<Services>,
    body: Request,
) -> Result<Response, ApiError> {
    let max_open_jobs = super::auth::admit_submit(&services, &caller)?;
    let headers = body.headers().clone();
    let moving = || admitted.set_aside();
    let request = super::upload::submitted(&services, &uploads, &caller, body, moving).await?;
    admitted.readmit(&services, caller.tenant_id)?;
    // A header that is not text is no key: it is refused as an empty one.
    let idempotency_key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let tenant = (caller.tenant_id, max_open_jobs);
    let limits = services.settings.request_limits();
    services.learn_patterns(&request).await;
    let new = NewExtraction::checked(tenant, idempotency_key, request, &limits)
        .map_err(|refused| ApiError::refused(refused, "Idempotency-Key"))?;
    let submitted = pipeline::submit(&services, new, || admitted.durable()).await?;
    let row = submitted.extraction();
    let location = format!("/v1/extractions/{}", row.id);
    let body = Accepted {
        id: row.id,
        status: row.status,
    };
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response())
}

async fn read(
    caller: Caller,
    State(services): State<Services>,
    id: Result<Path<Uuid>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<ExtractionView>, ApiError> {
    caller.require(Scope::Read)?;
    let Path(id) = id?;
    let with_request = match query.as_deref().unwrap_or_default() {
        "" => false,
        "include=request" => true,
        _ => {
            return Err(ApiError::BadRequest(
                "the only query parameter is include=request".into(),
            ))
        }
    };
    let row = owned(&services, &caller, id).await?;
    if let Some(at) = row.erased_at {
        return Err(ApiError::Gone(format!(
            "extraction {id} was erased at {at}"
        )));
    }
    let request = with_request
        .then(|| row.request.clone().map(|r| r.0))
        .flatten();
    let mut view = ExtractionView::from(row);
    view.request = request;
    Ok(Json(view))
}

/// One transition a job went through, as its log has it.
#[derive(Serialize, JsonSchema, sqlx::FromRow)]
#[schemars(rename = "TransitionLogEntry", deny_unknown_fields)]
pub(super) struct Logged {
    /// The transition's name (`mark_running`, `mark_succeeded`, …).
    transition: String,
    /// The fencing token (attempt) it ran under, if any.
    token: Option<i32>,
    /// When its transaction ran.
    at: DateTime<Utc>,
}

/// `GET /v1/extractions/{id}/transitions`: the job's transition log, oldest
/// first (who claimed it and when, each attempt and how it ended).
async fn transitions_of(
    caller: Caller,
    State(services): State<Services>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Json<Vec<Logged>>, ApiError> {
    caller.require(Scope::Read)?;
    let Path(id) = id?;
    owned(&services, &caller, id).await?;
    let log = sqlx::query_as::<_, Logged>(
        "SELECT transition::text AS transition, token, at FROM extraction_transitions
          WHERE extraction_id = $1 ORDER BY at, transition LIMIT 1000",
    )
    .bind(id)
    .fetch_all(&services.pool)
    .await
    .map_err(store::StoreError::from)?;
    Ok(Json(log))
}

/// Erases a finished job's request and results now (204); the job stays as
/// a tombstone without content, which `GET` and a replay of its key answer
/// 410. A job still queued or running (or whose bbox refinement is still to
/// run) answers 409: cancel it, or wait for it, first. Erasing again
/// answers 204 again.
async fn erase(
    caller: Caller,
    State(services): State<Services>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    caller.require(Scope::Delete)?;
    let Path(id) = id?;
    match retention::erase(&services.pool, caller.tenant_id, id).await? {
        Erased::Now(row, files) => {
            services.metrics.transition(Transition::Erase, &Some(&row));
            // The job's file is content too: gone now unless another job
            // names it. Left behind by a failure here, collection takes it
            // after its grace.
            if let Err(e) = services.files.forget(caller.tenant_id, &files).await {
                tracing::warn!(%id, error = %e, "an erased job's file was not deleted");
            }
            let emitted = services
                .jobs
                .emit(Transition::Erase, &row, None, PublishReason::Submit);
            if let Err(e) = emitted.await {
                tracing::warn!(%id, error = %e, "lifecycle event not published");
            }
            tracing::info!(%id, "job content erased on request");
            Ok(StatusCode::NO_CONTENT)
        }
        Erased::Already => Ok(StatusCode::NO_CONTENT),
        Erased::NotFinished(row) => {
            let bbox = row
                .bbox_status
                .map(|b| format!(", its bbox refinement {b}"));
            Err(ApiError::Conflict(format!(
                "the job is {}{}; cancel it or wait for it to finish, then erase it",
                row.status,
                bbox.unwrap_or_default()
            )))
        }
        Erased::NotFound => Err(ApiError::NotFound(id.to_string())),
    }
}

/// The caller's tenant's job `id`; another tenant's job is not found, so its
/// existence is never revealed.
async fn owned(services: &Services, caller: &Caller, id: Uuid) -> Result<Extraction, ApiError> {
    store::get_for_tenant(&services.pool, caller.tenant_id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))
}

/// Sends a failed job back to the queue with a fresh attempt budget (200,
/// the job as it is now); a job that is not failed answers 409.
async fn retry(
    caller: Caller,
    State(services): State<Services>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Json<ExtractionView>, ApiError> {
    caller.require(Scope::Cancel)?;
    let Path(id) = id?;
    // A job never changes tenant, so checking its owner first is race-free.
    let job = owned(&services, &caller, id).await?;
    if let Some(at) = job.erased_at {
        return Err(ApiError::Gone(format!(
            "extraction {id} was erased at {at}"
        )));
    }
    if services.jobs.retry_failed(id).await?.is_none() {
        return Err(ApiError::Conflict(format!(
            "only a failed job can be retried; this one is {}",
            job.status
        )));
    }
    Ok(Json(owned(&services, &caller, id).await?.into()))
}

/// Cancels a queued job at once (200). A running job is asked to stop: its
/// holder sees the request at its next heartbeat and cancels it (202).
async fn cancel(
    caller: Caller,
    State(services): State<Services>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Cancel)?;
    let Path(id) = id?;
    // A job never changes tenant, so checking its owner first is race-free.
    owned(&services, &caller, id).await?;
    match services.jobs.cancel(id).await? {
        Cancel::Cancelled(row) => {
            return Ok((StatusCode::OK, Json(ExtractionView::from(row))).into_response())
        }
        Cancel::Requested(row) => {
            return Ok((StatusCode::ACCEPTED, Json(ExtractionView::from(row))).into_response())
        }
        Cancel::Neither => {}
    }
    match store::get(&services.pool, id).await? {
        None => Err(ApiError::NotFound(id.to_string())),
        Some(row) if row.status == ExtractionStatus::Running => {
            Ok((StatusCode::ACCEPTED, Json(ExtractionView::from(row))).into_response())
        }
        Some(row) => Err(ApiError::Conflict(format!(
            "extraction is {}; only a queued or running extraction can be cancelled",
            row.status
        ))),
    }
}
