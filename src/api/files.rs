//! `POST /v1/files`: a tenant uploads a document as its bytes (the body);
//! `GET /v1/files/{id}`: what it uploaded. The file is stored once per
//! tenant under its content's SHA-256 (`files`), so uploading the same bytes
//! again answers the same file (200 instead of 201).
//!
//! `GET /v1/extractions/{id}/file`: a job's file, for the extractor of
//! protocol version 2 that got the signed URL (`files::signed`): no API
//! key, the signature is the credential, for one attempt of one job while
//! that attempt runs, and until it expires (410 once the attempt ended).

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
