//! The one submit path, for every intake (HTTP, and the Kafka topic
//! `extraction.requests`): insert the row idempotently, then hand it to the
//! workers.
//!
//! The row is durable before anything is published. Over HTTP and the import
//! stream ([`submit`]) the answer comes within `http_answer_timeout_s`, whatever
//! the dependencies do: a row not written by then is an error the client
//! retries (503; with its `Idempotency-Key`, a retry never makes a second
//! job), and a row written is accepted (202) even if the broker has not
//! acknowledged its event yet. The event then goes on in the background (the
//! producer retries for `publish_timeout_s`); a publish that fails leaves a
//! class-1 orphan (queued, never published), which the extraction reaper
//! revives. So a broker outage delays jobs and loses none. The Kafka
//! intake ([`submit_durably`]) has a better option: it fails the record, which
//! is delivered again, so its offset is committed only once the row and the
//! job's event are both durable. Once the broker acknowledged the event, the
//! row is stamped as published (`stamps`: late, and only if still queued),
//! which tells the reaper it is not lost.
//!
//! A request naming a `webhook_url` is refused before anything is written if
//! the SSRF guard refuses the URL (`outbound::ssrf::Guard`) or webhooks are off, and
//! so is one naming an extractor that the settings do not have, or a file
//! (`document.object`) its tenant does not have.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use sqlx::PgPool;

use super::jobs::lane;
use super::{Batched, Jobs, Stamps};
use crate::config::Settings;
use crate::domain::{pattern, ExtractionRequest, ExtractionStatus, RequestLimits, Stage};
use crate::events::PublishReason;
use crate::extract::{CpuPool, Extractors};
use crate::failpoints;
use crate::health::{Dependency, Health};
use crate::kafka::PublishError;
use crate::store::{self, Extraction, NewExtraction, StoreError, SubmitError, Submitted};
use crate::trace;
use crate::webhook::Webhooks;
use tracing::Instrument;

/// The submit path's handle, shared by `serve` (the API and the import
/// stream) and the intake: what a submit checks, writes and publishes with.
#[derive(Clone)]
pub struct Submitter(Arc<Inner>);

struct Inner {
    parts: Parts,
    settings: SubmitSettings,
    /// The bytes each tenant kept when last summed here, and when.
    stored: std::sync::Mutex<std::collections::HashMap<Uuid, (i64, Instant)>>,
}

/// How long a tenant's summed bytes are taken as they were: the sum runs
/// over all its files, documents and corrections, so a burst of submits on
/// files runs it once, not each time. The quota may be passed by what one
/// such window of submits stores.
const STORED_FOR: Duration = Duration::from_secs(5);

/// Most tenants whose sums a process keeps.
const STORED_TENANTS: usize = 10_000;

/// What a submit uses.
pub struct Parts {
    /// The pool the files' touches and links run on.
    pub pool: PgPool,
    /// The lifecycle: the new job's hand-over and its `submit` event.
    pub jobs: Jobs,
    /// The batched insert and key lookup.
    pub batched: Batched,
    /// The extractors a request may name, and which of them take files.
    pub extractors: Extractors,
    /// The webhook URL check.
    pub webhooks: Webhooks,
    /// The "published" stamps of new jobs.
    pub stamps: Stamps,
    /// What is known of the dependencies' outages.
    pub health: Health,
    /// Where a request's new patterns compile: a pool of its own, so that
    /// extractions holding every thread of the extraction pool (a slow
    /// pattern runs until its deadline) never hold up a submit.
    pub compiler: CpuPool,
}

/// What a submit reads of the settings.
struct SubmitSettings {
    /// How long a submit over HTTP may take before it is answered.
    answer_bound: Duration,
    /// The request limits, for the patterns learned ahead of validation.
    limits: RequestLimits,
    /// Bytes of files, documents and corrections a tenant may keep (0:
    /// no quota): a job on a file keeps a document of its own.
    file_quota: u64,
}

impl Submitter {
    /// The submit path on `parts`, as `settings` describe it.
    pub fn new(settings: &Settings, parts: Parts) -> Self {
        let settings = SubmitSettings {
            answer_bound: settings.http_answer_timeout_s.get(),
            limits: settings.request_limits(),
            file_quota: settings.tenant_max_file_bytes,
        };
        Self(Arc::new(Inner {
            parts,
            settings,
            stored: Default::default(),
        }))
    }
}

impl Submitter {
    /// Inserts `new` (or finds the row its idempotency key names) and, when a
    /// row was created, publishes it; answers within `http_answer_timeout_s`.
    /// A row not written in time is [`SubmitError::TimedOut`]; a publish not
    /// acknowledged in time (at once, in a known broker outage) goes on after
    /// the answer, and if it fails the reaper revives the job. `durable` is
    /// called once the row is (the admission limit's signal).
    pub async fn submit(
        &self,
        new: NewExtraction,
        durable: impl FnOnce(),
    ) -> Result<Submitted, SubmitError> {
        let (health, bound) = (&self.0.parts.health, self.0.settings.answer_bound);
        // In a known outage, say so at once: waiting out the bound would only
        // hold the client (and its connection) for the same answer.
        if health.is_down(Dependency::Postgres) {
            return Err(SubmitError::Store(StoreError::from(
                sqlx::Error::PoolTimedOut,
            )));
        }
        let deadline = tokio::time::Instant::now() + bound;
        let submitted = tokio::time::timeout_at(deadline, self.insert(new))
            .await
            .map_err(|_| SubmitError::TimedOut(bound))??;
        durable();
        if let Submitted::Created(row) = &submitted {
            // In a known broker outage the answer does not wait for an ack
            // that cannot come before the bound: the row is durable, and the
            // event goes out (or the reaper revives the job) once it is back.
            let deadline = match health.is_down(Dependency::Kafka) {
                true => tokio::time::Instant::now(),
                false => deadline,
            };
            let (submitter, row) = (self.clone(), row.clone());
            // Spawned: neither the deadline nor a client that hangs up cuts the
            // publish short.
            let span = trace::job_span(row.id, None);
            let publishing = tokio::spawn(
                async move {
                    match submitter.publish_created(&row).await {
                        Ok(()) => tracing::debug!("submitted; its event was acknowledged"),
                        Err(e) => tracing::warn!(error = %e, "submitted event not published; the reaper will revive the job"),
                    }
                }
                .instrument(span),
            );
            if tokio::time::timeout_at(deadline, publishing).await.is_err() {
                tracing::debug!("submit answered before its event was acknowledged");
            }
        }
        Ok(submitted)
    }

    /// [`submit`](Self::submit), but `Ok` only once the job's event was
    /// acknowledged, also for a repeat whose first publish never was (its
    /// submitter failed in between).
    pub async fn submit_durably(
        &self,
        new: NewExtraction,
    ) -> Result<Submitted, DurableSubmitError> {
        let submitted = self.insert(new).await?;
        match &submitted {
            Submitted::Created(row) => self.publish_created(row).await?,
            Submitted::Replayed(row)
                if row.status == ExtractionStatus::Queued && row.published_at.is_none() =>
            {
                self.publish_again(row).await?
            }
            Submitted::Replayed(_) => {}
        }
        Ok(submitted)
    }

    /// The first half of a submit: the checks and the insert, nothing
    /// published. The benchmark queues a backlog this way before it releases
    /// the events (`docstream::bench_support`).
    pub async fn insert(&self, new: NewExtraction) -> Result<Submitted, SubmitError> {
        let parts = &self.0.parts;
        let name = new.request.extractor_name();
        let Some(takes_files) = parts.extractors.takes_files(name) else {
            return Err(SubmitError::UnknownExtractor(name.to_owned()));
        };
        if let Some(file) = &new.request.document.object {
            if !takes_files {
                return Err(SubmitError::TakesNoFiles(name.to_owned()));
            }
            // Its last use is now: no collection deletes it under the new job.
            if !store::files::touch(&parts.pool, new.tenant_id, file).await? {
                return Err(SubmitError::NoSuchFile(file.clone()));
            }
            self.within_quota(new.tenant_id).await?;
        }
        let naming = new
            .request
            .document
            .object
            .clone()
            .map(|f| (new.tenant_id, f));
        if let Some(url) = &new.request.webhook_url {
            let checked = parts.webhooks.check_submitted(url).await;
            checked.map_err(SubmitError::WebhookRefused)?;
        }
        let insert = |insert| async { parts.batched.insert.run(insert).await? };
        let find = |key| async { parts.batched.by_key.run(key).await };
        let submitted = store::submit_with(new, insert, find).await?;
        if let Some((tenant, file)) = naming {
            // A repeat links again: its first try may have failed in between.
            store::files::link(&parts.pool, tenant, &file, submitted.extraction().id).await?;
        }
        if let Submitted::Created(_) = &submitted {
            if let Err(e) = failpoints::hit("submit.after_insert").await {
                let failed = sqlx::Error::Protocol(e.to_string());
                return Err(SubmitError::Store(StoreError::from(failed)));
            }
        }
        Ok(submitted)
    }

    /// Refuses a job on a file when its tenant keeps as many bytes as its
    /// quota allows (each such job keeps a document of its own, counted
    /// each time), from a sum at most [`STORED_FOR`] old.
    async fn within_quota(&self, tenant: Uuid) -> Result<(), SubmitError> {
        let quota = self.0.settings.file_quota;
        if quota == 0 {
            return Ok(());
        }
        let lock = || self.0.stored.lock().unwrap_or_else(|e| e.into_inner());
        let recent = lock().get(&tenant).copied();
        let used = match recent {
            Some((used, at)) if at.elapsed() < STORED_FOR => used,
            _ => {
                let used = store::files::stored_bytes(&self.0.parts.pool, tenant).await?;
                let mut stored = lock();
                if stored.len() >= STORED_TENANTS {
                    stored.clear();
                }
                stored.insert(tenant, (used, Instant::now()));
                used
            }
        };
        match u64::try_from(used).unwrap_or(0) >= quota {
            true => Err(SubmitError::OverQuota { used, quota }),
            false => Ok(()),
        }
    }

    /// The second half of a submit: a new job's `extraction.submitted` event,
    /// and its `submit` lifecycle event.
    pub async fn publish_created(&self, row: &Extraction) -> Result<(), PublishError> {
        self.0.parts.jobs.submitted(row).await?;
        self.0.parts.stamps.published(row.id);
        Ok(())
    }

    /// A repeated submit's job whose first hand-over was never acknowledged
    /// (its submitter failed in between): handed over now, without a second
    /// `submit` event, and stamped once acknowledged.
    async fn publish_again(&self, row: &Extraction) -> Result<(), PublishError> {
        let (reason, lane) = (PublishReason::Submit, lane(row));
        let jobs = &self.0.parts.jobs;
        jobs.hand_over(Stage::Extraction, row.id, lane, reason)
            .await?;
        self.0.parts.stamps.published(row.id);
        Ok(())
    }

    /// Compiles the patterns of `request` this process has not met (within
    /// the size limit, and of the fields the limit allows) on the compiler
    /// pool, so that validating the request on the runtime finds each
    /// compiled or refused already: a hundred new worst-case patterns take
    /// the runtime threads for tens of milliseconds (seconds in a debug
    /// build), and `/healthz` and every other request with them. A request
    /// of known patterns pays a lookup each.
    ///
    /// The compiling is never cut short: had it stopped at a deadline, the
    /// validation would compile the rest on the runtime, where nothing can
    /// stop it. A caller with a bound stops waiting instead (the REST
    /// backstop answers 503), and the patterns compiled meanwhile are there
    /// for the client's retry.
    pub async fn learn_patterns(&self, request: &ExtractionRequest) {
        let limits = &self.0.settings.limits;
        let program = limits.pattern_program_bytes;
        let unknown: Vec<String> = (request.fields.iter().take(limits.fields))
            .filter_map(|field| field.pattern.as_deref())
            .filter(|p| p.len() <= limits.pattern_bytes && !pattern::known(p, program))
            .map(str::to_owned)
            .collect();
        if unknown.is_empty() {
            return;
        }
        // Only a panic is an error here; validation then compiles what is
        // still unknown.
        let _ = (self.0.parts.compiler)
            .run_to_end(move || pattern::learn(&unknown, program))
            .await;
    }
}

/// Why [`Submitter::submit_durably`] did not make a job durable.
#[derive(Debug, thiserror::Error)]
pub enum DurableSubmitError {
    /// Refused, or the database failed.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The job's event was not acknowledged.
    #[error(transparent)]
    Publish(#[from] PublishError),
}
