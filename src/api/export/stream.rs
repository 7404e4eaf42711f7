//! An open stream: the socket loop, from the open (and its group's carried
//! commits) to the close.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{close_code, Message, WebSocket};
use futures::{SinkExt, StreamExt};
use prometheus::IntCounter;
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::api::state::Api;
use crate::api::{ws, ApiError};
use crate::auth::{Authenticator, Caller};
use crate::config::Backpressure;
use crate::domain::Scope;
use crate::kafka::consumer::ConsumerError;
use crate::kafka::groups::Carried;
use crate::kafka::{groups, ConsumerSpec};
use crate::metrics::Metrics;

use super::handler::Exporter;
use super::query::{GroupName, Options};
use super::queue::{Outbound, Outgoing};
use super::STREAM;
use crate::api::state::ExportSettings;

/// How a stream ended.
#[derive(Debug)]
enum Ended {
    /// The client closed or vanished.
    Client,
    /// Shutdown: everything in flight was acknowledged and committed.
    Graceful,
    /// Closed by the server without a complete drain.
    Forced(String),
    /// The key it was opened with was revoked (or its tenant deleted, or the
    /// key lost the scope) while it ran.
    Refused(String),
}

pub(super) async fn export(
    socket: WebSocket,
    api: Api,
    options: Options,
    closing: CancellationToken,
) {
    let (sink, frames) = socket.split();
    if let Some((stream, consuming)) = ExportStream::open(sink, &api, options).await {
        stream.run(frames, consuming, closing).await;
    }
}

/// The stream's consumer, run in a task of its own.
type Consuming = JoinHandle<Result<(), ConsumerError>>;

/// An open export stream: its socket's writing half, its consumer, and what
/// was sent and not acknowledged yet. Each event of the stream (a client
/// frame, a record from the consumer, shutdown, the consumer's end) is one
/// method; the last one, [`ExportStream::close`], commits what was
/// acknowledged and closes the socket.
struct ExportStream {
    sink: ws::Sink,
    /// Who opened it, and where its key is checked again.
    caller: Caller,
    auth: Authenticator,
    settings: ExportSettings,
    metrics: Metrics,
    group: String,
    auto_ack: bool,
    outbound: Arc<Outbound>,
    /// Set on shutdown: the consumer stopped, and what is in flight drains.
    draining: Arc<AtomicBool>,
    /// Stops the stream's consumer.
    consume: CancellationToken,
    /// What was sent and not acknowledged yet, by seq, with when it was sent.
    unacked: BTreeMap<u64, (oneshot::Sender<()>, Instant)>,
    /// The last seq sent.
    seq: u64,
    /// Malformed client frames in a row.
    errors: u32,
    /// A send that takes longer than the drain timeout ends the stream.
    send_timeout: Duration,
    sent: IntCounter,
}

impl ExportStream {
    /// Starts the stream's consumer; when it cannot be created, closes the
    /// socket (1011) and gives `None`.
    async fn open(sink: ws::Sink, api: &Api, options: Options) -> Option<(Self, Consuming)> {
        let settings = api.settings.export;
        let metrics = api.metrics.clone();
        let outbound = Outbound::new(settings.max_queue_size, &metrics, options.strategy);
        let outbound = Arc::new(outbound);
        let group = options.group.kafka(&api.settings.export_group_prefix);
        if let Err(e) = carry_legacy_group(api, &options.group).await {
            tracing::error!(%group, error = %e, "export stream: the old group's commits not carried over");
            let why = "group unavailable; retry shortly";
            return refuse_open(sink, &metrics, close_code::AGAIN, why).await;
        }
        let spec = consumer_spec(api, &settings, &group, &options);
        let draining = Arc::new(AtomicBool::new(false));
        let exporter = Exporter::new(outbound.clone(), options.filter, draining.clone());
        let consume = CancellationToken::new();
        let runtime = match api.consumers.start(spec, exporter, consume.clone()) {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::error!(error = %e, "export stream: consumer not created");
                let why = "consumer unavailable";
                return refuse_open(sink, &metrics, close_code::ERROR, why).await;
            }
        };
        let consuming = tokio::spawn(runtime.run());
        tracing::info!(%group, strategy = options.strategy.as_str(), "export stream opened");
        let stream = ExportStream {
            sink,
            sent: metrics.streams.frames.with_label_values(&[STREAM, "sent"]),
            send_timeout: settings.drain_timeout,
            settings,
            metrics,
            group,
            auto_ack: options.auto_ack,
            outbound,
            draining,
            consume,
            unacked: BTreeMap::new(),
            caller: options.caller,
            auth: api.auth.clone(),
            seq: 0,
            errors: 0,
        };
        Some((stream, consuming))
    }

    /// Dispatches the stream's events to their methods until one ends it,
    /// then closes it.
    async fn run(
        mut self,
        mut frames: ws::Frames,
        mut consuming: Consuming,
        closing: CancellationToken,
    ) {
        let outbound = self.outbound.clone();
        let ack_timeout = self.settings.ack_timeout;
        let mut liveness = ws::Liveness::new(self.settings.ping_interval);
        let mut consumer_done = false;
        let ended = loop {
            if self.errors >= self.settings.max_consecutive_errors {
                break Ended::Forced(format!("{} consecutive errors", self.errors));
            }
            let window_open = self.auto_ack || self.unacked.len() < self.settings.max_unacked;
            // The oldest unacknowledged event's deadline; far away when there is none.
            let oldest = self.unacked.first_key_value().map(|(_, (_, at))| *at);
            let ack_deadline = oldest.map_or_else(far_future, |at| at + ack_timeout);
            let flow = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(ack_deadline.into()), if oldest.is_some() => {
                    break Ended::Forced(format!("no acknowledgement within {ack_timeout:?}"));
                }
                _ = closing.cancelled(), if !self.draining.load(Ordering::SeqCst) => {
                    self.on_shutdown()
                }
                joined = &mut consuming => {
                    consumer_done = true;
                    break self.on_consumer_end(joined);
                }
                frame = frames.next() => {
                    liveness.heard();
                    self.on_frame(frame).await
                }
                item = outbound.next(), if window_open => self.on_record(item).await,
                alive = liveness.tick() => match alive {
                    Ok(()) => match self.auth.recheck(&self.caller, Scope::Export).await {
                        Ok(()) => self.send(ws::ping()).await,
                        Err(refused) => break Ended::Refused(refused.to_string()),
                    },
                    Err(silent) => break Ended::Forced(format!("the client answered no ping for {silent:?}")),
                },
            };
            if let ControlFlow::Break(ended) = flow {
                break ended;
            }
        };
        let consuming = (!consumer_done).then_some(consuming);
        self.close(ended, &mut frames, consuming).await;
    }

    /// Shutdown began: stop consuming; what is in flight drains through the
    /// stream's loop.
    fn on_shutdown(&self) -> ControlFlow<Ended> {
        self.draining.store(true, Ordering::SeqCst);
        self.consume.cancel();
        ControlFlow::Continue(())
    }

    /// The consumer ended: after a drain that is the graceful end, otherwise
    /// a failure.
    fn on_consumer_end(&self, joined: Result<Result<(), ConsumerError>, JoinError>) -> Ended {
        match joined {
            Ok(Ok(())) if self.draining.load(Ordering::SeqCst) => Ended::Graceful,
            Ok(Ok(())) => Ended::Forced("the consumer stopped".into()),
            Ok(Err(e)) => Ended::Forced(e.to_string()),
            Err(e) => Ended::Forced(format!("the consumer task failed: {e}")),
        }
    }

    /// A frame from the client (or its end): an acknowledgement delivers
    /// every event up to its seq; anything else malformed is answered with an
    /// error frame and counted.
    async fn on_frame(
        &mut self,
        frame: Option<Result<Message, axum::Error>>,
    ) -> ControlFlow<Ended> {
        let refused = match frame {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => {
                return ControlFlow::Break(Ended::Client);
            }
            Some(Ok(Message::Text(text))) => match acknowledged(&text, self.seq) {
                Ok(upto) => {
                    let rest = self.unacked.split_off(&(upto + 1));
                    for (_, (done, _)) in std::mem::replace(&mut self.unacked, rest) {
                        let _ = done.send(());
                    }
                    self.errors = 0;
                    return ControlFlow::Continue(());
                }
                Err(message) => ApiError::BadRequest(message),
            },
            Some(Ok(Message::Binary(_))) => ws::binary_refused(),
            Some(Ok(_)) => return ControlFlow::Continue(()),
        };
        self.errors += 1;
        let refusal = Message::Text(refused.body().to_string().into());
        self.send(refusal).await
    }

    /// A record from the consumer, next in the queue: sent with the next seq,
    /// then delivered (auto ack) or waiting for the client's acknowledgement.
    async fn on_record(&mut self, item: Outgoing) -> ControlFlow<Ended> {
        self.seq += 1;
        let frame = serde_json::json!({
            "seq": self.seq,
            "partition": item.partition,
            "offset": item.offset,
            "event": item.event,
        });
        let message = Message::Text(frame.to_string().into());
        // A send that failed or timed out leaves the socket in an unknown
        // state, and skipping the event would hold its partition's commit
        // until the stream ends: the stream ends now, and the event
        // (abandoned, not committed) goes to the group's next connection.
        self.send(message).await?;
        self.sent.inc();
        if self.auto_ack {
            let _ = item.done.send(());
        } else {
            self.unacked.insert(self.seq, (item.done, Instant::now()));
        }
        ControlFlow::Continue(())
    }

    /// Sends `message` within the send timeout: a client that stops reading
    /// cannot hold the stream (and its group member) forever. A failed send
    /// ends the stream by force.
    async fn send(&mut self, message: Message) -> ControlFlow<Ended> {
        match send(&mut self.sink, message, self.send_timeout).await {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(Ended::Forced(e)),
        }
    }

    /// The stream's end: what was not acknowledged is abandoned (not
    /// committed), the consumer stops (unless it already ended, `consuming`
    /// is `None` then) and commits the acknowledged prefix; only then is the
    /// socket closed, 1000 after a drain, 1011 by force.
    async fn close(mut self, ended: Ended, frames: &mut ws::Frames, consuming: Option<Consuming>) {
        self.outbound.close();
        if !self.unacked.is_empty() {
            self.metrics
                .streams
                .redeliveries
                .with_label_values(&[STREAM])
                .inc_by(self.unacked.len() as u64);
        }
        drop(std::mem::take(&mut self.unacked));
        self.consume.cancel();
        if let Some(consuming) = consuming {
            if let Ok(Err(e)) = consuming.await {
                tracing::warn!(error = %e, "export stream: consumer stopped with an error");
            }
        }
        let kind = match &ended {
            Ended::Client => "client",
            Ended::Graceful => {
                self.close_socket(frames, close_code::NORMAL, "server shutting down")
                    .await;
                "graceful"
            }
            Ended::Forced(reason) => {
                tracing::warn!(%reason, "export stream closed by force");
                self.close_socket(frames, close_code::ERROR, reason).await;
                "forced"
            }
            Ended::Refused(reason) => {
                tracing::info!(%reason, "export stream closed: its key no longer admits it");
                self.close_socket(frames, close_code::POLICY, reason).await;
                "forced"
            }
        };
        let _ = tokio::time::timeout(ws::CLOSE_HANDSHAKE, self.sink.close()).await;
        self.metrics
            .streams
            .closes
            .with_label_values(&[STREAM, kind])
            .inc();
        let (group, seq) = (&self.group, self.seq);
        tracing::info!(%group, ?ended, last_seq = seq, "export stream closed");
    }

    /// Sends the close frame and, if it went out, waits for the client's.
    async fn close_socket(&mut self, frames: &mut ws::Frames, code: u16, reason: &str) {
        let closed = ws::close_frame(code, reason);
        if send(&mut self.sink, closed, ws::CLOSE_HANDSHAKE)
            .await
            .is_ok()
        {
            ws::finish_handshake(frames).await;
        }
    }
}

/// Closes a stream that could not open with `code` and `why`, counted as a
/// forced close.
async fn refuse_open<T>(mut sink: ws::Sink, metrics: &Metrics, code: u16, why: &str) -> Option<T> {
    let _ = sink.send(ws::close_frame(code, why)).await;
    let closes = &metrics.streams.closes;
    closes.with_label_values(&[STREAM, "forced"]).inc();
    None
}

/// Carries the commits of the stream's group under its old name over to its
/// name now, while that has none (the first open after the rename). A
/// stream must not start while this is unknown: its group would begin at
/// `from` and skip what the old group had not yet delivered.
async fn carry_legacy_group(api: &Api, group: &GroupName) -> Result<(), String> {
    let (settings, consumers) = (&api.settings, &api.consumers);
    let prefix = &settings.export_group_prefix;
    let (old, new) = (
        consumers.name(&group.legacy(prefix)),
        consumers.name(&group.kafka(prefix)),
    );
    let topic = consumers.name(&settings.events_topic);
    let kafka = consumers.kafka().clone();
    let carry = {
        let (old, new) = (old.clone(), new.clone());
        move || groups::carry_over(&kafka, &topic, &old, &new, CARRY_TIMEOUT)
    };
    let carried = tokio::task::spawn_blocking(carry)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    if let Carried::Partitions(n) = carried {
        tracing::info!(%old, %new, partitions = n, "export group's commits carried over from its old name");
    }
    Ok(())
}

/// How long each step of a carry-over may wait for the broker.
const CARRY_TIMEOUT: Duration = Duration::from_secs(5);

/// The stream's consumer: a member of `group` on the events topic, with room
/// for every event the stream may hold.
fn consumer_spec(
    api: &Api,
    stream: &ExportSettings,
    group: &str,
    options: &Options,
) -> ConsumerSpec {
    let mut spec = (api.consumers).spec(group, &api.settings.events_topic);
    // Every event in the queue or the unacknowledged window is a record in
    // flight. The drop strategies read on past a full queue (that is what
    // makes them drop), as many records ahead as a pipeline consumer would.
    spec.max_in_flight = stream.max_queue_size + stream.max_unacked;
    if options.strategy != Backpressure::Block {
        spec.max_in_flight += api.consumers.max_in_flight();
    }
    spec.drain_timeout = stream.drain_timeout;
    spec.from_earliest = options.from_earliest;
    spec
}

/// A deadline no stream lives to see.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

/// Sends `message` within `timeout`.
async fn send(sink: &mut ws::Sink, message: Message, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, sink.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("send failed: {e}")),
        Err(_) => Err(format!("send timed out after {timeout:?}")),
    }
}

/// The `seq` a client frame acknowledges up to, or why the frame is refused.
fn acknowledged(text: &str, last_sent: u64) -> Result<u64, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Ack {
        ack: u64,
    }
    let Ack { ack } =
        serde_json::from_str(text).map_err(|e| format!("expected {{\"ack\": <seq>}}: {e}"))?;
    if ack > last_sent {
        return Err(format!(
            "ack {ack} is beyond the last event sent ({last_sent})"
        ));
    }
    Ok(ack)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn acks_are_cumulative_and_never_beyond_what_was_sent() {
        assert_eq!(acknowledged(r#"{"ack": 7}"#, 10), Ok(7));
        assert!(acknowledged(r#"{"ack": 11}"#, 10).is_err());
        assert!(acknowledged(r#"{"ack": -1}"#, 10).is_err());
        assert!(acknowledged("ack", 10).is_err());
    }
}
