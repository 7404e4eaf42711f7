//! The console: a browser view of the caller's jobs at `/console`, served
//! from files compiled into the binary (no build step, nothing fetched at
//! run time). It is a client of the public API like any other: it adds no
//! route of its own, and holds the API key in the tab's memory only.
//!
//! Every answer carries a strict Content-Security-Policy: scripts and
//! styles only from this origin (no inline script), requests only to it,
//! images from it or from blobs the page made (a scan's page is fetched
//! with the key, which an image element cannot send), no framing, no forms
//! posting elsewhere.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// The policy of every console answer.
pub(super) const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' blob:; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

const INDEX: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// `/console` and its two assets; no key is needed to load them (the data
/// they show is fetched with the key the person types in).
pub(super) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/console",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/console/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/console/console.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}
