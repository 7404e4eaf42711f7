//! The HTTP edge: `serve`'s routes (the REST API, the import and export streams),
//! assembled by [`app`] on the parts an [`Api`] holds and run by [`serve`];
//! and the internal listener every process has ([`metrics_router`]). Every
//! API route but the probes needs an API key (`auth`).

mod account;
mod auth;
mod bulk;
mod console;
mod corrections;
mod describe;
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
mod state;
mod upload;
mod uploads;
mod ws;

pub use error::ApiError;
pub use gate::Gate;
pub use listener::{serve, ConnectionLimits};
pub use state::{Api, ApiSettings, Parts as ApiParts};

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use aide::transform::TransformPathItem;
use axum::extract::{DefaultBodyLimit, FromRef, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

use std::time::Duration;

use crate::config::Settings;
use crate::health::Health;
use crate::metrics::Metrics;

/// The whole API on `api`, as `settings` describe it, behind `gate` (which
/// refuses requests once shutdown began and counts the ones in flight), with
/// its contract at `GET /openapi.json`, made from the same routes.
pub fn app(settings: &Settings, api: Api, gate: Gate) -> Router {
    let metrics = api.metrics.clone();
    let (routes, document) = openapi::finish(settings, || routes(settings));
    let uploads = uploads::Uploads::new(settings, &metrics.http);
    Router::new()
        .merge(routes.with_state(api))
        .merge(openapi::router(document))
        .merge(console::router())
        .layer(DefaultBodyLimit::max(settings.http_body_limit_bytes))
        .layer(axum::Extension(gate.clone()))
        .layer(axum::Extension(sockets::Sockets::new(settings)))
        .layer(axum::Extension(uploads))
        .layer(middleware::from_fn_with_state(metrics, count_requests))
        .layer(middleware::from_fn_with_state(gate, gate::admit))
}

/// Every route of the API with its operation, and the answers the layers
/// of [`app`] give them: 503 from the gate once shutdown began, and 413
/// from the body limit to a route that reads a body.
fn routes(settings: &Settings) -> ApiRouter<Api> {
    // REST requests are answered within the bound, whatever Postgres or the
    // broker do; the submit keeps its own, tighter, bound inside it.
    let bound = settings.http_answer_timeout_s.get() + REST_MARGIN;
    let rest = ApiRouter::new()
        .merge(extractions::routes(settings))
        .merge(corrections::routes())
        .merge(list::routes())
        .merge(bulk::routes())
        .merge(letters::routes())
        .merge(account::routes())
        .merge(overview::routes())
        .merge(results::routes(settings))
        .merge(files::job_routes())
        .layer(middleware::from_fn_with_state(bound, answer_within));
    ApiRouter::new()
        .merge(rest)
        .merge(letters::replay_routes())
        .merge(import::routes())
        .merge(export::routes(settings))
        .merge(files::routes(settings))
        .merge(probes())
        .with_path_items(|mut item| {
            each_operation(&mut item, |operation| {
                if operation.request_body.is_some() {
                    describe::refuse(operation, &[413]);
                }
                describe::refuse(operation, &[503]);
            });
            item
        })
}

/// Calls `f` on every operation of a path item.
fn each_operation(item: &mut TransformPathItem<'_>, f: impl FnMut(&mut aide::openapi::Operation)) {
    let item = item.inner_mut();
    let operations = [
        &mut item.get,
        &mut item.post,
        &mut item.put,
        &mut item.patch,
        &mut item.delete,
    ];
    operations.into_iter().flatten().for_each(f);
}

/// The internal listener of every process (`metrics_addr`): `/metrics`,
/// `/healthz` and `/readyz`. `/metrics` is only here, never on the API's
/// port: it belongs on an internal network.
pub fn metrics_router(metrics: Metrics, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .with_state(metrics)
        .merge(Router::from(probes::<Health>()).with_state(health))
}

/// `/healthz` (alive) and `/readyz` (ready for traffic), which need no key:
/// on the API's port for a load balancer, and on the internal listener.
fn probes<S>() -> ApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Health: FromRef<S>,
{
    let plain = |description: &str, text: &str| {
        json!({
            "description": description,
            "content": {"text/plain": {"schema": {"type": "string", "const": text}}},
        })
    };
    ApiRouter::new()
        .api_route(
            "/healthz",
            get_with(
                || async { "ok" },
                move |op| {
                    let op = describe::operation(
                        op,
                        "healthz",
                        "probes",
                        "Liveness",
                        "`ok` while the process serves requests.",
                    );
                    describe::raw_answer(op, 200, plain("Alive.", "ok"))
                },
            ),
        )
        .api_route(
            "/readyz",
            get_with(readyz, move |op| {
                let op = describe::operation(
                    op,
                    "readyz",
                    "probes",
                    "Readiness",
                    "`ready` when Postgres and the broker answered the last probes and \
                     the process is not draining; else 503.",
                );
                describe::raw_answer(op, 200, plain("Ready for traffic.", "ready"))
            }),
        )
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
