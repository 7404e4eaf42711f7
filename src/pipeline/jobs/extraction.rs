//! How an extraction attempt ends: succeeded (and its bbox refinement
//! requested), failed, requeued for a retry, or cancelled. Each is one fenced
//! transition of claim `token` followed by its events. The worker ends the
//! attempts it ran itself; the API ends a deferred attempt when its extractor
//! posts the result. Each returns whether the claim was still held: a `false`
//! is a stale holder, whose work is dropped and counted.

use tracing::Instrument;
use uuid::Uuid;

use super::{lane, JobError, Jobs};
use crate::domain::Lane;
use crate::domain::{Stage, Transition};
use crate::events::PublishReason;
use crate::extract::ExtractionOutput;
use crate::failpoints;
use crate::store::transitions::{self, Completion};
use crate::store::{orphans, Extraction};

impl Jobs {
    /// Marks attempt `token` succeeded with `output` and requests its bbox
    /// refinement, in one commit; then publishes both events and the request.
    pub async fn succeed_extraction(
        &self,
        (id, token): (Uuid, i32),
        output: &ExtractionOutput,
        reason: PublishReason,
    ) -> Result<bool, JobError> {
        let result = serde_json::to_value(output).expect("extraction output serialises");
        let completion = Completion { id, token, result };
        let succeeded = self.0.batched.succeed[Stage::Extraction]
            .run(completion)
            .await?;
        // One statement made both transitions: they win or lose together.
        let metrics = &self.0.metrics;
        metrics.transition(Transition::MarkSucceeded, &succeeded);
        metrics.transition(Transition::StartBboxRefinement, &succeeded);
        let Some(succeeded) = succeeded else {
            self.stale(Stage::Extraction, id, token, "completion");
            return Ok(false);
        };
        // As with the claim: the success event is acknowledged while the bbox
        // refinement is requested.
        let (emitted, followed) = tokio::join!(
            self.emit(Transition::MarkSucceeded, &succeeded, Some(token), reason),
            self.follow_up(id, &succeeded, reason),
        );
        emitted?;
        followed?;
        Ok(true)
    }

    /// After a success: the bbox request and its event acknowledged.
    async fn follow_up(
        &self,
        id: Uuid,
        requested: &Extraction,
        reason: PublishReason,
    ) -> Result<(), JobError> {
        failpoints::hit("worker.after_mark_succeeded").await?;
        let (requested_published, emitted) = tokio::join!(
            self.request_bbox_refinement(id, lane(requested), reason),
            self.emit(Transition::StartBboxRefinement, requested, None, reason),
        );
        requested_published?;
        emitted
    }

    /// Publishes the bbox refinement request and, once acknowledged, stamps it.
    pub async fn request_bbox_refinement(
        &self,
        id: Uuid,
        lane: Lane,
        reason: PublishReason,
    ) -> Result<(), JobError> {
        self.hand_over(Stage::BboxRefinement, id, lane, reason)
            .await?;
        Ok(self.0.batched.bbox_requested.run(id).await?)
    }

    /// Marks attempt `claim` failed for good with `error`.
    pub async fn fail_extraction(
        &self,
        claim: (Uuid, i32),
        error: &str,
        reason: PublishReason,
    ) -> Result<bool, JobError> {
        self.fail_claim(Stage::Extraction, claim, error, reason)
            .await
    }

    /// Requeues attempt `token` with a backoff, or fails the job once its
    /// current run (since its last retry on request) had its `max_attempts`.
    pub async fn retry_or_fail_extraction(
        &self,
        (id, token): (Uuid, i32),
        error: &str,
        reason: PublishReason,
    ) -> Result<bool, JobError> {
        let settings = &self.0.settings;
        let pool = &self.0.pool;
        let base = self
            .persist("attempts_base", || transitions::attempts_base(pool, id))
            .await?;
        let run = token - base;
        if run >= settings.max_attempts {
            let error = format!("{error} (gave up after {run} attempts)");
            return self.fail_extraction((id, token), &error, reason).await;
        }
        let delay_s = settings.backoff.after(run).as_secs_f64();
        let requeued = || transitions::requeue_for_retry(pool, id, token, error, delay_s);
        let transition = Transition::RequeueForRetry;
        let row = self
            .complete_claim(transition, (id, token), requeued)
            .await?;
        let Some(row) = self
            .conclude(Stage::Extraction, transition, (id, token), row, reason)
            .await?
        else {
            return Ok(false);
        };
        self.0
            .metrics
            .jobs
            .retries_scheduled
            .with_label_values(&["extraction"])
            .inc();
        tracing::info!(%id, attempt = token, delay_s, %error, next_attempt_at = ?row.next_attempt_at, "attempt failed; retry scheduled");
        let due = publish_when_due(self.clone(), id, lane(&row), delay_s);
        tokio::spawn(due.in_current_span());
        Ok(true)
    }

    /// Sends failed job `id` back to the queue at its client's request, with
    /// a fresh attempt budget, and hands it to the workers; `None` when the
    /// job is not failed. Once the row is queued the retry has happened: an
    /// event or a hand-over that the broker does not take is logged, and the
    /// reaper publishes the job later (it is queued and unpublished).
    pub async fn retry_failed(&self, id: Uuid) -> Result<Option<Extraction>, JobError> {
        let pool = &self.0.pool;
        let row = self
            .persist("retry_failed", || transitions::retry_failed(pool, id))
            .await?;
        self.0.metrics.transition(Transition::RetryFailed, &row);
        let Some(row) = row else {
            return Ok(None);
        };
        let reason = PublishReason::Retry;
        if let Err(e) = self.emit(Transition::RetryFailed, &row, None, reason).await {
            tracing::warn!(%id, error = %e, "lifecycle event not published");
        }
        if let Err(e) = self
            .republish(Stage::Extraction, id, lane(&row), reason)
            .await
        {
            tracing::warn!(%id, error = %e, "retried job not published; the reaper will");
        }
        tracing::info!(%id, attempts = row.attempts, "failed job retried on request");
        Ok(Some(row))
    }

    /// Cancels the job of running attempt `token`, at its client's request.
    pub async fn cancel_running_extraction(
        &self,
        (id, token): (Uuid, i32),
        reason: PublishReason,
    ) -> Result<bool, JobError> {
        let cancelled = || transitions::mark_cancelled(&self.0.pool, id, Some(token));
        let transition = Transition::MarkCancelled;
        let row = self
            .complete_claim(transition, (id, token), cancelled)
            .await?;
        let cancelled = self
            .conclude(Stage::Extraction, transition, (id, token), row, reason)
            .await?;
        if cancelled.is_some() {
            tracing::info!(%id, token, "running extraction cancelled at the client's request");
        }
        Ok(cancelled.is_some())
    }
}

/// The delayed publish of a retry. Losing it (the process dies first) is safe:
/// the due time is in the row, and the reaper republishes a class-3 orphan.
async fn publish_when_due(jobs: Jobs, id: Uuid, lane: Lane, delay_s: f64) {
    tokio::time::sleep(std::time::Duration::from_secs_f64(delay_s)).await;
    if failpoints::hit("worker.before_retry_publish")
        .await
        .is_err()
    {
        return;
    }
    let stage = Stage::Extraction;
    if let Err(e) = jobs.hand_over(stage, id, lane, PublishReason::Retry).await {
        tracing::warn!(%id, error = %e, "retry publish failed; the reaper will revive the job");
        return;
    }
    if let Err(e) = orphans::record_published(&jobs.0.pool, stage, id).await {
        tracing::warn!(%id, error = %e, "retry publish not recorded; the reaper may republish it");
    }
}
