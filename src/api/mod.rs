//! The HTTP edge: `serve`'s routes (the REST API, the import and export streams),
//! assembled by [`app`] and run by [`serve`].

mod error;
mod export;
mod extractions;
mod gate;
mod import;
mod results;

pub use error::ApiError;
pub use gate::Gate;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pipeline::Services;

/// The whole API on `services`, behind `gate` (which refuses requests once
/// shutdown began and counts the ones in flight).
pub fn app(services: Services, gate: Gate) -> Router {
    let limit = services.settings.http_body_limit_bytes;
    let metrics = services.metrics.clone();
    Router::new()
        .merge(extractions::router())
        .merge(results::router())
        .merge(import::router())
        .merge(export::router())
        .route("/healthz", get(healthz))
        .with_state(services)
        .merge(
            Router::new()
                .route("/metrics", get(render_metrics))
                .with_state(metrics.clone()),
        )
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::Extension(gate.clone()))
        .layer(middleware::from_fn_with_state(metrics, count_requests))
        .layer(middleware::from_fn_with_state(gate, gate::admit))
}

/// Just `/metrics` and `/healthz`, for processes without the API.
pub fn metrics_router(metrics: Metrics) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics)
}

/// Serves `router` on `listener` until `shutdown`; in-flight requests finish first.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn healthz(State(services): State<Services>) -> Response {
    match sqlx::query("SELECT 1").execute(&services.pool).await {
        Ok(_) => "ok".into_response(),
        Err(e) => ApiError::Internal(format!("database unreachable: {e}")).into_response(),
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
    let response = next.run(request).await;
    metrics
        .http_requests
        .with_label_values(&[route.as_str(), response.status().as_str()])
        .inc();
    response
}
