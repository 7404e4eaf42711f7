//! The HTTP edge: `serve`'s routes (the REST API, the import and export streams),
//! assembled by [`app`] and run by [`serve`]; and the internal listener every
//! process has ([`metrics_router`]). Every API route but the probes needs an
//! API key (`auth`).

mod account;
mod auth;
mod bulk;
mod console;
mod corrections;
mod error;
mod export;
mod extractions;
mod files;
mod gate;
mod import;
mod letters;
mod list;
mod listener;
mod openapi;
mod overview;
mod query;
mod results;
mod sockets;
mod upload;
mod uploads;
mod ws;

pub use error::ApiError;
pub use gate::Gate;
pub use listener::{serve, ConnectionLimits};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use std::time::Duration;

use crate::health::Health;
use crate::metrics::Metrics;
use crate::pipeline::Services;

/// The whole API on `services`, behind `gate` (which refuses requests once
/// shutdown began and counts the ones in flight).
pub fn app(services: Services, gate: Gate) -> Router {
    let limit = services.settings.http_body_limit_bytes;
    let metrics = services.metrics.clone();
    // REST requests are answered within the bound, whatever Postgres or the
    // broker do; the submit keeps its own, tighter, bound inside it.
    let bound = services.settings.http_answer_timeout_s.get() + REST_MARGIN;
    let rest = Router::new()
        .merge(extractions::router(&services))
        .merge(corrections::router())
        .merge(list::router())
        .merge(bulk::router())
        .merge(letters::router())
        .merge(account::router())
        .merge(overview::router())
        .merge(results::router())
        .layer(middleware::from_fn_with_state(bound, answer_within));
    Router::new()
        .merge(rest)
        .merge(letters::replay_router())
        .merge(import::router())
        .merge(export::router())
        .merge(files::router())
        .with_state(services.clone())
        .merge(probes_router(&services))
        .merge(openapi::router(&services.settings))
        .merge(console::router())
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::Extension(gate.clone()))
        .layer(axum::Extension(sockets::Sockets::new(&services.settings)))
        .layer(axum::Extension(uploads::Uploads::new(
            &services.settings,
            &services.metrics.http,
        )))
        .layer(middleware::from_fn_with_state(metrics, count_requests))
        .layer(middleware::from_fn_with_state(gate, gate::admit))
}

/// The internal listener of every process (`metrics_addr`): `/metrics`,
/// `/healthz` and `/readyz`. `/metrics` is only here, never on the API's
/// port: it belongs on an internal network.
pub fn metrics_router(services: &Services) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .with_state(services.metrics.clone())
        .merge(probes_router(services))
}

/// `/healthz` (alive) and `/readyz` (ready for traffic), which need no key:
/// on the API's port for a load balancer, and on the internal listener.
fn probes_router(services: &Services) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(services.health.clone())
}

/// How much longer than the submit's own bound the REST backstop waits: just
/// enough that a submit's own bound (202 once the row is durable) normally
/// answers first. It is small because the key lookup runs before the
/// submit's bound starts, and the backstop is what keeps the whole answer
/// near `http_answer_timeout_s` (a fault test had answers 0.6 s past a
/// 500 ms margin on a saturated machine).
const REST_MARGIN: Duration = Duration::from_millis(100);

/// Ready: Postgres and the broker answered the last probes, and the process
/// is not draining. An orchestrator sends traffic only to ready processes,
/// and restarts only those whose `/healthz` stops answering.
async fn readyz(State(health): State<Health>) -> Response {
    match health.ready() {
        Ok(()) => "ready".into_response(),
        Err(reason) => ApiError::Unavailable(format!("not ready: {reason}")).into_response(),
    }
}

/// Answers 503 with `Retry-After` to a request still waiting after `bound`.
/// Logged at debug, as the submit's own 503 is: in an outage every request
/// gets one, and a line each (8,600 in a 20 s Postgres blackhole of the
/// fault tests) is a storm of synchronous writes on the runtime's threads
/// just when the process is under stress. The outage itself is logged once
/// (`health`), and the answers are `docstream_http_requests_total{status="503"}`.
async fn answer_within(
    State(bound): State<Duration>,
    mut request: Request,
    next: Next,
) -> Response {
    let lifted = BoundLifted::default();
    request.extensions_mut().insert(lifted.clone());
    let answer = next.run(request);
    tokio::pin!(answer);
    match tokio::time::timeout(bound, &mut answer).await {
        Ok(response) => response,
        Err(_) if lifted.0.load(std::sync::atomic::Ordering::Acquire) => answer.await,
        Err(_) => {
            tracing::debug!(
                ?bound,
                "request answered 503: no answer from a dependency in time"
            );
            ApiError::Unavailable("no answer from the database in time; retry shortly".into())
                .into_response()
        }
    }
}

/// Lifted by a handler that moves a file's bytes (a multipart submit's
/// file, a fetched `document.url`): those take as long as the bytes take,
/// so [`answer_within`] waits for its answer. The submit's row is still
/// written within the bound once the bytes are in (`pipeline::submit`).
#[derive(Clone, Default)]
pub(crate) struct BoundLifted(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl BoundLifted {
    /// The answer may take longer than the bound.
    pub(crate) fn lift(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

async fn render_metrics(State(metrics): State<Metrics>) -> String {
    metrics.render()
}

async fn count_requests(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched".to_owned(), |p| p.as_str().to_owned());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let status = response.status();
    let labels = [route.as_str(), status.as_str()];
    metrics
        .http
        .duration
        .with_label_values(&labels)
        .observe(started.elapsed().as_secs_f64());
    metrics.http.requests.with_label_values(&labels).inc();
    response
}
