//! The HTTP extractor: one `POST` to a team's extraction service per attempt,
//! following the extractor protocol (see [`super::protocol`]).
//!
//! What each answer means for the job:
//! - 200 with a valid result: the extraction succeeded;
//! - 422 or 400: the provider refused the document, and the job fails at once;
//! - 429 or 503 with `Retry-After`: the provider is busy; the call is made
//!   again after that long, within the same attempt (no attempt is spent),
//!   until the waits exceed the extractor's `retry_after_budget_s`;
//! - any other status, a timeout or a connection error: the attempt fails and
//!   the job is retried with its backoff, which spends an attempt;
//! - a 200 that is not a valid result: the job fails at once.
//!
//! Calls pass [`Limits`] first (this process's bound), then take one of
//! their tenant's slots when the extractor gives tenants a share, then one
//! of the deployment's slots and their turn under its rate ([`SharedCap`]). A
//! call's future may be dropped at any point (a cancelled job, a drain that
//! ran out): the connection is then closed, which tells the provider to stop.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::limits::Limits;
use super::protocol::{self, CallBody};
use super::slots::{SharedCap, SharedCaps, SharedSlot};
use super::{check_required, ExtractError, Extracted, ExtractionOutput, Job};
use crate::config::ExtractorSettings;
use crate::domain::Document;
use crate::domain::Lane;
use crate::metrics::ExtractorMetrics;
use crate::outbound::error_chain;

/// The shortest wait a `Retry-After` answer buys.
const MIN_RETRY_AFTER: Duration = Duration::from_millis(500);

/// One configured external extractor.
pub struct HttpExtractor {
    name: String,
    settings: ExtractorSettings,
    client: reqwest::Client,
    /// This process's bound and rate limit.
    limits: Limits,
    /// The deployment's cap.
    shared: SharedCap,
    /// Each tenant's share of it, when the extractor gives one.
    shares: Option<TenantShares>,
    metrics: ExtractorMetrics,
}

/// The deployment-wide caps of each tenant's calls of one extractor, made
/// as tenants' calls come (a few rows and a small struct each).
struct TenantShares {
    cap: usize,
    caps: SharedCaps,
    of: std::sync::Mutex<HashMap<Uuid, Arc<SharedCap>>>,
}

impl TenantShares {
    /// Leases one of `lane`'s tenant's slots (calls of no known tenant share
    /// the nil id's).
    async fn acquire(&self, extractor: &str, lane: Lane) -> SharedSlot {
        let tenant = lane.tenant.unwrap_or_default();
        let cap = {
            let mut of = self.of.lock().expect("tenant shares");
            let cap = of
                .entry(tenant)
                .or_insert_with(|| Arc::new(self.caps.tenant(extractor, tenant, self.cap)));
            cap.clone()
        };
        cap.acquire(lane).await
    }
}

/// What one call came to.
enum Answer {
    /// The attempt is over, one way or the other: the values, and for a
    /// file the document the provider read.
    Done(Result<(ExtractionOutput, Option<Document>), ExtractError>),
    /// The provider asked to be called again after this long.
    RetryAfter(Duration),
    /// The provider took the job and will post the result within this long.
    Deferred(Duration),
}

impl HttpExtractor {
    /// Whether it takes a job's file (protocol version 2).
    pub fn takes_files(&self) -> bool {
        self.settings.takes_files()
    }

    /// The extractor `name` with `settings`, its calls capped across the
    /// deployment (and each tenant's, when it has a share) by `caps`, whose
    /// order (the priority bound and the tenants' weights) this process's
    /// slots follow too.
    pub fn new(
        name: &str,
        settings: &ExtractorSettings,
        caps: &SharedCaps,
    ) -> reqwest::Result<Self> {
        crate::outbound::install_tls_provider();
        // No proxy, whatever HTTP(S)_PROXY say: a proxy between docstream
        // and its own extraction service would see every document.
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(settings.timeout())
            .connect_timeout(settings.timeout().min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("docstream/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let (max_wait, weights) = caps.order();
        let shares = (settings.tenant_max_concurrency > 0).then(|| TenantShares {
            cap: settings.tenant_max_concurrency,
            caps: caps.clone(),
            of: std::sync::Mutex::default(),
        });
        Ok(Self {
            name: name.to_owned(),
            limits: Limits::new(settings.process_cap(), max_wait, weights),
            shared: caps.extractor(name, settings.max_concurrency),
            shares,
            settings: settings.clone(),
            client,
            metrics: caps.metrics(),
        })
    }

    /// Calls until an answer ends the attempt, waiting out `Retry-After`s
    /// within the budget. Once `stop` fires, no new call starts: waiting for a
    /// slot, a token or a `Retry-After` ends with [`ExtractError::Interrupted`],
    /// while a call already made goes on.
    pub async fn run(
        &self,
        job: &Job<'_>,
        stop: &CancellationToken,
    ) -> Result<Extracted, ExtractError> {
        // Serialised once; each call (a retry after Retry-After) shares it.
        let body =
            Bytes::from(serde_json::to_vec(&CallBody::of(job)).expect("a request serialises"));
        let budget = self.settings.retry_after_budget();
        let mut waited = Duration::ZERO;
        loop {
            let wait = match self.admitted_call(job, &body, stop).await {
                Answer::Done(result) => {
                    return result.map(|(output, read)| match read {
                        Some(document) => Extracted::Read(output, document),
                        None => Extracted::Output(output),
                    })
                }
                Answer::Deferred(deadline) => return Ok(Extracted::Deferred(deadline)),
                // A floor, so "Retry-After: 0" cannot turn into a busy loop.
                Answer::RetryAfter(wait) => wait.max(MIN_RETRY_AFTER),
            };
            if waited + wait > budget {
                return Err(ExtractError::Unavailable(format!(
                    "extractor {:?} kept asking to retry later (Retry-After) beyond its budget of {} s",
                    self.name, self.settings.retry_after_budget_s
                )));
            }
            tracing::debug!(id = %job.id, attempt = job.attempt, extractor = %self.name,
                wait_s = wait.as_secs_f64(), "extractor busy; calling again after Retry-After");
            self.metrics
                .retry_after_seconds
                .with_label_values(&[&self.name])
                .inc_by(wait.as_secs_f64());
            tokio::select! {
                _ = stop.cancelled() => return Err(ExtractError::Interrupted),
                _ = tokio::time::sleep(wait) => {}
            }
            waited += wait;
        }
    }

    /// One call, inside this process's slot, its tenant's share when there
    /// is one, and a deployment-wide slot, and after the rate limit.
    async fn admitted_call(&self, job: &Job<'_>, body: &Bytes, stop: &CancellationToken) -> Answer {
        let admitted = tokio::select! {
            biased;
            _ = stop.cancelled() => return Answer::Done(Err(ExtractError::Interrupted)),
            admitted = self.limits.admit(job.lane) => admitted,
        };
        let asked = Instant::now();
        // The tenant's slot first: a call holds one of the extractor's only
        // within its tenant's share.
        let _share = match &self.shares {
            Some(shares) => tokio::select! {
                biased;
                _ = stop.cancelled() => return Answer::Done(Err(ExtractError::Interrupted)),
                slot = shares.acquire(&self.name, job.lane) => Some(slot),
            },
            None => None,
        };
        let share_wait = asked.elapsed();
        let _shared = tokio::select! {
            biased;
            _ = stop.cancelled() => return Answer::Done(Err(ExtractError::Interrupted)),
            slot = self.shared.acquire(job.lane) => slot,
        };
        let shared_wait = asked.elapsed() - share_wait;
        // The slot first, so a call that waits for its start is one that
        // will start then.
        let token_wait = match self.settings.requests_per_second {
            rate if rate > 0.0 => tokio::select! {
                biased;
                _ = stop.cancelled() => return Answer::Done(Err(ExtractError::Interrupted)),
                waited = self.shared.pace(Duration::from_secs_f64(1.0 / rate)) => waited,
            },
            _ => Duration::ZERO,
        };
        let waits = &self.metrics.wait_seconds;
        waits
            .with_label_values(&[&self.name, "slot"])
            .observe(admitted.slot_wait.as_secs_f64());
        waits
            .with_label_values(&[&self.name, "shared_slot"])
            .observe(shared_wait.as_secs_f64());
        if self.shares.is_some() {
            waits
                .with_label_values(&[&self.name, "tenant_slot"])
                .observe(share_wait.as_secs_f64());
        }
        waits
            .with_label_values(&[&self.name, "token"])
            .observe(token_wait.as_secs_f64());
        // Set where calls are made, so only worker processes export the cap.
        let cap = i64::try_from(self.settings.max_concurrency).unwrap_or(i64::MAX);
        let cap_gauge = self
            .metrics
            .max_concurrency
            .with_label_values(&[&self.name]);
        cap_gauge.set(cap);
        // From the first call on, so a first Retry-After is an increase.
        self.metrics
            .retry_after_seconds
            .with_label_values(&[&self.name]);
        let in_flight = self.metrics.in_flight.with_label_values(&[&self.name]);
        in_flight.inc();
        // Decremented however the call ends, including by being dropped.
        let _in_flight = scopeguard(move || in_flight.dec());
        let started = Instant::now();
        let (outcome, answer) = self.call(job, body).await;
        self.metrics
            .call_seconds
            .with_label_values(&[&self.name])
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .calls
            .with_label_values(&[&self.name, outcome])
            .inc();
        answer
    }

    /// Sends the call and reads its answer: (outcome label, answer).
    async fn call(&self, job: &Job<'_>, body: &Bytes) -> (&'static str, Answer) {
        let mut request = self
            .client
            .post(&self.settings.url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("Idempotency-Key", protocol::idempotency_key(job))
            .header("traceparent", protocol::traceparent(job))
            .body(body.clone());
        if !self.settings.token.is_empty() {
            request = request.header(AUTHORIZATION, format!("Bearer {}", self.settings.token));
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return self.transport_error(e),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| protocol::retry_after(v, chrono::Utc::now()));
        let body = match read_limited(response, protocol::MAX_ANSWER_BYTES).await {
            Ok(body) => body,
            Err(ReadError::TooLarge) => {
                return self.invalid(format!(
                    "the answer is larger than {} bytes",
                    protocol::MAX_ANSWER_BYTES
                ))
            }
            Err(ReadError::Transport(e)) => return self.transport_error(e),
        };
        self.judge(job, status, retry_after, &body)
    }

    fn judge(
        &self,
        job: &Job<'_>,
        status: StatusCode,
        retry_after: Option<Duration>,
        body: &[u8],
    ) -> (&'static str, Answer) {
        match status.as_u16() {
            200 => {
                let words = job.request.document.words().len();
                let file = job.file.is_some();
                match protocol::read_result(body, job.request, words, file) {
                    Ok((output, read)) => {
                        let checked = check_required(job.request, &output).map(|()| (output, read));
                        ("succeeded", Answer::Done(checked))
                    }
                    Err(reason) => self.invalid(reason),
                }
            }
            202 if job.callback.is_some() => {
                let cap = Duration::from_secs_f64(self.settings.deferred_deadline_s);
                match protocol::deferred_deadline(body, cap) {
                    Ok(deadline) => ("deferred", Answer::Deferred(deadline)),
                    Err(reason) => self.invalid(reason),
                }
            }
            202 => self.invalid(
                "answered 202 (a deferred result), but deferred results are off: \
                 set DOCSTREAM_PUBLIC_URL and DOCSTREAM_CALLBACK_SECRET"
                    .to_owned(),
            ),
            400 | 422 => {
                let refused = ExtractError::Refused {
                    extractor: self.name.clone(),
                    message: protocol::error_message(body),
                };
                ("refused", Answer::Done(Err(refused)))
            }
            429 | 503 if retry_after.is_some() => (
                "retry_after",
                Answer::RetryAfter(retry_after.unwrap_or_default()),
            ),
            _ => {
                // The body of an unexpected answer (a stack trace, a proxy's
                // page) is for the operator's log, not the job's client.
                let message = protocol::error_message(body);
                tracing::warn!(id = %job.id, attempt = job.attempt, extractor = %self.name,
                    %status, %message, "extractor failed; the attempt will be retried");
                let failed = ExtractError::Unavailable(format!(
                    "extractor {:?} answered {status}",
                    self.name
                ));
                ("failed", Answer::Done(Err(failed)))
            }
        }
    }

    fn invalid(&self, reason: String) -> (&'static str, Answer) {
        let invalid = ExtractError::InvalidAnswer {
            extractor: self.name.clone(),
            reason,
        };
        ("invalid_answer", Answer::Done(Err(invalid)))
    }

    fn transport_error(&self, e: reqwest::Error) -> (&'static str, Answer) {
        let (outcome, message) = if e.is_timeout() {
            (
                "timed_out",
                format!(
                    "extractor {:?} timed out after {} s",
                    self.name, self.settings.timeout_s
                ),
            )
        } else {
            (
                "unreachable",
                // Without the URL: it may carry credentials, and the error is
                // shown to the job's client.
                format!(
                    "extractor {:?} unreachable: {}",
                    self.name,
                    error_chain(&e.without_url())
                ),
            )
        };
        (
            outcome,
            Answer::Done(Err(ExtractError::Unavailable(message))),
        )
    }
}

enum ReadError {
    TooLarge,
    Transport(reqwest::Error),
}

/// The body, unless it is longer than `limit`.
async fn read_limited(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, ReadError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadError::Transport)? {
        if body.len() + chunk.len() > limit {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
