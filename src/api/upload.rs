//! A submit's body: a JSON request, or `multipart/form-data` with the
//! document as a file: a part `request` (the JSON request without its
//! `document`) and a part `file` (the bytes). The file is stored as an
//! upload to `POST /v1/files` would store it, and the request names it
//! (`document.object`), so the same key with the same file is the same job.
//!
//! A JSON request's document may also be a URL (`document.url`): the
//! file is fetched through the SSRF guard of webhooks and stored the same
//! way. While a file's bytes move, the answer bound is lifted
//! ([`BoundLifted`]) and the submit holds no admission permit; the bounds
//! of uploads hold it instead (`uploads`): its declared length, its
//! tenant's uploads in progress, the body timeout. Each part is read only
//! up to its own limit.
//!
//! The request (or its part) is checked before the file is fetched or
//! stored: a refused request stores nothing. A file stored for a submit that is then refused
//! (its key was used with another request) stays the tenant's file.

use axum::body::{Body, Bytes};
use axum::extract::multipart::Field;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{header, HeaderMap};
use axum::Json;

use super::state::Api;
use super::uploads::Uploads;
use super::{ApiError, BoundLifted};
use crate::auth::Caller;
use crate::domain::{ExtractionRequest, RequestError};

/// Whether `headers` declare a multipart body.
pub(super) fn is_multipart(headers: &HeaderMap) -> bool {
    let content_type = headers.get(header::CONTENT_TYPE);
    let content_type = content_type
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("multipart/form-data")
}

/// The request a submit's body holds, its file stored first if it has one.
/// A file's bytes move within the bounds of uploads (`uploads`), and
/// `moving` is called before they do.
pub(super) async fn submitted(
    api: &Api,
    uploads: &Uploads,
    caller: &Caller,
    request: Request,
    moving: impl FnOnce(),
) -> Result<ExtractionRequest, ApiError> {
    let limit = api.settings.body_limit;
    let lifted = request.extensions().get::<BoundLifted>().cloned();
    let lift = || {
        if let Some(lifted) = &lifted {
            lifted.lift();
        }
        moving();
    };
    if !is_multipart(request.headers()) {
        if let Err(refused) = super::uploads::declared_within(request.headers(), limit) {
            return Err(super::uploads::linger(request, refused));
        }
        // The route takes bodies as large as a file; a JSON one is held to
        // the API's own limit.
        let request = request.map(|body| Body::new(http_body_util::Limited::new(body, limit)));
        let Json(mut parsed) = Json::<ExtractionRequest>::from_request(request, &())
            .await
            .map_err(|r| ApiError::from_json_rejection(r, limit))?;
        let Some(url) = parsed.document.url.take() else {
            return Ok(parsed);
        };
        let url_limit = api.settings.url_limit;
        if url.len() > url_limit {
            let what = "document.url".into();
            let unit = "bytes";
            return Err(RequestError::TooLarge {
                what,
                limit: url_limit,
                unit,
            }
            .into());
        }
        let fetched = parsed.document == Default::default();
        if !fetched {
            return Err(RequestError::DocumentShape.into());
        }
        // Checked first, with a placeholder for the file still to come.
        parsed.document.object = Some("0".repeat(64));
        parsed.validate(&api.settings.request_limits)?;
        // The fetch has its own timeout (DOCSTREAM_FILE_FETCH_TIMEOUT_S).
        let _slot = uploads.take(caller.tenant_id)?;
        lift();
        let (stored, _) = api.files.fetch(caller.tenant_id, &url).await?;
        parsed.document.object = Some(stored.id);
        return Ok(parsed);
    }
    let early = uploads.declared_within(request.headers(), api.settings.multipart_limit);
    let _slot = match early.and_then(|()| uploads.take(caller.tenant_id)) {
        Ok(slot) => slot,
        Err(refused) => return Err(super::uploads::linger(request, refused)),
    };
    lift();
    let max = api.files.max_bytes();
    let form = uploads.within_body_timeout(form_parts(request, limit, max));
    let (json, (declared, bytes)) = form.await?;
    let mut request = request_without_document(&json)?;
    request.validate(&api.settings.request_limits)?;
    let (stored, _) = api
        .files
        .upload(caller.tenant_id, declared.as_deref(), bytes)
        .await?;
    request.document.object = Some(stored.id);
    Ok(request)
}

/// A multipart submit's parts: the request (at most `limit` bytes) and the
/// file (at most `max`) with its declared type. Each is refused 413 as soon
/// as it passes its limit, before the rest of it is read.
async fn form_parts(
    request: Request,
    limit: usize,
    max: usize,
) -> Result<(Bytes, (Option<String>, Bytes)), ApiError> {
    let multipart_error = |e| multipart_error(e, max);
    let mut form = Multipart::from_request(request, &())
        .await
        .map_err(|r| ApiError::BadRequest(r.body_text()))?;
    let (mut json, mut file) = (None, None);
    while let Some(part) = form.next_field().await.map_err(multipart_error)? {
        match part.name() {
            Some("request") if json.is_none() => {
                json = Some(part_within(part, limit, max).await?);
            }
            Some("file") if file.is_none() => {
                let declared = part.content_type().map(str::to_owned);
                file = Some((declared, part_within(part, max, max).await?));
            }
            Some(name @ ("request" | "file")) => {
                return Err(ApiError::BadRequest(format!(
                    "the part {name:?} came twice"
                )))
            }
            name => {
                return Err(ApiError::BadRequest(format!(
                "unexpected part {:?}: a multipart submit has the parts \"request\" and \"file\"",
                name.unwrap_or_default()
            )))
            }
        }
    }
    let json = json.ok_or_else(|| missing("request"))?;
    let file = file.ok_or_else(|| missing("file"))?;
    Ok((json, file))
}

/// The bytes of `part`, refused 413 as soon as they pass `limit` (`max`:
/// the file limit, for a form that passed the route's own).
async fn part_within(mut part: Field<'_>, limit: usize, max: usize) -> Result<Bytes, ApiError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = part.chunk().await.map_err(|e| multipart_error(e, max))? {
        if bytes.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(limit));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.into())
}

/// The request part, with a placeholder file for the one still to be
/// stored: one that carries a document of its own is refused.
fn request_without_document(json: &[u8]) -> Result<ExtractionRequest, ApiError> {
    let mut value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| RequestError::from_json(&e))?;
    let Some(object) = value.as_object_mut() else {
        return Err(RequestError::Shape("the request part must be a JSON object".into()).into());
    };
    if object.contains_key("document") {
        return Err(RequestError::Shape(
            "the request part must not carry a `document`: the file part is the document".into(),
        )
        .into());
    }
    let placeholder = "0".repeat(64);
    object.insert(
        "document".into(),
        serde_json::json!({ "object": placeholder }),
    );
    Ok(serde_json::from_value(value).map_err(|e| RequestError::from_json(&e))?)
}

fn missing(part: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "the part {part:?} is missing: a multipart submit has the parts \"request\" and \"file\""
    ))
}

/// A part that could not be read: past the file limit `max` (413), or not
/// multipart as it said (400).
fn multipart_error(e: axum::extract::multipart::MultipartError, max: usize) -> ApiError {
    match e.status() {
        axum::http::StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(max),
        _ => ApiError::BadRequest(e.body_text()),
    }
}
