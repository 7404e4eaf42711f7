//! What both stages' workers do the same way, over a [`Stage`]: claim (or
//! wait out a live holder), acknowledge the claim's event while the work
//! runs, hold the claim with heartbeats, fail it, count a stale holder, and
//! hand a job to a stage again. Each reads the stage's lease and topic from
//! its [`StageSettings`], and its statements from `store` by the stage; what
//! a stage's work is (an extraction, a grounding) stays in its worker.

use std::future::Future;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{JobError, Jobs, Parts};
use crate::domain::Lane;
use crate::domain::Stage;
use crate::events::{ExtractionSubmitted, PostProcessingRequested, PublishReason};
use crate::kafka::PublishError;
use crate::pipeline::lease::{hold, Held};
use crate::store::{leases, orphans, transitions, Claim, StoreError};

impl Jobs {
    /// Claims `stage` of job `id` and runs `work` on the claim. The claim's
    /// event is acknowledged while the work runs: joined, so it is queued (in
    /// order) before anything the work publishes, and the record is
    /// delivered only once both are done. `false` when the delivery did not
    /// claim (the stage finished, or another holder has it).
    pub async fn run_claimed<W, Fut, E>(
        &self,
        stage: Stage,
        id: Uuid,
        reason: PublishReason,
        stop: &CancellationToken,
        work: W,
    ) -> Result<bool, E>
    where
        W: FnOnce(Claim) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: From<JobError>,
    {
        let stage_name = stage.as_str();
        let Some(claim) = self.claim_or_wait(stage, id, stop).await? else {
            tracing::debug!(
                stage = stage_name,
                ?reason,
                "not claimed (finished, or another holder's)"
            );
            return Ok(false);
        };
        let token = claim.token;
        tracing::debug!(stage = stage_name, token, ?reason, "claimed");
        if let Some(recovery) = claim.extraction.recovery_s(stage) {
            let recoveries = &self.0.metrics.jobs.recovery;
            recoveries
                .with_label_values(&[stage_name])
                .observe(recovery);
        }
        let (emitted, ran) = tokio::join!(
            self.emit(
                stage.claim_transition(),
                &claim.extraction,
                Some(token),
                reason
            ),
            work(claim),
        );
        emitted?;
        let outcome = if ran.is_ok() { "done" } else { "failed" };
        tracing::debug!(stage = stage_name, outcome, "claim ended");
        ran.map(|()| true)
    }

    /// Runs `work` while claim `token` of `stage` on job `id` is renewed
    /// every heartbeat (see `lease::hold`).
    pub async fn hold_claim<T>(
        &self,
        stage: Stage,
        (id, token): (Uuid, i32),
        work: impl Future<Output = T>,
    ) -> Held<T> {
        let lease_s = self.stage(stage).lease.as_secs_f64();
        let renew = || leases::renew(&self.0.pool, stage, id, token, lease_s);
        let heartbeat = self.0.settings.heartbeat;
        hold(work, heartbeat, &self.0.health, renew).await
    }

    /// Ends claim `token` of `stage` as failed for good with `error`, and
    /// publishes its event; `false` when the claim was no longer held.
    pub async fn fail_claim(
        &self,
        stage: Stage,
        (id, token): (Uuid, i32),
        error: &str,
        reason: PublishReason,
    ) -> Result<bool, JobError> {
        let failed = || transitions::fail(&self.0.pool, stage, id, token, error);
        let transition = stage.failure_transition();
        let row = self.complete_claim(transition, (id, token), failed).await?;
        let row = self
            .conclude(stage, transition, (id, token), row, reason)
            .await?;
        Ok(row.is_some())
    }

    /// Claims `stage` of job `id`. When another holder's lease is live, waits
    /// for it heartbeat by heartbeat, for up to two leases: a record
    /// redelivered after its holder died (its partition moved on) then takes
    /// the job over as soon as the lease expires, without waiting behind the
    /// backlog for a reaper's republish. `None` is a duplicate delivery to
    /// skip; an event for a row that does not exist is poison. `stop`
    /// (revoke, shutdown) ends the wait with the record undelivered.
    async fn claim_or_wait(
        &self,
        stage: Stage,
        id: Uuid,
        stop: &CancellationToken,
    ) -> Result<Option<Claim>, JobError> {
        let Parts {
            pool,
            metrics,
            batched,
            ..
        } = &*self.0;
        let heartbeat = self.0.settings.heartbeat;
        let give_up = tokio::time::Instant::now() + self.stage(stage).lease * 2;
        loop {
            let claim = batched.claim[stage].run(id).await?;
            if claim.is_some() {
                metrics.transition(stage.claim_transition(), &claim);
                return Ok(claim);
            }
            match leases::claim_is_live(pool, stage, id).await? {
                None => return Err(JobError::MissingRow(id)),
                // Stopping (revoke or shutdown) ends the wait undelivered: the
                // record is not committed, and the partition's next owner waits
                // for the lease in our place (its holder may be dead).
                Some(true) if stop.is_cancelled() => return Err(JobError::StoppedWhileHeld(id)),
                Some(true) if tokio::time::Instant::now() < give_up => {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(heartbeat) => {}
                    }
                }
                // The holder has kept its lease for two leases: it is alive and
                // owns the job; this delivery is a duplicate.
                Some(_) => {
                    metrics.transition(stage.claim_transition(), &claim);
                    metrics
                        .jobs
                        .claim_losers
                        .with_label_values(&[stage.as_str()])
                        .inc();
                    tracing::debug!(%id, stage = stage.as_str(), "claim lost; delivery skipped");
                    return Ok(None);
                }
            }
        }
    }

    /// Publishes again the event that hands job `id`'s `stage` to its
    /// workers (`extraction.submitted`, or the bbox request), with `reason`,
    /// and once the broker acknowledged it stamps the row as republished.
    /// The reapers and `docstream reclaim` revive jobs through here.
    pub async fn republish(
        &self,
        stage: Stage,
        id: Uuid,
        lane: Lane,
        reason: PublishReason,
    ) -> Result<(), RepublishError> {
        self.hand_over(stage, id, lane, reason).await?;
        orphans::record_published(&self.0.pool, stage, id).await?;
        Ok(())
    }

    /// Publishes the event that hands job `id`'s `stage` to its workers, in
    /// its `lane` (tenant and priority), and waits for the broker's
    /// acknowledgement.
    pub async fn hand_over(
        &self,
        stage: Stage,
        id: Uuid,
        lane: Lane,
        reason: PublishReason,
    ) -> Result<(), PublishError> {
        let topic = &self.stage(stage).topic;
        let publisher = &self.0.publisher;
        match stage {
            Stage::Extraction => {
                let event = ExtractionSubmitted::new(id, reason);
                publisher
                    .publish_job_in(topic, id, Some(lane), &event)
                    .await
            }
            Stage::BboxRefinement => {
                let event = PostProcessingRequested::bbox_refinement(id, reason);
                publisher
                    .publish_job_in(topic, id, Some(lane), &event)
                    .await
            }
        }
    }
}

/// Why a republish did not fully happen.
#[derive(Debug, thiserror::Error)]
pub enum RepublishError {
    /// The event was not acknowledged: nothing changed, try again later.
    #[error("republish failed: {0}")]
    Publish(#[from] PublishError),
    /// The event went out, but its stamp was not written: the job may be
    /// republished again before its threshold (harmless, since claims are
    /// atomic).
    #[error("republished, but not recorded: {0}")]
    Record(#[from] StoreError),
}
