//! Review: a person with the `review` scope corrects a value of a succeeded
//! job (`POST /v1/extractions/{id}/fields/{field}/corrections`), most often
//! one flagged `needs_review`; anyone who may read the job reads its
//! corrections (`GET /v1/extractions/{id}/corrections`). The extracted value
//! is never overwritten: the correction is stored beside it
//! (`store::corrections`), logged as the transition `correct_field`,
//! announced on the events topic (so on the export stream) with what was
//! corrected, and to the job's webhook as `extraction.field_corrected`.

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::http::Uri;
use axum::Json;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::describe;
use super::state::Api;
use super::ApiError;
use crate::auth::Caller;
use crate::domain::{ExtractionStatus, Scope};
use crate::store::corrections::{self, Corrected, Correction, NewCorrection};
use crate::store::{self, Extraction};

/// Longest reviewer name, in bytes.
const MAX_REVIEWER_BYTES: usize = 200;

pub(super) fn routes() -> ApiRouter<Api> {
    ApiRouter::new()
        .api_route(
            "/v1/extractions/{id}/fields/{field}/corrections",
            post_with(correct, describe_correct),
        )
        .api_route(
            "/v1/extractions/{id}/corrections",
            get_with(corrections_of, describe_corrections),
        )
}

/// A correction's body.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "CorrectionRequest", deny_unknown_fields)]
#[serde(deny_unknown_fields)]
pub(super) struct CorrectionRequest {
    /// The right value (at most the result's limit of bytes per field), or
    /// null when the document does not hold the field. Required.
    #[schemars(with = "Option<String>")]
    value: serde_json::Value,
    /// Who reviewed it, as the console or the caller names them (at most
    /// 200 bytes): the key says which key, this which person.
    #[serde(default)]
    #[schemars(length(max = 200))]
    reviewer: Option<String>,
}

/// Stores a correction of field `field` of job `id` (201, the correction).
/// A job of another tenant is not found; an erased one is gone (410); one
/// that has not succeeded has no value to correct (409); a field its
/// request did not name, or a value that is not text or null, is refused
/// (422).
async fn correct(
    caller: Caller,
    State(api): State<Api>,
    path: Result<Path<(Uuid, String)>, PathRejection>,
    body: Result<Json<CorrectionRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<Correction>), ApiError> {
    caller.require(Scope::Review)?;
    let Path((id, field)) = path?;
    let limit = api.settings.body_limit;
    let Json(body) = body.map_err(|e| ApiError::from_json_rejection(e, limit))?;
    let value = match &body.value {
        serde_json::Value::String(value) => Some(value.as_str()),
        serde_json::Value::Null => None,
        _ => {
            return Err(ApiError::Unprocessable(
                "value must be a string, or null when the document does not hold the field".into(),
            ))
        }
    };
    let limit = api.extractors.result_limits().field_bytes;
    let storable = |text: &str| !text.contains('\0');
    if value.is_some_and(|v| v.len() > limit || !storable(v)) {
        return Err(ApiError::Unprocessable(format!(
            "value must be at most {limit} bytes of text without NUL characters"
        )));
    }
    let reviewer = body.reviewer.as_deref();
    if reviewer.is_some_and(|r| r.len() > MAX_REVIEWER_BYTES || !storable(r)) {
        return Err(ApiError::Unprocessable(format!(
            "reviewer must be at most {MAX_REVIEWER_BYTES} bytes of text without NUL characters"
        )));
    }
    let rate = api.settings.corrections_per_key_per_min;
    let burst = (rate / 10).max(1);
    let taken = api
        .correction_rates
        .take(caller.key_id, f64::from(rate) / 60.0, burst);
    taken.map_err(|wait| ApiError::TooManyRequests {
        message: format!(
            "this key made {rate} corrections a minute here, as many as it may \
             (DOCSTREAM_CORRECTIONS_PER_KEY_PER_MIN)"
        ),
        retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
    })?;
    let job = correctable(&api, &caller, id, &field).await?;
    let new = NewCorrection {
        extraction_id: id,
        tenant_id: caller.tenant_id,
        field: &field,
        value,
        key_id: caller.key_id,
        reviewer,
    };
    // Between the check and the statement the job may have been erased;
    // the statement judges again, and its refusal is told as the check's.
    let made = match corrections::correct(&api.pool, &new, api.settings.corrections).await? {
        Corrected::Made(made) => made,
        Corrected::NoJob => {
            correctable(&api, &caller, id, &field).await?;
            return Err(ApiError::Conflict(
                "the job changed while it was being corrected; try again".into(),
            ));
        }
        Corrected::FieldFull(cap) => {
            return Err(ApiError::Conflict(format!(
                "field {field:?} of this job has {cap} corrections, as many as a field may \
                 (DOCSTREAM_MAX_CORRECTIONS_PER_FIELD)"
            )))
        }
        Corrected::JobFull(cap) => {
            return Err(ApiError::Conflict(format!(
                "this job has {cap} corrections, as many as a job may \
                 (DOCSTREAM_MAX_CORRECTIONS_PER_JOB)"
            )))
        }
        Corrected::OverQuota { used, quota } => {
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "the tenant keeps {used} bytes of files, documents and corrections; with \
                     this correction it would pass its quota of {quota} bytes \
                     (DOCSTREAM_TENANT_MAX_FILE_BYTES)"
                ),
                retry_after_s: 3600,
            })
        }
    };
    api.jobs.corrected(&job, &made).await;
    let correction = made.correction;
    tracing::info!(%id, field = %correction.field, correction = correction.id, "value corrected");
    Ok((StatusCode::CREATED, Json(correction)))
}

fn describe_correct(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "correctExtractionField",
        "extractions",
        "Correct an extracted value",
        "A person's review of a succeeded job's value (scope `review`), most often one \
         flagged `needs_review`. The correction is stored beside the extracted value, \
         which stays in the result as the extractor gave it; it is logged as the \
         transition `correct_field`, published on the events topic (and so the export \
         stream) with what was corrected, and sent to the job's webhook as \
         `extraction.field_corrected`. A later correction of the same field supersedes \
         it. A job that has not succeeded answers 409; an erased one 410; a field the \
         request did not name 422. A field has at most `DOCSTREAM_MAX_CORRECTIONS_PER_FIELD` \
         corrections and a job `DOCSTREAM_MAX_CORRECTIONS_PER_JOB` (409 past them); a key \
         makes at most `DOCSTREAM_CORRECTIONS_PER_KEY_PER_MIN` a minute on a server, and \
         a correction's bytes count toward the tenant's storage quota (429 with \
         `Retry-After` past either). The events topic names the corrected field, never \
         its value.",
    );
    let field = describe::path_parameter(
        "field",
        "The field's name, as the request gave it.",
        json!({"type": "string", "minLength": 1}),
    );
    let op = describe::parameters(op, [describe::id_parameter(), field]);
    let op = describe::body_described(
        op,
        "The corrected value. A body that is not JSON gets 400, one without \
         `Content-Type: application/json` 415, one that does not describe a \
         correction 422.",
    );
    let op = op.response_with::<201, Json<Correction>, _>(|a| a.description("Stored."));
    describe::refusals(op, &[400, 403, 404, 409, 410, 415, 422, 429])
}

/// The caller's job `id`, if its field `field` can be corrected now.
async fn correctable(
    api: &Api,
    caller: &Caller,
    id: Uuid,
    field: &str,
) -> Result<Extraction, ApiError> {
    let job = store::get_for_tenant(&api.pool, caller.tenant_id, id).await?;
    let job = job.ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    if let Some(at) = job.erased_at {
        return Err(ApiError::Gone(format!(
            "extraction {id} was erased at {at}"
        )));
    }
    if job.status != ExtractionStatus::Succeeded {
        return Err(ApiError::Conflict(format!(
            "only a succeeded job's values can be corrected; this one is {}",
            job.status
        )));
    }
    if !corrections::request_names(&api.pool, id, field).await? {
        return Err(ApiError::Unprocessable(format!(
            "the job's request names no field {field:?}"
        )));
    }
    Ok(job)
}

/// A page of a job's corrections: after which, and how many.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Page {
    #[serde(default)]
    after: i64,
    #[serde(default = "whole_page")]
    limit: i64,
}

fn whole_page() -> i64 {
    corrections::MAX_PAGE
}

/// Job `id`'s corrections, oldest first, a page at a time (`after` the
/// last one seen, at most `limit`): the latest of a field is its value now.
async fn corrections_of(
    caller: Caller,
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
    uri: Uri,
) -> Result<Json<Vec<Correction>>, ApiError> {
    caller.require(Scope::Read)?;
    let Path(id) = id?;
    // Read here, not by an extractor: the parameters are described by hand.
    let page = Query::<Page>::try_from_uri(&uri);
    let Query(page) = page.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let max = corrections::MAX_PAGE;
    if !(1..=max).contains(&page.limit) || page.after < 0 {
        return Err(ApiError::BadRequest(format!(
            "limit must be 1 to {max}, and after a correction's id (0 or more)"
        )));
    }
    let job = store::get_for_tenant(&api.pool, caller.tenant_id, id).await?;
    let job = job.ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    if let Some(at) = job.erased_at {
        return Err(ApiError::Gone(format!(
            "extraction {id} was erased at {at}"
        )));
    }
    let listed = corrections::of_job(&api.pool, id, page.after, page.limit).await?;
    Ok(Json(listed))
}

fn describe_corrections(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getExtractionCorrections",
        "extractions",
        "Read an extraction's corrections",
        "The corrections of the job's values, oldest first (scope `read`): the latest of \
         a field is its value now. A page at a time: at most `limit`, after the correction \
         of id `after`; pass the last id of a page as `after` for the next, until a page \
         has fewer than `limit`.",
    );
    let after = describe::query_parameter(
        "after",
        false,
        "The id of the last correction seen: the page starts after it (0, the default: from the first).",
        json!({"type": "integer", "format": "int64", "minimum": 0, "default": 0}),
    );
    let limit = describe::query_parameter(
        "limit",
        false,
        "Most corrections on the page.",
        json!({"type": "integer", "minimum": 1, "maximum": corrections::MAX_PAGE, "default": corrections::MAX_PAGE}),
    );
    let op = describe::parameters(op, [describe::id_parameter(), after, limit]);
    let op =
        op.response_with::<200, Json<Vec<Correction>>, _>(|a| a.description("The corrections."));
    describe::refusals(op, &[400, 403, 404, 410])
}
