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

use super::jobs::lane;
use super::Services;
use crate::config::RULES;
use crate::domain::{ExtractionStatus, Stage};
use crate::events::PublishReason;
use crate::failpoints;
use crate::health::Dependency;
use crate::kafka::PublishError;
use crate::store::{self, Extraction, NewExtraction, StoreError, SubmitError, Submitted};
use crate::trace;
use tracing::Instrument;

/// Inserts `new` (or finds the row its idempotency key names) and, when a row
/// was created, publishes it; answers within `http_answer_timeout_s`. A row
/// not written in time is [`SubmitError::TimedOut`]; a publish not
/// acknowledged in time (at once, in a known broker outage) goes on after
/// the answer, and if it fails the reaper revives the job. `durable` is
/// called once the row is (the admission limit's signal).
pub async fn submit(
    services: &Services,
    new: NewExtraction,
    durable: impl FnOnce(),
) -> Result<Submitted, SubmitError> {
    let bound = services.settings.http_answer_timeout_s.get();
    // In a known outage, say so at once: waiting out the bound would only
    // hold the client (and its connection) for the same answer.
    if services.health.is_down(Dependency::Postgres) {
        return Err(SubmitError::Store(StoreError::from(
            sqlx::Error::PoolTimedOut,
        )));
    }
    let deadline = tokio::time::Instant::now() + bound;
    let submitted = tokio::time::timeout_at(deadline, insert(services, new))
        .await
        .map_err(|_| SubmitError::TimedOut(bound))??;
    durable();
    if let Submitted::Created(row) = &submitted {
        // In a known broker outage the answer does not wait for an ack
        // that cannot come before the bound: the row is durable, and the
        // event goes out (or the reaper revives the job) once it is back.
        let deadline = match services.health.is_down(Dependency::Kafka) {
            true => tokio::time::Instant::now(),
            false => deadline,
        };
        let (services, row) = (services.clone(), row.clone());
        // Spawned: neither the deadline nor a client that hangs up cuts the
        // publish short.
        let span = trace::job_span(row.id, None);
        let publishing = tokio::spawn(
            async move {
                match publish_created(&services, &row).await {
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

/// Why [`submit_durably`] did not make a job durable.
#[derive(Debug, thiserror::Error)]
pub enum DurableSubmitError {
    /// Refused, or the database failed.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The job's event was not acknowledged.
    #[error(transparent)]
    Publish(#[from] PublishError),
}

/// [`submit`], but `Ok` only once the job's event was acknowledged, also for a
/// repeat whose first publish never was (its submitter failed in between).
pub async fn submit_durably(
    services: &Services,
    new: NewExtraction,
) -> Result<Submitted, DurableSubmitError> {
    let submitted = insert(services, new).await?;
    match &submitted {
        Submitted::Created(row) => publish_created(services, row).await?,
        Submitted::Replayed(row)
            if row.status == ExtractionStatus::Queued && row.published_at.is_none() =>
        {
            publish_again(services, row).await?
        }
        Submitted::Replayed(_) => {}
    }
    Ok(submitted)
}

/// The first half of a submit: the checks and the insert, nothing published.
/// The benchmark queues a backlog this way before it releases the events
/// (`docstream::bench_support`).
pub async fn insert(services: &Services, new: NewExtraction) -> Result<Submitted, SubmitError> {
    known_extractor(services, new.request.extractor_name())?;
    if let Some(file) = &new.request.document.object {
        let name = new.request.extractor_name();
        let extractor = services.settings.extractors.get(name);
        if extractor.is_some_and(|e| !e.takes_files()) {
            return Err(SubmitError::TakesNoFiles(name.to_owned()));
        }
        // Its last use is now: no collection deletes it under the new job.
        if !store::files::touch(&services.pool, new.tenant_id, file).await? {
            return Err(SubmitError::NoSuchFile(file.clone()));
        }
    }
    let naming = new
        .request
        .document
        .object
        .clone()
        .map(|f| (new.tenant_id, f));
    if let Some(url) = &new.request.webhook_url {
        let checked = services.webhooks.check_submitted(url).await;
        checked.map_err(SubmitError::WebhookRefused)?;
    }
    let insert = |insert| async { services.batched.insert.run(insert).await? };
    let find = |key| async { services.batched.by_key.run(key).await };
    let submitted = store::submit_with(new, insert, find).await?;
    if let Some((tenant, file)) = naming {
        // A repeat links again: its first try may have failed in between.
        store::files::link(&services.pool, tenant, &file, submitted.extraction().id).await?;
    }
    if let Submitted::Created(_) = &submitted {
        if let Err(e) = failpoints::hit("submit.after_insert").await {
            let failed = sqlx::Error::Protocol(e.to_string());
            return Err(SubmitError::Store(StoreError::from(failed)));
        }
    }
    Ok(submitted)
}

/// Refuses a request for an extractor the settings do not name.
fn known_extractor(services: &Services, name: &str) -> Result<(), SubmitError> {
    match name == RULES || services.settings.extractors.contains_key(name) {
        true => Ok(()),
        false => Err(SubmitError::UnknownExtractor(name.to_owned())),
    }
}

/// The second half of a submit: a new job's `extraction.submitted` event,
/// and its `submit` lifecycle event.
pub async fn publish_created(services: &Services, row: &Extraction) -> Result<(), PublishError> {
    services.jobs.submitted(row).await?;
    services.stamps.published(row.id);
    Ok(())
}

/// A repeated submit's job whose first hand-over was never acknowledged
/// (its submitter failed in between): handed over now, without a second
/// `submit` event, and stamped once acknowledged.
async fn publish_again(services: &Services, row: &Extraction) -> Result<(), PublishError> {
    let reason = PublishReason::Submit;
    let lane = lane(row);
    services
        .jobs
        .hand_over(Stage::Extraction, row.id, lane, reason)
        .await?;
    services.stamps.published(row.id);
    Ok(())
}
