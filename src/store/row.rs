//! The `extractions` row as Rust sees it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use uuid::Uuid;

use crate::domain::{BboxStatus, ExtractionRequest, ExtractionStatus, Priority, Stage};

/// One job: the row of `extractions`, with the columns of its side tables
/// (`extraction_requests`, `extraction_results`) when the statement that read
/// it joined them (the view `extraction_rows` has them all).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Extraction {
    /// Primary key, also the Kafka key of every event about this job.
    pub id: Uuid,
    /// The tenant the job belongs to.
    pub tenant_id: Uuid,
    /// Where the job is; stored as text, which a CHECK holds to the
    /// statuses' names.
    #[sqlx(try_from = "String")]
    pub status: ExtractionStatus,
    /// The client's idempotency key, if it sent one (from the request row).
    #[sqlx(default)]
    pub idempotency_key: Option<String>,
    /// Hash of the request, to refuse a replayed key with another body (from
    /// the request row).
    #[sqlx(default)]
    pub request_hash: Option<String>,
    /// The submitted request, from the request row: the claims and the reads
    /// return it, the other transitions do not (parsing it back would be most
    /// of a completion's cost).
    #[sqlx(default)]
    pub request: Option<Json<ExtractionRequest>>,
    /// Extracted values, once succeeded (from the result row).
    #[sqlx(default)]
    pub result: Option<serde_json::Value>,
    /// Grounded boxes, once the bbox refinement succeeded (from its result row).
    #[sqlx(default)]
    pub bbox_result: Option<serde_json::Value>,
    /// Last error (failed, or the reason of the last retry).
    pub error: Option<String>,
    /// Claims so far; the current holder's fencing token.
    pub attempts: i32,
    /// Claims before the job's last retry on request: its current run's
    /// attempts are `attempts - attempts_base`.
    #[sqlx(default)]
    pub attempts_base: i32,
    /// End of the current claim's lease (database clock).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When the row was inserted.
    pub submitted_at: DateTime<Utc>,
    /// When the latest claim started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the extraction reached a terminal state.
    pub finished_at: Option<DateTime<Utc>>,
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
    /// Whether the request named a `webhook_url`.
    pub webhook: bool,
    /// Which waiting work a worker starts first.
    #[sqlx(default)]
    pub priority: Priority,
    /// When the job's content was erased on request (a tombstone since).
    #[sqlx(default)]
    pub erased_at: Option<DateTime<Utc>>,
    /// The bbox refinement sub-state, once the extraction succeeded.
    pub bbox_status: Option<String>,
    /// Bbox claims so far; the current bbox holder's fencing token.
    pub bbox_attempts: i32,
    /// When the bbox refinement was requested.
    pub bbox_requested_at: Option<DateTime<Utc>>,
    /// When the bbox request was acknowledged by the broker.
    pub bbox_published_at: Option<DateTime<Utc>>,
    /// When the latest bbox claim started.
    pub bbox_started_at: Option<DateTime<Utc>>,
    /// End of the current bbox claim's lease.
    pub bbox_lease_expires_at: Option<DateTime<Utc>>,
    /// When grounding finished.
    pub bbox_finished_at: Option<DateTime<Utc>>,
    /// Why grounding failed.
    pub bbox_error: Option<String>,
    /// Last time a reaper republished the bbox request.
    pub bbox_republished_at: Option<DateTime<Utc>>,
    /// Since when the bbox refinement has been an orphan, until a claim recovers it.
    pub bbox_orphaned_at: Option<DateTime<Utc>>,
    /// Seconds from orphaning (or lease expiry) to the bbox claim that recovered it.
    pub bbox_last_recovery_s: Option<f64>,
    /// Not a column: the webhook delivery a terminal transition wrote along
    /// with it (see `store::webhooks`); `None` from every other statement.
    #[sqlx(default)]
    pub webhook_id: Option<String>,
}

/// The bbox refinement sub-state, as the API shows it under
/// `post_processing.bbox_refinement`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct BboxRefinement {
    /// Sub-state.
    pub status: BboxStatus,
    /// Claims so far; the current holder's fencing token.
    #[schemars(range(min = 0))]
    pub attempts: i32,
    /// When the bbox refinement was requested.
    pub requested_at: Option<DateTime<Utc>>,
    /// When the post-processing request was acknowledged by the broker.
    pub published_at: Option<DateTime<Utc>>,
    /// When the latest claim started.
    pub started_at: Option<DateTime<Utc>>,
    /// End of the current claim's lease.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When grounding finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// Once grounding finished (else null): each field's place on the
    /// page, or null.
    #[schemars(with = "Option<crate::domain::Grounding>")]
    pub result: Option<serde_json::Value>,
    /// Why grounding failed.
    pub error: Option<String>,
    /// Last time a reaper republished the bbox request.
    pub republished_at: Option<DateTime<Utc>>,
    /// Seconds from orphaning (or lease expiry) to the claim that recovered it.
    pub last_recovery_s: Option<f64>,
}

impl Extraction {
    /// The submitted request, when the statement that read the row returned it.
    pub fn request(&self) -> Option<&ExtractionRequest> {
        self.request.as_ref().map(|r| &r.0)
    }

    /// Seconds from when `stage` was orphaned (or its lease expired) to the
    /// claim that read this row, when that claim recovered it.
    pub fn recovery_s(&self, stage: Stage) -> Option<f64> {
        match stage {
            Stage::Extraction => self.last_recovery_s,
            Stage::BboxRefinement => self.bbox_last_recovery_s,
        }
    }

    /// The bbox refinement sub-state, once the extraction succeeded; a value
    /// outside the CHECK constraint cannot be read back.
    pub fn bbox_refinement(&self) -> Option<BboxRefinement> {
        let status = self.bbox_status.as_deref()?;
        Some(BboxRefinement {
            status: status
                .parse()
                .expect("bbox_status is constrained by a CHECK in the schema"),
            attempts: self.bbox_attempts,
            requested_at: self.bbox_requested_at,
            published_at: self.bbox_published_at,
            started_at: self.bbox_started_at,
            lease_expires_at: self.bbox_lease_expires_at,
            finished_at: self.bbox_finished_at,
            result: self.bbox_result.clone(),
            error: self.bbox_error.clone(),
            republished_at: self.bbox_republished_at,
            last_recovery_s: self.bbox_last_recovery_s,
        })
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

/// A priority is stored as its name (a CHECK holds the column to the names).
impl sqlx::Type<sqlx::Postgres> for Priority {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <String as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Priority {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let name = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Ok(Priority::parse(name).ok_or_else(|| format!("unknown priority {name:?}"))?)
    }
}
