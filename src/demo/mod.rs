//! `docstream demo`: runs every role in this process (the API, two workers, one
//! bbox worker) and the reference extraction service (`extractor-serve`),
//! submits the shipped sample documents over HTTP for that service to extract,
//! and the sample PDFs as files (multipart) for the built-in rules to read,
//! beside scans of them (each PDF rendered by poppler at 200 dpi, a PNG
//! with no text layer, read by OCR), shows progress while they flow, and
//! prints a summary, with the fields of a scan and OCR's confidence in
//! them. It fails when any document does not reach bbox succeeded.
//!
//! The jobs take the path a team's own extraction service would: each one is
//! an HTTP call under the extractor protocol, with its limits and metrics.

mod report;
mod samples;

pub use samples::{sample_files, sample_requests, SampleFile};

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::stream::{self, StreamExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use docstream::config::Settings;
use docstream::domain::{ExtractionRequest, Scope};
use docstream::files::ocr::OcrSettings;
use docstream::provider;
use docstream::roles::{self, Mix};
use docstream::store::tenants;

/// Options of `docstream demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// How many documents to submit (the samples, cycled).
    #[arg(long, default_value_t = 200)]
    pub documents: usize,
    /// Extraction worker consumers to run.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Bbox worker consumers to run.
    #[arg(long, default_value_t = 1)]
    pub bbox_workers: usize,
    /// Submissions in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// Extract with the built-in rules in the worker instead of calling the
    /// reference extraction service.
    #[arg(long)]
    pub rules: bool,
    /// A delay the reference extraction service adds to each call.
    #[arg(long, default_value_t = 0)]
    pub extractor_latency_ms: u64,
    /// After the summary, keep the pipeline, the API and the console
    /// serving (with the demo's key) until Ctrl-C.
    #[arg(long)]
    pub stay: bool,
}

/// The tenant the demo submits as.
const DEMO_TENANT: &str = "demo";

/// A new key with the default scopes for tenant `name` (made on its first
/// use), whose quota holds nothing back: how the demo and the benchmark get
/// a key with nothing from the user.
pub async fn unlimited_key(pool: &sqlx::PgPool, name: &str) -> anyhow::Result<tenants::CreatedKey> {
    let key = match tenants::create_tenant(pool, name).await {
        Err(tenants::TenantStoreError::Exists(_)) => {
            tenants::create_key(pool, name, &Scope::DEFAULT).await?
        }
        created => created?.key,
    };
    tenants::set_quota(pool, name, Some(Some(0.0)), None, Some(Some(0))).await?;
    Ok(key)
}

/// An HTTP client that sends `api_key` with every request.
pub fn api_client(api_key: &str) -> anyhow::Result<reqwest::Client> {
    docstream::outbound::install_tls_provider();
    let mut headers = reqwest::header::HeaderMap::new();
    let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {api_key}"))?;
    value.set_sensitive(true);
    headers.insert(reqwest::header::AUTHORIZATION, value);
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .build()?)
}

/// The name the demo gives the reference extraction service.
const REFERENCE: &str = "reference";

/// Runs the demo; see the module docs.
pub async fn run(
    settings: Settings,
    args: DemoArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut settings = settings;
    // The demo's own process serves /metrics on a free port: nobody scrapes it.
    settings.metrics_addr = ([127, 0, 0, 1], 0).into();
    let provider = match args.rules {
        true => None,
        false => Some(start_provider(&mut settings, &args, &shutdown).await?),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let scans = scans_of(&OcrSettings::of(&settings), sample_files()).await?;
    let services = roles::connect(settings).await?;
    let pool = services.pool.clone();
    // A key of the tenant `demo` (made on the first run), revoked at the end.
    // However many documents it is asked for, the demo submits them at once.
    let key = unlimited_key(&pool, DEMO_TENANT)
        .await
        .context("making the demo's API key (did `docstream migrate` run?)")?;
    let mix = Mix {
        serve: true,
        workers: args.workers,
        bbox_workers: args.bbox_workers,
        intakes: 0,
    };
    let stop = shutdown.child_token();
    let pipeline = tokio::spawn(roles::run(services, mix, Some(listener), stop.clone()));

    let extractor = provider.as_ref().map(|(url, _)| url.as_str());
    let console = format!(
        "console: {base}/console (log in with the key {}, which the demo revokes when it ends)",
        key.api_key
    );
    println!("{console}");
    let client = api_client(&key.api_key)?;
    let outcome = drive(
        &client,
        &base,
        (&pool, &scans),
        &args,
        extractor.is_some(),
        &shutdown,
    )
    .await;
    let report = |summary: &report::Summary| {
        match extractor {
            Some(url) => println!("extractor: {REFERENCE:?}, docstream extractor-serve at {url}"),
            None => println!("extractor: the built-in rules"),
        }
        print!("{summary}");
    };
    if let (true, Ok(summary)) = (args.stay, &outcome) {
        report(summary);
        println!("{console}\nserving until Ctrl-C (--stay)");
        shutdown.cancelled().await;
    }
    stop.cancel();
    pipeline.await??;
    tenants::revoke_key(&pool, key.key_id).await?;
    let summary = outcome?;
    if !args.stay {
        report(&summary);
    }
    anyhow::ensure!(
        summary.all_bbox_succeeded(),
        "{} of {} documents did not reach bbox succeeded",
        summary.total - summary.bbox_succeeded,
        summary.total
    );
    Ok(())
}

/// Starts the reference extraction service on a free loopback port and names
/// it in `settings` (unless the settings already have one by that name).
async fn start_provider(
    settings: &mut Settings,
    args: &DemoArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<(String, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}{}", listener.local_addr()?, provider::PATH);
    let provider_args = provider::ProviderArgs {
        addr: listener.local_addr()?,
        latency_ms: args.extractor_latency_ms,
        token: None,
        ocr_tesseract: settings.ocr_tesseract.clone(),
        ocr_languages: settings.ocr_languages.clone(),
    };
    let stop = shutdown.child_token();
    let server = tokio::spawn(async move { provider::serve(listener, &provider_args, stop).await });
    let extractor = settings.extractors.entry(REFERENCE.to_owned()).or_default();
    if extractor.url.is_empty() {
        extractor.url = url.clone();
        extractor.max_concurrency = 64;
    }
    Ok((extractor.url.clone(), server))
}

async fn drive(
    client: &reqwest::Client,
    base: &str,
    (pool, scans): (&sqlx::PgPool, &[Scan]),
    args: &DemoArgs,
    reference: bool,
    shutdown: &CancellationToken,
) -> anyhow::Result<report::Summary> {
    let samples = sample_requests();
    let files = sample_files();
    let started = Instant::now();
    let progress = report::Progress::new((args.documents + files.len() + scans.len()) as u64);
    // The PDFs as files: read by the built-in rules (an extractor of the
    // protocol's version 1 takes documents as JSON only).
    let mut ids: Vec<Uuid> = stream::iter(&files)
        .map(|file| {
            let name = format!("{}.pdf", file.name);
            async move {
                let pdf = (name.as_str(), "application/pdf", file.pdf);
                submit_multipart(client, base, &file.request, pdf).await
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .inspect(|_| progress.submitted())
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    // The scans: read by OCR, as a scanned or photographed page would be.
    let scanned: Vec<Uuid> = stream::iter(scans)
        .map(|(file, png)| {
            let name = format!("{}.scan.png", file.name);
            let mut request = file.request.clone();
            request["metadata"]["scan"] = serde_json::json!(true);
            async move {
                let png = (name.as_str(), "image/png", png.as_slice());
                submit_multipart(client, base, &request, png).await
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .inspect(|_| progress.submitted())
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    ids.extend(&scanned);
    let documents: Vec<Uuid> = stream::iter(0..args.documents)
        .map(|i| {
            let mut request = samples[i % samples.len()].request.clone();
            if reference {
                request.extractor = Some(REFERENCE.to_owned());
            }
            submit(client, base, request)
        })
        .buffer_unordered(args.concurrency.max(1))
        .inspect(|_| progress.submitted())
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    ids.extend(documents);

    let deadline = started + Duration::from_secs(args.timeout_s);
    until_settled(pool, &ids, &progress, (deadline, args.timeout_s), shutdown).await?;
    progress.finish();
    Ok(report::Summary::query(pool, &ids, &scanned, started.elapsed()).await?)
}

/// Waits until every job of `ids` has settled (or `deadline`, after
/// `timeout_s`, or `shutdown`), drawing their counts meanwhile.
async fn until_settled(
    pool: &sqlx::PgPool,
    ids: &[Uuid],
    progress: &report::Progress,
    (deadline, timeout_s): (Instant, u64),
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    loop {
        let counts = report::Counts::query(pool, ids).await?;
        progress.update(&counts);
        if counts.settled() == ids.len() as i64 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out after {timeout_s} s: {counts:?}"
        );
        tokio::select! {
            _ = shutdown.cancelled() => anyhow::bail!("interrupted"),
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// The resolution the demo scans its sample PDFs at.
const SCAN_DPI: f64 = 200.0;

/// A sample PDF and a scan of it.
type Scan = (samples::SampleFile, Vec<u8>);

/// Each one-page sample PDF as a scan: its page rendered to a PNG by
/// poppler (what a scanner gives: pixels, no text layer). A PNG holds one
/// page; `docstream eval` reads the multi-page samples as TIFFs.
async fn scans_of(ocr: &OcrSettings, files: Vec<samples::SampleFile>) -> anyhow::Result<Vec<Scan>> {
    let mut scans = Vec::new();
    for file in files.into_iter().filter(|f| f.pages == 1) {
        let pdf = axum::body::Bytes::from_static(file.pdf);
        let png = ocr.render(pdf, 1, SCAN_DPI, None).await;
        let png = png.with_context(|| {
            format!(
                "scanning the sample {} (is poppler-utils installed?)",
                file.name
            )
        })?;
        scans.push((file, png));
    }
    Ok(scans)
}

async fn submit(
    client: &reqwest::Client,
    base: &str,
    request: ExtractionRequest,
) -> anyhow::Result<Uuid> {
    let response = client
        .post(format!("{base}/v1/extractions"))
        .json(&request)
        .send()
        .await
        .context("submitting a sample")?;
    accepted(response).await
}

/// Submits `request` with `file`, named `name` and of `media_type`, as
/// `multipart/form-data`.
async fn submit_multipart(
    client: &reqwest::Client,
    base: &str,
    request: &serde_json::Value,
    (name, media_type, file): (&str, &str, &[u8]),
) -> anyhow::Result<Uuid> {
    let (content_type, body) = multipart_body(request, name, media_type, file)?;
    let response = client
        .post(format!("{base}/v1/extractions"))
        .header(reqwest::header::CONTENT_TYPE, content_type)
        .body(body)
        .send()
        .await
        .with_context(|| format!("submitting the sample file {name}"))?;
    accepted(response).await
}

/// A multipart submit of `request` (without its document) and the file
/// `file` named `name`, of media type `media_type`: its `Content-Type` and
/// its body.
pub fn multipart_body(
    request: &serde_json::Value,
    name: &str,
    media_type: &str,
    file: &[u8],
) -> anyhow::Result<(String, Vec<u8>)> {
    let boundary = format!("docstream-{}", Uuid::new_v4().simple());
    let mut body = Vec::with_capacity(file.len() + 4096);
    let parts: [(&str, &str, &[u8]); 2] = [
        ("request", "application/json", &serde_json::to_vec(request)?),
        ("file", media_type, file),
    ];
    for (part, content_type, bytes) in parts {
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{part}\"; filename=\"{name}\"\r\nContent-Type: {content_type}\r\n\r\n"
        );
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    Ok((format!("multipart/form-data; boundary={boundary}"), body))
}

/// The id of a submit answered 202.
pub async fn accepted(response: reqwest::Response) -> anyhow::Result<Uuid> {
    let status = response.status();
    let body: serde_json::Value = response.json().await?;
    anyhow::ensure!(
        status == reqwest::StatusCode::ACCEPTED,
        "submit answered {status}: {body}"
    );
    let id = body["id"].as_str().context("answer without id")?;
    Ok(id.parse()?)
}
