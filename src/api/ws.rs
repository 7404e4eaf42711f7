//! What the import and export WebSockets share: the admission before the
//! upgrade (the key's scope, the tenant's socket cap, the gate), the watch
//! on a client that may have vanished, the refusal of binary frames, and the
//! server side of the close handshake.

use std::future::Future;
use std::time::Duration;

use aide::transform::TransformOperation;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures::stream::{SplitSink, SplitStream};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::describe;
use super::gate::Hold;
use super::sockets::{Slot, Sockets, Stream};
use super::{ApiError, Gate};
use crate::auth::Caller;
use crate::domain::Scope;

/// The writing half of a stream's socket.
pub(super) type Sink = SplitSink<WebSocket, Message>;

/// The reading half of a stream's socket.
pub(super) type Frames = SplitStream<WebSocket>;

/// How long a server-side close waits for the client's close frame.
pub(super) const CLOSE_HANDSHAKE: Duration = Duration::from_secs(5);

/// A stream's watch on its client: a ping every `interval`, and the verdict
/// that the client is gone once it has sent nothing, not even the pong, for
/// two of them. TCP alone never tells a server that a client's machine
/// vanished while the server has nothing to send.
pub(super) struct Liveness {
    interval: Duration,
    heard: tokio::time::Instant,
    ticks: tokio::time::Interval,
}

impl Liveness {
    pub(super) fn new(interval: Duration) -> Self {
        let now = tokio::time::Instant::now();
        let mut ticks = tokio::time::interval_at(now + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            interval,
            heard: now,
            ticks,
        }
    }

    /// The client sent something (any frame), or the stream stopped
    /// reading for reasons of its own: the silence starts again.
    pub(super) fn heard(&mut self) {
        self.heard = tokio::time::Instant::now();
    }

    /// The next tick: `Ok` to send a ping, `Err` with the silence when the
    /// client has been quiet for two intervals.
    pub(super) async fn tick(&mut self) -> Result<(), Duration> {
        self.ticks.tick().await;
        let silent = self.heard.elapsed();
        match silent >= 2 * self.interval {
            true => Err(silent),
            false => Ok(()),
        }
    }
}

/// A ping: its payload is empty; any frame from the client counts as life.
pub(super) fn ping() -> Message {
    Message::Ping(Default::default())
}

/// The first checks of a stream's request: the key has `scope`, and the
/// request is a WebSocket upgrade. They come before the stream's own checks
/// of its parameters.
pub(super) fn accept(
    caller: &Caller,
    scope: Scope,
    socket: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<WebSocketUpgrade, ApiError> {
    caller.require(scope)?;
    Ok(socket?)
}

/// An admitted stream: it holds one of its tenant's sockets and keeps the
/// gate open (shutdown waits for it) until the stream ends.
pub(super) struct Admission {
    // Held, never read: dropping them gives the socket and the gate back.
    _slot: Slot,
    _hold: Hold,
}

/// The last checks before the upgrade: the tenant has a socket of `stream`
/// left, and the server is not shutting down.
pub(super) fn admit(
    sockets: &Sockets,
    gate: &Gate,
    tenant: Uuid,
    stream: Stream,
) -> Result<(Admission, CancellationToken), ApiError> {
    let slot = sockets.take(tenant, stream)?;
    let Some(hold) = gate.hold() else {
        return Err(ApiError::ShuttingDown(
            "server is shutting down; retry shortly".into(),
        ));
    };
    Ok((
        Admission {
            _slot: slot,
            _hold: hold,
        },
        gate.closing(),
    ))
}

impl Admission {
    /// Upgrades `socket`, whose client messages (and frames) are at most
    /// `max_message` bytes, and runs `stream` on it; the slot and the hold are
    /// given back once `stream` is done.
    pub(super) fn upgrade<S, F>(
        self,
        socket: WebSocketUpgrade,
        max_message: usize,
        stream: S,
    ) -> Response
    where
        S: FnOnce(WebSocket) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let socket = socket
            .max_message_size(max_message)
            .max_frame_size(max_message);
        socket.on_upgrade(move |socket| async move {
            stream(socket).await;
            drop(self);
        })
    }
}

/// Why a binary frame is refused: both streams speak JSON text only.
pub(super) fn binary_refused() -> ApiError {
    ApiError::BadRequest("frames must be JSON text".into())
}

/// A close frame with `code`, its reason cut to the 123 bytes a close frame
/// has room for.
pub(super) fn close_frame(code: u16, reason: &str) -> Message {
    let mut reason = reason.to_owned();
    while reason.len() > 123 {
        reason.pop();
    }
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// Reads (and drops, unanswered) what the client still sends until its close
/// frame, for at most [`CLOSE_HANDSHAKE`], so the connection ends with both
/// close frames instead of a reset.
pub(super) async fn finish_handshake(frames: &mut Frames) {
    let handshake = async {
        while let Some(Ok(message)) = frames.next().await {
            if let Message::Close(_) = message {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_HANDSHAKE, handshake).await;
}

/// An upgrade's contract, in the words both streams share: the headers of
/// a WebSocket upgrade (RFC 6455) that the server checks (a request
/// without them gets 400), the upgrade's answer with `protocol` (what the
/// frames are), and the refusals before it.
pub(super) fn describe_upgrade<'t>(
    op: TransformOperation<'t>,
    protocol: &str,
) -> TransformOperation<'t> {
    let header = |name: &str, description: &str, schema: Value| {
        json!({
            "name": name,
            "in": "header",
            "required": true,
            "description": description,
            "schema": schema,
        })
    };
    let headers = [
        header(
            "Connection",
            "A list of tokens that has `Upgrade` (any case).",
            json!({
                "type": "string",
                "pattern": "^([^,]*,)*[ \\t]*[Uu][Pp][Gg][Rr][Aa][Dd][Ee][ \\t]*(,.*)?$",
            }),
        ),
        header(
            "Upgrade",
            "`websocket` (any case).",
            json!({"type": "string", "pattern": "^[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt]$"}),
        ),
        header(
            "Sec-WebSocket-Version",
            "`13`.",
            json!({"type": "string", "const": "13"}),
        ),
        header(
            "Sec-WebSocket-Key",
            "The client's nonce, the base64 of 16 random bytes; the server answers its \
             digest in `Sec-WebSocket-Accept`.",
            json!({"type": "string"}),
        ),
    ];
    let op = describe::parameters(op, headers);
    let upgraded = json!({
        "description": format!("Switching Protocols: the WebSocket. {protocol}"),
        "headers": {
            "Upgrade": {"required": true, "schema": {"type": "string", "const": "websocket"}},
            "Sec-WebSocket-Accept": {"required": true, "schema": {"type": "string"}},
        },
    });
    let op = describe::raw_answer(op, 101, upgraded);
    describe::refusals(op, &[400, 403, 429, 503])
}
