//! The `extractions` row as Rust sees it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use uuid::Uuid;

use crate::domain::{BboxStatus, ExtractionRequest, ExtractionStatus};

/// One row of `extractions`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Extraction {
    /// Primary key, also the Kafka key of every event about this job.
    pub id: Uuid,
    /// See [`ExtractionStatus`]; stored as text.
    pub status: String,
    /// The client's idempotency key, if it sent one.
    pub idempotency_key: Option<String>,
    /// Hash of the request, to refuse a replayed key with another body.
    pub request_hash: String,
    /// The submitted request. Transitions that do not need it (every one but
    /// the claims and the insert) leave it out of what they return: it is the
    /// bulk of the row, and parsing it back is most of a completion's cost.
    #[sqlx(default)]
    pub request: Option<Json<ExtractionRequest>>,
    /// Extracted values, once succeeded.
    pub result: Option<serde_json::Value>,
    /// Last error (failed, or the reason of the last retry).
    pub error: Option<String>,
    /// Claims so far; the current holder's fencing token.
    pub attempts: i32,
    /// End of the current claim's lease (database clock).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When the row was inserted.
    pub submitted_at: DateTime<Utc>,
    /// When the latest claim started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the extraction reached a terminal state.
    pub finished_at: Option<DateTime<Utc>>,
    /// Post-processing sub-states, `{"bbox_refinement": {...}}`.
    pub post_processing: serde_json::Value,
    /// When a requeued job is due again.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When the current queued attempt's event was acknowledged by the broker.
    pub published_at: Option<DateTime<Utc>>,
    /// Set when a client asked to cancel the job while it was running.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// Last time a reaper republished the job's event.
    pub republished_at: Option<DateTime<Utc>>,
    /// Since when the job has been an orphan, until a claim recovers it.
    pub orphaned_at: Option<DateTime<Utc>>,
    /// Seconds from orphaning (or lease expiry) to the claim that recovered it.
    pub last_recovery_s: Option<f64>,
    /// Not a column: the webhook delivery a terminal transition wrote along
    /// with it (see `store::webhooks`); `None` from every other statement.
    #[sqlx(default)]
    pub webhook_id: Option<String>,
}

/// The `bbox_refinement` sub-state inside `post_processing`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BboxRefinement {
    /// Sub-state.
    pub status: BboxStatus,
    /// Claims so far; the current holder's fencing token.
    #[serde(default)]
    pub attempts: i32,
    /// When the worker started publishing the post-processing request.
    #[serde(default)]
    pub requested_at: Option<DateTime<Utc>>,
    /// When the post-processing request was acknowledged by the broker.
    #[serde(default)]
    pub published_at: Option<DateTime<Utc>>,
    /// When the latest claim started.
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    /// End of the current claim's lease.
    #[serde(default)]
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When grounding finished.
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    /// Grounded boxes per field.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    /// Why grounding failed.
    #[serde(default)]
    pub error: Option<String>,
    /// Last time a reaper republished the bbox request.
    #[serde(default)]
    pub republished_at: Option<DateTime<Utc>>,
    /// Seconds from orphaning (or lease expiry) to the claim that recovered it.
    #[serde(default)]
    pub last_recovery_s: Option<f64>,
}

impl Extraction {
    /// The submitted request, when the statement that read the row returned it.
    pub fn request(&self) -> Option<&ExtractionRequest> {
        self.request.as_ref().map(|r| &r.0)
    }

    /// The typed status; a value outside the CHECK constraint cannot be read back.
    pub fn status(&self) -> ExtractionStatus {
        self.status
            .parse()
            .expect("status is constrained by a CHECK in the schema")
    }

    /// The bbox refinement sub-state, once the extraction succeeded.
    pub fn bbox_refinement(&self) -> Option<BboxRefinement> {
        let sub = self.post_processing.get("bbox_refinement")?;
        serde_json::from_value(sub.clone()).ok()
    }
}

/// A won claim: the row as the claim left it, and the fencing token that every
/// completing transition of this claim must present.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The row after the claim.
    pub extraction: Extraction,
    /// Attempt number of this claim.
    pub token: i32,
}
