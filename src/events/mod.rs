//! The events that flow between stages, bound to their Avro schemas in `schemas/`.
//!
//! Events are small (ids and reasons, never the document). Each is encoded with
//! Avro single-object encoding (`codec`), so any Avro library can decode it from
//! the `.avsc` file alone, without a registry.

mod codec;

pub use codec::{decode, encode, CodecError, Event, SINGLE_OBJECT_MAGIC};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::Transition;
use crate::store::Extraction;

/// Why an event was published: first submit, a retry, or a reaper revival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExtractionEvent {
    /// The job.
    #[schemars(with = "uuid::Uuid")]
    pub extraction_id: String,
    /// The transition that won.
    pub transition: String,
    /// Status after it.
    #[schemars(with = "crate::domain::ExtractionStatus")]
    pub status: String,
    /// Bbox sub-state after it, if there is one.
    #[schemars(with = "Option<crate::domain::BboxStatus>")]
    pub bbox_status: Option<String>,
    /// Fencing token it ran under.
    pub token: Option<i32>,
    /// Error text of a failure or retry.
    pub error: Option<String>,
    /// Why the work behind it was published.
    pub reason: PublishReason,
    /// Publish time, ms since the epoch.
    pub published_at_ms: i64,
    /// The job's tenant; null in events written before tenants existed
    /// (schema version 1), whose jobs belong to the tenant `default`.
    #[schemars(with = "Option<uuid::Uuid>")]
    pub tenant_id: Option<String>,
    /// What a person corrected (which field, by whom; never the value,
    /// which the API serves and erasure reaches), on a `correct_field`
    /// event; null on every other (and in events written before schema
    /// version 3).
    #[serde(default)]
    pub correction: Option<FieldCorrection>,
}

/// A value of a succeeded job corrected in review. The value itself is
/// not here: events never carry what a document holds, since a record on
/// Kafka outlives the job's erasure. A client reads it with
/// `GET /v1/extractions/{id}/corrections`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FieldCorrection {
    /// The correction's id: the latest of a field is its value now.
    pub correction_id: i64,
    /// The field's name.
    pub field: String,
    /// Always null. The schema keeps the field, so a reader of it reads
    /// every record; what the value is, the API says.
    pub value: Option<String>,
    /// The API key that made it.
    #[schemars(with = "uuid::Uuid")]
    pub key_id: String,
    /// The name the reviewer gave, if any.
    pub reviewer: Option<String>,
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

/// `extraction.dlq`: a record parked because it could not be processed. It
/// tells the original value by size, hash and excerpt, never whole, so a
/// letter is always small enough to produce (see [`DeadLetter::new`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Original topic.
    pub topic: String,
    /// Original partition.
    pub partition: i32,
    /// Original offset.
    pub offset: i64,
    /// Original key: its first [`DeadLetter::MAX_KEY`] bytes.
    #[serde(with = "apache_avro::serde::bytes_opt")]
    pub key: Option<Vec<u8>>,
    /// Size of the original value in bytes; -1 when it had none.
    pub payload_size: i64,
    /// SHA-256 of the original value, lowercase hex; empty when it had none.
    pub payload_sha256: String,
    /// The original value's first bytes; all of it when it is small.
    #[serde(with = "apache_avro::serde::bytes_opt")]
    pub payload_excerpt: Option<Vec<u8>>,
    /// Machine-readable class of the failure.
    pub error_kind: String,
    /// Human-readable reason: its first [`DeadLetter::MAX_ERROR`] bytes.
    pub error: String,
    /// Publish time, ms since the epoch.
    pub published_at_ms: i64,
}

/// Where a record came from, and what it carried.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// Its topic.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Its value.
    pub payload: Option<&'a [u8]>,
}

impl DeadLetter {
    /// Most bytes of the original key a letter keeps.
    pub const MAX_KEY: usize = 1024;
    /// Most bytes of the reason a letter keeps.
    pub const MAX_ERROR: usize = 4096;

    /// The letter for `source`, failed as `kind` for `reason`, with at most
    /// `excerpt_bytes` of its value. Every part is bounded, so a letter
    /// weighs at most about `excerpt_bytes` + 6 KiB whatever the record did:
    /// with the excerpt limit far below the producer's maximum, a letter is
    /// never refused for its size.
    pub fn new(source: Source<'_>, kind: &str, reason: &str, excerpt_bytes: usize) -> Self {
        let payload = source.payload;
        let size = payload.map_or(-1, |p| i64::try_from(p.len()).unwrap_or(i64::MAX));
        let sha256 = payload.map_or_else(String::new, crate::domain::sha256_hex);
        let excerpt = |bytes: &[u8], most: usize| bytes[..bytes.len().min(most)].to_vec();
        Self {
            topic: source.topic.to_owned(),
            partition: source.partition,
            offset: source.offset,
            key: source.key.map(|k| excerpt(k, Self::MAX_KEY)),
            payload_size: size,
            payload_sha256: sha256,
            payload_excerpt: payload.map(|p| excerpt(p, excerpt_bytes)),
            error_kind: kind.to_owned(),
            error: truncated(reason, Self::MAX_ERROR),
            published_at_ms: now_ms(),
        }
    }
}

/// `text`'s first `most` bytes, cut at a character boundary.
fn truncated(text: &str, most: usize) -> String {
    let mut end = text.len().min(most);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
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
            status: row.status.as_str().to_owned(),
            bbox_status: row.bbox_refinement().map(|b| b.status.as_str().to_owned()),
            token,
            error: row.error.clone(),
            reason,
            published_at_ms: now_ms(),
            tenant_id: Some(row.tenant_id.to_string()),
            correction: None,
        }
    }
}
