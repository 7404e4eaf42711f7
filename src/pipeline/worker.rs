//! `worker`: consumes `extraction.submitted`, claims the job, runs the job's
//! extractor while heartbeats keep the claim, completes the claim with its
//! fencing token, and hands the job to bbox refinement by publishing
//! `extraction.post_processing.requested`.
//!
//! A cancel request seen at a heartbeat drops the running extraction (an HTTP
//! extractor's call is closed) and cancels the job. When the consumer stops
//! (shutdown, revoke), a running extraction gets the drain's budget to
//! finish; past it, it is dropped and its claim released for the next owner,
//! and the record is not committed.
//!
//! A failure that may pass (timeout, unavailable extractor) is retried with a
//! capped, jittered backoff: the job is requeued with its due time in the row and
//! its event is republished when due. Should that delayed publish be lost, the
//! row is an orphan of class 3 and the extraction reaper revives it.

use std::time::{Duration, Instant};
use tracing::Instrument;

use uuid::Uuid;

use super::jobs::lane;
use super::lease::Held;
use super::{job_record, JobError, Jobs};
use crate::config::Settings;
use crate::config::RULES;
use crate::domain::{BboxStatus, Document, ExtractionRequest, ExtractionStatus, Lane, Stage};
use crate::events::{ExtractionSubmitted, PublishReason};
use crate::extract::deferred::Callback;
use crate::extract::{
    CpuPool, Deadline, ExtractError, Extracted, ExtractionOutput, Extractors, Job,
};
use crate::failpoints;
use crate::files::{self, FileError, Files};
use crate::kafka::{HandlerError, Record, RecordHandler};
use crate::metrics::JobMetrics;
use crate::store::leases::Renewed;
use crate::store::{self, leases, Claim};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// The stage this worker claims.
const STAGE: Stage = Stage::Extraction;

/// The extraction worker's record handler.
pub struct ExtractionWorker {
    parts: Parts,
    settings: WorkerSettings,
}

/// What the extraction worker works with.
pub struct Parts {
    /// The pool its leases, documents and reads run on.
    pub pool: PgPool,
    /// The lifecycle: claims, completions, retries and hand-overs.
    pub jobs: Jobs,
    /// The extractors it can run, with their per-process limits.
    pub extractors: Extractors,
    /// The files jobs name, and their readers.
    pub files: Files,
    /// Where reading a file and OCR run.
    pub cpu: CpuPool,
    /// The extractions' and OCR pages' durations.
    pub metrics: JobMetrics,
}

/// What the extraction worker reads of the settings.
struct WorkerSettings {
    /// Attempts before a job fails for good.
    max_attempts: i32,
    /// How long a running extraction may go on once its consumer stopped.
    drain_budget: Duration,
    /// Where a deferred result is posted, and the key of its token.
    deferred: Option<(String, String)>,
    /// How often a delivery that lost its claim looks at the job again.
    heartbeat: Duration,
    /// How long reading a job's file may take.
    deadline: Duration,
}

/// What the attempt came to, before it is made durable.
enum Attempt {
    /// The values, and the document read from the job's file if it names one.
    Extracted(ExtractionOutput, Option<Document>),
    Deferred(std::time::Duration),
    Retryable(String),
    Failed(String),
}

impl From<Result<Extracted, ExtractError>> for Attempt {
    fn from(outcome: Result<Extracted, ExtractError>) -> Self {
        match outcome {
            Ok(Extracted::Output(output)) => Self::Extracted(output, None),
            Ok(Extracted::Read(output, document)) => Self::Extracted(output, Some(document)),
            Ok(Extracted::Deferred(deadline)) => Self::Deferred(deadline),
            Err(e) if e.is_retryable() => Self::Retryable(e.to_string()),
            Err(e) => Self::Failed(e.to_string()),
        }
    }
}

impl Attempt {
    /// The `outcome` label of the extraction-duration histogram.
    fn label(&self) -> &'static str {
        match self {
            Self::Extracted(..) => "succeeded",
            Self::Deferred(_) => "deferred",
            Self::Retryable(_) => "retryable",
            Self::Failed(_) => "failed",
        }
    }
}

impl ExtractionWorker {
    /// A worker on `parts` that runs each job's extractor, as `settings`
    /// describe it.
    pub fn new(settings: &Settings, parts: Parts) -> Self {
        let deferred = settings.deferred_results();
        let settings = WorkerSettings {
            max_attempts: settings.max_attempts,
            drain_budget: settings.extraction_drain_budget(),
            deferred: deferred.map(|(url, secret)| (url.to_owned(), secret.to_owned())),
            heartbeat: settings.heartbeat_interval_s.get(),
            deadline: settings.extraction_deadline_s.get(),
        };
        Self { parts, settings }
    }

    async fn run_claim(
        &self,
        mut claim: Claim,
        reason: PublishReason,
        stop: &CancellationToken,
    ) -> Result<(), HandlerError> {
        let (id, token) = (claim.extraction.id, claim.token);
        if claim.extraction.cancel_requested_at.is_some() {
            return Ok(self.cancel(id, token, reason).await?);
        }
        failpoints::hit("worker.after_claim")
            .await
            .map_err(JobError::from)?;
        let max_attempts = self.settings.max_attempts;
        if token - claim.extraction.attempts_base > max_attempts {
            // Only a revived claim gets here (a worker that died, a deferred
            // result that never came): the attempts are spent all the same.
            let error =
                format!("gave up after {max_attempts} attempts (the last ended without a result)");
            let failed = self.parts.jobs.fail_extraction((id, token), &error, reason);
            return Ok(failed.await.map(drop)?);
        }
        let request = claim
            .extraction
            .request
            .take()
            .map(|json| std::sync::Arc::new(json.0))
            .ok_or_else(|| {
                HandlerError::Transient(
                    "the claim returned no request (a bug in its statement)".into(),
                )
            })?;
        let started = Instant::now();
        let lane = lane(&claim.extraction);
        let attempt = match self.extract_held((id, token, lane), &request, stop).await {
            Held::Lost => {
                self.parts.jobs.stale(STAGE, id, token, "heartbeat");
                return Ok(());
            }
            // Dropping the work closed its call: the provider sees the close.
            Held::CancelRequested => return Ok(self.cancel(id, token, reason).await?),
            Held::Done(None | Some(Err(ExtractError::Interrupted))) => {
                return self.release(id, token).await
            }
            Held::Done(Some(outcome)) => Attempt::from(outcome),
        };
        let elapsed = started.elapsed().as_secs_f64();
        let durations = &self.parts.metrics.extraction_duration;
        durations
            .with_label_values(&[attempt.label()])
            .observe(elapsed);
        Ok(self.settle((id, token), attempt, reason).await?)
    }

    /// Runs the job's extractor while the claim's lease is renewed: until it
    /// ends, the lease is lost, a cancel is requested, or the drain budget of
    /// a stopping consumer runs out (`None`).
    async fn extract_held(
        &self,
        (id, token, lane): (Uuid, i32, Lane),
        request: &std::sync::Arc<crate::domain::ExtractionRequest>,
        stop: &CancellationToken,
    ) -> Held<Option<Result<Extracted, ExtractError>>> {
        let settings = &self.settings;
        let callback =
            (settings.deferred.as_ref()).map(|(url, secret)| Callback::new(url, secret, id, token));
        let job = Job {
            id,
            attempt: token,
            request,
            callback: callback.as_ref(),
            lane,
            file: None,
        };
        let work = within_drain(self.extract(&job, stop), stop, settings.drain_budget);
        self.parts.jobs.hold_claim(STAGE, (id, token), work).await
    }

    /// Makes an attempt's outcome durable: success, deferral, retry or failure.
    async fn settle(
        &self,
        claim: (Uuid, i32),
        attempt: Attempt,
        reason: PublishReason,
    ) -> Result<(), JobError> {
        let parts = &self.parts;
        match attempt {
            Attempt::Extracted(output, document) => {
                if let Some(document) = document {
                    if !store::documents::keep(&parts.pool, claim, &document).await? {
                        parts.jobs.stale(STAGE, claim.0, claim.1, "completion");
                        return Ok(());
                    }
                }
                parts.jobs.succeed_extraction(claim, &output, reason).await
            }
            Attempt::Deferred(deadline) => self.defer(claim, deadline).await,
            Attempt::Retryable(error) => {
                let retried = parts.jobs.retry_or_fail_extraction(claim, &error, reason);
                retried.await
            }
            Attempt::Failed(error) => parts.jobs.fail_extraction(claim, &error, reason).await,
        }
        .map(drop)
    }

    async fn extract(
        &self,
        job: &Job<'_>,
        stop: &CancellationToken,
    ) -> Result<Extracted, ExtractError> {
        if let Err(e) = failpoints::hit("worker.extract").await {
            return Err(ExtractError::Unavailable(e.to_string()));
        }
        let name = job.request.extractor_name();
        match &job.request.document.object {
            None => self.parts.extractors.extract(name, job, stop).await,
            // Boxed: reading a file (OCR's child processes above all) holds
            // a state machine of kilobytes across its awaits. Inline, every
            // job's task would carry it, and a worker holds hundreds of jobs
            // at once (the burn-down's peak RSS grew by 10 MiB with it).
            Some(file) => Box::pin(self.extract_file(job, file, stop)).await,
        }
    }

    /// Runs the job's extractor on the document in its file. The rules read
    /// it here (a PDF's text layer, a text file's text) on the CPU pool and
    /// search it as a document submitted as JSON; an extractor of protocol
    /// version 2 gets a URL to fetch it from, and may answer its words. The
    /// document read is kept for bbox refinement.
    async fn extract_file(
        &self,
        job: &Job<'_>,
        file: &str,
        stop: &CancellationToken,
    ) -> Result<Extracted, ExtractError> {
        let parts = &self.parts;
        let name = job.request.extractor_name();
        let refused = |message: String| ExtractError::Refused {
            extractor: name.to_owned(),
            message,
        };
        let tenant = job.lane.tenant.ok_or_else(|| {
            ExtractError::Unavailable("the job's tenant is unknown (a bug in its claim)".into())
        })?;
        let gone = |e: FileError| match e {
            FileError::Missing(_) => refused(format!(
                "the job's file {file} is gone (deleted since the submit)"
            )),
            e => ExtractError::Unavailable(e.to_string()),
        };
        if name != RULES {
            if parts.extractors.takes_files(name) == Some(false) {
                return Err(refused(
                    "this extractor speaks protocol version 1, which takes documents as JSON \
                     only: a file needs `rules` or an extractor of protocol version 2"
                        .into(),
                ));
            }
            let url = parts
                .files
                .url_for(tenant, file, (job.id, job.attempt))
                .await;
            let file = url.map_err(gone)?;
            let with_file = Job {
                file: Some(&file),
                ..*job
            };
            return match parts.extractors.extract(name, &with_file, stop).await? {
                // A provider that answered no words leaves nothing to ground in.
                Extracted::Output(output) => Ok(Extracted::Read(output, Document::default())),
                other => Ok(other),
            };
        }
        let (kind, bytes) = parts.files.read(tenant, file).await.map_err(gone)?;
        let limits = parts.files.read_limits();
        let budget = self.settings.deadline;
        // In a process of its own, killed at the deadline: a parse cannot
        // check one, and must not keep its slot past it.
        let reader = parts.files.pdf_reader();
        let file = bytes.clone();
        let read = |deadline: Deadline| async move {
            files::document_apart(reader, kind, file, &limits, &deadline).await
        };
        let reading = parts.cpu.run_apart(budget, read).await?;
        let document = self.read_scans(job, reading, bytes).await?;
        let mut request = ExtractionRequest::clone(job.request);
        request.document = document;
        let request = std::sync::Arc::new(request);
        let read_job = Job {
            request: &request,
            ..*job
        };
        match parts.extractors.extract(name, &read_job, stop).await? {
            Extracted::Output(output) => Ok(Extracted::Read(output, request.document.clone())),
            other => Ok(other),
        }
    }

    /// Reads by OCR the pages of `reading` that have no text, one page at a
    /// time, each holding one of the deployment's OCR slots and one of the
    /// CPU pool's for no longer than its limit (the engine's process is
    /// killed past it), and all of them for no longer than the job's.
    async fn read_scans(
        &self,
        job: &Job<'_>,
        reading: files::Reading,
        bytes: axum::body::Bytes,
    ) -> Result<Document, ExtractError> {
        let parts = &self.parts;
        let ocr = parts.files.ocr();
        // Time spent reading the job's pages so far, in milliseconds.
        let spent = std::sync::atomic::AtomicU64::new(0);
        let spent = &spent;
        let run = |scan: files::Scan, mut reading: files::Reading| {
            let bytes = bytes.clone();
            async move {
                use std::sync::atomic::Ordering::Relaxed;
                let ocr = ocr.expect("scans are read only with OCR on");
                let left = ocr
                    .job_timeout
                    .saturating_sub(Duration::from_millis(spent.load(Relaxed)));
                if left.is_zero() {
                    return Err(files::ocr_budget_spent(ocr.job_timeout));
                }
                // The page stops itself at its limit; the pool's budget is
                // a backstop a little past it, and the job's what is left.
                let budget = (ocr.page_timeout + Duration::from_secs(1)).min(left);
                let _slot = parts.extractors.ocr_slot(job.lane).await;
                // Timed from when the CPU pool's slot is held: the wait for
                // it is not the job's reading.
                let started = std::sync::OnceLock::new();
                let read = |_| {
                    let _ = started.set(Instant::now());
                    files::read_scan(ocr, bytes, &scan, &mut reading)
                };
                let read = parts.cpu.run_apart(budget, read).await;
                let took = started.get().map(Instant::elapsed).unwrap_or_default();
                spent.fetch_add(u64::try_from(took.as_millis()).unwrap_or(u64::MAX), Relaxed);
                match read {
                    Err(ExtractError::DeadlineExceeded(_)) if budget == left => {
                        return Err(files::ocr_budget_spent(ocr.job_timeout))
                    }
                    read => read?,
                }
                parts.metrics.ocr_page_duration.observe(took.as_secs_f64());
                Ok(reading)
            }
        };
        reading.read_scans(ocr, run).await
    }

    /// The extractor will post the result: the claim is held until `deadline`
    /// (no heartbeats meanwhile) and the record is delivered, so a long
    /// extraction holds no worker slot. A result that never comes leaves a job
    /// running past its lease, which the reaper revives (orphan class 2).
    async fn defer(&self, (id, token): (Uuid, i32), deadline: Duration) -> Result<bool, JobError> {
        let parts = &self.parts;
        // Never shorter than a lease: a provider cannot make the reaper
        // revive the job before its result had a chance to arrive.
        let deadline_s = deadline
            .as_secs_f64()
            .max(parts.jobs.stage(STAGE).lease.as_secs_f64());
        let held = leases::renew(&parts.pool, STAGE, id, token, deadline_s).await?;
        match held {
            Some(Renewed {
                cancel_requested: true,
            }) => {
                let cancelled = parts
                    .jobs
                    .cancel_running_extraction((id, token), PublishReason::Submit);
                cancelled.await
            }
            Some(_) => {
                tracing::info!(%id, token, deadline_s, "extraction deferred: the result will be posted");
                Ok(true)
            }
            // A fast provider may have posted the result already; otherwise
            // the claim was taken over.
            None => {
                let row = store::get(&parts.pool, id).await?;
                let answered = row
                    .is_some_and(|r| r.attempts == token && r.status != ExtractionStatus::Running);
                match answered {
                    true => {
                        tracing::debug!(%id, token, "deferred result arrived before the deferral")
                    }
                    false => parts.jobs.stale(STAGE, id, token, "completion"),
                }
                Ok(answered)
            }
        }
    }

    async fn cancel(&self, id: Uuid, token: i32, reason: PublishReason) -> Result<(), JobError> {
        let cancelled = self
            .parts
            .jobs
            .cancel_running_extraction((id, token), reason);
        cancelled.await.map(drop)
    }

    /// Gives up claim `token` when the consumer stopped: the extraction had not
    /// called its extractor yet, or its call outlived the drain's budget. The
    /// lease ends now, so the record's next owner claims the job at once
    /// instead of waiting for the lease, and the record is left undelivered
    /// (not committed). Like a crash, the claim counts as an attempt.
    async fn release(&self, id: Uuid, token: i32) -> Result<(), HandlerError> {
        let released = leases::release(&self.parts.pool, STAGE, id, token).await;
        if let Err(e) = released {
            tracing::warn!(%id, token, error = %e, "claim not released; it ends with its lease");
        }
        tracing::info!(%id, token, "consumer stopping: extraction unfinished; claim released");
        Err(HandlerError::Abandoned(format!(
            "{id}: extraction unfinished when the consumer stopped"
        )))
    }

    /// A delivery that lost the claim is complete only once the job's follow-up
    /// is durable. If the job succeeded but its bbox request is not yet
    /// acknowledged, the holder is either publishing it right now or died
    /// before it could: wait for the stamp, heartbeat by heartbeat, for up to
    /// the post-processing orphan threshold, then publish it ourselves (a
    /// second request is harmless: the bbox claim is atomic). Stopping leaves
    /// the record undelivered for the next owner.
    async fn finish_follow_up(
        &self,
        id: Uuid,
        reason: PublishReason,
        stop: &CancellationToken,
    ) -> Result<(), HandlerError> {
        let threshold = self.parts.jobs.stage(Stage::BboxRefinement).orphan_after;
        let give_up = tokio::time::Instant::now() + threshold;
        loop {
            let row = store::get(&self.parts.pool, id)
                .await
                .map_err(JobError::from)?;
            let owed = row.filter(|row| {
                row.status == ExtractionStatus::Succeeded
                    && row.bbox_refinement().is_some_and(|b| {
                        b.status == BboxStatus::Pending && b.published_at.is_none()
                    })
            });
            let Some(owed) = owed else {
                return Ok(());
            };
            if stop.is_cancelled() {
                return Err(HandlerError::Transient(format!(
                    "stopped while {id}'s follow-up was unacknowledged"
                )));
            }
            if tokio::time::Instant::now() >= give_up {
                tracing::info!(%id, "completing a follow-up its holder never acknowledged");
                let jobs = &self.parts.jobs;
                let requested = jobs.request_bbox_refinement(id, lane(&owed), reason);
                return Ok(requested.await?);
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(self.settings.heartbeat) => {}
            }
        }
    }
}

/// Runs `work`, unless `stop` fired (shutdown, revoke) and `budget` passed
/// since: then `None`, and the work is dropped.
async fn within_drain<T>(
    work: impl std::future::Future<Output = T>,
    stop: &CancellationToken,
    budget: std::time::Duration,
) -> Option<T> {
    tokio::pin!(work);
    tokio::select! {
        biased;
        done = &mut work => return Some(done),
        _ = stop.cancelled() => {}
    }
    tokio::time::timeout(budget, work).await.ok()
}

impl RecordHandler for ExtractionWorker {
    /// Claims the job and runs its attempt, inside the job's span; a delivery
    /// that did not claim makes sure the job's follow-up is durable.
    async fn handle(&self, record: &Record, stop: &CancellationToken) -> Result<(), HandlerError> {
        let (event, id, span) = job_record::<ExtractionSubmitted>(record, |e| &e.extraction_id)?;
        let reason = event.reason;
        let run = |claim| self.run_claim(claim, reason, stop);
        let claimed = self.parts.jobs.run_claimed(STAGE, id, reason, stop, run);
        match claimed.instrument(span.clone()).await? {
            true => Ok(()),
            false => {
                let follow_up = self.finish_follow_up(id, reason, stop);
                follow_up.instrument(span).await
            }
        }
    }
}
