//! `POST /v1/extractions/{id}/result`: where an extraction service that
//! answered a call with 202 posts the result later. The bearer token it got
//! with the call names the job and the attempt; the result ends that attempt
//! the way the worker ends one it ran (the same fenced transitions), so a
//! result for an attempt that no longer holds the job changes nothing.
//!
//! Body: the 200 answer of the extractor protocol, `{"fields": {…}}`, or a
//! failure, `{"error": "…", "retryable": false}`.

use aide::axum::routing::post_with;
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::describe;
use super::ApiError;
use crate::config::Settings;
use crate::domain::{ExtractionRequest, ExtractionStatus, ResultLimits};
use crate::events::PublishReason;
use crate::extract::{
    check_required, deferred, protocol, ExtractError, ExtractionOutput, ResultSize,
};

use super::state::Api;
use crate::pipeline::JobError;
use crate::store;

pub(super) fn routes(settings: &Settings) -> ApiRouter<Api> {
    ApiRouter::new().api_route(
        "/v1/extractions/{id}/result",
        post_with(post_result, |op| describe_result(op, settings)),
    )
}

/// What a deferred result did to the job.
#[derive(Serialize, schemars::JsonSchema)]
#[schemars(rename = "ResultRecorded", deny_unknown_fields)]
pub(super) struct Recorded {
    id: Uuid,
    #[schemars(extend("enum" = ["succeeded", "retried", "failed"]))]
    status: &'static str,
}

/// A posted failure.
#[derive(serde::Deserialize)]
struct Failure {
    error: String,
    #[serde(default)]
    retryable: bool,
}

/// Results continue the path of the submitted job: they are not a retry, a
/// reaper's or an operator's doing.
const REASON: PublishReason = PublishReason::Submit;

async fn post_result(
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Recorded>, ApiError> {
    let Path(id) = id?;
    // The token first: a caller without one is not worth reading a body of
    // up to the limit for.
    let attempt = authorised_attempt(&api, id, &headers)?;
    let limit = api.settings.body_limit;
    let body = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(limit))?;
    let row = store::get(&api.pool, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    if row.status != ExtractionStatus::Running || row.attempts != attempt {
        return Err(ApiError::Conflict(format!(
            "attempt {attempt} no longer holds this extraction (it is {}, attempt {})",
            row.status, row.attempts
        )));
    }
    let claim = (id, attempt);
    if row.cancel_requested_at.is_some() {
        api.jobs
            .cancel_running_extraction(claim, REASON)
            .await
            .map_err(unavailable)?;
        return Err(ApiError::Conflict("the extraction was cancelled".into()));
    }
    let request = row
        .request()
        .ok_or_else(|| ApiError::Internal("the row was read without its request".into()))?;
    end(&api, claim, row.attempts_base, request, &body).await
}

/// The deferred result's contract: its token, its body (read as JSON
/// whatever it is declared as), its answers.
fn describe_result<'t>(op: TransformOperation<'t>, settings: &Settings) -> TransformOperation<'t> {
    let description = format!(
        "Where an extraction service that answered a call with 202 posts the result \
         later, with the bearer token it got with the call (it names the job and the \
         attempt; API keys are not accepted here). The body is the extractor protocol's \
         200 answer, `{{\"fields\": {{…}}}}`, or a failure, `{{\"error\": \"…\", \
         \"retryable\": false}}`; it is read as JSON whatever its `Content-Type`, and is \
         at most {body} bytes. A result for an attempt that no longer holds the job (it \
         finished, was retried or cancelled) gets 409 and changes nothing. When \
         deferred results are off (`DOCSTREAM_PUBLIC_URL` or `DOCSTREAM_CALLBACK_SECRET` \
         unset) every call gets 401.",
        body = settings.http_body_limit_bytes,
    );
    let mut op = describe::operation(
        op,
        "postExtractionResult",
        "extractors",
        "Post a deferred result",
        &description,
    );
    let token = aide::openapi::SecurityRequirement::from_iter([("ResultToken".to_owned(), vec![])]);
    op.inner_mut().security = vec![token];
    let op = describe::parameters(op, [describe::id_parameter()]);
    let op = describe::raw_body(
        op,
        json!({
            "required": true,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DeferredResult"}}},
        }),
    );
    let op = op.response_with::<200, Json<Recorded>, _>(|a| {
        a.description("What the result did to the job.")
    });
    describe::refusals(op, &[400, 401, 404, 409, 422])
}

/// The attempt the bearer token was issued for, if it is this job's.
fn authorised_attempt(api: &Api, id: Uuid, headers: &HeaderMap) -> Result<i32, ApiError> {
    let Some(secret) = &api.settings.callback_secret else {
        return Err(ApiError::Unauthorized(
            "deferred results are off in this deployment".into(),
        ));
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    token
        .and_then(|token| deferred::verify(secret, id, token))
        .ok_or_else(|| {
            ApiError::Unauthorized("missing or wrong result token for this extraction".into())
        })
}

/// How a posted result ends its attempt.
enum Ending {
    /// The values, and for a file the document the provider read.
    Succeed(ExtractionOutput, Option<crate::domain::Document>),
    Retry(String),
    Fail(String),
}

/// What `body` says of the attempt: a 422 when it is neither a result nor a
/// failure. A result past `limits` fails the job, as from any extractor.
fn read_ending(
    request: &ExtractionRequest,
    body: &[u8],
    limits: ResultLimits,
) -> Result<Ending, ApiError> {
    let name = request.extractor_name();
    if let Ok(Failure { error, retryable }) = serde_json::from_slice::<Failure>(body) {
        let error = protocol::shortened(error);
        return Ok(match retryable {
            true => Ending::Retry(
                ExtractError::Unavailable(format!("extractor {name:?}: {error}")).to_string(),
            ),
            false => Ending::Fail(
                ExtractError::Refused {
                    extractor: name.to_owned(),
                    message: error,
                }
                .to_string(),
            ),
        });
    }
    let words = request.document.words().len();
    let file = request.document.object.is_some();
    let (output, read) = protocol::read_result(body, request, words, file).map_err(|reason| {
        ApiError::Unprocessable(format!(
            "expected {{\"fields\": …}} or {{\"error\": …}}: {reason}"
        ))
    })?;
    let checked = ResultSize::check(&output, limits).and(check_required(request, &output));
    Ok(match checked {
        Ok(()) => Ending::Succeed(output, read),
        Err(refused) => Ending::Fail(refused.to_string()),
    })
}

/// Ends attempt `claim` (of the job's run since `base`) with what `body` says.
async fn end(
    api: &Api,
    claim: (Uuid, i32),
    base: i32,
    request: &ExtractionRequest,
    body: &[u8],
) -> Result<Json<Recorded>, ApiError> {
    let limits = api.extractors.result_limits();
    let (won, status) = match read_ending(request, body, limits)? {
        Ending::Succeed(output, read) => {
            let kept = match &read {
                Some(document) => crate::store::documents::keep(&api.pool, claim, document)
                    .await
                    .map_err(|e| unavailable(e.into()))?,
                None => true,
            };
            let succeeded = match kept {
                true => api.jobs.succeed_extraction(claim, &output, REASON).await,
                false => Ok(false),
            };
            (succeeded, "succeeded")
        }
        Ending::Retry(error) => (
            api.jobs
                .retry_or_fail_extraction(claim, &error, REASON)
                .await,
            // The last attempt's failure fails the job instead.
            match claim.1 - base >= api.settings.max_attempts {
                true => "failed",
                false => "retried",
            },
        ),
        Ending::Fail(error) => (
            api.jobs.fail_extraction(claim, &error, REASON).await,
            "failed",
        ),
    };
    match won.map_err(unavailable)? {
        true => Ok(Json(Recorded {
            id: claim.0,
            status,
        })),
        false => Err(ApiError::Conflict(format!(
            "attempt {} no longer holds this extraction",
            claim.1
        ))),
    }
}

/// A deferred result that was not recorded: whatever the cause, the
/// provider posts it again.
fn unavailable(e: JobError) -> ApiError {
    tracing::warn!(error = %e, "deferred result not recorded");
    ApiError::Unavailable("the result could not be recorded now; post it again".into())
}
