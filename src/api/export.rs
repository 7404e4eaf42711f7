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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::{SinkExt, StreamExt};
use prometheus::{IntCounter, IntGauge};
use serde::Deserialize;
use tokio::sync::{oneshot, Notify};
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::sockets::{Sockets, Stream};
use super::{ws, ApiError, Gate};
use crate::auth::{Authenticator, Caller};
use crate::config::{Backpressure, Settings};
use crate::domain::Scope;
use crate::events::{decode, ExtractionEvent};
use crate::kafka::consumer::ConsumerError;
use crate::kafka::groups::{self, Carried};
use crate::kafka::{ConsumerSpec, HandlerError, Record, RecordHandler};
use crate::metrics::Metrics;
use crate::pipeline::Services;

/// The `stream` label of this stream's metrics.
const STREAM: &str = "export";

/// Largest frame a client may send: acknowledgements are tens of bytes.
const MAX_CLIENT_FRAME: usize = 64 * 1024;

/// Longest group name a client may choose.
pub(super) const MAX_GROUP_LEN: usize = 100;

pub(super) fn router() -> Router<Services> {
    Router::new().route("/v1/export", get(upgrade))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    group: Option<String>,
    strategy: Option<String>,
    ack: Option<String>,
    status: Option<String>,
    transition: Option<String>,
    from: Option<String>,
}

/// A stream's options, checked before the upgrade.
struct Options {
    /// Who opened the stream: its key is looked up again while it runs.
    caller: Caller,
    group: GroupName,
    strategy: Backpressure,
    auto_ack: bool,
    from_earliest: bool,
    filter: Filter,
}

/// A stream's group: its tenant's name and the name the client chose.
#[derive(Debug)]
struct GroupName {
    tenant: String,
    name: String,
}

impl GroupName {
    /// The Kafka group: `prefix`, the tenant, `.`, the name. Tenant names
    /// have no `.`, so the first `.` after the prefix ends the tenant, and
    /// two pairs never meet.
    fn kafka(&self, prefix: &str) -> String {
        format!("{prefix}{}.{}", self.tenant, self.name)
    }

    /// The group this stream had before groups were joined with `.`: its
    /// commits are carried over to [`Self::kafka`] while that has none.
    fn legacy(&self, prefix: &str) -> String {
        format!("{prefix}{}-{}", self.tenant, self.name)
    }
}

/// Which events a stream sends: its tenant's, and of those the ones the
/// client's filters admit (`None` admits all).
struct Filter {
    tenant_id: Uuid,
    statuses: Option<HashSet<String>>,
    transitions: Option<HashSet<String>>,
}

impl Filter {
    fn admits(&self, event: &ExtractionEvent) -> bool {
        let admits = |set: &Option<HashSet<String>>, value: &str| {
            set.as_ref().is_none_or(|set| set.contains(value))
        };
        event.belongs_to(self.tenant_id)
            && admits(&self.statuses, &event.status)
            && admits(&self.transitions, &event.transition)
    }
}

fn options(
    params: Params,
    caller: &Caller,
    default_strategy: Backpressure,
) -> Result<Options, ApiError> {
    let bad = |msg: String| Err(ApiError::BadRequest(msg));
    let Some(group) = params.group else {
        return bad("the group parameter is required: it names the stream's consumer group".into());
    };
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if group.is_empty() || group.len() > MAX_GROUP_LEN || !group.chars().all(legal) {
        return bad(format!(
            "group must be 1 to {MAX_GROUP_LEN} characters of A-Z, a-z, 0-9, '.', '_' and '-'"
        ));
    }
    let strategy = match params.strategy.as_deref() {
        None => default_strategy,
        Some(name) => match name.parse() {
            Ok(strategy) => strategy,
            Err(why) => return bad(format!("strategy {why}")),
        },
    };
    let auto_ack = match params.ack.as_deref() {
        None | Some("client") => false,
        Some("auto") => true,
        Some(other) => return bad(format!("ack {other:?}: expected client or auto")),
    };
    let from_earliest = match params.from.as_deref() {
        None | Some("latest") => false,
        Some("earliest") => true,
        Some(other) => return bad(format!("from {other:?}: expected latest or earliest")),
    };
    let set = |list: Option<String>| {
        list.map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
    };
    Ok(Options {
        caller: caller.clone(),
        // A group belongs to its tenant: equal names of two tenants are two groups.
        group: GroupName {
            tenant: caller.tenant.clone(),
            name: group,
        },
        strategy,
        auto_ack,
        from_earliest,
        filter: Filter {
            tenant_id: caller.tenant_id,
            statuses: set(params.status),
            transitions: set(params.transition),
        },
    })
}

async fn upgrade(
    caller: Caller,
    State(services): State<Services>,
    Extension(gate): Extension<Gate>,
    Extension(sockets): Extension<Sockets>,
    params: Result<Query<Params>, QueryRejection>,
    socket: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let open = || {
        let socket = ws::accept(&caller, Scope::Export, socket)?;
        let Query(params) = params.map_err(|e| ApiError::BadRequest(e.body_text()))?;
        let strategy = services.settings.export_backpressure_strategy;
        let options = options(params, &caller, strategy)?;
        let (admission, closing) = ws::admit(&sockets, &gate, caller.tenant_id, Stream::Export)?;
        // A client sends acknowledgements only: small frames.
        Ok::<_, ApiError>(admission.upgrade(socket, MAX_CLIENT_FRAME, move |socket| {
            export(socket, services, options, closing)
        }))
    };
    open().unwrap_or_else(IntoResponse::into_response)
}

/// An event waiting for the socket; `done` tells its record's handler that
/// the client has it (or that it was dropped by the strategy).
struct Outgoing {
    partition: i32,
    offset: i64,
    event: ExtractionEvent,
    done: oneshot::Sender<()>,
}

/// The queue between the stream's consumer (many record handlers) and its
/// socket (one writer), bounded by the backpressure strategy.
struct Outbound {
    queue: Mutex<Queue>,
    /// An event entered the queue.
    ready: Notify,
    /// An event left the queue.
    room: Notify,
    strategy: Backpressure,
    capacity: usize,
    depth: IntGauge,
    dropped: IntCounter,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Outgoing>,
    closed: bool,
}

enum Offered {
    Queued,
    Dropped,
    Closed,
}

impl Outbound {
    fn new(settings: &Settings, metrics: &Metrics, strategy: Backpressure) -> Self {
        Outbound {
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
            room: Notify::new(),
            strategy,
            capacity: settings.export_max_queue_size,
            depth: metrics.streams.queue_depth.with_label_values(&[STREAM]),
            dropped: metrics
                .streams
                .dropped
                .with_label_values(&[STREAM, strategy.as_str()]),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().expect("export queue lock")
    }

    /// Queues `item` per the strategy; with `block`, waits for room.
    async fn offer(&self, item: Outgoing) -> Offered {
        let mut item = Some(item);
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut queue = self.lock();
                if queue.closed {
                    return Offered::Closed;
                }
                if queue.items.len() >= self.capacity {
                    match self.strategy {
                        Backpressure::Block => {}
                        Backpressure::DropNew => {
                            self.dropped.inc();
                            return Offered::Dropped;
                        }
                        Backpressure::DropOldest => {
                            if let Some(oldest) = queue.items.pop_front() {
                                // Decided, not lost: its record is committed.
                                let _ = oldest.done.send(());
                                self.dropped.inc();
                                self.depth.dec();
                            }
                        }
                    }
                }
                if queue.items.len() < self.capacity {
                    queue.items.push_back(item.take().expect("offered once"));
                    self.depth.inc();
                    self.ready.notify_one();
                    return Offered::Queued;
                }
            }
            room.await;
        }
    }

    /// The next queued event; waits for one. Cancel-safe.
    async fn next(&self) -> Outgoing {
        loop {
            let ready = self.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if let Some(item) = self.lock().items.pop_front() {
                self.depth.dec();
                self.room.notify_waiters();
                return item;
            }
            ready.await;
        }
    }

    /// Refuses further events and forgets the queued ones: their handlers see
    /// their record abandoned, so it is not committed.
    fn close(&self) {
        let mut queue = self.lock();
        queue.closed = true;
        self.depth.sub(queue.items.len() as i64);
        queue.items.clear();
        self.room.notify_waiters();
    }
}

/// Keeps each partition's events in offset order on their way into the
/// queue: the consumer starts a partition's records in order, but their tasks
/// run concurrently, and a client reads a job's events in the order they
/// happened (a job's events share a key, hence a partition).
#[derive(Default)]
struct Line {
    partitions: Mutex<HashMap<i32, Waiting>>,
}

/// A partition's records in line: offset, and how to wake the record.
type Waiting = VecDeque<(i64, Arc<Notify>)>;

impl Line {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Waiting>> {
        self.partitions.lock().expect("export line lock")
    }

    fn join(&self, partition: i32, offset: i64) {
        let mut partitions = self.lock();
        let line = partitions.entry(partition).or_default();
        line.push_back((offset, Arc::new(Notify::new())));
    }
}

/// A record's place in its partition's line; leaving (on drop) lets the next
/// record go.
struct Place<'a> {
    line: &'a Line,
    partition: i32,
    offset: i64,
}

impl Place<'_> {
    /// Waits until every earlier record of the partition has left the line.
    async fn turn(&self) {
        loop {
            let wake = {
                let partitions = self.line.lock();
                let Some(line) = partitions.get(&self.partition) else {
                    return;
                };
                match line.iter().position(|(o, _)| *o == self.offset) {
                    Some(0) | None => return,
                    Some(i) => line[i].1.clone(),
                }
            };
            wake.notified().await;
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut partitions = self.line.lock();
        let Some(line) = partitions.get_mut(&self.partition) else {
            return;
        };
        if let Some(i) = line.iter().position(|(o, _)| *o == self.offset) {
            line.remove(i);
            if let (0, Some((_, next))) = (i, line.front()) {
                next.notify_one();
            }
        }
        if line.is_empty() {
            partitions.remove(&self.partition);
        }
    }
}

/// The record handler of a stream's consumer: an event is delivered when the
/// client acknowledged it.
struct Exporter {
    outbound: Arc<Outbound>,
    line: Line,
    filter: Filter,
    /// Set when the stream's own shutdown began: from then on a stopped
    /// record drains instead of giving up.
    draining: Arc<AtomicBool>,
}

impl RecordHandler for Exporter {
    fn starting(&self, record: &Record) {
        self.line.join(record.partition, record.offset);
    }

    async fn handle(&self, record: &Record, stop: &CancellationToken) -> Result<(), HandlerError> {
        let place = Place {
            line: &self.line,
            partition: record.partition,
            offset: record.offset,
        };
        let payload = record.payload.as_deref().unwrap_or_default();
        let event: ExtractionEvent = decode(payload)?;
        if !self.filter.admits(&event) {
            return Ok(());
        }
        let (done, received) = oneshot::channel();
        let item = Outgoing {
            partition: record.partition,
            offset: record.offset,
            event,
            done,
        };
        // Waiting for its turn or for room is given up when the partition is
        // revoked (another connection of the group takes it over; this
        // member forgot it), but not when the stream's own shutdown stopped
        // the consumer: then what is in flight drains. Once queued, the event
        // waits for the client: on a revoke, the drain lets it be
        // acknowledged; when the client is gone, closing the queue abandons it.
        let entered = async {
            place.turn().await;
            self.outbound.offer(item).await
        };
        let offered = tokio::select! {
            offered = entered => offered,
            _ = revoked(stop, &self.draining) => {
                return Err(HandlerError::Abandoned("partition revoked".into()));
            }
        };
        drop(place);
        let gone = || HandlerError::Abandoned("the export client is gone".into());
        match offered {
            Offered::Queued => received.await.map_err(|_| gone()),
            Offered::Dropped => Ok(()),
            Offered::Closed => Err(gone()),
        }
    }
}

/// Fires when `stop` does, unless the stream is draining.
async fn revoked(stop: &CancellationToken, draining: &AtomicBool) {
    stop.cancelled().await;
    if draining.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
}

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

async fn export(
    socket: WebSocket,
    services: Services,
    options: Options,
    closing: CancellationToken,
) {
    let (sink, frames) = socket.split();
    if let Some((stream, consuming)) = ExportStream::open(sink, &services, options).await {
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
    settings: Arc<Settings>,
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
    async fn open(
        sink: ws::Sink,
        services: &Services,
        options: Options,
    ) -> Option<(Self, Consuming)> {
        let settings = services.settings.clone();
        let metrics = services.metrics.clone();
        let outbound = Arc::new(Outbound::new(&settings, &metrics, options.strategy));
        let group = options.group.kafka(&settings.export_group_prefix);
        if let Err(e) = carry_legacy_group(services, &options.group).await {
            tracing::error!(%group, error = %e, "export stream: the old group's commits not carried over");
            let why = "group unavailable; retry shortly";
            return refuse_open(sink, &metrics, close_code::AGAIN, why).await;
        }
        let spec = consumer_spec(services, &group, &options);
        let draining = Arc::new(AtomicBool::new(false));
        let exporter = Exporter {
            outbound: outbound.clone(),
            line: Line::default(),
            filter: options.filter,
            draining: draining.clone(),
        };
        let consume = CancellationToken::new();
        let runtime = match services.consume_with(spec, exporter, consume.clone()) {
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
            send_timeout: settings.export_drain_timeout_s.get(),
            settings,
            metrics,
            group,
            auto_ack: options.auto_ack,
            outbound,
            draining,
            consume,
            unacked: BTreeMap::new(),
            caller: options.caller,
            auth: services.auth.clone(),
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
        let ack_timeout = self.settings.export_ack_timeout_s.get();
        let mut liveness = ws::Liveness::new(self.settings.ws_ping_interval_s.get());
        let mut consumer_done = false;
        let ended = loop {
            if self.errors >= self.settings.export_max_consecutive_errors {
                break Ended::Forced(format!("{} consecutive errors", self.errors));
            }
            let window_open =
                self.auto_ack || self.unacked.len() < self.settings.export_max_unacked;
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
async fn carry_legacy_group(services: &Services, group: &GroupName) -> Result<(), String> {
    let settings = &services.settings;
    let prefix = &settings.export_group_prefix;
    let (old, new) = (
        settings.group(&group.legacy(prefix)),
        settings.group(&group.kafka(prefix)),
    );
    let topic = settings.topic(&settings.topic_events);
    let brokers = settings.kafka_brokers.clone();
    let carry = {
        let (old, new) = (old.clone(), new.clone());
        move || groups::carry_over(&brokers, &topic, &old, &new, CARRY_TIMEOUT)
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
fn consumer_spec(services: &Services, group: &str, options: &Options) -> ConsumerSpec {
    let settings = &services.settings;
    let mut spec = services.consumer_spec(group, &settings.topic_events);
    // Every event in the queue or the unacknowledged window is a record in
    // flight. The drop strategies read on past a full queue (that is what
    // makes them drop), as many records ahead as a pipeline consumer would.
    spec.max_in_flight = settings.export_max_queue_size + settings.export_max_unacked;
    if options.strategy != Backpressure::Block {
        spec.max_in_flight += settings.consumer_max_in_flight;
    }
    spec.drain_timeout = settings.export_drain_timeout_s.get();
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

    fn params(query: &str) -> Params {
        let uri: axum::http::Uri = format!("/v1/export?{query}").parse().unwrap();
        Query::<Params>::try_from_uri(&uri).unwrap().0
    }

    fn caller(tenant: &str) -> Caller {
        crate::store::tenants::KeyOwner {
            tenant_id: Uuid::now_v7(),
            tenant: tenant.into(),
            key_id: Uuid::now_v7(),
            scopes: vec![Scope::Export],
            quota: Default::default(),
        }
        .into()
    }

    #[test]
    fn options_are_checked_before_the_upgrade() {
        let acme = caller("acme");
        let ok = options(
            params("group=audit&strategy=drop_new&ack=auto&status=succeeded,failed&from=earliest"),
            &acme,
            Backpressure::Block,
        )
        .unwrap();
        assert_eq!(ok.strategy, Backpressure::DropNew);
        assert!(ok.auto_ack && ok.from_earliest);
        assert_eq!(ok.group.kafka("x-"), "x-acme.audit", "the tenant's group");
        assert_eq!(ok.group.legacy("x-"), "x-acme-audit", "its name before");
        assert_eq!(ok.filter.tenant_id, acme.tenant_id);
        assert_eq!(ok.filter.statuses.unwrap().len(), 2);
        let default = options(params("group=a"), &acme, Backpressure::Block).unwrap();
        assert_eq!(default.strategy, Backpressure::Block);
        assert!(!default.auto_ack && !default.from_earliest);
        for bad in [
            "",
            "group=",
            "group=a%20b",
            "group=a&strategy=fifo",
            "group=a&ack=never",
            "group=a&from=yesterday",
        ] {
            assert!(
                options(params(bad), &acme, Backpressure::Block).is_err(),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn a_stream_admits_only_its_tenants_events() {
        let mut event = item(0).0.event;
        let (acme, other) = (Uuid::now_v7(), Uuid::now_v7());
        let filter = |tenant_id| Filter {
            tenant_id,
            statuses: None,
            transitions: None,
        };
        event.tenant_id = Some(acme.to_string());
        assert!(filter(acme).admits(&event));
        assert!(!filter(other).admits(&event));
        // Written before tenants: the tenant default's.
        event.tenant_id = None;
        assert!(!filter(acme).admits(&event));
        assert!(filter(crate::store::tenants::DEFAULT_TENANT_ID).admits(&event));
    }

    fn outbound(strategy: Backpressure, capacity: usize) -> Outbound {
        Outbound {
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
            room: Notify::new(),
            strategy,
            capacity,
            depth: IntGauge::new("depth", "test").unwrap(),
            dropped: IntCounter::new("dropped", "test").unwrap(),
        }
    }

    fn item(offset: i64) -> (Outgoing, oneshot::Receiver<()>) {
        let (done, received) = oneshot::channel();
        let event = ExtractionEvent {
            extraction_id: offset.to_string(),
            transition: "mark_running".into(),
            status: "running".into(),
            bbox_status: None,
            token: Some(1),
            error: None,
            reason: crate::events::PublishReason::Submit,
            published_at_ms: 0,
            tenant_id: None,
        };
        let outgoing = Outgoing {
            partition: 0,
            offset,
            event,
            done,
        };
        (outgoing, received)
    }

    #[tokio::test]
    async fn a_full_queue_drops_per_strategy_and_blocks_otherwise() {
        let drop_new = outbound(Backpressure::DropNew, 1);
        assert!(matches!(drop_new.offer(item(1).0).await, Offered::Queued));
        assert!(matches!(drop_new.offer(item(2).0).await, Offered::Dropped));
        assert_eq!((drop_new.dropped.get(), drop_new.depth.get()), (1, 1));
        assert_eq!(drop_new.next().await.offset, 1);

        let drop_oldest = outbound(Backpressure::DropOldest, 1);
        let (first, mut first_done) = item(1);
        assert!(matches!(drop_oldest.offer(first).await, Offered::Queued));
        assert!(matches!(
            drop_oldest.offer(item(2).0).await,
            Offered::Queued
        ));
        assert_eq!(
            first_done.try_recv(),
            Ok(()),
            "the evicted event counts as decided"
        );
        assert_eq!(drop_oldest.dropped.get(), 1);
        assert_eq!(drop_oldest.next().await.offset, 2);

        let block = Arc::new(outbound(Backpressure::Block, 1));
        assert!(matches!(block.offer(item(1).0).await, Offered::Queued));
        let waiting = tokio::spawn({
            let block = block.clone();
            async move { matches!(block.offer(item(2).0).await, Offered::Queued) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "block waits for room");
        assert_eq!(block.next().await.offset, 1);
        assert!(waiting.await.unwrap(), "room made, the event is queued");
        assert_eq!(block.dropped.get(), 0);
        block.close();
        assert!(matches!(block.offer(item(3).0).await, Offered::Closed));
    }

    #[test]
    fn acks_are_cumulative_and_never_beyond_what_was_sent() {
        assert_eq!(acknowledged(r#"{"ack": 7}"#, 10), Ok(7));
        assert!(acknowledged(r#"{"ack": 11}"#, 10).is_err());
        assert!(acknowledged(r#"{"ack": -1}"#, 10).is_err());
        assert!(acknowledged("ack", 10).is_err());
    }
}
