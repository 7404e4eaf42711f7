//! `bbox-worker`: consumes `extraction.post_processing.requested`, claims the
//! bbox refinement sub-state, grounds every extracted value to its words' boxes
//! while heartbeats keep the claim, and completes the claim with its token.

use std::time::Instant;
use tracing::Instrument;

use uuid::Uuid;

use super::lease::{hold, Held};
use super::{decode_record, transient, Services, Stage};
use crate::domain::{ExtractionRequest, Transition};
use crate::events::{PostProcessingRequested, PublishReason};
use crate::extract::{ground, ExtractionOutput};
use crate::failpoints;
use crate::kafka::{HandlerError, Record, RecordHandler};
use crate::store::transitions::{self, Completion};
use crate::store::{leases, Claim};
use crate::trace;
use tokio_util::sync::CancellationToken;

/// The bbox worker's record handler.
pub struct BboxWorker {
    services: Services,
}

impl BboxWorker {
    /// A bbox worker on `services`.
    pub fn new(services: Services) -> Self {
        Self { services }
    }

    /// Grounds the claimed job on the CPU pool, within its deadline: the
    /// values' boxes, or why there are none.
    async fn grounding(
        services: &Services,
        claim: &Claim,
        request: Option<ExtractionRequest>,
    ) -> Result<serde_json::Value, String> {
        failpoints::hit("bbox.after_claim")
            .await
            .map_err(|e| e.to_string())?;
        let row = &claim.extraction;
        let output: ExtractionOutput =
            serde_json::from_value(row.result.clone().unwrap_or_default())
                .map_err(|e| format!("extraction result is unreadable: {e}"))?;
        let request = request.ok_or("the claim returned no request")?;
        let budget = services.settings.bbox_refine_timeout_s.get();
        let size = request.document.text_bytes() * output.fields.len().max(1);
        let grounded = services.cpu.run(budget, size, move |_| {
            let grounding = ground(&request.document, &output);
            Ok(serde_json::to_value(grounding).expect("grounding serialises"))
        });
        grounded.await.map_err(|e| e.to_string())
    }

    async fn complete(
        &self,
        id: Uuid,
        token: i32,
        grounded: Result<serde_json::Value, String>,
        reason: PublishReason,
    ) -> Result<(), HandlerError> {
        let services = &self.services;
        let pool = &services.pool;
        let (transition, completed) = match grounded {
            Ok(result) => {
                let completion = Completion { id, token, result };
                let succeeded = services.batched.bbox_succeed.run(completion).await;
                (
                    Transition::MarkBboxRefinementSucceeded,
                    succeeded.map_err(transient)?,
                )
            }
            Err(error) => {
                let failed = || transitions::mark_bbox_refinement_failed(pool, id, token, &error);
                let failed = services.persist("mark_bbox_refinement_failed", failed);
                (Transition::MarkBboxRefinementFailed, failed.await?)
            }
        };
        let claim = (id, token);
        services
            .conclude(Stage::BboxRefinement, transition, claim, completed, reason)
            .await?;
        Ok(())
    }

    async fn ground_and_complete(
        &self,
        mut claim: Claim,
        reason: PublishReason,
    ) -> Result<(), HandlerError> {
        let services = &self.services;
        let settings = &services.settings;
        let (id, token) = (claim.extraction.id, claim.token);
        let lease_s = settings.bbox_refinement_lease_s.as_secs_f64();
        let started = Instant::now();
        let request = claim.extraction.request.take().map(|json| json.0);
        let work = Self::grounding(services, &claim, request);
        let renew = || leases::renew_bbox_lease(&services.pool, id, token, lease_s);
        let grounded = match hold(
            work,
            settings.heartbeat_interval_s.get(),
            &services.health,
            renew,
        )
        .await
        {
            Held::Done(grounded) => grounded,
            // Bbox refinement has no cancel of its own; a lost claim is someone else's now.
            Held::Lost | Held::CancelRequested => {
                services.stale(Stage::BboxRefinement, id, token, "heartbeat");
                return Ok(());
            }
        };
        services
            .metrics
            .jobs
            .bbox_duration
            .observe(started.elapsed().as_secs_f64());
        self.complete(id, token, grounded, reason).await
    }
}

impl RecordHandler for BboxWorker {
    async fn handle(&self, record: &Record, stop: &CancellationToken) -> Result<(), HandlerError> {
        let (event, id) = decode_record::<PostProcessingRequested>(record, |e| &e.extraction_id)?;
        let span = trace::job_span(id, record.traceparent().as_ref());
        self.work(event, id, stop).instrument(span).await
    }
}

impl BboxWorker {
    /// Claims job `id`'s bbox refinement and runs it, inside the job's span.
    async fn work(
        &self,
        event: PostProcessingRequested,
        id: Uuid,
        stop: &CancellationToken,
    ) -> Result<(), HandlerError> {
        let services = &self.services;
        let try_claim = || services.batched.bbox_claim.run(id);
        let Some(claim) = services
            .claim_or_wait(Stage::BboxRefinement, id, stop, try_claim)
            .await?
        else {
            tracing::debug!(reason = ?event.reason, "bbox refinement not claimed (finished, or another holder's)");
            return Ok(());
        };
        let token = claim.token;
        tracing::debug!(token, reason = ?event.reason, "bbox refinement claimed");
        if let Some(recovery) = claim
            .extraction
            .bbox_refinement()
            .and_then(|b| b.last_recovery_s)
        {
            services
                .metrics
                .jobs
                .recovery
                .with_label_values(&["bbox_refinement"])
                .observe(recovery);
        }
        // The claim's event is acknowledged while the grounding runs (joined:
        // queued first, and the record is delivered only once both are done).
        let (emitted, grounded) = tokio::join!(
            services.emit(
                Transition::MarkBboxRefinementRunning,
                &claim.extraction,
                Some(token),
                event.reason,
            ),
            self.ground_and_complete(claim, event.reason),
        );
        emitted?;
        tracing::debug!(
            outcome = if grounded.is_ok() { "done" } else { "failed" },
            "bbox refinement ended"
        );
        grounded
    }
}
