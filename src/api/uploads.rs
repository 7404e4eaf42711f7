//! The bounds of uploads: the requests whose bytes take as long as their
//! sender does (`POST /v1/files`, a multipart submit, a `document.url`
//! fetched at the submit), so the answer bound cannot hold them. Instead:
//!
//! - a body declared (`Content-Length`) past its route's limit is refused
//!   413 from its headers, before a byte of it is read;
//! - one tenant has at most `tenant_max_uploads` uploads in progress on a
//!   process; one more gets 429 with `Retry-After`, so a tenant's slow
//!   uploads hold its own slots, never everyone's;
//! - a body must arrive whole within `http_body_timeout_s` of when its
//!   reading begins; past it the request is answered 408 and its
//!   connection closed, so a trickling client holds nothing for longer.
//!
//! An upload holds no admission permit while its bytes move: a submit takes
//! its permit once its file is stored (`api::extractions`).
//!
//! A refusal before the body is read lingers ([`linger`]): most clients
//! write the whole body before they read an answer, and a connection closed
//! under them reads as a broken pipe, not as the 413 or 429 it was.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use uuid::Uuid;

use super::ApiError;
use crate::config::Settings;
use crate::metrics::HttpMetrics;

/// The bounds of one `serve` process's uploads; clones share them.
#[derive(Clone)]
pub(super) struct Uploads(Arc<Inner>);

struct Inner {
    /// Uploads in progress, per tenant (a tenant with none has no entry).
    per_tenant: Mutex<HashMap<Uuid, usize>>,
    /// Most uploads in progress per tenant.
    cap: usize,
    /// Longest a body may take to arrive.
    body_timeout: Duration,
    metrics: HttpMetrics,
}

/// One upload in progress; it leaves its tenant's count when dropped.
pub(super) struct UploadSlot {
    inner: Arc<Inner>,
    tenant: Uuid,
}

impl Uploads {
    /// The bounds in `settings`, counted in `metrics`.
    pub(super) fn new(settings: &Settings, metrics: &HttpMetrics) -> Self {
        Self(Arc::new(Inner {
            per_tenant: Mutex::default(),
            cap: settings.tenant_max_uploads,
            body_timeout: settings.http_body_timeout_s.get(),
            metrics: metrics.clone(),
        }))
    }

    /// 413 for an upload whose headers declare more than `limit` bytes.
    pub(super) fn declared_within(
        &self,
        headers: &HeaderMap,
        limit: usize,
    ) -> Result<(), ApiError> {
        declared_within(headers, limit).inspect_err(|_| self.refused("too_large"))
    }

    /// A slot for an upload of `tenant`'s, or 429 when it has its most in
    /// progress.
    pub(super) fn take(&self, tenant: Uuid) -> Result<UploadSlot, ApiError> {
        let cap = self.0.cap;
        let mut held = self.0.lock();
        let count = held.entry(tenant).or_default();
        if *count >= cap {
            drop(held);
            self.refused("tenant_cap");
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "the tenant has its most uploads in progress ({cap}, \
                     DOCSTREAM_TENANT_MAX_UPLOADS) on this server; retry once one has ended"
                ),
                retry_after_s: 1,
            });
        }
        *count += 1;
        self.0.metrics.uploads_in_flight.inc();
        Ok(UploadSlot {
            inner: self.0.clone(),
            tenant,
        })
    }

    /// `reading` (of a body), or 408 once it has taken the body timeout.
    pub(super) async fn within_body_timeout<T>(
        &self,
        reading: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let timeout = self.0.body_timeout;
        match tokio::time::timeout(timeout, reading).await {
            Ok(read) => read,
            Err(_) => {
                self.refused("body_timeout");
                Err(ApiError::BodyTimeout(timeout))
            }
        }
    }

    fn refused(&self, reason: &str) {
        let refusals = &self.0.metrics.upload_refusals;
        refusals.with_label_values(&[reason]).inc();
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, usize>> {
        // Counts updated in place: a poisoned lock holds them as they were.
        self.per_tenant.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        let mut held = self.inner.lock();
        if let Some(count) = held.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.tenant);
            }
        }
        self.inner.metrics.uploads_in_flight.dec();
    }
}

/// 413 for a request whose headers declare more than `limit` bytes of body.
/// How long a refused upload's body is still read (and dropped).
const LINGER: Duration = Duration::from_secs(5);

/// Most bytes of a refused upload's body read (and dropped) while it lingers.
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// Refuses `request` with `error` before its body was read, reading what
/// is left of the body and dropping it, in a task of its own, for at most
/// [`LINGER`] or [`LINGER_BYTES`]: the client then finishes writing and
/// reads the refusal, as it would from a server that lingers on close.
/// Nothing of the body is kept.
pub(super) fn linger(request: axum::extract::Request, error: ApiError) -> ApiError {
    let mut body = request.into_body().into_data_stream();
    tokio::spawn(async move {
        use futures::StreamExt;
        let drain = async {
            let mut read = 0;
            while let Some(Ok(chunk)) = body.next().await {
                read += chunk.len();
                if read > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    });
    error
}

pub(super) fn declared_within(headers: &HeaderMap, limit: usize) -> Result<(), ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH);
    let declared = declared.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => Err(ApiError::PayloadTooLarge(limit)),
        _ => Ok(()),
    }
}

/// The whole of `body`, refused 413 as soon as it passes `limit` bytes.
pub(super) async fn body_within(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::PayloadTooLarge(limit))
        }
        Err(e) => Err(ApiError::BadRequest(format!(
            "the body could not be read: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uploads(cap: usize) -> Uploads {
        let settings = Settings {
            tenant_max_uploads: cap,
            ..Settings::default()
        };
        Uploads::new(&settings, &crate::metrics::Metrics::new().http)
    }

    #[test]
    fn a_tenant_past_its_cap_is_refused_and_another_is_not() {
        let uploads = uploads(2);
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let held: Vec<UploadSlot> = (0..2).map(|_| uploads.take(a).unwrap()).collect();
        let refused = uploads.take(a).err().expect("a third upload refused");
        assert_eq!(refused.status_and_code().0.as_u16(), 429);
        let other = uploads.take(b).expect("another tenant's upload");
        drop(held);
        let again = uploads.take(a).expect("free once its uploads ended");
        drop((other, again));
        assert!(uploads.0.lock().is_empty());
    }

    #[test]
    fn a_declared_length_past_the_limit_is_refused() {
        let mut headers = HeaderMap::new();
        assert!(declared_within(&headers, 10).is_ok());
        headers.insert(header::CONTENT_LENGTH, "10".parse().unwrap());
        assert!(declared_within(&headers, 10).is_ok());
        headers.insert(header::CONTENT_LENGTH, "11".parse().unwrap());
        let refused = declared_within(&headers, 10).unwrap_err();
        assert_eq!(refused.status_and_code().0.as_u16(), 413);
    }
}
