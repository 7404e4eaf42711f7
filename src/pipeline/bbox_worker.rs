//! `bbox-worker`: consumes `extraction.post_processing.requested`, claims the
//! bbox refinement sub-state, grounds every extracted value to its words' boxes
//! while heartbeats keep the claim, and completes the claim with its token.

use std::time::Instant;
use tracing::Instrument;

use uuid::Uuid;

use super::lease::Held;
use super::{job_record, Batched, JobError, Jobs};
use crate::domain::{Document, ExtractionRequest, Stage};
use crate::events::{PostProcessingRequested, PublishReason};
use crate::extract::{ground, CpuPool, ExtractionOutput};
use crate::failpoints;
use crate::kafka::{HandlerError, Record, RecordHandler};
use crate::metrics::JobMetrics;
use crate::store::transitions::Completion;
use crate::store::{documents, Claim};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// The stage this worker claims.
const STAGE: Stage = Stage::BboxRefinement;

/// The bbox worker's record handler.
pub struct BboxWorker {
    parts: Parts,
    /// How long one grounding may take.
    budget: std::time::Duration,
}

/// What the bbox worker works with.
pub struct Parts {
    /// The pool the documents read from files are kept in.
    pub pool: PgPool,
    /// The lifecycle: claims, holds and failures.
    pub jobs: Jobs,
    /// The batched completion of its stage.
    pub batched: Batched,
    /// Where grounding runs.
    pub cpu: CpuPool,
    /// The groundings' durations.
    pub metrics: JobMetrics,
}

impl BboxWorker {
    /// A bbox worker on `parts`, each grounding within `budget`
    /// (`bbox_refine_timeout_s`).
    pub fn new(parts: Parts, budget: std::time::Duration) -> Self {
        Self { parts, budget }
    }

    /// Grounds the claimed job on the CPU pool, within its deadline: the
    /// values' boxes, or why there are none.
    async fn grounding(
        &self,
        claim: &Claim,
        request: Option<Result<(Document, f64), String>>,
    ) -> Result<serde_json::Value, String> {
        failpoints::hit("bbox.after_claim")
            .await
            .map_err(|e| e.to_string())?;
        let row = &claim.extraction;
        let output: ExtractionOutput =
            serde_json::from_value(row.result.clone().unwrap_or_default())
                .map_err(|e| format!("extraction result is unreadable: {e}"))?;
        let (document, min_confidence) = request.ok_or("the claim returned no request")??;
        let size = document.text_bytes() * output.fields.len().max(1);
        let grounded = self.parts.cpu.run(self.budget, size, move |_| {
            let grounding = ground(&document, &output, min_confidence);
            Ok(serde_json::to_value(grounding).expect("grounding serialises"))
        });
        grounded.await.map_err(|e| e.to_string())
    }

    /// Completes claim `token` with the grounding, or fails it with why
    /// there is none.
    async fn complete(
        &self,
        claim: (Uuid, i32),
        grounded: Result<serde_json::Value, String>,
        reason: PublishReason,
    ) -> Result<(), JobError> {
        let parts = &self.parts;
        let (id, token) = claim;
        match grounded {
            Ok(result) => {
                let completion = Completion { id, token, result };
                let row = parts.batched.succeed[STAGE].run(completion).await?;
                let transition = STAGE.success_transition();
                let concluded = parts.jobs.conclude(STAGE, transition, claim, row, reason);
                concluded.await.map(drop)
            }
            Err(error) => {
                let failed = parts.jobs.fail_claim(STAGE, claim, &error, reason);
                failed.await.map(drop)
            }
        }
    }

    async fn ground_and_complete(
        &self,
        mut claim: Claim,
        reason: PublishReason,
    ) -> Result<(), JobError> {
        let parts = &self.parts;
        let claimed = (claim.extraction.id, claim.token);
        let started = Instant::now();
        let request = claim.extraction.request.take().map(|json| json.0);
        let document = match request {
            Some(request) => Some(document_of(&parts.pool, claimed.0, request).await?),
            None => None,
        };
        let work = self.grounding(&claim, document);
        let grounded = match parts.jobs.hold_claim(STAGE, claimed, work).await {
            Held::Done(grounded) => grounded,
            // Bbox refinement has no cancel of its own; a lost claim is someone else's now.
            Held::Lost | Held::CancelRequested => {
                parts.jobs.stale(STAGE, claimed.0, claimed.1, "heartbeat");
                return Ok(());
            }
        };
        let duration = &parts.metrics.bbox_duration;
        duration.observe(started.elapsed().as_secs_f64());
        self.complete(claimed, grounded, reason).await
    }
}

/// The document job `id`'s values were found in: the request's own, or for
/// a file the words its extraction read and kept (an error if it kept none);
/// and the confidence under which a value needs review.
async fn document_of(
    pool: &PgPool,
    id: Uuid,
    request: ExtractionRequest,
) -> Result<Result<(Document, f64), String>, JobError> {
    let min_confidence = request.min_confidence();
    let Some(file) = request.document.object else {
        return Ok(Ok((request.document, min_confidence)));
    };
    let kept = documents::get(pool, id).await?;
    let kept = kept.ok_or(format!("the document read from file {file} was not kept"));
    Ok(kept.map(|document| (document, min_confidence)))
}

impl RecordHandler for BboxWorker {
    /// Claims the job's bbox refinement and grounds it, inside the job's span.
    async fn handle(&self, record: &Record, stop: &CancellationToken) -> Result<(), HandlerError> {
        let (event, id, span) =
            job_record::<PostProcessingRequested>(record, |e| &e.extraction_id)?;
        let reason = event.reason;
        let ground = |claim| self.ground_and_complete(claim, reason);
        let ran = self.parts.jobs.run_claimed(STAGE, id, reason, stop, ground);
        let ran: Result<bool, JobError> = ran.instrument(span).await;
        Ok(ran.map(drop)?)
    }
}
