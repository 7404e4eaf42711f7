//! `/v1/extractions`: submit (idempotent), read, cancel.

mod submit;

pub(super) use submit::Accepted;

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::describe;
use super::ApiError;
use crate::api::state::Api;
use crate::auth::Caller;
use crate::config::Settings;
use crate::domain::{ExtractionRequest, ExtractionStatus, Priority, Scope};
use crate::extract::ExtractionOutput;
use crate::pipeline::jobs::Cancel;
use crate::store::retention::Erased;
use crate::store::transitions::{self, Logged};
use crate::store::{self, BboxRefinement, Extraction};

/// Submit, read, retry, cancel and erase, each with its contract. A submit
/// may carry a file: its own body limit is large enough for one, and a JSON
/// body is held to the API's own limit (`upload`).
pub(super) fn routes(settings: &Settings) -> ApiRouter<Api> {
    let limit = DefaultBodyLimit::max(super::state::multipart_limit(settings));
    ApiRouter::new()
        .api_route(
            "/v1/extractions",
            post_with(submit::submit, |op| submit::describe(op, settings)).layer(limit),
        )
        .api_route(
            "/v1/extractions/{id}",
            get_with(read, describe_read).delete_with(erase, describe_erase),
        )
        .api_route(
            "/v1/extractions/{id}/cancel",
            post_with(cancel, describe_cancel),
        )
        .api_route(
            "/v1/extractions/{id}/retry",
            post_with(retry, describe_retry),
        )
        .api_route(
            "/v1/extractions/{id}/transitions",
            get_with(transitions_of, describe_transitions),
        )
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

async fn read(
    caller: Caller,
    State(api): State<Api>,
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
    let row = owned(&api, &caller, id).await?;
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

fn describe_read(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getExtraction",
        "extractions",
        "Read an extraction",
        "The job (scope `read`): its status, attempts, timestamps, result, error and bbox \
         refinement. The document itself is not echoed. Another tenant's job is not \
         found, exactly like one that does not exist. A job whose content was erased \
         answers 410.",
    );
    let include = describe::query_parameter(
        "include",
        false,
        "`request`: the job with its request as submitted (document, fields, metadata).",
        json!({"type": "string", "enum": ["request"]}),
    );
    let op = describe::parameters(op, [describe::id_parameter(), include]);
    let op = op.response_with::<200, Json<ExtractionView>, _>(|answer| {
        let answer = answer.description("The job.");
        describe::links(answer, &[("CancelExtraction", "cancelExtraction")])
    });
    describe::refusals(op, &[400, 403, 404, 410])
}

/// `GET /v1/extractions/{id}/transitions`: the job's transition log, oldest
/// first (who claimed it and when, each attempt and how it ended).
async fn transitions_of(
    caller: Caller,
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Json<Vec<Logged>>, ApiError> {
    caller.require(Scope::Read)?;
    let Path(id) = id?;
    owned(&api, &caller, id).await?;
    Ok(Json(transitions::log_of(&api.pool, id).await?))
}

fn describe_transitions(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getExtractionTransitions",
        "extractions",
        "Read an extraction's transition log",
        "Every transition the job went through, oldest first (scope `read`): its \
         submit, each claim with its attempt, each ending. At most 1,000.",
    );
    let op = describe::parameters(op, [describe::id_parameter()]);
    let op = op.response_with::<200, Json<Vec<Logged>>, _>(|a| a.description("The log."));
    describe::refusals(op, &[400, 403, 404])
}

/// Erases a finished job's request and results now (204); the job stays as
/// a tombstone without content, which `GET` and a replay of its key answer
/// 410. A job still queued or running (or whose bbox refinement is still to
/// run) answers 409: cancel it, or wait for it, first. Erasing again
/// answers 204 again.
async fn erase(
    caller: Caller,
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    caller.require(Scope::Delete)?;
    let Path(id) = id?;
    match api.jobs.erase(caller.tenant_id, id).await? {
        Erased::Now(_, files) => {
            // The job's file is content too: gone now unless another job
            // names it. Left behind by a failure here, collection takes it
            // after its grace.
            if let Err(e) = api.files.forget(caller.tenant_id, &files).await {
                tracing::warn!(%id, error = %e, "an erased job's file was not deleted");
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

fn describe_erase(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "eraseExtraction",
        "extractions",
        "Erase an extraction",
        "Erases a finished job's content now (scope `delete`): its request (document, \
         fields, metadata, webhook URL), its results, its error texts and its webhook \
         deliveries. The job stays as a tombstone without content: `GET` answers 410, \
         the list shows it with `erased_at`, and a submit that repeats its \
         `Idempotency-Key` answers 410 instead of making the job again. A job still \
         queued or running, or whose bbox refinement has yet to run, answers 409: \
         cancel it (or wait for it) first. Erasing an erased job answers 204 again. \
         Copies on Kafka topics (events, which carry errors but never documents or \
         results, and dead letters' excerpts) expire with the topics' retention.",
    );
    let op = describe::parameters(op, [describe::id_parameter()]);
    let op = describe::raw_answer(op, 204, json!({"description": "Erased (now or before)."}));
    describe::refusals(op, &[400, 403, 404, 409])
}

/// The caller's tenant's job `id`; another tenant's job is not found, so its
/// existence is never revealed.
async fn owned(api: &Api, caller: &Caller, id: Uuid) -> Result<Extraction, ApiError> {
    store::get_for_tenant(&api.pool, caller.tenant_id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))
}

/// Sends a failed job back to the queue with a fresh attempt budget (200,
/// the job as it is now); a job that is not failed answers 409.
async fn retry(
    caller: Caller,
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Json<ExtractionView>, ApiError> {
    caller.require(Scope::Cancel)?;
    let Path(id) = id?;
    // A job never changes tenant, so checking its owner first is race-free.
    let job = owned(&api, &caller, id).await?;
    if let Some(at) = job.erased_at {
        return Err(ApiError::Gone(format!(
            "extraction {id} was erased at {at}"
        )));
    }
    if api.jobs.retry_failed(id).await?.is_none() {
        return Err(ApiError::Conflict(format!(
            "only a failed job can be retried; this one is {}",
            job.status
        )));
    }
    Ok(Json(owned(&api, &caller, id).await?.into()))
}

fn describe_retry(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "retryExtraction",
        "extractions",
        "Retry a failed extraction",
        "Sends a failed job back to the queue (scope `cancel`), with a fresh budget of \
         attempts: it runs again as if just submitted, and its `attempts` keep counting. \
         The retry is logged as the transition `retry_failed` and published as every \
         transition is. A job that is not failed answers 409 and is left as it is; an \
         erased one 410.",
    );
    let op = describe::parameters(op, [describe::id_parameter()]);
    let op = op.response_with::<200, Json<ExtractionView>, _>(|answer| {
        let answer = answer.description("Retried: the job as it is now (queued).");
        describe::links(answer, &[("GetExtraction", "getExtraction")])
    });
    describe::refusals(op, &[400, 403, 404, 409, 410])
}

/// Cancels a queued job at once (200). A running job is asked to stop: its
/// holder sees the request at its next heartbeat and cancels it (202).
async fn cancel(
    caller: Caller,
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Cancel)?;
    let Path(id) = id?;
    // A job never changes tenant, so checking its owner first is race-free.
    owned(&api, &caller, id).await?;
    match api.jobs.cancel(id).await? {
        Cancel::Cancelled(row) => {
            return Ok((StatusCode::OK, Json(ExtractionView::from(row))).into_response())
        }
        Cancel::Requested(row) => {
            return Ok((StatusCode::ACCEPTED, Json(ExtractionView::from(row))).into_response())
        }
        Cancel::Neither => {}
    }
    match store::get(&api.pool, id).await? {
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

fn describe_cancel(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "cancelExtraction",
        "extractions",
        "Cancel an extraction",
        "Cancels a job (scope `cancel`). A queued job is cancelled at once (200); a \
         running one is asked to stop, and its holder cancels it at its next heartbeat \
         (202). A finished job answers 409.",
    );
    let op = describe::parameters(op, [describe::id_parameter()]);
    let op = op.response_with::<200, Json<ExtractionView>, _>(|answer| {
        let answer = answer.description("Cancelled: the job as it is now.");
        describe::links(answer, &[("GetExtraction", "getExtraction")])
    });
    let op = op.response_with::<202, Json<ExtractionView>, _>(|answer| {
        let answer = answer.description("Running: cancellation requested (`cancel_requested_at`).");
        describe::links(answer, &[("GetExtraction", "getExtraction")])
    });
    describe::refusals(op, &[400, 403, 404, 409])
}
