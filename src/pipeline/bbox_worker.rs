//! `bbox-worker`: consumes `extraction.post_processing.requested`, claims the
//! bbox refinement sub-state, grounds every extracted value to its words' boxes,
//! and completes the claim.

use std::time::Instant;

use super::{decode_record, transient, Services};
use crate::domain::Transition;
use crate::events::PostProcessingRequested;
use crate::extract::{ground, ExtractionOutput};
use crate::kafka::{HandlerError, Record, RecordHandler};
use crate::store::transitions;

/// The bbox worker's record handler.
pub struct BboxWorker {
    services: Services,
}

impl BboxWorker {
    /// A bbox worker on `services`.
    pub fn new(services: Services) -> Self {
        Self { services }
    }
}

impl RecordHandler for BboxWorker {
    async fn handle(&self, record: &Record) -> Result<(), HandlerError> {
        let (event, id) = decode_record::<PostProcessingRequested>(record, |e| &e.extraction_id)?;
        let services = &self.services;
        let lease_s = services.settings.bbox_refinement_lease_s;
        let claim = transitions::mark_bbox_refinement_running(&services.pool, id, lease_s)
            .await
            .map_err(transient)?;
        services
            .metrics
            .transition(Transition::MarkBboxRefinementRunning, &claim);
        let Some(claim) = claim else {
            return services.lost_claim("bbox_refinement", id).await;
        };
        let token = claim.token;
        services
            .emit(
                Transition::MarkBboxRefinementRunning,
                &claim.extraction,
                Some(token),
                event.reason,
            )
            .await?;

        let started = Instant::now();
        let row = &claim.extraction;
        let output: Result<ExtractionOutput, _> =
            serde_json::from_value(row.result.clone().unwrap_or_default());
        let (transition, completed) = match output {
            Ok(output) => {
                let grounding = ground(&row.request.0.document, &output);
                let json = serde_json::to_value(grounding).expect("grounding serialises");
                let done =
                    transitions::mark_bbox_refinement_succeeded(&services.pool, id, token, &json)
                        .await;
                (Transition::MarkBboxRefinementSucceeded, done)
            }
            Err(e) => {
                let error = format!("extraction result is unreadable: {e}");
                let done =
                    transitions::mark_bbox_refinement_failed(&services.pool, id, token, &error)
                        .await;
                (Transition::MarkBboxRefinementFailed, done)
            }
        };
        services
            .metrics
            .bbox_duration
            .observe(started.elapsed().as_secs_f64());
        let completed = completed.map_err(transient)?;
        services.metrics.transition(transition, &completed);
        match completed {
            Some(row) => {
                services
                    .emit(transition, &row, Some(token), event.reason)
                    .await
            }
            None => {
                services
                    .metrics
                    .claim_losers
                    .with_label_values(&["stale_completion"])
                    .inc();
                tracing::warn!(%id, token, "bbox completion rejected: the claim is no longer ours");
                Ok(())
            }
        }
    }
}
