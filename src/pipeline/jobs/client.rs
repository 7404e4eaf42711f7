//! What clients and operators ask of jobs: a new job handed to the workers,
//! a cancel, a retry, a correction of a value, an erasure, a bulk action's
//! batch, a tenant's jobs cancelled before it is deleted. Each change is followed up here, and only here, as
//! the lifecycle's own transitions are: counted, the webhook of a job it
//! ended woken, its event published, and a job it queued handed over.

use uuid::Uuid;

use super::{lane, JobError, Jobs, RepublishError};
use crate::domain::{Stage, Transition};
use crate::events::{ExtractionEvent, FieldCorrection, PublishReason};
use crate::kafka::PublishError;
use crate::store::bulk::Applied;
use crate::store::corrections::Made;
use crate::store::retention::{self, Erased};
use crate::store::{orphans, transitions, Extraction};

/// What a cancel came to.
#[derive(Debug)]
pub enum Cancel {
    /// The job was queued, and is cancelled now.
    Cancelled(Extraction),
    /// The job is running: its holder was asked to stop, and cancels it at
    /// its next heartbeat.
    Requested(Extraction),
    /// Neither: the job is finished, was asked to stop before, or is not
    /// there.
    Neither,
}

impl Jobs {
    /// Hands new job `row` to the workers and publishes its `submit` event,
    /// both at once. A hand-over the broker did not take is the caller's to
    /// answer (the job stays queued and unpublished, which the reaper
    /// revives); a lost event is logged.
    pub async fn submitted(&self, row: &Extraction) -> Result<(), PublishError> {
        let reason = PublishReason::Submit;
        let (handed, emitted) = tokio::join!(
            self.hand_over(Stage::Extraction, row.id, lane(row), reason),
            self.emit(Transition::Submit, row, None, reason),
        );
        if let Err(e) = emitted {
            tracing::warn!(id = %row.id, error = %e, "lifecycle event not published");
        }
        handed
    }

    /// Cancels job `id` at its client's request: a queued job at once, a
    /// running one by asking its holder to stop.
    pub async fn cancel(&self, id: Uuid) -> Result<Cancel, JobError> {
        let pool = &self.0.pool;
        let cancelled = transitions::mark_cancelled(pool, id, None).await?;
        self.0
            .metrics
            .transition(Transition::MarkCancelled, &cancelled);
        if let Some(row) = cancelled {
            self.announce_change(Transition::MarkCancelled, &row, PublishReason::Submit)
                .await;
            return Ok(Cancel::Cancelled(row));
        }
        let requested = transitions::request_cancel(pool, id).await?;
        self.0
            .metrics
            .transition(Transition::RequestCancel, &requested);
        Ok(requested.map_or(Cancel::Neither, Cancel::Requested))
    }

    /// Follows up a correction stored of succeeded job `job`: counted, the
    /// job's webhook woken, and its event published. The correction is
    /// stored already: an event the broker did not take is a gap in the
    /// stream, logged, not a lost correction.
    pub async fn corrected(&self, job: &Extraction, made: &Made) {
        let transition = Transition::CorrectField;
        self.0.metrics.transition(transition, &Some(job));
        let webhooks = &self.0.webhooks;
        webhooks.wake(made.webhook_id.as_deref(), job.tenant_id);
        let correction = &made.correction;
        let mut event = ExtractionEvent::of(transition, job, None, PublishReason::Submit);
        event.correction = Some(FieldCorrection {
            correction_id: correction.id,
            field: correction.field.clone(),
            // Never the value: the record outlives an erase.
            value: None,
            key_id: correction.key_id.to_string(),
            reviewer: correction.reviewer.clone(),
        });
        if let Err(e) = self.announce(job.id, event).await {
            tracing::warn!(id = %job.id, error = %e, "correction event not published");
        }
    }

    /// Erases tenant `tenant_id`'s finished job `id` (`store::retention::erase`):
    /// when it was erased now, counted and its `erase` event published (a
    /// lost event is logged). The files it named are the caller's to forget.
    pub async fn erase(&self, tenant_id: Uuid, id: Uuid) -> Result<Erased, JobError> {
        let erased = retention::erase(&self.0.pool, tenant_id, id).await?;
        if let Erased::Now(row, _) = &erased {
            let transition = Transition::Erase;
            self.0.metrics.transition(transition, &Some(row));
            if let Err(e) = self
                .emit(transition, row, None, PublishReason::Submit)
                .await
            {
                tracing::warn!(%id, error = %e, "lifecycle event not published");
            }
        }
        Ok(erased)
    }

    /// Expires whatever claim holds job `id` and hands the job over again to
    /// the stage it is at, with the reason `operator` (`docstream reclaim`):
    /// the stage, or `None` when the job is unknown or has nothing left to
    /// do. Safe against a live holder: its fencing token no longer matches,
    /// so its completion is refused.
    pub async fn reclaim(&self, id: Uuid) -> Result<Option<Stage>, JobError> {
        let pool = &self.0.pool;
        let Some(stage) = orphans::reclaim(pool, id).await? else {
            return Ok(None);
        };
        let lane = crate::store::get(pool, id).await?.map(|row| lane(&row));
        let republished =
            self.republish(stage, id, lane.unwrap_or_default(), PublishReason::Operator);
        match republished.await {
            Ok(()) => Ok(Some(stage)),
            Err(RepublishError::Publish(e)) => Err(e.into()),
            Err(RepublishError::Record(e)) => Err(e.into()),
        }
    }

    /// Cancels the open jobs `ids` (a deleted tenant's): the queued ones at
    /// once, the running ones by asking their holders to stop.
    pub async fn cancel_many(&self, ids: &[Uuid]) -> Result<(), JobError> {
        let pool = &self.0.pool;
        let cancelled = transitions::cancel_queued_many(pool, ids).await?;
        let requested = transitions::request_cancel_many(pool, ids).await?;
        self.followed_batch(&Applied {
            cancelled: cancelled.into_iter().flatten().collect(),
            cancel_requested: requested.into_iter().flatten().collect(),
            ..Applied::default()
        })
        .await;
        Ok(())
    }

    /// What a bulk action's committed batch owes, as the single-job routes
    /// owe it: each change counted, each cancel's webhook woken and event
    /// published, each retried job's event published and the job handed
    /// over (stamped once acknowledged). A lost event is logged; a lost
    /// hand-over leaves the job queued and unstamped, which the reaper
    /// revives.
    pub async fn followed_batch(&self, applied: &Applied) {
        use futures::future::join_all;
        let metrics = &self.0.metrics;
        for row in &applied.cancel_requested {
            metrics.transition(Transition::RequestCancel, &Some(row));
        }
        let cancelled = applied.cancelled.iter().map(|row| async move {
            metrics.transition(Transition::MarkCancelled, &Some(row));
            self.announce_change(Transition::MarkCancelled, row, PublishReason::Submit)
                .await;
        });
        let retried = applied.retried.iter().map(|row| async move {
            metrics.transition(Transition::RetryFailed, &Some(row));
            let reason = PublishReason::Retry;
            self.announce_change(Transition::RetryFailed, row, reason).await;
            let handed = self.hand_over(Stage::Extraction, row.id, lane(row), reason);
            match handed.await {
                Ok(()) => Some(row.id),
                Err(e) => {
                    tracing::warn!(id = %row.id, error = %e, "retried job not published; the reaper will");
                    None
                }
            }
        });
        let (_, handed) = tokio::join!(join_all(cancelled), join_all(retried));
        let handed: Vec<Uuid> = handed.into_iter().flatten().collect();
        if handed.is_empty() {
            return;
        }
        let stamped = orphans::record_published_many(&self.0.pool, Stage::Extraction, &handed);
        if let Err(e) = stamped.await {
            tracing::warn!(error = %e, "retried jobs' publish not recorded; the reaper may republish them");
        }
    }

    /// What `transition`, won on `row` outside a stage's claim, owes once
    /// it is durable: the webhook of a job it ended woken (the statement that
    /// ended it wrote the delivery, and returned its id), and its event
    /// published. A lost event is logged: the change stands.
    async fn announce_change(
        &self,
        transition: Transition,
        row: &Extraction,
        reason: PublishReason,
    ) {
        self.0
            .webhooks
            .wake(row.webhook_id.as_deref(), row.tenant_id);
        if let Err(e) = self.emit(transition, row, None, reason).await {
            tracing::warn!(id = %row.id, error = %e, "lifecycle event not published");
        }
    }
}
