//! `GET /v1/export?group=NAME`: a WebSocket that streams `extraction.events`.
//!
//! Query parameters:
//! - `group` (required): the stream's name. Each name is a consumer group of
//!   its own (`export_group_prefix`, the caller's tenant, `.`, the name), so a
//!   client that reconnects with the same name resumes after the last event
//!   it acknowledged. A tenant's name cannot hold a `.`, so no two (tenant,
//!   name) pairs share a group. (Groups were once joined with `-`, and tenant
//!   `p` with name `b-c` met tenant `p-b` with name `c`: a stream's first
//!   open under the new name carries its old group's commits over, see
//!   [`GroupName::legacy`].)
//! - `strategy`: `block` (the default, `export_backpressure_strategy`),
//!   `drop_oldest` or `drop_new` — what happens to an event when the stream's
//!   queue (`export_max_queue_size`) is full.
//! - `ack`: `client` (the default: the client acknowledges) or `auto` (an
//!   event counts as received once the socket took it).
//! - `status`, `transition`: comma-separated filters on the event's fields.
//! - `from`: where a group with nothing committed yet starts: `latest` (the
//!   default: only events from now on) or `earliest` (every event the topic
//!   still holds). A group that committed before resumes where it was.
//!
//! A stream carries only the events of the caller's tenant: the others are
//! passed over (and committed) without being sent. The key needs the
//! `export` scope.
//!
//! Each event goes out as `{"seq", "partition", "offset", "event": {…}}`; the
//! client answers `{"ack": N}`, which acknowledges every event up to `seq` N.
//! A malformed frame from the client is answered `{"error": {"code", "message"}}`.
//!
//! **No loss.** The stream is a member of the group's consumer
//! ([`crate::kafka::consumer`]): an event's record counts as delivered only when
//! the client acknowledged it, so the committed offset never passes an event
//! the client did not get. With `block` nothing is ever skipped: a slow client
//! stops the queue, then the consumer pauses. The drop strategies keep the
//! stream moving instead and count every event they drop; a dropped event is
//! committed (it was decided, not lost by accident). At most
//! `export_max_unacked` events are sent and not yet acknowledged.
//!
//! **Close.** When the client leaves, what it did not acknowledge is not
//! committed and goes to the group's next connection (counted as
//! redeliveries). On server shutdown the stream stops consuming, keeps sending
//! what was queued and reading acknowledgements until every event in flight is
//! acknowledged (`export_drain_timeout_s`), commits, and only then closes the
//! socket with 1000. A drain that times out, a client that keeps sending
//! malformed frames (`export_max_consecutive_errors` in a row), a client that
//! holds an event unacknowledged for longer than `export_ack_timeout_s` (it
//! holds its partitions' commits, and the group's other members cannot take
//! them over while it lives), a send that
//! fails or takes longer than the drain timeout (the client stopped reading),
//! or a Kafka failure closes the stream by force (1011), committing only what
//! was acknowledged.

//!
//! **Where things are.** A stream's life, in order: [`query`] checks what the
//! client asked for before the upgrade; [`stream`] opens the stream (its
//! group, its commits carried over, its consumer) and runs the socket loop
//! to the close; the consumer's [`handler`] takes each record through the
//! partition's [`order`] into the backpressure [`queue`], and waits for the
//! client's acknowledgement.

mod handler;
mod order;
mod query;
mod queue;
mod stream;

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Extension, Query, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::api::state::Api;
use crate::auth::Caller;
use crate::config::Settings;
use crate::domain::Scope;

use super::describe;
use super::sockets::{Sockets, Stream};
use super::{ws, ApiError, Gate};
use query::{options, Params};
use stream::export;

/// The `stream` label of this stream's metrics.
pub(super) const STREAM: &str = "export";

/// Largest frame a client may send: acknowledgements are tens of bytes.
pub(super) const MAX_CLIENT_FRAME: usize = 64 * 1024;

/// Longest group name a client may choose.
pub(super) const MAX_GROUP_LEN: usize = 100;

pub(super) fn routes(settings: &Settings) -> ApiRouter<Api> {
    ApiRouter::new().api_route(
        "/v1/export",
        get_with(upgrade, |op| describe_upgrade(op, settings)),
    )
}

async fn upgrade(
    caller: Caller,
    State(api): State<Api>,
    Extension(gate): Extension<Gate>,
    Extension(sockets): Extension<Sockets>,
    uri: Uri,
    socket: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let open = || {
        let socket = ws::accept(&caller, Scope::Export, socket)?;
        // The query is read here, not by an extractor: its parameters are
        // described by hand, with the settings' defaults.
        let params = Query::<Params>::try_from_uri(&uri);
        let Query(params) = params.map_err(|e| ApiError::BadRequest(e.body_text()))?;
        let strategy = api.settings.export_backpressure;
        let options = options(params, &caller, strategy)?;
        let (admission, closing) = ws::admit(&sockets, &gate, caller.tenant_id, Stream::Export)?;
        // A client sends acknowledgements only: small frames.
        Ok::<_, ApiError>(admission.upgrade(socket, MAX_CLIENT_FRAME, move |socket| {
            export(socket, api, options, closing)
        }))
    };
    open().unwrap_or_else(IntoResponse::into_response)
}

fn describe_upgrade<'t>(op: TransformOperation<'t>, settings: &Settings) -> TransformOperation<'t> {
    let protocol = protocol(settings);
    let description = format!(
        "Upgrades to a WebSocket that streams the caller's tenant's events (scope \
         `export`). A request that is not a WebSocket upgrade, or has a missing, \
         malformed or unknown query parameter, gets 400.\n\n{protocol}"
    );
    let op = describe::operation(
        op,
        "exportStream",
        "streams",
        "Export stream (WebSocket)",
        &description,
    );
    let op = ws::describe_upgrade(op, &protocol);
    describe::parameters(op, query(settings))
}

/// What the stream's frames are and when it closes, with the settings'
/// limits; both the operation and its 101 answer say it.
fn protocol(settings: &Settings) -> String {
    format!(
        "The server sends the caller's tenant's `extraction.events` as `ExportFrame`s, \
         `{{\"seq\", \"partition\", \"offset\", \"event\": {{…}}}}`, in offset order within \
         a partition (so a job's events in the order they happened). The client answers \
         `{{\"ack\": N}}` (an `ExportAck`), which acknowledges every event up to `seq` N; \
         at most {unacked} events are sent and not yet acknowledged \
         (`DOCSTREAM_EXPORT_MAX_UNACKED`). An event's offset is committed only once it is \
         acknowledged (or dropped by a drop strategy), so a group that reconnects resumes \
         after the last event it acknowledged. A malformed client frame is answered \
         `{{\"error\": {{\"code\": \"bad_request\", \"message\"}}}}`; \
         {errors} in a row (`DOCSTREAM_EXPORT_MAX_CONSECUTIVE_ERRORS`), an event left \
         unacknowledged for {ack_s} s (`DOCSTREAM_EXPORT_ACK_TIMEOUT_S`), a client that \
         stops reading, or a Kafka failure close the stream with 1011. On shutdown the \
         server stops consuming, sends what was queued, waits up to {drain_s} s for every \
         event sent to be acknowledged, commits, and closes with 1000.",
        unacked = settings.export_max_unacked,
        errors = settings.export_max_consecutive_errors,
        ack_s = settings.export_ack_timeout_s,
        drain_s = settings.export_drain_timeout_s,
    )
}

/// The stream's query parameters: its group and what it streams.
fn query(settings: &Settings) -> [Value; 6] {
    let query = describe::query_parameter;
    [
        query(
            "group",
            true,
            "The stream's name: a consumer group of the caller's tenant of its own, so a \
             client that reconnects with the same name resumes where it left off.",
            json!({"type": "string", "minLength": 1, "maxLength": MAX_GROUP_LEN,
                   "pattern": "^[A-Za-z0-9._-]+$"}),
        ),
        query(
            "strategy",
            false,
            &format!(
                "What happens to an event when the stream's queue \
                 (`DOCSTREAM_EXPORT_MAX_QUEUE_SIZE`, {}) is full: `block` waits (nothing \
                 is skipped), `drop_oldest` and `drop_new` drop and count. The default is \
                 `DOCSTREAM_EXPORT_BACKPRESSURE_STRATEGY` ({}).",
                settings.export_max_queue_size, settings.export_backpressure_strategy
            ),
            json!({"type": "string", "enum": ["block", "drop_oldest", "drop_new"]}),
        ),
        query(
            "ack",
            false,
            "`client` (the default): the client acknowledges; `auto`: an event counts as \
             received once the socket took it.",
            json!({"type": "string", "enum": ["client", "auto"], "default": "client"}),
        ),
        query(
            "status",
            false,
            "Comma-separated statuses: only events whose job has one of them.",
            json!({"type": "string"}),
        ),
        query(
            "transition",
            false,
            "Comma-separated transitions: only events of one of them.",
            json!({"type": "string"}),
        ),
        query(
            "from",
            false,
            "Where a group with nothing committed yet starts: `latest` (events from now \
             on) or `earliest` (what the topic still holds). A group that committed \
             resumes where it was.",
            json!({"type": "string", "enum": ["latest", "earliest"], "default": "latest"}),
        ),
    ]
}

/// An event of job `id` for the tests: `mark_running`, of no tenant.
#[cfg(test)]
fn running_event(id: &str) -> crate::events::ExtractionEvent {
    crate::events::ExtractionEvent {
        extraction_id: id.into(),
        transition: "mark_running".into(),
        status: "running".into(),
        bbox_status: None,
        token: Some(1),
        error: None,
        reason: crate::events::PublishReason::Submit,
        published_at_ms: 0,
        tenant_id: None,
        correction: None,
    }
}
