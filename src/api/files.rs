//! `POST /v1/files`: a tenant uploads a document as its bytes (the body);
//! `GET /v1/files/{id}`: what it uploaded. The file is stored once per
//! tenant under its content's SHA-256 (`files`), so uploading the same bytes
//! again answers the same file (200 instead of 201).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::ApiError;
use crate::auth::Caller;
use crate::domain::Scope;
use crate::files::StoredFile;
use crate::pipeline::Services;

/// The routes, with the files' own body limit in place of the API's.
pub(super) fn router(services: &Services) -> Router<Services> {
    Router::new()
        .route("/v1/files", post(upload))
        .route("/v1/files/{id}", get(read))
        .layer(DefaultBodyLimit::max(services.files.max_bytes()))
}

async fn upload(
    caller: Caller,
    State(services): State<Services>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<StoredFile>), ApiError> {
    caller.require(Scope::Submit)?;
    let limit = services.files.max_bytes();
    let bytes = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(limit),
        _ => ApiError::BadRequest(rejection.body_text()),
    })?;
    let declared = match headers.get(header::CONTENT_TYPE) {
        Some(value) => Some(value.to_str().map_err(|_| {
            ApiError::BadRequest("the Content-Type header is not ASCII text".into())
        })?),
        None => None,
    };
    let (file, made) = services
        .files
        .upload(caller.tenant_id, declared, bytes)
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
