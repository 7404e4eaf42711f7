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

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use uuid::Uuid;

use super::uploads::{self, Uploads};
use super::ApiError;
use crate::auth::Caller;
use crate::domain::{ExtractionStatus, Scope};
use crate::files::signed::{self, Signed};
use crate::files::StoredFile;
use crate::pipeline::Services;
use crate::store;

/// The routes. An upload is held to the bounds of uploads (`uploads`) and
/// to the file limit, not to the API's body limit.
pub(super) fn router() -> Router<Services> {
    Router::new()
        .route("/v1/files", post(upload))
        .route("/v1/files/{id}", get(read))
        .route("/v1/extractions/{id}/file", get(job_file))
        .route("/v1/extractions/{id}/document", get(job_document))
        .route("/v1/extractions/{id}/pages/{page}", get(job_page))
}

/// The caller's job `id`, with its request, unless erased (410).
async fn readable_job(
    services: &Services,
    caller: &Caller,
    id: Uuid,
) -> Result<(store::Extraction, crate::domain::ExtractionRequest), ApiError> {
    caller.require(Scope::Read)?;
    let row = store::get_for_tenant(&services.pool, caller.tenant_id, id).await?;
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
    State(services): State<Services>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Json<crate::domain::Document>, ApiError> {
    let Path(id) = id?;
    let (_, request) = readable_job(&services, &caller, id).await?;
    if request.document.object.is_none() {
        return Ok(Json(request.document));
    }
    match store::documents::get(&services.pool, id).await? {
        Some(document) => Ok(Json(document)),
        None => Err(ApiError::NotFound(format!(
            "extraction {id} has not read its file yet"
        ))),
    }
}

/// Page `page` (from 0) of job `id`'s file as an image: a PNG's or JPEG's
/// own bytes, a PDF page rendered to a PNG. A job of no file, or a TIFF,
/// has no page to draw.
async fn job_page(
    caller: Caller,
    State(services): State<Services>,
    path: Result<Path<(Uuid, usize)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((id, page)) = path?;
    let (row, request) = readable_job(&services, &caller, id).await?;
    let Some(object) = request.document.object else {
        return Err(ApiError::NotFound(format!(
            "extraction {id} has no file: its document was sent as JSON"
        )));
    };
    let (kind, bytes) = services
        .files
        .page_image(row.tenant_id, &object, page)
        .await?;
    let private = (header::CACHE_CONTROL, "private, max-age=300");
    Ok(([(header::CONTENT_TYPE, kind), private], bytes).into_response())
}

/// Stores the body as a file: refused 413 from its declared length, 429
/// past the tenant's uploads in progress, 408 past the body timeout, all
/// before the file is stored.
async fn upload(
    caller: Caller,
    State(services): State<Services>,
    Extension(uploads): Extension<Uploads>,
    request: Request,
) -> Result<(StatusCode, Json<StoredFile>), ApiError> {
    caller.require(Scope::Submit)?;
    let limit = services.files.max_bytes();
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
    let (file, made) = services
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

async fn read(
    caller: Caller,
    State(services): State<Services>,
    Path(id): Path<String>,
) -> Result<Json<StoredFile>, ApiError> {
    caller.require(Scope::Read)?;
    match services.files.get(caller.tenant_id, &id).await? {
        Some(file) => Ok(Json(file)),
        None => Err(ApiError::NoSuchFile(id)),
    }
}

/// A job's file, to the holder of its signed URL.
async fn job_file(
    State(services): State<Services>,
    id: Result<Path<Uuid>, PathRejection>,
    query: Result<Query<Signed>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id?;
    let Query(signed) = query.map_err(|_| {
        ApiError::Forbidden("a file URL needs its attempt, expires and signature".into())
    })?;
    let Some((_, secret)) = services.settings.deferred_results() else {
        return Err(ApiError::Forbidden(
            "file URLs are off in this deployment (DOCSTREAM_CALLBACK_SECRET)".into(),
        ));
    };
    let now = chrono::Utc::now().timestamp();
    signed::verify(secret, id, &signed, now).map_err(|e| ApiError::Forbidden(e.to_string()))?;
    let row = store::get(&services.pool, id).await?;
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
    let (kind, bytes) = services.files.read(tenant, &object).await?;
    Ok(([(header::CONTENT_TYPE, kind.as_str())], bytes).into_response())
}
