//! `POST /v1/files`: a tenant uploads a document as its bytes (the body);
//! `GET /v1/files/{id}`: what it uploaded. The file is stored once per
//! tenant under its content's SHA-256 (`files`), so uploading the same bytes
//! again answers the same file (200 instead of 201).
//!
//! `GET /v1/extractions/{id}/file`: a job's file, for the extractor of
//! protocol version 2 that got the signed URL (`files::signed`): no API
//! key, the signature is the credential, for one attempt of one job while
//! that attempt runs, and until it expires (410 once the attempt ended).
//!
//! `GET /v1/extractions/{id}/document`: the words a job was read from, on
//! their pages (for a file, what its extraction read, OCR's confidence
//! included); `GET /v1/extractions/{id}/pages/{page}`: a page of its file
//! as an image, for people to check a box against (the console).

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;
use uuid::Uuid;

use super::describe;
use super::state::Api;
use super::uploads::{self, Uploads};
use super::ApiError;
use crate::auth::Caller;
use crate::config::Settings;
use crate::domain::{ExtractionStatus, Scope};
use crate::files::signed::{self, Signed};
use crate::files::StoredFile;
use crate::store;

/// The routes that move a file's bytes, which take as long as the bytes
/// do. An upload is held to the bounds of uploads (`uploads`) and to the
/// file limit, not to the API's body limit.
pub(super) fn routes(settings: &Settings) -> ApiRouter<Api> {
    ApiRouter::new()
        .api_route(
            "/v1/files",
            post_with(upload, |op| describe_upload(op, settings)),
        )
        .api_route("/v1/files/{id}", get_with(read, describe_read))
        .api_route(
            "/v1/extractions/{id}/file",
            get_with(job_file, describe_job_file),
        )
}

/// The routes that read what a job was read from, answered within the
/// REST bound like every other: a page drawn past it is answered 503 and
/// kept for the retry (`files::drawn`).
pub(super) fn job_routes() -> ApiRouter<Api> {
    ApiRouter::new()
        .api_route(
            "/v1/extractions/{id}/document",
            get_with(job_document, describe_job_document),
        )
        .api_route(
            "/v1/extractions/{id}/pages/{page}",
            get_with(job_page, describe_job_page),
        )
}

/// The caller's job `id`, with its request, unless erased (410).
async fn readable_job(
    api: &Api,
    caller: &Caller,
    id: Uuid,
) -> Result<(store::Extraction, crate::domain::ExtractionRequest), ApiError> {
    caller.require(Scope::Read)?;
    let row = store::get_for_tenant(&api.pool, caller.tenant_id, id).await?;
    let mut row = row.ok_or_else(|| ApiError::NotFound(id.to_string()))?;
    if let Some(at) = row.erased_at {
        return Err(ApiError::Gone(format!(
            "extraction {id} was erased at {at}"
        )));
    }
    let request = row.request.take().map(|r| r.0);
    let request = request.ok_or_else(|| ApiError::NotFound(format!("{id} has no request")))?;
    Ok((row, request))
}

/// The document job `id` was read from: its request's, or for a file what
/// its extraction read (404 until it read it).
async fn job_document(
    caller: Caller,
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Json<crate::domain::Document>, ApiError> {
    let Path(id) = id?;
    let (_, request) = readable_job(&api, &caller, id).await?;
    if request.document.object.is_none() {
        return Ok(Json(request.document));
    }
    match store::documents::get(&api.pool, id).await? {
        Some(document) => Ok(Json(document)),
        None => Err(ApiError::NotFound(format!(
            "extraction {id} has not read its file yet"
        ))),
    }
}

fn describe_job_document(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getExtractionDocument",
        "extractions",
        "Read the document an extraction was read from",
        "The words the job's values were found in, on their pages (scope `read`): the \
         request's document, or for a file what its extraction read of it (a text \
         layer's words, or OCR's with their `confidence`). 404 until a file's extraction \
         read it; 410 once erased.",
    );
    let op = describe::parameters(op, [describe::id_parameter()]);
    let op = op
        .response_with::<200, Json<crate::domain::Document>, _>(|a| a.description("The document."));
    describe::refusals(op, &[400, 403, 404, 410])
}

/// Page `page` (from 0) of job `id`'s file as an image: a PNG's or JPEG's
/// own bytes, a PDF page rendered to a PNG. A job of no file, or a TIFF,
/// has no page to draw.
async fn job_page(
    caller: Caller,
    State(api): State<Api>,
    path: Result<Path<(Uuid, usize)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((id, page)) = path?;
    let (row, request) = readable_job(&api, &caller, id).await?;
    let Some(object) = request.document.object else {
        return Err(ApiError::NotFound(format!(
            "extraction {id} has no file: its document was sent as JSON"
        )));
    };
    let (kind, bytes) = api.files.page_image(row.tenant_id, &object, page).await?;
    let private = (header::CACHE_CONTROL, "private, max-age=300");
    Ok(([(header::CONTENT_TYPE, kind), private], bytes).into_response())
}

fn describe_job_page(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getExtractionPage",
        "extractions",
        "Draw a page of an extraction's file",
        "Page `page` (from 0, as a grounded field's `page`) of the job's file as an \
         image, to check a box against (scope `read`): a PNG's own bytes, a JPEG's \
         without its EXIF (the pixels as OCR read them), or a PDF page rendered to a PNG at \
         100 dpi, or lower to stay within the pixel cap (`DOCSTREAM_OCR_MAX_PIXELS`): its \
         boxes are in points, so scale by the image's width over the page's. A TIFF is not \
         drawn (422): browsers do not read it. A job whose document was JSON, or a page \
         past the last, is 404. Past the server's renders at once \
         (`DOCSTREAM_RENDER_SLOTS`) the answer is 503 with `Retry-After`, as it is for a \
         page not drawn within the answer bound; the page drawn meanwhile is there for \
         the retry.",
    );
    let page = describe::path_parameter(
        "page",
        "The page, from 0 (no file has more pages than this maximum).",
        json!({"type": "integer", "minimum": 0, "maximum": crate::config::MAX_PAGES - 1}),
    );
    let op = describe::parameters(op, [describe::id_parameter(), page]);
    let image = json!({"schema": {"type": "string", "format": "binary"}});
    let op = describe::raw_answer(
        op,
        200,
        json!({
            "description": "The page.",
            "content": {"image/png": image, "image/jpeg": image},
        }),
    );
    describe::refusals(op, &[400, 403, 404, 410, 422])
}

/// Stores the body as a file: refused 413 from its declared length, 429
/// past the tenant's uploads in progress, 408 past the body timeout, all
/// before the file is stored.
async fn upload(
    caller: Caller,
    State(api): State<Api>,
    Extension(uploads): Extension<Uploads>,
    request: Request,
) -> Result<(StatusCode, Json<StoredFile>), ApiError> {
    caller.require(Scope::Submit)?;
    let limit = api.files.max_bytes();
    if let Err(refused) = uploads.declared_within(request.headers(), limit) {
        return Err(uploads::linger(request, refused));
    }
    let declared = match request.headers().get(header::CONTENT_TYPE) {
        Some(value) => Some(value.to_str().map_err(|_| {
            ApiError::BadRequest("the Content-Type header is not ASCII text".into())
        })?),
        None => None,
    };
    let declared = declared.map(str::to_owned);
    let _slot = match uploads.take(caller.tenant_id) {
        Ok(slot) => slot,
        Err(refused) => return Err(uploads::linger(request, refused)),
    };
    let body = uploads::body_within(request.into_body(), limit);
    let bytes = uploads.within_body_timeout(body).await?;
    let (file, made) = api
        .files
        .upload(caller.tenant_id, declared.as_deref(), bytes)
        .await?;
    let status = if made {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    tracing::info!(tenant = %caller.tenant, file = %file.id, size = file.size, made, "file uploaded");
    Ok((status, Json(file)))
}

fn describe_upload<'t>(op: TransformOperation<'t>, settings: &Settings) -> TransformOperation<'t> {
    let description = format!(
        "Stores a document sent as its bytes, the whole body (scope `submit`): a PDF, \
         PNG, JPEG, TIFF or UTF-8 text file of at most {max} bytes \
         (`DOCSTREAM_FILE_MAX_BYTES`). What it is comes from its bytes; a `Content-Type` \
         naming another kind answers 415 (send `application/octet-stream` to let the \
         bytes say). The file's id is its SHA-256: the same bytes uploaded again by the \
         same tenant answer the same file, 200 instead of 201. A tenant never sees \
         another's files.\n\n\
         A `Content-Length` past the limit gets 413 before a byte is read. Past the \
         tenant's uploads in progress on this server ({uploads}, \
         `DOCSTREAM_TENANT_MAX_UPLOADS`) the answer is 429 with `Retry-After`, and so it \
         is past the tenant's bytes of files and of the documents its jobs read from \
         them (`DOCSTREAM_TENANT_MAX_FILE_BYTES`). A body that does not arrive whole \
         within {timeout} s (`DOCSTREAM_HTTP_BODY_TIMEOUT_S`) gets 408.",
        max = settings.file_max_bytes,
        uploads = settings.tenant_max_uploads,
        timeout = settings.http_body_timeout_s.get().as_secs_f64(),
    );
    let op = describe::operation(op, "uploadFile", "files", "Upload a file", &description);
    let binary = json!({"schema": {
        "type": "string",
        "contentMediaType": "application/octet-stream",
        "minLength": 1,
    }});
    let media = [
        "application/octet-stream",
        "application/pdf",
        "image/png",
        "image/jpeg",
    ];
    let media = media.into_iter().chain(["image/tiff", "text/plain"]);
    let content: serde_json::Map<String, serde_json::Value> =
        media.map(|m| (m.to_owned(), binary.clone())).collect();
    let op = describe::raw_body(op, json!({"required": true, "content": content}));
    let op = op
        .response_with::<201, Json<StoredFile>, _>(|a| {
            a.description("Stored: these bytes are new to the tenant.")
        })
        .response_with::<200, Json<StoredFile>, _>(|a| {
            a.description("The tenant had uploaded these bytes before: the same file.")
        });
    describe::refusals(op, &[400, 403, 408, 413, 415, 422, 429])
}

async fn read(
    caller: Caller,
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<StoredFile>, ApiError> {
    caller.require(Scope::Read)?;
    match api.files.get(caller.tenant_id, &id).await? {
        Some(file) => Ok(Json(file)),
        None => Err(ApiError::NoSuchFile(id)),
    }
}

fn describe_read(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getFile",
        "files",
        "Read a file's description",
        "The tenant's file (scope `read`): its id, SHA-256, size, kind and when it was \
         first uploaded. Another tenant's file is not found, exactly like one that does \
         not exist.",
    );
    let id = describe::path_parameter(
        "id",
        "The file's id: its SHA-256, lower-case hex.",
        json!({"type": "string"}),
    );
    let op = describe::parameters(op, [id]);
    let op = op.response_with::<200, Json<StoredFile>, _>(|a| a.description("The file."));
    describe::refusals(op, &[403, 404])
}

/// A job's file, to the holder of its signed URL.
async fn job_file(
    State(api): State<Api>,
    id: Result<Path<Uuid>, PathRejection>,
    query: Result<Query<Signed>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id?;
    let Query(signed) = query.map_err(|_| {
        ApiError::Forbidden("a file URL needs its attempt, expires and signature".into())
    })?;
    let Some(secret) = &api.settings.callback_secret else {
        return Err(ApiError::Forbidden(
            "file URLs are off in this deployment (DOCSTREAM_CALLBACK_SECRET)".into(),
        ));
    };
    let now = chrono::Utc::now().timestamp();
    signed::verify(secret, id, &signed, now).map_err(|e| ApiError::Forbidden(e.to_string()))?;
    let row = store::get(&api.pool, id).await?;
    // The URL is the attempt's: once another holds the job, or it ended,
    // the extractor that got it has no more business with the file.
    let running = |row: &store::Extraction| {
        row.status == ExtractionStatus::Running && row.attempts == signed.attempt
    };
    if row.as_ref().is_some_and(|row| !running(row)) {
        return Err(ApiError::Gone(format!(
            "attempt {} of extraction {id} has ended: this file URL no longer opens its file",
            signed.attempt
        )));
    }
    let file = row.and_then(|row| {
        let object = row.request.and_then(|r| r.0.document.object)?;
        Some((row.tenant_id, object))
    });
    let Some((tenant, object)) = file else {
        return Err(ApiError::NotFound(format!("extraction {id} has no file")));
    };
    let (kind, bytes) = api.files.read(tenant, &object).await?;
    Ok(([(header::CONTENT_TYPE, kind.as_str())], bytes).into_response())
}

/// The signed file route's contract: no key, its query (`Signed`) the
/// URL's signature.
fn describe_job_file(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let op = describe::operation(
        op,
        "getExtractionFile",
        "files",
        "Fetch a job's file (extractor protocol version 2)",
        "The bytes of the job's file, for the extraction service that got this URL in \
         its call (files in the folder store; a bucket presigns its own URLs). No API \
         key: the URL is signed with the deployment's callback secret for one attempt of \
         one job, and works while that attempt holds the job, until it expires \
         (`DOCSTREAM_FILE_URL_TTL_S`). An expired, altered or unsigned URL gets 403; one \
         whose attempt ended (the job finished, or another attempt holds it) 410.",
    );
    let mut op = describe::parameters(op, [describe::id_parameter()]);
    // The id first, then the query the type gave.
    op.inner_mut().parameters.rotate_right(1);
    let bytes = json!({"schema": {"type": "string", "format": "binary"}});
    let op = describe::raw_answer(
        op,
        200,
        json!({
            "description": "The file's bytes, with its sniffed media type.",
            "content": {
                "application/pdf": bytes, "image/png": bytes, "image/jpeg": bytes,
                "image/tiff": bytes, "text/plain": {"schema": {"type": "string"}},
            },
        }),
    );
    describe::refusals(op, &[400, 403, 404, 410])
}
