//! The HTTP server loop: accepts connections up to a cap, gives each a
//! deadline for its request headers, and shuts down gracefully.
//!
//! - **Connection cap** (`http_max_connections`): a connection past it is
//!   answered `503` with `Retry-After` and a JSON error, then closed, so a
//!   flood of idle connections cannot take the file descriptors the
//!   connections already in service need.
//! - **Header-read timeout** (`http_header_read_timeout_s`): a client must
//!   send a request's headers within it or the connection is closed. The
//!   timer starts whenever the connection waits for a request, so it also
//!   bounds how long a kept-alive connection may sit idle; a slowloris client
//!   that trickles its headers holds a connection for at most this long.
//!   Bodies are bounded by the REST answer timeout; WebSocket streams, once
//!   upgraded, by their own protocol.
//! - **Shutdown**: the listener closes, requests in flight finish, idle
//!   connections close; upgraded streams drain through the gate.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
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
    let graceful = GracefulShutdown::new();
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let http = Arc::new(http);
    loop {
        let (stream, _peer) = tokio::select! {
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
        let (http, watcher) = (http.clone(), graceful.watcher());
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let connection = http.serve_connection_with_upgrades(TokioIo::new(stream), service);
            // A connection's end (a client gone, a timeout) is routine.
            let _ = watcher.watch(connection).await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
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
