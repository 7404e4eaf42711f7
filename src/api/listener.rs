//! The HTTP server loop: accepts connections up to a cap, gives each a
//! deadline for its request headers, and shuts down gracefully.
//!
//! - **Connection cap** (`http_max_connections`): a connection past it is
//!   answered `503` with `Retry-After` and a JSON error, then closed, so a
//!   flood of idle connections cannot take the file descriptors the
//!   connections already in service need.
//! - **Idle limit** (`http_header_read_timeout_s`): a connection with no
//!   request in progress for that long is closed, whatever it is doing: a
//!   socket that never sends a byte, one stuck half-way through the HTTP/2
//!   preface (before the protocol is even known), a kept-alive HTTP/1
//!   connection, an HTTP/2 connection that answers pings but opens no
//!   stream. HTTP/1 also gets it as hyper's header-read timeout, so a
//!   slowloris client that trickles its headers holds a connection for at
//!   most this long. HTTP/2 connections are pinged at the same interval and
//!   closed when a ping goes unanswered, so a peer that vanished while a
//!   request was in progress is noticed too. A connection with a request in
//!   progress is never closed here: the request bounds itself. Bodies are
//!   bounded by the REST answer timeout, an upload's by the body timeout
//!   (`uploads`: 408, then the connection closes); WebSocket streams, once
//!   upgraded, by their own protocol.
//! - **Shutdown**: the listener closes, requests in flight finish, idle
//!   connections close; upgraded streams drain through the gate.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::service::Service as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;

use super::auth::Peer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The bounds of one listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest wait for a request's headers.
    pub header_read_timeout: Duration,
}

impl ConnectionLimits {
    /// The limits `settings` give each HTTP listener.
    pub fn of(settings: &crate::config::Settings) -> Self {
        Self {
            max_connections: settings.http_max_connections,
            header_read_timeout: settings.http_header_read_timeout_s.get(),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown`; in-flight
/// requests finish first.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let idle = limits.header_read_timeout;
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(idle);
    http.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(idle)
        .keep_alive_timeout(idle);
    let http = Arc::new(http);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: wait a little, as a busy
                    // server must, instead of spinning on the error.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, limits.max_connections));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (http, router, shutdown) = (http.clone(), router.clone(), shutdown.clone());
        tokio::spawn(async move {
            let activity = Activity::new();
            let service = counted(router, activity.clone(), Peer(peer.ip()));
            let connection = http.serve_connection_with_upgrades(TokioIo::new(stream), service);
            let close = auto::UpgradeableConnection::graceful_shutdown;
            watch(connection, close, &activity, idle, &shutdown).await;
            drop(slot);
        });
    }
    drop(listener);
    // Every connection holds a slot until it ends: having them all back
    // means every connection has drained.
    let every = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(every).await;
    Ok(())
}

/// How long a connection told to close (idle, or the server shutting down)
/// may take to say goodbye with no request in progress: an HTTP/2 peer that
/// vanished never acknowledges the GOAWAY, and is dropped after this.
const GOODBYE: Duration = Duration::from_secs(1);

/// Drives `connection` until it ends: it is asked to close once it has had
/// no request in progress for `idle`, or when `shutdown` fires (requests in
/// progress then finish first), and dropped when it has not closed
/// [`GOODBYE`] after that with nothing in progress.
async fn watch<C: Future>(
    connection: C,
    close: impl Fn(Pin<&mut C>),
    activity: &Activity,
    idle: Duration,
    shutdown: &CancellationToken,
) {
    let mut connection = std::pin::pin!(connection);
    let mut closing: Option<Instant> = None;
    loop {
        let wake = match closing {
            Some(asked) => asked + GOODBYE,
            None => activity.quiet_since() + idle,
        };
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = shutdown.cancelled(), if closing.is_none() => {
                close(connection.as_mut());
                closing = Some(Instant::now());
            }
            _ = tokio::time::sleep_until(wake) => {
                if activity.in_progress() {
                    // Its requests keep it; the clock restarts when they end.
                    if closing.is_none() {
                        continue;
                    }
                    closing = Some(Instant::now());
                } else if closing.is_some() {
                    return;
                } else if activity.quiet_since() + idle <= Instant::now() {
                    close(connection.as_mut());
                    closing = Some(Instant::now());
                }
            }
        }
    }
}

/// The requests of one connection: how many are in progress, and since
/// when none has been.
struct Activity {
    opened: Instant,
    in_progress: AtomicUsize,
    /// Milliseconds from `opened` to when the last request ended (or the
    /// connection opened).
    quiet_from_ms: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            in_progress: AtomicUsize::new(0),
            quiet_from_ms: AtomicU64::new(0),
        })
    }

    fn in_progress(&self) -> bool {
        self.in_progress.load(Ordering::Acquire) > 0
    }

    /// Since when no request has been in progress (now, while one is).
    fn quiet_since(&self) -> Instant {
        if self.in_progress() {
            return Instant::now();
        }
        self.opened + Duration::from_millis(self.quiet_from_ms.load(Ordering::Acquire))
    }

    /// A request began; it is in progress until the guard drops.
    fn begin(self: &Arc<Self>) -> InProgress {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
        InProgress(self.clone())
    }
}

/// One request in progress on a connection.
struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        let activity = &self.0;
        let since_open = u64::try_from(activity.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity
            .quiet_from_ms
            .fetch_max(since_open, Ordering::AcqRel);
        activity.in_progress.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `router` as hyper's service, counting each request in `activity` from
/// its headers to its answer, and telling it the connection's `peer`.
fn counted(
    router: Router,
    activity: Arc<Activity>,
    peer: Peer,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    let router = TowerToHyperService::new(router);
    hyper::service::service_fn(move |mut request: hyper::Request<_>| {
        request.extensions_mut().insert(peer);
        let in_progress = activity.begin();
        let answer = router.call(request);
        async move {
            let answer = answer.await;
            drop(in_progress);
            answer
        }
    })
}

/// Answers a connection past the cap with a 503 and closes it.
async fn refuse(mut stream: TcpStream, cap: usize) {
    let body = serde_json::json!({"error": {
        "code": "too_many_connections",
        "message": format!("this server holds its most connections ({cap}); retry shortly"),
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        super::error::RETRY_AFTER_S,
        body.len()
    );
    let answer = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent until it closes: closing with its
        // request unread would reset the connection, and the client might
        // never see the answer.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), answer).await;
}
