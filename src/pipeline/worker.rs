//! `worker`: consumes `extraction.submitted`, claims the job, runs the extractor
//! under the async timeout, completes the claim, and hands the job to bbox
//! refinement by publishing `extraction.post_processing.requested`.

use std::time::Instant;

use uuid::Uuid;

use super::{decode_record, transient, Services};
use crate::domain::Transition;
use crate::events::{ExtractionSubmitted, PostProcessingRequested, PublishReason};
use crate::extract::{ExtractionOutput, Extractor};
use crate::kafka::{HandlerError, Record, RecordHandler};
use crate::store::{transitions, Claim};

/// The extraction worker's record handler.
pub struct ExtractionWorker<E> {
    services: Services,
    extractor: E,
}

impl<E: Extractor> ExtractionWorker<E> {
    /// A worker that extracts with `extractor`.
    pub fn new(services: Services, extractor: E) -> Self {
        Self {
            services,
            extractor,
        }
    }

    async fn run_claim(&self, claim: Claim, reason: PublishReason) -> Result<(), HandlerError> {
        let started = Instant::now();
        let request = &claim.extraction.request.0;
        let outcome = tokio::time::timeout(
            self.services.settings.async_timeout(),
            self.extractor.extract(request),
        )
        .await;
        let (label, result) = match outcome {
            Ok(Ok(output)) => ("succeeded", Ok(output)),
            Ok(Err(e)) => ("failed", Err(e.to_string())),
            Err(_) => (
                "timed_out",
                Err(format!(
                    "extraction timed out after {} s",
                    self.services.settings.async_timeout_s
                )),
            ),
        };
        self.services
            .metrics
            .extraction_duration
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(output) => {
                self.succeed(claim.extraction.id, claim.token, &output, reason)
                    .await
            }
            Err(error) => {
                self.fail(claim.extraction.id, claim.token, &error, reason)
                    .await
            }
        }
    }

    async fn succeed(
        &self,
        id: Uuid,
        token: i32,
        output: &ExtractionOutput,
        reason: PublishReason,
    ) -> Result<(), HandlerError> {
        let services = &self.services;
        let result = serde_json::to_value(output).expect("extraction output serialises");
        let row = transitions::mark_succeeded(&services.pool, id, token, &result)
            .await
            .map_err(transient)?;
        services.metrics.transition(Transition::MarkSucceeded, &row);
        let Some(row) = row else {
            return self.stale(id, token);
        };
        services
            .emit(Transition::MarkSucceeded, &row, Some(token), reason)
            .await?;
        let requested = transitions::start_bbox_refinement(&services.pool, id)
            .await
            .map_err(transient)?;
        services
            .metrics
            .transition(Transition::StartBboxRefinement, &requested);
        let Some(requested) = requested else {
            return Ok(());
        };
        let topic = services
            .settings
            .topic(&services.settings.topic_post_processing);
        let follow_up = PostProcessingRequested::bbox_refinement(id, reason);
        let key = id.to_string();
        let (published, emitted) = tokio::join!(
            services
                .publisher
                .publish(&topic, key.as_bytes(), &follow_up),
            services.emit(Transition::StartBboxRefinement, &requested, None, reason),
        );
        published.map_err(transient)?;
        emitted
    }

    async fn fail(
        &self,
        id: Uuid,
        token: i32,
        error: &str,
        reason: PublishReason,
    ) -> Result<(), HandlerError> {
        let services = &self.services;
        let row = transitions::mark_failed(&services.pool, id, token, error)
            .await
            .map_err(transient)?;
        services.metrics.transition(Transition::MarkFailed, &row);
        match row {
            Some(row) => {
                services
                    .emit(Transition::MarkFailed, &row, Some(token), reason)
                    .await
            }
            None => self.stale(id, token),
        }
    }

    /// A completion under a token that no longer holds the claim: dropped, counted.
    fn stale(&self, id: Uuid, token: i32) -> Result<(), HandlerError> {
        self.services
            .metrics
            .claim_losers
            .with_label_values(&["stale_completion"])
            .inc();
        tracing::warn!(%id, token, "completion rejected: the claim is no longer ours");
        Ok(())
    }
}

impl<E: Extractor> RecordHandler for ExtractionWorker<E> {
    async fn handle(&self, record: &Record) -> Result<(), HandlerError> {
        let (event, id) = decode_record::<ExtractionSubmitted>(record, |e| &e.extraction_id)?;
        let services = &self.services;
        let lease_s = services.settings.extraction_run_lease_s;
        let claim = transitions::mark_running(&services.pool, id, lease_s)
            .await
            .map_err(transient)?;
        services.metrics.transition(Transition::MarkRunning, &claim);
        let Some(claim) = claim else {
            return services.lost_claim("extraction", id).await;
        };
        services
            .emit(
                Transition::MarkRunning,
                &claim.extraction,
                Some(claim.token),
                event.reason,
            )
            .await?;
        self.run_claim(claim, event.reason).await
    }
}
