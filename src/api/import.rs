//! `GET /v1/import`: a WebSocket on which a client streams submissions.
//!
//! Each text frame is `{"ref": any, "idempotency_key": "…"?, "request": {…}}`
//! (`request` is the body `POST /v1/extractions` takes) and is answered on the
//! socket, in completion order, with `{"ref", "id", "status"}` or
//! `{"ref", "error": {"code", "message"}}`. Every frame takes the submit path
//! of the API, so it is validated, inserted idempotently and published alike.
//!
//! - **Backpressure.** At most [`IN_FLIGHT`] frames of a socket, and at most
//!   `import_max_in_flight_bytes` of their text, are being submitted; the next
//!   frame is read only when there is room, so a fast client is slowed by TCP,
//!   never dropped, and a socket's memory stays bounded whatever its frames
//!   weigh.
//! - **Frame size.** A message (or frame) is at most the body limit; a larger
//!   one closes the socket with 1009 (message too big), after the frames
//!   before it are answered.
//! - **Close.** When the client closes, or when the server shuts down, reading
//!   stops; every frame already read is drained (row written, event
//!   published) and answered while the socket still takes answers; on
//!   shutdown the server then closes with 1000 (normal), and frames that
//!   arrive after that are dropped unread and unanswered. `serve` waits for
//!   that drain before it flushes and exits.

use std::sync::Arc;

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::describe;
use super::sockets::{Sockets, Stream};
use super::state::Api;
use super::{ws, ApiError, Gate};
use crate::auth::Caller;
use crate::domain::{schema, ExtractionRequest, RequestError, Scope, MAX_IDEMPOTENCY_KEY_LEN};
use crate::store::NewExtraction;

/// Frames of one socket being submitted at once.
pub const IN_FLIGHT: usize = 64;

/// The `stream` label of this stream's metrics.
const STREAM: &str = "import";

pub(super) fn routes() -> ApiRouter<Api> {
    ApiRouter::new().api_route("/v1/import", get_with(upgrade, describe_upgrade))
}

/// A client frame of the import stream: one submission.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ImportFrame")]
pub(super) struct Frame {
    /// Anything; echoed in the answer.
    #[serde(rename = "ref", default)]
    reference: serde_json::Value,
    #[schemars(
        length(min = 1, max = MAX_IDEMPOTENCY_KEY_LEN),
        pattern(schema::VISIBLE_ASCII)
    )]
    idempotency_key: Option<String>,
    request: ExtractionRequest,
}

async fn upgrade(
    caller: Caller,
    State(api): State<Api>,
    Extension(gate): Extension<Gate>,
    Extension(sockets): Extension<Sockets>,
    socket: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let open = || {
        let socket = ws::accept(&caller, Scope::Submit, socket)?;
        let (admission, closing) = ws::admit(&sockets, &gate, caller.tenant_id, Stream::Import)?;
        // A frame is one request: it gets the body limit, as a POST does.
        let limit = api.settings.body_limit;
        Ok::<_, ApiError>(admission.upgrade(socket, limit, move |socket| {
            import(socket, api, caller, closing)
        }))
    };
    open().unwrap_or_else(IntoResponse::into_response)
}

fn describe_upgrade(op: TransformOperation<'_>) -> TransformOperation<'_> {
    let protocol = format!(
        "Each text frame from the client is one submission, an `ImportFrame`: \
        `{{\"ref\": any, \"idempotency_key\": \"…\" (optional), \"request\": {{…}}}}`, where \
        `request` is the body `POST /v1/extractions` takes. It takes the submit path of \
        the REST API (the same checks, quotas, idempotency and answers) and is answered on \
        the socket, in completion order, with an `ImportAnswer`: `{{\"ref\", \"id\", \
        \"status\"}}` or `{{\"ref\", \"error\": {{\"code\", \"message\"}}}}` with the REST API's \
        codes. A binary frame is answered with `bad_request`. At most {IN_FLIGHT} submissions of a \
        socket are in progress; the next frame is read only when one finishes, so a fast \
        client is slowed down, never dropped. When the client closes, reading stops and \
        every frame already read is still written, published and answered. When the \
        server shuts down it stops reading, answers every frame it read, and closes with \
        1000; a client should read until the server's close."
    );
    let description = format!(
        "Upgrades to a WebSocket on which a client streams submissions (scope \
         `submit`). A request that is not a WebSocket upgrade gets 400.\n\n{protocol}"
    );
    let op = describe::operation(
        op,
        "importStream",
        "streams",
        "Import stream (WebSocket)",
        &description,
    );
    ws::describe_upgrade(op, &protocol)
}

#[derive(Debug, PartialEq)]
enum Ended {
    ClientClosed,
    ServerClosing,
    /// The client sent a message past the size limit.
    TooLarge,
    /// The client answered no ping for two intervals: it is gone.
    Silent,
    /// The key it was opened with was revoked (or its tenant deleted, or the
    /// key lost the scope) while it ran.
    Refused(String),
}

impl Ended {
    /// The `kind` label of the stream's close.
    fn kind(&self) -> &'static str {
        match self {
            Ended::ClientClosed => "client",
            Ended::ServerClosing => "graceful",
            Ended::TooLarge => "too_large",
            Ended::Silent | Ended::Refused(_) => "forced",
        }
    }
}

/// Whether a read failed because the message was past the size limit.
fn too_large(error: &axum::Error) -> bool {
    // tungstenite's capacity error, which axum passes on as its own.
    error.to_string().contains("Space limit exceeded")
}

async fn import(socket: WebSocket, api: Api, caller: Caller, closing: CancellationToken) {
    let (sink, mut frames) = socket.split();
    let (answers, writer) = answer_writer(sink);
    let mut submits = Submits::new(&api, caller, answers);
    let ended = submits.read(&mut frames, &closing).await;
    submits.drain().await;
    if let Ok(sink) = writer.await {
        let limit = api.settings.body_limit;
        close(sink, &mut frames, &ended, limit).await;
    }
    let closes = &api.metrics.streams.closes;
    closes.with_label_values(&[STREAM, ended.kind()]).inc();
    tracing::debug!(?ended, "import stream drained and closed");
}

/// The socket's writer: answers go out as they come; once the client is gone
/// they are dropped, but the submits behind them still finish. It gives the
/// sink back once every sender of answers is gone.
fn answer_writer(mut sink: ws::Sink) -> (mpsc::Sender<Message>, JoinHandle<ws::Sink>) {
    let (answers, mut to_send) = mpsc::channel::<Message>(IN_FLIGHT);
    let writer = tokio::spawn(async move {
        let mut open = true;
        while let Some(answer) = to_send.recv().await {
            if open && sink.send(answer).await.is_err() {
                open = false;
            }
        }
        sink
    });
    (answers, writer)
}

/// The frames of one socket being submitted, within the socket's bounds:
/// [`IN_FLIGHT`] frames and `import_max_in_flight_bytes` of their text.
struct Submits {
    api: Api,
    caller: Arc<Caller>,
    answers: mpsc::Sender<Message>,
    slots: Arc<Semaphore>,
    budget: usize,
    bytes: Arc<Semaphore>,
    running: JoinSet<()>,
}

impl Submits {
    fn new(api: &Api, caller: Caller, answers: mpsc::Sender<Message>) -> Self {
        let budget = api.settings.import_max_in_flight_bytes;
        Submits {
            api: api.clone(),
            caller: Arc::new(caller),
            answers,
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
            budget,
            bytes: Arc::new(Semaphore::new(budget)),
            running: JoinSet::new(),
        }
    }

    /// Reads and submits frames, each once there is room for it, until the
    /// client closes, the server shuts down or a message is too large.
    async fn read(&mut self, frames: &mut ws::Frames, closing: &CancellationToken) -> Ended {
        let mut liveness = ws::Liveness::new(self.api.settings.ws_ping_interval);
        loop {
            let slot = tokio::select! {
                _ = closing.cancelled() => return Ended::ServerClosing,
                slot = self.slots.clone().acquire_owned() => slot.expect("never closed"),
            };
            // Frames were not read while the socket's submits held every
            // slot: that silence is the server's, not the client's.
            liveness.heard();
            let frame = loop {
                tokio::select! {
                    _ = closing.cancelled() => return Ended::ServerClosing,
                    frame = frames.next() => break frame,
                    alive = liveness.tick() => match alive {
                        Ok(()) => {
                            let auth = &self.api.auth;
                            if let Err(refused) = auth.recheck(&self.caller, Scope::Submit).await {
                                return Ended::Refused(refused.to_string());
                            }
                            let _ = self.answers.try_send(ws::ping());
                        }
                        Err(_) => return Ended::Silent,
                    },
                }
            };
            liveness.heard();
            let text = match frame {
                Some(Err(e)) if too_large(&e) => return Ended::TooLarge,
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Ended::ClientClosed,
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Binary(_))) => {
                    self.refuse_binary().await;
                    continue;
                }
                Some(Ok(_)) => continue,
            };
            // A frame larger than the whole budget takes all of it, alone.
            let weight = u32::try_from(text.len().clamp(1, self.budget)).unwrap_or(u32::MAX);
            let held = tokio::select! {
                _ = closing.cancelled() => return Ended::ServerClosing,
                held = self.bytes.clone().acquire_many_owned(weight) => held.expect("never closed"),
            };
            self.spawn(text, (slot, held));
        }
    }

    async fn refuse_binary(&self) {
        let frames = &self.api.metrics.streams.frames;
        frames.with_label_values(&[STREAM, "refused"]).inc();
        let refused = ws::binary_refused();
        let _ = self
            .answers
            .send(answer(serde_json::Value::Null, refused.body()))
            .await;
    }

    /// Submits `text` in a task of its own, which answers it and then gives
    /// back the room it `held`.
    fn spawn(&mut self, text: Utf8Bytes, held: (OwnedSemaphorePermit, OwnedSemaphorePermit)) {
        let api = self.api.clone();
        let (answers, caller) = (self.answers.clone(), self.caller.clone());
        let depth = api.metrics.streams.queue_depth.with_label_values(&[STREAM]);
        depth.inc();
        self.running.spawn(async move {
            let (reference, outcome) = submit_frame(&api, &caller, &text).await;
            let verdict = match outcome["error"].is_null() {
                true => "accepted",
                false => "refused",
            };
            let frames = &api.metrics.streams.frames;
            frames.with_label_values(&[STREAM, verdict]).inc();
            let _ = answers.send(answer(reference, outcome)).await;
            depth.dec();
            drop(held);
        });
    }

    /// Waits for every submit; then the last sender of answers is gone, and
    /// the writer gives the sink back.
    async fn drain(mut self) {
        while self.running.join_next().await.is_some() {}
    }
}

/// Closes the socket once every answer went out: with 1000 on shutdown, 1009
/// past the size limit (`limit`), 1008 once its key no longer admits it, and just the sink's close when the client
/// closed or went silent (no one would answer a close frame).
async fn close(mut sink: ws::Sink, frames: &mut ws::Frames, ended: &Ended, limit: usize) {
    let close = match ended {
        Ended::ServerClosing => Some(ws::close_frame(close_code::NORMAL, "server shutting down")),
        Ended::TooLarge => Some(ws::close_frame(
            close_code::SIZE,
            &format!("message larger than {limit} bytes"),
        )),
        Ended::Refused(reason) => Some(ws::close_frame(close_code::POLICY, reason)),
        Ended::ClientClosed | Ended::Silent => None,
    };
    if let Some(close) = close {
        let _ = sink.send(close).await;
        ws::finish_handshake(frames).await;
    }
    let _ = sink.close().await;
}

fn answer(reference: serde_json::Value, mut outcome: serde_json::Value) -> Message {
    outcome["ref"] = reference;
    Message::Text(outcome.to_string().into())
}

/// The `ref` of a frame that does not parse as one, if it can be read: the
/// rest of the frame is skipped unread, so a bad string elsewhere in it (a
/// lone surrogate, say) does not hide the reference.
fn reference_of(text: &str) -> serde_json::Value {
    #[derive(Deserialize)]
    struct Reference {
        #[serde(rename = "ref", default)]
        reference: serde_json::Value,
    }
    serde_json::from_str::<Reference>(text)
        .map(|r| r.reference)
        .unwrap_or_default()
}

/// Submits one frame; its reference and `{"id", "status"}` or `{"error"}`.
async fn submit_frame(
    api: &Api,
    caller: &Caller,
    text: &str,
) -> (serde_json::Value, serde_json::Value) {
    let frame: Frame = match serde_json::from_str(text) {
        Ok(frame) => frame,
        Err(e) => {
            let refused = ApiError::from(RequestError::from_json(&e));
            return (reference_of(text), refused.body());
        }
    };
    let outcome = submit(api, caller, frame.idempotency_key, frame.request).await;
    let body = match outcome {
        Ok((id, status)) => serde_json::json!({"id": id, "status": status}),
        Err(e) => e.body(),
    };
    (frame.reference, body)
}

async fn submit(
    api: &Api,
    caller: &Caller,
    idempotency_key: Option<String>,
    request: ExtractionRequest,
) -> Result<(Uuid, String), ApiError> {
    let max_open_jobs = super::auth::admit_submit(api, caller)?;
    let tenant = (caller.tenant_id, max_open_jobs);
    let limits = api.settings.request_limits;
    api.submitter.learn_patterns(&request).await;
    let new = NewExtraction::checked(tenant, idempotency_key, request, &limits)
        .map_err(|refused| ApiError::refused(refused, "idempotency_key"))?;
    let submitted = api.submitter.submit(new, || ()).await?;
    let row = submitted.extraction();
    Ok((row.id, row.status.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_that_does_not_parse_keeps_its_reference_and_code() {
        let surrogate =
            r#"{"ref": "r1", "request": {"document": {"text": "a\ud800"}, "fields": []}}"#;
        assert_eq!(reference_of(surrogate), serde_json::json!("r1"));
        let late = r#"{"request": {"document": {"text": "a\ud800"}}, "ref": 7}"#;
        assert_eq!(reference_of(late), serde_json::json!(7));
        let e = serde_json::from_str::<Frame>(surrogate).err().unwrap();
        let body = ApiError::from(RequestError::from_json(&e)).body();
        assert_eq!(body["error"]["code"], "unrepresentable_text", "{body}");
    }

    /// Pieces hostile frames are made of: escapes JSON allows but Postgres
    /// cannot store, structure that breaks off, and ordinary text.
    fn piece() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just(r"\u0000".to_owned()),
            Just(r"\ud800".to_owned()),
            Just(r"\udfff\ud800".to_owned()),
            Just("\"".to_owned()),
            Just("[".repeat(300)),
            Just("{".to_owned()),
            Just("}".to_owned()),
            "[a-zA-Z0-9 ,:]{0,12}",
            any::<String>(),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Whatever a frame holds, parsing it never panics, and a refusal
        /// is a 4xx with a code.
        #[test]
        fn any_frame_is_parsed_or_refused_with_a_4xx_and_a_code(
            pieces in proptest::collection::vec(piece(), 0..6),
            at in 0usize..4,
        ) {
            let hostile = pieces.concat();
            let frames = [
                hostile.clone(),
                format!(r#"{{"ref": 1, "request": {{"document": {{"text": "{hostile}"}}, "fields": [{{"name": "x", "anchor": "a"}}]}}}}"#),
                format!(r#"{{"ref": 2, "request": {{"document": {{"text": "a"}}, "fields": [{{"name": "{hostile}", "anchor": "a"}}], "metadata": {hostile}}}}}"#),
                format!(r#"{{"ref": 3, "idempotency_key": "{hostile}", "request": {hostile}}}"#),
            ];
            let text = &frames[at];
            let limits = crate::domain::RequestLimits::DEFAULT;
            let refused = match serde_json::from_str::<Frame>(text) {
                Ok(frame) => frame.request.validate(&limits).err().map(ApiError::from),
                Err(e) => Some(ApiError::from(RequestError::from_json(&e))),
            };
            let _ = reference_of(text);
            if let Some(refused) = refused {
                let (status, code) = refused.status_and_code();
                proptest::prop_assert!(status.is_client_error(), "{status} for {text:?}");
                proptest::prop_assert!(!code.is_empty());
            }
        }
    }
}
