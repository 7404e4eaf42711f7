//! The events that flow between stages, bound to their Avro schemas in `schemas/`.
//!
//! Events are small (ids and reasons, never the document). Each is encoded with
//! Avro single-object encoding (`codec`), so any Avro library can decode it from
//! the `.avsc` file alone, without a registry.

mod codec;

pub use codec::{decode, encode, CodecError, SINGLE_OBJECT_MAGIC};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::Transition;
use crate::store::Extraction;

/// Why an event was published: first submit, a retry, or a reaper revival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PublishReason {
    /// Published by the submit path.
    Submit,
    /// Published after a retry was scheduled.
    Retry,
    /// Published by a reaper reviving an orphan.
    Reaper,
    /// Published by an operator's `docstream reclaim`.
    Operator,
}

impl PublishReason {
    /// The schema symbol, also used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submit => "submit",
            Self::Retry => "retry",
            Self::Reaper => "reaper",
            Self::Operator => "operator",
        }
    }
}

/// A Rust type bound to one `.avsc` file.
pub trait Event: Serialize + for<'de> Deserialize<'de> {
    /// The schema's full name, e.g. `dev.docstream.events.ExtractionSubmitted`.
    const NAME: &'static str;
}

/// `extraction.requests`: a submission from a Kafka producer (the intake role
/// turns it into a job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExtractionRequested {
    /// Names the job, as the `Idempotency-Key` header does.
    pub idempotency_key: String,
    /// The request, as the JSON body of `POST /v1/extractions`.
    pub request_json: String,
    /// When the producer sent it, ms since the epoch.
    pub requested_at_ms: i64,
}

/// `extraction.submitted`: a job waits for a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExtractionSubmitted {
    /// The job.
    pub extraction_id: String,
    /// Why it was published.
    pub reason: PublishReason,
    /// Publish time, ms since the epoch.
    pub published_at_ms: i64,
}

/// `extraction.post_processing.requested`: a bbox refinement waits for a bbox worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostProcessingRequested {
    /// The job.
    pub extraction_id: String,
    /// The step requested; only `bbox_refinement` exists.
    pub step: String,
    /// Why it was published.
    pub reason: PublishReason,
    /// Publish time, ms since the epoch.
    pub published_at_ms: i64,
}

/// `extraction.events`: one per won transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExtractionEvent {
    /// The job.
    pub extraction_id: String,
    /// The transition that won.
    pub transition: String,
    /// Status after it.
    pub status: String,
    /// Bbox sub-state after it, if there is one.
    pub bbox_status: Option<String>,
    /// Fencing token it ran under.
    pub token: Option<i32>,
    /// Error text of a failure or retry.
    pub error: Option<String>,
    /// Why the work behind it was published.
    pub reason: PublishReason,
    /// Publish time, ms since the epoch.
    pub published_at_ms: i64,
    /// The job's tenant; `None` in events written before tenants existed
    /// (schema version 1), whose jobs belong to the tenant `default`.
    pub tenant_id: Option<String>,
}

impl ExtractionEvent {
    /// Whether the event is about a job of tenant `tenant_id`.
    pub fn belongs_to(&self, tenant_id: Uuid) -> bool {
        match &self.tenant_id {
            Some(owner) => owner.parse::<Uuid>().is_ok_and(|owner| owner == tenant_id),
            None => tenant_id == crate::store::tenants::DEFAULT_TENANT_ID,
        }
    }
}

/// `extraction.dlq`: a record parked because it could not be processed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Original topic.
    pub topic: String,
    /// Original partition.
    pub partition: i32,
    /// Original offset.
    pub offset: i64,
    /// Original key.
    #[serde(with = "apache_avro::serde_avro_bytes_opt")]
    pub key: Option<Vec<u8>>,
    /// Original value.
    #[serde(with = "apache_avro::serde_avro_bytes_opt")]
    pub payload: Option<Vec<u8>>,
    /// Machine-readable class of the failure.
    pub error_kind: String,
    /// Human-readable reason.
    pub error: String,
    /// Publish time, ms since the epoch.
    pub published_at_ms: i64,
}

impl Event for ExtractionRequested {
    const NAME: &'static str = "dev.docstream.events.ExtractionRequested";
}
impl Event for ExtractionSubmitted {
    const NAME: &'static str = "dev.docstream.events.ExtractionSubmitted";
}
impl Event for PostProcessingRequested {
    const NAME: &'static str = "dev.docstream.events.PostProcessingRequested";
}
impl Event for ExtractionEvent {
    const NAME: &'static str = "dev.docstream.events.ExtractionEvent";
}
impl Event for DeadLetter {
    const NAME: &'static str = "dev.docstream.events.DeadLetter";
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl ExtractionSubmitted {
    /// The event that hands job `id` to a worker.
    pub fn new(id: Uuid, reason: PublishReason) -> Self {
        Self {
            extraction_id: id.to_string(),
            reason,
            published_at_ms: now_ms(),
        }
    }
}

impl PostProcessingRequested {
    /// The event that hands the bbox refinement of `id` to a bbox worker.
    pub fn bbox_refinement(id: Uuid, reason: PublishReason) -> Self {
        Self {
            extraction_id: id.to_string(),
            step: "bbox_refinement".to_owned(),
            reason,
            published_at_ms: now_ms(),
        }
    }
}

impl ExtractionEvent {
    /// Describes the row `row` as `transition` left it, under claim `token`.
    pub fn of(
        transition: Transition,
        row: &Extraction,
        token: Option<i32>,
        reason: PublishReason,
    ) -> Self {
        Self {
            extraction_id: row.id.to_string(),
            transition: transition.as_str().to_owned(),
            status: row.status.clone(),
            bbox_status: row.bbox_refinement().map(|b| b.status.as_str().to_owned()),
            token,
            error: row.error.clone(),
            reason,
            published_at_ms: now_ms(),
            tenant_id: Some(row.tenant_id.to_string()),
        }
    }
}
