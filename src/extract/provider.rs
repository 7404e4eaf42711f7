//! `docstream extractor-serve`: a reference provider of the extractor protocol
//! that extracts with the built-in rules. The demo and the benchmark run their
//! jobs through it, so the path they measure is the path a team's own service
//! takes; a team can also point docstream at it to try the protocol out.
//! `--latency-ms` adds a fixed delay per call, to stand in for a model.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::protocol::{CallBody, ErrorBody, ResultBody};
use super::{find_fields, Deadline, ExtractError, RuleBudget};
use crate::domain::ExtractionRequest;

/// How the reference provider behaves.
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderArgs {
    /// Where to listen; port 0 picks a free one (printed on start).
    #[arg(long, default_value = "127.0.0.1:9300")]
    pub addr: SocketAddr,
    /// A delay added to every call, standing in for a model's latency.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Require `Authorization: Bearer <token>`.
    #[arg(long, env = "DOCSTREAM_PROVIDER_TOKEN")]
    pub token: Option<String>,
}

/// The path calls are posted to.
pub const PATH: &str = "/extract";

/// The provider's routes: `POST /extract`.
pub fn router(args: &ProviderArgs) -> Router {
    Router::new()
        .route(PATH, post(extract))
        .with_state(Arc::new(args.clone()))
}

/// Serves on `listener` until `shutdown`, letting calls in progress finish.
pub async fn serve(
    listener: TcpListener,
    args: &ProviderArgs,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(args))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Binds `args.addr`, prints the URL to call and serves until `shutdown`.
pub async fn run(args: ProviderArgs, shutdown: CancellationToken) -> std::io::Result<()> {
    let listener = TcpListener::bind(args.addr).await?;
    let url = format!("http://{}{PATH}", listener.local_addr()?);
    println!("extractor-serve: listening on {url}");
    tracing::info!(%url, latency_ms = args.latency_ms, "extractor-serve: listening");
    serve(listener, &args, shutdown).await
}

async fn extract(
    State(args): State<Arc<ProviderArgs>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(token) = &args.token {
        let expected = format!("Bearer {token}");
        let given = headers
            .get(header::AUTHORIZATION)
            .map_or(&b""[..], |v| v.as_bytes());
        if !constant_time_eq(given, expected.as_bytes()) {
            return error(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token".into(),
            );
        }
    }
    let call: CallBody = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("not a call: {e}")),
    };
    tokio::time::sleep(Duration::from_millis(args.latency_ms)).await;
    let request = ExtractionRequest {
        document: call.document.into_owned(),
        fields: call.fields.into_owned(),
        webhook_url: None,
        metadata: None,
        extractor: None,
        priority: None,
    };
    if let Some(field) = request
        .fields
        .iter()
        .find(|f| f.pattern.is_none() && f.anchor.is_none())
    {
        let message = format!(
            "field {:?}: this provider finds values by `pattern` or `anchor`, and it has neither",
            field.name
        );
        return error(StatusCode::UNPROCESSABLE_ENTITY, message);
    }
    // Off the runtime, like the worker's rule extractor.
    let found = tokio::task::spawn_blocking(move || {
        find_fields(&request, &RuleBudget::default(), &Deadline::none())
    });
    let found = found.await.unwrap_or_else(|e| {
        Err(ExtractError::Unavailable(format!(
            "extraction failed unexpectedly: {e}"
        )))
    });
    match found {
        Ok(output) => Json(ResultBody {
            fields: output.fields,
        })
        .into_response(),
        Err(e @ ExtractError::Pattern { .. }) => {
            error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn error(status: StatusCode, error: String) -> Response {
    (status, Json(ErrorBody { error })).into_response()
}

/// Whether `a` equals `b`, in a time that does not depend on where they
/// differ (so the answer's timing does not reveal the token).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}
