//! `docstream extractor-serve`: a reference provider of the extractor protocol
//! that extracts with the built-in rules. The demo and the benchmark run their
//! jobs through it, so the path they measure is the path a team's own service
//! takes; a team can also point docstream at it to try the protocol out.
//! `--latency-ms` adds a fixed delay per call, to stand in for a model.
//!
//! It speaks version 2: a call for a file carries a URL, which it fetches
//! (within the file limit), reads as the worker's rules would (a PDF's text
//! layer, a text file's text) and answers with the values and the words it
//! read on each page. Pages without text (an image, a scanned PDF page) it
//! reads by OCR as the worker does (Tesseract in a child process per
//! page), so a team can run OCR as a service of its own beside the workers;
//! with `--ocr-tesseract ''` it refuses them (422), as a provider without
//! OCR should.

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

use crate::config::Settings;
use crate::domain::{Document, ExtractionRequest};
use crate::extract::protocol::{CallBody, ErrorBody, FileRef, ResultBody};
use crate::extract::{find_fields, Deadline, ExtractError, RuleBudget};
use crate::files::ocr::OcrSettings;
use crate::files::{self, FileType, ReadLimits};

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
    /// The Tesseract program pages without text are read with; empty: no
    /// OCR.
    #[arg(long, env = "DOCSTREAM_OCR_TESSERACT", default_value = "tesseract")]
    pub ocr_tesseract: String,
    /// Tesseract's languages, `+`-separated.
    #[arg(long, env = "DOCSTREAM_OCR_LANGUAGES", default_value = "eng")]
    pub ocr_languages: String,
}

impl ProviderArgs {
    /// The settings this provider reads files within: a deployment's
    /// defaults, with its OCR program and languages.
    fn settings(&self) -> Settings {
        Settings {
            ocr_tesseract: self.ocr_tesseract.clone(),
            ocr_languages: self.ocr_languages.clone(),
            ..Settings::default()
        }
    }
}

/// The path calls are posted to.
pub const PATH: &str = "/extract";

/// The provider's routes: `POST /extract`.
pub fn router(args: &ProviderArgs) -> Router {
    Router::new()
        .route(PATH, post(extract))
        .with_state(Arc::new((args.clone(), args.settings())))
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
    State(provider): State<Arc<(ProviderArgs, Settings)>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (args, settings) = &*provider;
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
    let (document, from_file) = match (call.document, call.file) {
        (Some(document), _) => (document.into_owned(), false),
        (None, Some(file)) => match read_file(&file, settings).await {
            Ok(document) => (document, true),
            Err(response) => return response,
        },
        (None, None) => {
            let message = "a call needs a `document` or a `file`".to_owned();
            return error(StatusCode::BAD_REQUEST, message);
        }
    };
    let request = ExtractionRequest {
        document,
        fields: call.fields.into_owned(),
        webhook_url: None,
        metadata: None,
        extractor: None,
        priority: None,
        min_confidence: None,
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
        let found = find_fields(&request, &RuleBudget::default(), &Deadline::none());
        found.map(|output| (output, request.document))
    });
    let found = found.await.unwrap_or_else(|e| {
        Err(ExtractError::Unavailable(format!(
            "extraction failed unexpectedly: {e}"
        )))
    });
    match found {
        Ok((output, document)) => Json(ResultBody {
            fields: output.fields,
            pages: document.pages.filter(|_| from_file),
        })
        .into_response(),
        Err(e @ ExtractError::Pattern { .. }) => {
            error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Fetches a call's file and reads its document within `settings`' limits,
/// or the answer that refuses it: a URL that does not answer its bytes is
/// retried (503), a file it cannot read refused (422).
async fn read_file(file: &FileRef, settings: &Settings) -> Result<Document, Response> {
    let unavailable = |message: String| error(StatusCode::SERVICE_UNAVAILABLE, message);
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| unavailable(e.to_string()))?;
    let response = client.get(&file.url).send().await;
    let response = response.map_err(|e| unavailable(format!("fetching the file failed: {e}")))?;
    if !response.status().is_success() {
        let status = response.status();
        return Err(unavailable(format!("fetching the file answered {status}")));
    }
    let bytes = response.bytes().await;
    let bytes = bytes.map_err(|e| unavailable(format!("fetching the file failed: {e}")))?;
    if bytes.len() > settings.file_max_bytes {
        let limit = settings.file_max_bytes;
        let message = format!("the file is larger than {limit} bytes");
        return Err(error(StatusCode::UNPROCESSABLE_ENTITY, message));
    }
    let Some(kind) = FileType::sniff(&bytes) else {
        let message = "the file is of a kind this provider does not read".to_owned();
        return Err(error(StatusCode::UNPROCESSABLE_ENTITY, message));
    };
    let limits = ReadLimits::of(settings);
    let ocr = (!settings.ocr_tesseract.is_empty()).then(|| OcrSettings::of(settings));
    match files::read_all(kind, bytes, &limits, ocr.as_ref()).await {
        Ok(document) => Ok(document),
        Err(ExtractError::Refused { message, .. }) => {
            Err(error(StatusCode::UNPROCESSABLE_ENTITY, message))
        }
        Err(ExtractError::Unavailable(why)) => Err(unavailable(why)),
        Err(refused) => Err(error(StatusCode::UNPROCESSABLE_ENTITY, refused.to_string())),
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
