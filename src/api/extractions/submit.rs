//! `POST /v1/extractions`: a submit, admitted by the process's admission
//! limit once its caller is known and before its body is read (a multipart
//! submit once its file is stored), then written and handed over.

use std::sync::{Arc, Mutex};

use aide::transform::TransformOperation;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use crate::admission::Permit;
use crate::api::describe;
use crate::api::state::Api;
use crate::api::uploads::Uploads;
use crate::api::ApiError;
use crate::auth::Caller;
use crate::config::Settings;
use crate::domain::{ExtractionRequest, ExtractionStatus};
use crate::store::NewExtraction;

/// The answer to a submit.
#[derive(Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(crate) struct Accepted {
    id: Uuid,
    /// `queued` for a new job; a repeated key answers its job's status.
    status: ExtractionStatus,
}

/// How long a refused submit's body may take to arrive before the refusal
/// is sent without it (and the connection closed).
const REFUSED_BODY_READ: std::time::Duration = std::time::Duration::from_millis(50);

/// Lets a submit in if the process has room for it, else answers 503
/// `overloaded` at once. Room is the process's admission limit, shared by
/// the tenants' weights (`admission`): the caller is known first (from the
/// key cache, as a rule). The admitted submit carries its permit (an
/// [`Admitted`]), which it marks when its row is durable. A multipart
/// submit goes in without one: it takes its permit once its file is stored
/// ([`Admitted::readmit`]).
pub(super) async fn submit(
    State(api): State<Api>,
    Extension(uploads): Extension<Uploads>,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let caller = match Caller::from_request_parts(&mut parts, &api).await {
        Ok(caller) => caller,
        Err(refused) => return refused.into_response(),
    };
    let admission = &api.admission;
    let permit = match crate::api::upload::is_multipart(&parts.headers) {
        true => Some(None),
        false => admission.try_admit(caller.tenant_id).map(Some),
    };
    let request = Request::from_parts(parts, body);
    let response = match permit {
        Some(permit) => {
            let admitted = Admitted(Arc::new(Mutex::new(permit)));
            let accepted = accept(&admitted, &uploads, &caller, &api, request).await;
            // Answered without a row (refused, unauthenticated, failed):
            // the whole request was its work. A no-op if its row was durable.
            admitted.durable();
            accepted.into_response()
        }
        None => {
            // The body is read (it is in the socket already, as a rule) and
            // dropped: a body left unread closes the connection, and a
            // client turned away would pay for a new one on its retry.
            let limit = api.settings.body_limit;
            let body = axum::body::to_bytes(request.into_body(), limit);
            let _ = tokio::time::timeout(REFUSED_BODY_READ, body).await;
            overloaded(&api).into_response()
        }
    };
    let (limit, in_flight) = admission.snapshot();
    let http = &api.metrics.http;
    http.admission_limit.set(limit as i64);
    http.submits_in_flight.set(in_flight as i64);
    response
}

/// An admitted submit's permit, while it holds one; it leaves the limit
/// when the request is done.
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
    fn readmit(&self, api: &Api, tenant: Uuid) -> Result<(), ApiError> {
        let mut permit = self.permit();
        if permit.is_some() {
            return Ok(());
        }
        *permit = api.admission.try_admit(tenant);
        match permit.is_some() {
            true => Ok(()),
            false => Err(overloaded(api)),
        }
    }
}

/// A submit refused for want of room, counted.
fn overloaded(api: &Api) -> ApiError {
    api.metrics.http.overload_rejections.inc();
    let message = "this server has no room for another submit now; retry shortly";
    ApiError::Overloaded(message.into())
}

/// The admitted submit: its quotas, its request (its file stored first),
/// its row and its hand-over. 202 with the job once its row is durable.
async fn accept(
    admitted: &Admitted,
    uploads: &Uploads,
    caller: &Caller,
    api: &Api,
    body: Request,
) -> Result<Response, ApiError> {
    let max_open_jobs = crate::api::auth::admit_submit(api, caller)?;
    let headers = body.headers().clone();
    let moving = || admitted.set_aside();
    let request = crate::api::upload::submitted(api, uploads, caller, body, moving).await?;
    admitted.readmit(api, caller.tenant_id)?;
    // A header that is not text is no key: it is refused as an empty one.
    let idempotency_key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let tenant = (caller.tenant_id, max_open_jobs);
    let limits = api.settings.request_limits;
    api.submitter.learn_patterns(&request).await;
    let new = NewExtraction::checked(tenant, idempotency_key, request, &limits)
        .map_err(|refused| ApiError::refused(refused, "Idempotency-Key"))?;
    let submitted = api.submitter.submit(new, || admitted.durable()).await?;
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

/// The submit's contract. Its handler reads the request itself (to admit
/// it before its body), so its key and body are named here.
pub(super) fn describe<'t>(
    op: TransformOperation<'t>,
    settings: &Settings,
) -> TransformOperation<'t> {
    let description = format!(
        "Submits one extraction job (scope `submit`). It is answered 202 once the job's \
         row is committed; the job's event follows (the reaper republishes it if the \
         broker was away). With an `Idempotency-Key`, a repeat of the same request answers \
         the first job (with its current status) instead of making a second one; the \
         same key with another request gets 422, and the key of a job that was erased \
         410. Keys are unique within a tenant, and remembered until their job is purged \
         (`DOCSTREAM_RETENTION_DAYS` after it finished).\n\n\
         Past the tenant's submit rate or its cap on open jobs the answer is 429 with \
         `Retry-After`, and nothing is written. When this server has no room for another \
         submit the answer is 503 with code `overloaded`, at once. A JSON body is at most \
         {body} bytes.\n\n\
         The document may also come as a file: `multipart/form-data` with a part \
         `request` (the JSON request without `document`) and a part `file` (at most \
         {file} bytes; a PDF, PNG, JPEG, TIFF or text file, known by its bytes). The \
         file is stored as `POST /v1/files` stores it and the job names it \
         (`document.object`), so the same key with the same file is the same job. A \
         refused request part stores nothing.\n\n\
         A multipart submit, or one whose `document.url` is fetched, is an upload: \
         past the tenant's uploads in progress on this server ({uploads}, \
         `DOCSTREAM_TENANT_MAX_UPLOADS`) it gets 429 with `Retry-After`; a body that \
         does not arrive whole within {timeout} s (`DOCSTREAM_HTTP_BODY_TIMEOUT_S`) \
         gets 408. A `Content-Length` past the limit gets 413 before a byte is read.",
        body = settings.http_body_limit_bytes,
        file = settings.file_max_bytes,
        uploads = settings.tenant_max_uploads,
        timeout = settings.http_body_timeout_s.get().as_secs_f64(),
    );
    let op = describe::operation(
        op,
        "submitExtraction",
        "extractions",
        "Submit an extraction",
        &description,
    );
    // The multipart form is described in prose (above) only: the fuzzer
    // would send schema-valid forms whose parts the schema cannot make
    // valid requests of.
    let op = op.input::<Caller>().input::<Json<ExtractionRequest>>();
    let op = describe::body_described(
        op,
        "The job. A body that is not JSON gets 400, one without \
         `Content-Type: application/json` 415, one that does not describe a valid \
         request 422.",
    );
    let op = describe::parameters(op, [describe::idempotency_key_header("submit")]);
    let op = op.response_with::<202, Json<Accepted>, _>(|answer| {
        let answer = answer.description("Accepted: the job is durable. `Location` names it.");
        let answer = describe::with_header(
            answer,
            "Location",
            "`/v1/extractions/{id}`.",
            json!({"type": "string", "pattern": "^/v1/extractions/[0-9a-f-]{36}$"}),
        );
        describe::links(
            answer,
            &[
                ("GetExtraction", "getExtraction"),
                ("CancelExtraction", "cancelExtraction"),
            ],
        )
    });
    describe::refusals(op, &[400, 403, 408, 410, 413, 415, 422, 429, 503])
}
