//! The shutdown gate in front of every route: counts requests in flight and,
//! once shutdown began, answers new ones 503 with `Retry-After`, so a client
//! retries elsewhere while the requests already accepted finish. Every answer
//! given once shutdown began says `Connection: close`, so clients stop
//! reusing their connections to this server before its listener closes them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Shared by the middleware and the `serve` role.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

struct Inner {
    closed: AtomicBool,
    /// Cancelled at [`Gate::close`]: what long-lived streams watch.
    closing: CancellationToken,
    in_flight: AtomicUsize,
    idle: Notify,
    metrics: Metrics,
}

/// A stream admitted through the gate; leaves it when dropped.
pub struct Hold(Arc<Inner>);

impl Drop for Hold {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Leaves the gate when the request is answered (or dropped).
struct Pass<'a>(&'a Inner);

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Gate {
    /// An open gate.
    pub fn new(metrics: Metrics) -> Self {
        let inner = Inner {
            closed: AtomicBool::new(false),
            closing: CancellationToken::new(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            metrics,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// From now on, new requests are refused.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.closing.cancel();
    }

    /// Fires when the gate closes: a stream stops reading and drains.
    pub fn closing(&self) -> CancellationToken {
        self.inner.closing.clone()
    }

    /// Counts a long-lived stream as in flight until the guard is dropped, so
    /// [`wait_idle`](Self::wait_idle) waits for its drain; `None` once closed.
    pub fn hold(&self) -> Option<Hold> {
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let hold = Hold(self.inner.clone());
        match self.inner.closed.load(Ordering::SeqCst) {
            true => None,
            false => Some(hold),
        }
    }

    /// Waits up to `timeout` until no admitted request is in flight.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let inner = &self.inner;
        let idle = async {
            loop {
                let notified = inner.idle.notified();
                if inner.in_flight.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, idle).await.is_ok()
    }
}

/// The middleware. Counting before checking means a request that slipped in
/// as the gate closed is waited for, never lost.
pub async fn admit(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let inner = &gate.inner;
    inner.in_flight.fetch_add(1, Ordering::SeqCst);
    let pass = Pass(inner);
    if inner.closed.load(Ordering::SeqCst) {
        drop(pass);
        inner.metrics.http.shutdown_rejections.inc();
        let body = serde_json::json!({"error": {"code": "shutting_down", "message": "server is shutting down; retry shortly"}});
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1"), (header::CONNECTION, "close")],
            Json(body),
        )
            .into_response();
    }
    let mut response = next.run(request).await;
    if inner.closed.load(Ordering::SeqCst) {
        let close = header::HeaderValue::from_static("close");
        response.headers_mut().insert(header::CONNECTION, close);
    }
    drop(pass);
    response
}
