//! The API's one error type. Every failure becomes a JSON body
//! `{"error": {"code", "message"}}` with the right status; internal details go to
//! the log, never to the client.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::auth::AuthError;
use crate::domain::{RequestError, MAX_IDEMPOTENCY_KEY_LEN};
use crate::files::FileError;
use crate::pipeline::JobError;
use crate::store::{Refusal, StoreError, SubmitError};

/// Why a request was not served.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON, or a header is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The JSON does not describe a valid request.
    #[error("{0}")]
    Unprocessable(String),
    /// A submitted request was refused: 422 with the refusal's own code, or
    /// 400 when the body is not JSON at all.
    #[error("{0}")]
    Invalid(#[from] RequestError),
    /// The body is larger than the configured limit.
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// An upload's body did not arrive whole within the body timeout
    /// (`uploads`): 408, and the connection is closed.
    #[error("the body did not arrive within {} s (DOCSTREAM_HTTP_BODY_TIMEOUT_S); send it faster, or a smaller file", .0.as_secs_f64())]
    BodyTimeout(std::time::Duration),
    /// The body is not declared as JSON.
    #[error("expected a body with Content-Type: application/json")]
    UnsupportedMediaType,
    /// An uploaded file is of a kind docstream does not take, or not the
    /// kind its `Content-Type` says.
    #[error("{0}")]
    UnsupportedFile(String),
    /// The request's credentials are missing or wrong.
    #[error("{0}")]
    Unauthorized(String),
    /// The credentials are good but do not allow this request.
    #[error("{0}")]
    Forbidden(String),
    /// No extraction has this id.
    #[error("no extraction with id {0}")]
    NotFound(String),
    /// The caller's tenant has no file with this id.
    #[error("no file with id {0}")]
    NoSuchFile(String),
    /// The request conflicts with the job's state.
    #[error("{0}")]
    Conflict(String),
    /// The job's content was erased on request.
    #[error("{0}")]
    Gone(String),
    /// The tenant is past a quota: retry after `retry_after_s`.
    #[error("{message}")]
    TooManyRequests {
        /// Which quota, and what to do.
        message: String,
        /// Seconds until a retry may succeed.
        retry_after_s: u64,
    },
    /// The process has no room for another submit now (`admission`): retry
    /// shortly; nothing was done for this request.
    #[error("{0}")]
    Overloaded(String),
    /// The server is shutting down: retry shortly (elsewhere).
    #[error("{0}")]
    ShuttingDown(String),
    /// A dependency is away or did not answer in time: retry shortly; with the
    /// same `Idempotency-Key`, a retried submit never makes a second job.
    #[error("{0}")]
    Unavailable(String),
    /// A dependency failed; details are logged.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// A submission refused before it reached the store; `key` is the
    /// idempotency key's name as the intake spells it (a header, a field).
    pub(crate) fn refused(refusal: Refusal, key: &str) -> Self {
        match refusal {
            Refusal::Request(e) => e.into(),
            Refusal::IdempotencyKey => Self::BadRequest(format!(
                "{key} must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
            )),
        }
    }

    pub(super) fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            Self::Invalid(e) if e.is_syntax() => (StatusCode::BAD_REQUEST, e.code()),
            Self::Invalid(e) => (StatusCode::UNPROCESSABLE_ENTITY, e.code()),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            Self::UnsupportedMediaType | Self::UnsupportedFile(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::NotFound(_) | Self::NoSuchFile(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::Gone(_) => (StatusCode::GONE, "gone"),
            Self::TooManyRequests { .. } => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
            Self::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Self::ShuttingDown(_) => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// Maps a JSON body rejection, given the configured body limit. What
    /// serde_json said is classified like any intake's parse error, so a
    /// lone surrogate or over-deep JSON is a 422 here as on the streams.
    pub fn from_json_rejection(rejection: JsonRejection, limit: usize) -> Self {
        match rejection {
            JsonRejection::JsonDataError(e) => {
                RequestError::from_json_message(e.body_text(), true).into()
            }
            JsonRejection::JsonSyntaxError(e) => {
                RequestError::from_json_message(e.body_text(), false).into()
            }
            rejection => match rejection.status() {
                StatusCode::PAYLOAD_TOO_LARGE => Self::PayloadTooLarge(limit),
                StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::UnsupportedMediaType,
                _ => Self::BadRequest(rejection.body_text()),
            },
        }
    }
}

impl From<axum::extract::ws::rejection::WebSocketUpgradeRejection> for ApiError {
    fn from(rejection: axum::extract::ws::rejection::WebSocketUpgradeRejection) -> Self {
        Self::BadRequest(format!(
            "not a WebSocket upgrade: {}",
            rejection.body_text()
        ))
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::BadRequest(format!("invalid path: {}", rejection.body_text()))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e.is_unavailable() {
            true => {
                // The outage is logged once where it is seen (`health`);
                // docstream_http_requests_total counts the 503s.
                tracing::debug!(error = %e, "request answered 503: the database is unavailable");
                Self::Unavailable("the database is unavailable; retry shortly".into())
            }
            false => Self::Internal(e.to_string()),
        }
    }
}

/// A step of the job lifecycle that did not happen: the database's errors
/// as the store's, a broker that did not acknowledge as a dependency away.
impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Store(e) => e.into(),
            JobError::MissingRow(id) => Self::NotFound(id.to_string()),
            JobError::Publish(_) | JobError::Failpoint(_) | JobError::StoppedWhileHeld(_) => {
                tracing::warn!(error = %e, "request answered 503: a step of the job did not happen");
                Self::Unavailable(format!("{e}; retry shortly"))
            }
        }
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::Empty
            | FileError::Pdf(_)
            | FileError::Image(_)
            | FileError::NotDrawn(_)
            | FileError::Url(_)
            | FileError::TooManyWords(_) => Self::Unprocessable(e.to_string()),
            FileError::Missing(id) => Self::NoSuchFile(id),
            FileError::NoPage(_) => Self::NotFound(e.to_string()),
            FileError::TooLarge(limit) => Self::PayloadTooLarge(limit),
            FileError::Unsupported | FileError::Mismatch { .. } => {
                Self::UnsupportedFile(e.to_string())
            }
            FileError::Database(e) => e.into(),
            FileError::NoUrl => Self::Unavailable(e.to_string()),
            FileError::Busy => Self::Overloaded(e.to_string()),
            FileError::NotNow(_) => Self::Unavailable(e.to_string()),
            FileError::Quota { .. } => Self::TooManyRequests {
                message: e.to_string(),
                retry_after_s: 3600,
            },
            FileError::Store(_) => {
                tracing::warn!(error = %e, "upload answered 503: the file store failed");
                Self::Unavailable("the file store is unavailable; retry shortly".into())
            }
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Missing | AuthError::Invalid => Self::Unauthorized(e.to_string()),
            AuthError::MissingScope(_) => Self::Forbidden(e.to_string()),
            AuthError::Store(e) => e.into(),
            AuthError::Throttled(wait) => Self::TooManyRequests {
                message: e.to_string(),
                retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
            },
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::KeyReused
            | SubmitError::WebhookRefused(_)
            | SubmitError::UnknownExtractor(_)
            | SubmitError::NoSuchFile(_)
            | SubmitError::TakesNoFiles(_) => Self::Unprocessable(e.to_string()),
            SubmitError::Erased(_) => Self::Gone(e.to_string()),
            SubmitError::Store(e) => e.into(),
            SubmitError::OverQuota { .. } => Self::TooManyRequests {
                message: e.to_string(),
                retry_after_s: 3600,
            },
            SubmitError::TooManyOpenJobs(_) => Self::TooManyRequests {
                message: e.to_string(),
                retry_after_s: 1,
            },
            SubmitError::TimedOut(_) => {
                tracing::debug!(error = %e, "submit answered 503");
                Self::Unavailable(format!("{e}; retry with the same Idempotency-Key"))
            }
        }
    }
}

impl ApiError {
    /// `{"error": {"code", "message"}}`; an internal detail goes to the log.
    pub(super) fn body(&self) -> serde_json::Value {
        let (_, code) = self.status_and_code();
        if let Self::Internal(detail) = self {
            tracing::error!(%detail, "request failed");
        }
        let mut body = serde_json::json!({"error": {"code": code, "message": self.to_string()}});
        if let Self::TooManyRequests { retry_after_s, .. } = self {
            body["error"]["retry_after_s"] = (*retry_after_s).into();
        }
        body
    }
}

/// Seconds a 503 asks the client to wait before it retries.
pub(super) const RETRY_AFTER_S: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_code();
        let mut response = (status, Json(self.body())).into_response();
        if let Self::TooManyRequests { retry_after_s, .. } = &self {
            let value = header::HeaderValue::from(*retry_after_s);
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body may still be on its way: the connection
            // cannot carry another request.
            let close = header::HeaderValue::from_static("close");
            response.headers_mut().insert(header::CONNECTION, close);
        }
        if status == StatusCode::UNAUTHORIZED {
            let challenge = header::HeaderValue::from_static("Bearer");
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, challenge);
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            let retry_after = header::HeaderValue::from_static(RETRY_AFTER_S);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, retry_after);
        }
        response
    }
}

/// Which errors a route answers is its own to declare (its describing
/// function, beside the handler): the error type alone cannot say.
impl aide::OperationOutput for ApiError {
    type Inner = ();
}
