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

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::sockets::{Sockets, Stream};
use super::{ApiError, Gate};
use crate::auth::Caller;
use crate::domain::{
    idempotency_key_is_valid, ExtractionRequest, RequestError, Scope, MAX_IDEMPOTENCY_KEY_LEN,
};
use crate::pipeline::{self, Services};
use crate::store::NewExtraction;

/// Frames of one socket being submitted at once.
pub const IN_FLIGHT: usize = 64;

/// The `stream` label of this stream's metrics.
const STREAM: &str = "import";

/// How long a server-side close waits for the client's close frame.
const CLOSE_HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) fn router() -> Router<Services> {
    Router::new().route("/v1/import", get(upgrade))
}

/// One submission on the socket.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Frame {
    /// The client's reference, echoed in the answer.
    #[serde(rename = "ref", default)]
    reference: serde_json::Value,
    idempotency_key: Option<String>,
    request: ExtractionRequest,
}

async fn upgrade(
    caller: Caller,
    State(services): State<Services>,
    Extension(gate): Extension<Gate>,
    Extension(sockets): Extension<Sockets>,
    socket: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if let Err(e) = caller.require(Scope::Submit) {
        return ApiError::from(e).into_response();
    }
    let socket = match socket {
        Ok(socket) => socket,
        Err(refused) => return ApiError::from(refused).into_response(),
    };
    let slot = match sockets.take(caller.tenant_id, Stream::Import) {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let Some(hold) = gate.hold() else {
        return ApiError::ShuttingDown("server is shutting down; retry shortly".into())
            .into_response();
    };
    let closing = gate.closing();
    // A frame is one request: it gets the body limit, as a POST does.
    let limit = services.settings.http_body_limit_bytes;
    let socket = socket.max_message_size(limit).max_frame_size(limit);
    socket.on_upgrade(move |socket| async move {
        import(socket, services, caller, closing).await;
        drop((hold, slot));
    })
}

#[derive(Debug, PartialEq)]
enum Ended {
    ClientClosed,
    ServerClosing,
    /// The client sent a message past the size limit.
    TooLarge,
}

/// Whether a read failed because the message was past the size limit.
fn too_large(error: &axum::Error) -> bool {
    // tungstenite's capacity error, which axum passes on as its own.
    error.to_string().contains("Space limit exceeded")
}

async fn import(socket: WebSocket, services: Services, caller: Caller, closing: CancellationToken) {
    let caller = Arc::new(caller);
    let (mut sink, mut frames) = socket.split();
    let (answers, mut to_send) = mpsc::channel::<Message>(IN_FLIGHT);
    // Answers go out as they come; once the client is gone they are dropped,
    // but the submits behind them still finish.
    let writer = tokio::spawn(async move {
        let mut open = true;
        while let Some(answer) = to_send.recv().await {
            if open && sink.send(answer).await.is_err() {
                open = false;
            }
        }
        sink
    });
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let limit = services.settings.http_body_limit_bytes;
    let budget = services.settings.import_max_in_flight_bytes;
    let bytes = Arc::new(Semaphore::new(budget));
    let mut submits = JoinSet::new();
    let ended = loop {
        let slot = tokio::select! {
            _ = closing.cancelled() => break Ended::ServerClosing,
            slot = slots.clone().acquire_owned() => slot.expect("never closed"),
        };
        let frame = tokio::select! {
            _ = closing.cancelled() => break Ended::ServerClosing,
            frame = frames.next() => frame,
        };
        let text = match frame {
            Some(Err(e)) if too_large(&e) => break Ended::TooLarge,
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break Ended::ClientClosed,
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Binary(_))) => {
                let frames = &services.metrics.streams.frames;
                frames.with_label_values(&[STREAM, "refused"]).inc();
                let refused = ApiError::BadRequest("frames must be JSON text".into());
                let _ = answers
                    .send(answer(serde_json::Value::Null, refused.body()))
                    .await;
                continue;
            }
            Some(Ok(_)) => continue,
        };
        // A frame larger than the whole budget takes all of it, alone.
        let weight = u32::try_from(text.len().clamp(1, budget)).unwrap_or(u32::MAX);
        let held = tokio::select! {
            _ = closing.cancelled() => break Ended::ServerClosing,
            held = bytes.clone().acquire_many_owned(weight) => held.expect("never closed"),
        };
        let (services, answers, caller) = (services.clone(), answers.clone(), caller.clone());
        let depth = services
            .metrics
            .streams
            .queue_depth
            .with_label_values(&[STREAM]);
        depth.inc();
        submits.spawn(async move {
            let (reference, outcome) = submit_frame(&services, &caller, &text).await;
            let verdict = match outcome["error"].is_null() {
                true => "accepted",
                false => "refused",
            };
            let frames = &services.metrics.streams.frames;
            frames.with_label_values(&[STREAM, verdict]).inc();
            let _ = answers.send(answer(reference, outcome)).await;
            depth.dec();
            drop((slot, held));
        });
    };
    while submits.join_next().await.is_some() {}
    drop(answers);
    if let Ok(mut sink) = writer.await {
        let close = match ended {
            Ended::ServerClosing => Some(CloseFrame {
                code: axum::extract::ws::close_code::NORMAL,
                reason: "server shutting down".into(),
            }),
            Ended::TooLarge => Some(CloseFrame {
                code: axum::extract::ws::close_code::SIZE,
                reason: format!("message larger than {limit} bytes").into(),
            }),
            Ended::ClientClosed => None,
        };
        if let Some(close) = close {
            let _ = sink.send(Message::Close(Some(close))).await;
            // The closing handshake: read (and drop, unanswered) what the
            // client sent meanwhile until its close arrives, so the connection
            // ends with both close frames instead of a reset.
            let handshake = async {
                while let Some(Ok(message)) = frames.next().await {
                    if let Message::Close(_) = message {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(CLOSE_HANDSHAKE, handshake).await;
        }
        let _ = sink.close().await;
    }
    let kind = match ended {
        Ended::ClientClosed => "client",
        Ended::ServerClosing => "graceful",
        Ended::TooLarge => "too_large",
    };
    let closes = &services.metrics.streams.closes;
    closes.with_label_values(&[STREAM, kind]).inc();
    tracing::debug!(?ended, "import stream drained and closed");
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
    services: &Services,
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
    let outcome = submit(services, caller, frame.idempotency_key, frame.request).await;
    let body = match outcome {
        Ok((id, status)) => serde_json::json!({"id": id, "status": status}),
        Err(e) => e.body(),
    };
    (frame.reference, body)
}

async fn submit(
    services: &Services,
    caller: &Caller,
    idempotency_key: Option<String>,
    request: ExtractionRequest,
) -> Result<(Uuid, String), ApiError> {
    let max_open_jobs = super::auth::admit_submit(services, caller)?;
    request.validate(&services.settings.request_limits())?;
    if idempotency_key
        .as_deref()
        .is_some_and(|k| !idempotency_key_is_valid(k))
    {
        return Err(ApiError::BadRequest(format!(
            "idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
        )));
    }
    let new = NewExtraction {
        id: crate::domain::new_job_id(),
        tenant_id: caller.tenant_id,
        max_open_jobs,
        idempotency_key,
        request,
    };
    let submitted = pipeline::submit(services, new).await?;
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
