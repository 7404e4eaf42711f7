//! The job model, free of I/O (the one shared state is the compiled-pattern
//! cache): states, the transitions between them, and the
//! request a client submits. Everything here is plain data and pure functions;
//! `store` makes it durable and `pipeline` drives it.

mod grounding;
mod limits;
pub mod pattern;
mod priority;
mod request;
mod retry;
pub mod schedule;
pub mod schema;
mod stage;
mod state;
mod tenant;

pub use grounding::{GroundedField, Grounding};
pub use limits::{RequestLimits, ResultLimits};
pub use priority::Priority;
pub use request::{
    extractor_name_is_valid, idempotency_key_is_valid, Document, ExtractionRequest, FieldSpec,
    FieldType, Page, RequestError, Word, WordRef, MAX_EXTRACTOR_NAME_LEN, MAX_IDEMPOTENCY_KEY_LEN,
    RULES_EXTRACTOR,
};
pub use retry::Backoff;
pub use schedule::Lane;
pub use stage::{PerStage, Stage};
pub use state::{BboxStatus, ExtractionStatus, Transition};
pub use tenant::{
    key_hash, key_is_well_formed, new_webhook_secret, tenant_name_is_valid,
    webhook_secret_is_valid, NewApiKey, Quota, QuotaOverrides, Scope, TenantError, KEY_PREFIX,
    MAX_TENANT_NAME_LEN,
};

/// A new job's id: a UUIDv7, ordered by creation time, so the index entries
/// of the jobs in flight sit together at the end of each index instead of
/// being scattered over all of it.
pub fn new_job_id() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}

/// The SHA-256 of `bytes`, as lower-case hex: a request's idempotency hash,
/// a dead letter's payload digest, a file's id.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
