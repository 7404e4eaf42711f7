//! Everything a job's records go through, behind the consumer roles that
//! drive it: the Kafka intake (`intake`), the submit path shared with the API
//! (`submit`, `stamps`), the two stages' workers (`worker`, `bbox_worker`)
//! over the job lifecycle (`jobs`: claim, hold, end and hand over a stage,
//! with each transition's event), the batched statements of the hot path
//! (`batched`), the reapers that revive orphans (`reaper`) and the queue
//! census (`census`). Each role is a
//! [`RecordHandler`](crate::kafka::RecordHandler) run by the consumer
//! runtime, on the parts its process assembled (`roles.rs`) and handed it.
//!
//! Every role claims before it works (a duplicate delivery loses the claim and is
//! skipped), completes with the claim's fencing token, and publishes one
//! `ExtractionEvent` per transition it won. A record counts as delivered only
//! after all of that was acknowledged.

mod batched;
mod bbox_worker;
pub mod bulk;
pub mod census;
mod intake;
pub mod jobs;
pub mod lease;
pub mod reaper;
pub mod retention;
mod stamps;
pub(crate) mod submit;
pub mod weights;
mod worker;

pub use batched::{BatchLimits, Batched};
pub use bbox_worker::{BboxWorker, Parts as BboxParts};
pub use intake::{Intake, Parts as IntakeParts, API_KEY_HEADER, TENANT_HEADER};
pub use jobs::{JobError, Jobs, RepublishError};
pub use reaper::{Kind as ReaperKind, Reaper, Sweep};
pub use stamps::Stamps;
pub use submit::{DurableSubmitError, Parts as SubmitParts, Submitter};
pub use worker::{ExtractionWorker, Parts as WorkerParts};

use uuid::Uuid;

pub use crate::domain::Stage;
use crate::events::{decode, Event};
use crate::kafka::{HandlerError, Record};

/// Decodes a job's record: its event `E`, the job's id, and the job's span
/// (continuing the record's trace). A record that does not decode is poison.
fn job_record<E: Event>(
    record: &Record,
    id_of: impl Fn(&E) -> &str,
) -> Result<(E, Uuid, tracing::Span), HandlerError> {
    let (event, id) = decode_record(record, id_of)?;
    let span = crate::trace::job_span(id, record.traceparent().as_ref());
    Ok((event, id, span))
}

/// Decodes a record's value as `E` and its extraction id; failures are poison.
fn decode_record<E: Event>(
    record: &Record,
    id_of: impl Fn(&E) -> &str,
) -> Result<(E, Uuid), HandlerError> {
    let payload = record.payload.as_deref().unwrap_or_default();
    let event: E = decode(payload)?;
    let id = Uuid::parse_str(id_of(&event)).map_err(|e| HandlerError::Poison {
        kind: "undecodable",
        reason: format!("extraction_id is not a UUID: {e}"),
    })?;
    Ok((event, id))
}
