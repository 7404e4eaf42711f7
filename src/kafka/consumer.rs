//! The consumer runtime every docstream consumer runs on.
//!
//! Guarantee: an offset is stored (and so committed) only when the record and
//! every record before it in its partition were delivered — the handler's row
//! transition is durable and every event it publishes was acknowledged. Records
//! of a partition are handled concurrently, up to `max_in_flight` per consumer;
//! the [`Ledger`] turns arrivals, passes over full lanes and out-of-order
//! completions into the commit point, in the one order that keeps the point
//! behind every record not delivered.
//!
//! - **Backpressure.** At the in-flight bound the consumer pauses its partitions
//!   and resumes them once in-flight work falls to half the bound; librdkafka's
//!   prefetch is capped, so memory stays bounded under any backlog.
//! - **Rebalance.** When partitions are revoked, their records are told to stop
//!   waiting, their in-flight work drains within the rebalance budget (below
//!   the session timeout), the delivered prefix is committed synchronously, and
//!   only then does the rebalance go on. Work that misses the budget is not
//!   committed (it is redelivered to the next owner) and is counted. Assigned
//!   partitions start with fresh bookkeeping.
//! - **Shutdown.** Pause everything, drain within the drain timeout, commit the
//!   delivered prefix. A drain that times out commits nothing undelivered and
//!   is reported as forced.
//! - **Outages.** A broker that goes away is not an error to exit on:
//!   librdkafka reconnects, the consumer keeps polling, and the outage is
//!   reported to [`Health`] (logged once). Records in flight keep waiting or
//!   retrying; none is committed before it was delivered. Only a fatal error
//!   (authentication, authorisation) ends the loop.
//! - **Poison.** A record that can never be processed is produced to the DLQ,
//!   and only once the DLQ acknowledged it does it count as delivered, so one bad
//!   record never stalls its partition. A record whose handling failed for a
//!   passing reason is retried with backoff until it succeeds or its partition
//!   is stopped.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::context::{is_fatal, report_error, report_log};
use super::lane::take_lane;
use super::ledger::{Arrived, Ledger};
use super::offsets::{Ticket, TopicPartition};
use super::passing::Arrival;
use super::publisher::Publisher;
use super::record::Record;
use crate::config::{GroupProtocol, KafkaClient};
use crate::domain::schedule::{Scheduler, Weights};
use crate::domain::{Lane, Priority};
use crate::events::{CodecError, DeadLetter, Source};
use crate::health::Health;
use crate::metrics::{KafkaStats, Metrics};

/// A received record's headers, copied.
fn headers_of(record: &impl Message) -> Vec<(String, Vec<u8>)> {
    let Some(headers) = record.headers() else {
        return Vec::new();
    };
    headers
        .iter()
        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
        .collect()
}

/// How handling a record failed.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The record can never be processed; it goes to the DLQ.
    #[error("poison record ({kind}): {reason}")]
    Poison {
        /// Short class, e.g. `undecodable`, `missing_row`.
        kind: &'static str,
        /// Human-readable reason.
        reason: String,
    },
    /// A dependency failed; handling is retried.
    #[error("transient failure: {0}")]
    Transient(String),
    /// The record's destination is gone (an export stream's client left): it is
    /// not delivered, not retried here, and not committed, so the next member
    /// of the group gets it again.
    #[error("abandoned: {0}")]
    Abandoned(String),
}

impl HandlerError {
    /// What an operator's log says of this error. Of a poison, its kind
    /// and not its reason: a reason may quote the record's document (a
    /// value that did not parse, a field it names), and logs travel
    /// further than the letter, which keeps the reason (found by the
    /// record's topic, partition and offset).
    pub fn for_log(&self) -> String {
        match self {
            Self::Poison { kind, .. } => format!("poison record ({kind})"),
            other => other.to_string(),
        }
    }
}

/// A record that does not decode is poison: the same bytes never will.
impl From<CodecError> for HandlerError {
    fn from(e: CodecError) -> Self {
        Self::Poison {
            kind: e.kind(),
            reason: e.to_string(),
        }
    }
}

/// What a consumer does with each record. `Ok` means delivered: every durable
/// effect of the record happened and every event it publishes was acknowledged.
/// Handling must be idempotent: a record may be delivered again after a crash.
/// `stop` fires when the record's partition is revoked or the consumer stops: a
/// handler that is merely waiting should give up then; work in progress should
/// finish, since the drain waits for it.
pub trait RecordHandler: Send + Sync + 'static {
    /// Handles one record.
    fn handle(
        &self,
        record: &Record,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Called by the consumer loop just before `record`'s task starts, so in
    /// offset order within a partition, whereas the tasks then run
    /// concurrently. A handler whose effects must keep the partition's order
    /// (an export stream) takes the record's place in line here. Does nothing
    /// by default.
    fn starting(&self, _record: &Record) {}
}

/// Where and how a consumer runs.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// Bootstrap servers.
    pub kafka: KafkaClient,
    /// Consumer group.
    pub group: String,
    /// Topic to consume.
    pub topic: String,
    /// Topic poison records go to.
    pub dlq_topic: String,
    /// Most bytes of a poison record's value its dead letter keeps.
    pub dlq_excerpt_bytes: usize,
    /// Most records in flight at once.
    pub max_in_flight: usize,
    /// Records of a partition received ahead and waiting before it is paused
    /// (or, with `pass_full_lanes`, before it passes over its full lanes).
    pub read_ahead: usize,
    /// Whether a partition whose read-ahead is full passes over the records
    /// of its full lanes to reach the others' (`kafka::passing`): the job
    /// stages', whose records name their lanes.
    pub pass_full_lanes: bool,
    /// The longest a waiting record is passed over by more urgent ones.
    pub priority_max_wait: Duration,
    /// Tenants' shares of the slots when several have records waiting.
    pub weights: Weights,
    /// How long a stop waits for in-flight records.
    pub drain_timeout: Duration,
    /// How long a revoke waits for the revoked partitions' in-flight records.
    pub rebalance_drain_timeout: Duration,
    /// Consumer session timeout, ms (classic protocol only).
    pub session_timeout_ms: u32,
    /// Classic or consumer (KIP-848).
    pub group_protocol: GroupProtocol,
    /// librdkafka prefetch cap, KiB.
    pub prefetch_kbytes: u32,
    /// Where a group with no committed offset starts: the earliest record
    /// (every pipeline role: a new group must see every job) or the latest.
    pub from_earliest: bool,
    /// How often librdkafka reports its statistics (lag, committed offsets),
    /// in ms; 0: never.
    pub statistics_interval_ms: u64,
}

/// Why a consumer stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// Kafka failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// A handler panicked: a bug; the process should exit and be restarted.
    #[error("a record handler panicked: {0}")]
    HandlerPanicked(String),
    /// The drain on stop ran out of time; those records were not committed.
    #[error("drain timed out with {abandoned} records in flight (not committed)")]
    DrainTimedOut {
        /// Records abandoned.
        abandoned: usize,
    },
}

/// A received record waiting for a free slot, with its partition's
/// assignment generation at receipt (its ticket is made when it starts: a
/// worker may hold thousands of records, and each ticket holds its topic's
/// name).
struct Buffered {
    record: Record,
    generation: u64,
    lane: Lane,
}

/// Received records waiting for a slot, in the order [`Scheduler`] gives,
/// and the partitions paused because too many of theirs wait.
struct Buffer {
    scheduler: Scheduler<Buffered>,
    paused: BTreeSet<i32>,
}

/// Bookkeeping shared by the run loop, the record tasks and the rebalance
/// callbacks (which librdkafka runs inside the run loop's poll).
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a record finishes, so a revoke can wait for its drain.
    finished: Condvar,
    metrics: Metrics,
    topic: String,
    rebalance_drain_timeout: Duration,
    shutdown: CancellationToken,
}

struct State {
    /// Arrivals, passes, deliveries and commit points of every partition
    /// (`kafka::ledger`: the one place they meet).
    ledger: Ledger,
    /// Fired when a partition is revoked: its records stop waiting or retrying.
    stops: HashMap<TopicPartition, CancellationToken>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("consumer state lock")
    }

    fn on_assign(&self, partitions: &TopicPartitionList) {
        let mut state = self.lock();
        for p in partitions.elements() {
            let tp = (p.topic().to_owned(), p.partition());
            state.ledger.assign(tp.clone());
            state.stops.insert(tp, self.shutdown.child_token());
        }
        tracing::info!(partitions = partitions.count(), "partitions assigned");
    }

    /// Stops the revoked partitions, drains their in-flight records within the
    /// budget, commits their delivered prefix, and forgets them.
    fn on_revoke<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        partitions: &TopicPartitionList,
    ) {
        let revoked: Vec<TopicPartition> = partitions
            .elements()
            .iter()
            .map(|p| (p.topic().to_owned(), p.partition()))
            .collect();
        let started = Instant::now();
        let deadline = started + self.rebalance_drain_timeout;
        let abandoned = blocking(|| {
            self.drain(consumer, &revoked, deadline, |state| {
                for tp in &revoked {
                    state.ledger.revoke(tp);
                    state.stops.remove(tp);
                }
            })
        });
        let outcome = if abandoned == 0 {
            "drained"
        } else {
            "timed_out"
        };
        self.metrics
            .drains
            .rebalance_drains
            .with_label_values(&[outcome])
            .inc();
        if abandoned > 0 {
            self.metrics
                .drains
                .records_abandoned
                .with_label_values(&["revoke"])
                .inc_by(abandoned as u64);
        }
        tracing::info!(
            partitions = revoked.len(),
            abandoned,
            drain_ms = started.elapsed().as_millis() as u64,
            "partitions revoked: drained and committed"
        );
    }

    /// The one drain, of a revoke and of a shutdown alike: `partitions`'
    /// records are told to stop (their stop tokens; a shutdown has
    /// cancelled them all already), waited for until none runs or
    /// `deadline`, and their delivered prefix is committed. Then, under the
    /// same lock as the commit, `then` updates the bookkeeping (a revoke
    /// forgets the partitions), so no record finishing meanwhile stores an
    /// offset in between. How many were still running: those are not
    /// committed, and are delivered again (to the partition's next owner,
    /// or after a restart). Blocks: call it where blocking is allowed.
    fn drain<C: ConsumerContext>(
        &self,
        consumer: &impl Consumer<C>,
        partitions: &[TopicPartition],
        deadline: Instant,
        then: impl FnOnce(&mut State),
    ) -> usize {
        {
            let state = self.lock();
            for stop in partitions.iter().filter_map(|tp| state.stops.get(tp)) {
                stop.cancel();
            }
        }
        let abandoned = self.wait_drained(partitions, deadline);
        let mut state = self.lock();
        let points: Vec<(TopicPartition, i64)> = (partitions.iter())
            .filter_map(|tp| {
                state
                    .ledger
                    .commit_point(tp)
                    .map(|point| (tp.clone(), point))
            })
            .collect();
        commit(consumer, &points);
        then(&mut state);
        abandoned
    }

    /// Waits until none of `partitions` has a record running, or `deadline`;
    /// returns how many were still running.
    fn wait_drained(&self, partitions: &[TopicPartition], deadline: Instant) -> usize {
        let mut state = self.lock();
        loop {
            let running: usize = partitions.iter().map(|tp| state.ledger.running(tp)).sum();
            let now = Instant::now();
            if running == 0 || now >= deadline {
                return running;
            }
            state = self
                .finished
                .wait_timeout(state, deadline - now)
                .expect("consumer state lock")
                .0;
        }
    }

    /// Records a finished record and stores the partition's new commit point,
    /// if it moved. The store happens under the lock: two records finishing
    /// at once must not store their points out of order, or the later,
    /// lower one would be what librdkafka commits (on close, after the
    /// runtime's own commit), and delivered records would come again.
    fn finish(&self, ticket: &Ticket, delivered: bool, consumer: &Consumed) {
        {
            let mut state = self.lock();
            if let Some(point) = state.ledger.finish(ticket, delivered) {
                store_offset(consumer, &ticket.partition, point);
            }
        }
        self.finished.notify_all();
    }

    /// A record of `lane` arrived while `waiting` of its partition's records
    /// wait: what became of it (`Ledger::arrive`), storing the partition's
    /// commit point if that moved it, under the lock as [`Shared::finish`]
    /// does.
    fn arrive(&self, record: &Record, lane: Lane, waiting: usize, consumer: &Consumed) -> Arrived {
        let mut state = self.lock();
        let arrived = (state.ledger).arrive(record.partition, record.offset, lane, waiting);
        if let Some(point) = arrived.point {
            store_offset(consumer, &(self.topic.clone(), record.partition), point);
        }
        arrived
    }

    /// Starts a received record: its ticket and stop token, or `None` when
    /// its partition was reassigned since it was received.
    fn start(&self, record: &Record, generation: u64) -> Option<(Ticket, CancellationToken)> {
        let ticket = Ticket {
            partition: (record.topic.clone(), record.partition),
            generation,
            offset: record.offset,
        };
        let mut state = self.lock();
        if !state.ledger.start(&ticket) {
            return None;
        }
        let stop = state
            .stops
            .entry(ticket.partition.clone())
            .or_insert_with(|| self.shutdown.child_token())
            .child_token();
        Some((ticket, stop))
    }

    /// Every partition this consumer owns now.
    fn owned(&self) -> Vec<TopicPartition> {
        self.lock().stops.keys().cloned().collect()
    }
}

/// Runs `wait` where blocking is allowed: librdkafka calls the rebalance
/// callback inside the run loop's poll, on a runtime thread, while the records
/// being drained run on the others.
fn blocking<T>(wait: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(wait)
    } else {
        wait()
    }
}

/// Commits `points` synchronously; a failure only means redelivery.
fn commit<C: ConsumerContext>(consumer: &impl Consumer<C>, points: &[(TopicPartition, i64)]) {
    if points.is_empty() {
        return;
    }
    let mut offsets = TopicPartitionList::new();
    for ((topic, partition), point) in points {
        let _ = offsets.add_partition_offset(topic, *partition, Offset::Offset(*point));
    }
    if let Err(e) = consumer.commit(&offsets, CommitMode::Sync) {
        tracing::warn!(error = %e, "commit failed; those records will be redelivered");
    }
}

/// Keeps the shared bookkeeping in step with the group's assignment, and
/// reports the client's trouble to `health`.
struct RuntimeContext {
    shared: Arc<Shared>,
    health: Health,
    stats: KafkaStats,
}

impl ClientContext for RuntimeContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        report_log(&self.health, level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        report_error(&self.health, error, reason);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        self.stats.report(&statistics);
    }
}

impl ConsumerContext for RuntimeContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            self.shared.on_revoke(consumer, partitions);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            self.shared.on_assign(partitions);
            // Fresh state: a partition assigned again must not stay paused.
            if let Err(e) = consumer.resume(partitions) {
                tracing::debug!(error = %e, "resume of assigned partitions failed");
            }
        }
    }
}

type Consumed = StreamConsumer<RuntimeContext>;

/// A started record, until its task ends: however it ends (delivered, given
/// up, panicked, or aborted at a forced shutdown), the record finishes in
/// the ledger, so a drain never waits for a task that is gone, and its
/// in-flight gauge comes down.
struct Running {
    shared: Arc<Shared>,
    consumer: Arc<Consumed>,
    ticket: Ticket,
    gauge: prometheus::IntGauge,
    delivered: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        (self.shared).finish(&self.ticket, self.delivered, &self.consumer);
        self.gauge.dec();
    }
}

/// The consumer loop of one role.
pub struct ConsumerRuntime<H> {
    spec: ConsumerSpec,
    handler: Arc<H>,
    publisher: Publisher,
    metrics: Metrics,
    shared: Arc<Shared>,
    consumer: Arc<Consumed>,
    health: Health,
}

impl<H: RecordHandler> ConsumerRuntime<H> {
    /// Creates the consumer and subscribes it; nothing is received until [`run`](Self::run).
    pub fn new(
        spec: ConsumerSpec,
        handler: Arc<H>,
        publisher: Publisher,
        metrics: Metrics,
        health: Health,
        shutdown: CancellationToken,
    ) -> Result<Self, ConsumerError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ledger: Ledger::new(&spec.topic, queue_bound(&spec), spec.pass_full_lanes),
                stops: HashMap::new(),
            }),
            finished: Condvar::new(),
            metrics: metrics.clone(),
            topic: spec.topic.clone(),
            rebalance_drain_timeout: spec.rebalance_drain_timeout,
            shutdown,
        });
        let context = RuntimeContext {
            shared: shared.clone(),
            health: health.clone(),
            stats: KafkaStats::consumer(metrics.offsets.clone(), &spec.group, spec.from_earliest),
        };
        let consumer: Consumed = client_config(&spec).create_with_context(context)?;
        consumer.subscribe(&[&spec.topic])?;
        Ok(Self {
            spec,
            handler,
            publisher,
            metrics,
            shared,
            consumer: Arc::new(consumer),
            health,
        })
    }

    /// Consumes until the shutdown token fires, then drains in-flight records
    /// within the drain timeout and commits what was delivered.
    pub async fn run(self) -> Result<(), ConsumerError> {
        let shutdown = self.shared.shutdown.clone();
        let mut tasks: JoinSet<()> = JoinSet::new();
        let mut buffer = Buffer {
            scheduler: Scheduler::new(self.spec.priority_max_wait, self.spec.weights.clone()),
            paused: BTreeSet::new(),
        };
        let waiting = self.waiting_gauges();
        loop {
            while tasks.len() < self.spec.max_in_flight {
                let Some((next, partition)) = buffer.scheduler.pop(Instant::now()) else {
                    break;
                };
                self.shared.lock().ledger.left(partition, next.lane);
                self.read_on_below_low_watermark(&mut buffer, partition);
                match self.shared.start(&next.record, next.generation) {
                    Some((ticket, stop)) => self.start(&mut tasks, next.record, ticket, stop),
                    None => tracing::debug!(
                        partition,
                        offset = next.record.offset,
                        "buffered record dropped: its partition was reassigned"
                    ),
                }
            }
            // A seek back that failed is tried again here.
            // Paused partitions and seeks back are looked at after every
            // event, not only when one of their records starts: a partition
            // paused with nothing of its own waiting has none to start.
            let mut due = self.shared.lock().ledger.rewinding();
            due.extend(buffer.paused.iter().copied());
            for partition in due {
                self.read_on_below_low_watermark(&mut buffer, partition);
            }
            for (gauge, priority) in waiting.iter().zip(Priority::ALL) {
                gauge.set(buffer.scheduler.waiting_of(priority) as i64);
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(joined) = tasks.join_next() => {
                    joined.map_err(|e| ConsumerError::HandlerPanicked(e.to_string()))?;
                }
                received = self.consumer.recv() => {
                    let record = match received {
                        Ok(record) => record,
                        Err(e) if is_fatal(&e) => return Err(e.into()),
                        // The broker is away or slow: librdkafka reconnects
                        // while this loop keeps polling.
                        Err(e) => {
                            self.health.failed(crate::health::Dependency::Kafka, &e);
                            continue;
                        }
                    };
                    let record = Record {
                        topic: record.topic().to_owned(),
                        partition: record.partition(),
                        offset: record.offset(),
                        key: record.key().map(<[u8]>::to_vec),
                        payload: record.payload().map(<[u8]>::to_vec),
                        headers: headers_of(&record),
                    };
                    self.metrics.consumer.events_consumed.with_label_values(&[&record.topic]).inc();
                    let mut record = record;
                    let lane = take_lane(&mut record);
                    self.arrived(&mut buffer, record, lane);
                }
            }
        }
        self.stop(tasks).await
    }

    fn start(
        &self,
        tasks: &mut JoinSet<()>,
        record: Record,
        ticket: Ticket,
        stop: CancellationToken,
    ) {
        self.handler.starting(&record);
        let gauge = self.in_flight_gauge(&ticket);
        gauge.inc();
        let delivery = Delivery {
            handler: self.handler.clone(),
            publisher: self.publisher.clone(),
            metrics: self.metrics.clone(),
            health: self.health.clone(),
            dlq_topic: self.spec.dlq_topic.clone(),
            dlq_excerpt_bytes: self.spec.dlq_excerpt_bytes,
        };
        let running = Running {
            shared: self.shared.clone(),
            consumer: self.consumer.clone(),
            ticket,
            gauge,
            delivered: false,
        };
        tasks.spawn(async move {
            // The whole guard moves into the task, to be dropped when it ends.
            let mut running = running;
            running.delivered = delivery.deliver(&record, &stop).await;
        });
    }

    /// A record arrived: received and waiting for a slot, passed over (its
    /// lane fills the partition's read-ahead: `kafka::passing`), or left (it was
    /// received before the last seek back).
    fn arrived(&self, buffer: &mut Buffer, record: Record, lane: Lane) {
        let partition = record.partition;
        let waiting = buffer.scheduler.waiting(partition);
        let arrived = self.shared.arrive(&record, lane, waiting, &self.consumer);
        match arrived.arrival {
            Arrival::Again => {}
            Arrival::Pass => {
                let offset = record.offset;
                tracing::trace!(partition, offset, waiting, "passing over a full lane");
                let passed = &self.metrics.consumer.passed_over;
                passed.with_label_values(&[&self.spec.topic]).inc();
            }
            Arrival::Take => {
                let generation = arrived.generation;
                let buffered = Buffered {
                    record,
                    generation,
                    lane,
                };
                let now = Instant::now();
                buffer.scheduler.push(buffered, partition, lane, now);
            }
        }
        self.pause_at_bound(buffer, partition);
    }

    /// Pauses a partition once `read_ahead` of its records wait (at least
    /// twice the in-flight bound, so work stays ready while a resumed
    /// partition refetches; twice that when it passes over full lanes), or
    /// it passed over as far as it may (`Passing::must_pause`). Pausing
    /// per partition keeps one deep backlog from starving the others.
    fn pause_at_bound(&self, buffer: &mut Buffer, partition: i32) {
        // Passing over, a partition takes the other lanes' records up to
        // twice the bound.
        let bound = match self.spec.pass_full_lanes {
            true => self.queue_bound() * 2,
            false => self.queue_bound(),
        };
        let full = buffer.scheduler.waiting(partition) >= bound
            || self.shared.lock().ledger.must_pause(partition);
        if !full || buffer.paused.contains(&partition) {
            return;
        }
        let mut one = TopicPartitionList::new();
        one.add_partition(&self.spec.topic, partition);
        match self.consumer.pause(&one) {
            Ok(()) => {
                buffer.paused.insert(partition);
                tracing::debug!(partition, "paused");
                self.metrics
                    .consumer
                    .pauses
                    .with_label_values(&[&self.spec.topic])
                    .inc();
                self.paused_gauge().set(buffer.paused.len() as i64);
            }
            Err(e) => tracing::warn!(partition, error = %e, "pause failed"),
        }
    }

    /// Once a partition's waiting records fell to half the bound: seeks it
    /// back to the first record it passed over, if it did, and resumes it
    /// if it was paused.
    fn read_on_below_low_watermark(&self, buffer: &mut Buffer, partition: i32) {
        let waiting = buffer.scheduler.waiting(partition);
        let rewind = self.shared.lock().ledger.rewind_due(partition, waiting);
        if let Some(offset) = rewind {
            // Asynchronous (no timeout): librdkafka drops what it fetched
            // past the offset. A seek that fails is tried again after the
            // next event; until it succeeds, the hold keeps the commit point
            // where it is.
            let seek = (self.consumer).seek(
                &self.spec.topic,
                partition,
                Offset::Offset(offset),
                Duration::ZERO,
            );
            match seek {
                Ok(()) => {
                    tracing::debug!(
                        partition,
                        offset,
                        waiting,
                        "sought back to the first record passed over"
                    );
                    self.shared.lock().ledger.sought(partition, offset)
                }
                Err(e) => tracing::warn!(partition, offset, error = %e, "seek back failed"),
            }
        }
        if !buffer.paused.contains(&partition)
            || waiting > self.queue_bound() / 2
            || self.shared.lock().ledger.must_pause(partition)
        {
            return;
        }
        let mut one = TopicPartitionList::new();
        one.add_partition(&self.spec.topic, partition);
        // A partition revoked meanwhile cannot be resumed; it starts fresh anyway.
        if let Err(e) = self.consumer.resume(&one) {
            tracing::debug!(partition, error = %e, "resume failed");
        }
        buffer.paused.remove(&partition);
        tracing::debug!(partition, waiting, "resumed");
        self.paused_gauge().set(buffer.paused.len() as i64);
    }

    fn queue_bound(&self) -> usize {
        queue_bound(&self.spec)
    }

    /// Shutdown: pause, then the drain a revoke makes ([`Shared::drain`]),
    /// of every partition, within the drain timeout.
    async fn stop(self, mut tasks: JoinSet<()>) -> Result<(), ConsumerError> {
        if let Ok(assignment) = self.consumer.assignment() {
            let _ = self.consumer.pause(&assignment);
        }
        let pending = tasks.len();
        let started = Instant::now();
        tracing::info!(pending, "shutdown: draining in-flight records");
        let deadline = started + self.spec.drain_timeout;
        let (shared, consumer) = (self.shared.clone(), self.consumer.clone());
        let drained = tokio::task::spawn_blocking(move || {
            shared.drain(consumer.as_ref(), &shared.owned(), deadline, |_| {})
        });
        let abandoned = drained
            .await
            .map_err(|e| ConsumerError::HandlerPanicked(e.to_string()))?;
        // What still runs is not committed; a record that panicked finished
        // (undelivered) as it unwound, and is reported here.
        tasks.abort_all();
        let mut panicked = None;
        while let Some(joined) = tasks.join_next().await {
            if let Err(e) = joined.map_err(|e| (e.is_panic(), e.to_string())) {
                if e.0 {
                    panicked.get_or_insert(ConsumerError::HandlerPanicked(e.1));
                }
            }
        }
        let drain_ms = started.elapsed().as_millis() as u64;
        let shutdowns = &self.metrics.drains.shutdowns;
        if abandoned == 0 {
            shutdowns.with_label_values(&["graceful"]).inc();
            tracing::info!(
                pending,
                drain_ms,
                "shutdown: graceful; delivered offsets committed"
            );
            return panicked.map_or(Ok(()), Err);
        }
        shutdowns.with_label_values(&["forced"]).inc();
        self.metrics
            .drains
            .records_abandoned
            .with_label_values(&["shutdown"])
            .inc_by(abandoned as u64);
        tracing::error!(
            abandoned,
            drain_ms,
            "shutdown: forced; undelivered records not committed"
        );
        Err(ConsumerError::DrainTimedOut { abandoned })
    }

    fn in_flight_gauge(&self, ticket: &Ticket) -> prometheus::IntGauge {
        let (topic, partition) = &ticket.partition;
        self.metrics
            .consumer
            .in_flight
            .with_label_values(&[topic.as_str(), &partition.to_string()])
    }

    fn waiting_gauges(&self) -> [prometheus::IntGauge; 3] {
        Priority::ALL.map(|p| {
            self.metrics
                .consumer
                .waiting
                .with_label_values(&[self.shared.topic.as_str(), p.as_str()])
        })
    }

    fn paused_gauge(&self) -> prometheus::IntGauge {
        self.metrics
            .consumer
            .paused_partitions
            .with_label_values(&[&self.shared.topic])
    }
}

/// Records of a partition that may wait for a slot before it pauses (or
/// passes over full lanes): the read-ahead, at least twice the in-flight
/// bound.
fn queue_bound(spec: &ConsumerSpec) -> usize {
    spec.read_ahead.max(spec.max_in_flight * 2)
}

fn client_config(spec: &ConsumerSpec) -> ClientConfig {
    let mut config = spec.kafka.config();
    config
        .set("group.id", &spec.group)
        // Offsets are stored by us, after delivery; librdkafka commits what is stored.
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set(
            "auto.offset.reset",
            if spec.from_earliest {
                "earliest"
            } else {
                "latest"
            },
        )
        .set(
            "queued.max.messages.kbytes",
            spec.prefetch_kbytes.to_string(),
        )
        // Fetch requests are small; Nagle would hold one back behind the last.
        .set("socket.nagle.disable", "true")
        .set("group.protocol", spec.group_protocol.as_str())
        .set(
            "statistics.interval.ms",
            spec.statistics_interval_ms.to_string(),
        );
    if spec.group_protocol == GroupProtocol::Classic {
        // Under KIP-848 the broker owns assignment and session timing.
        config
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", spec.session_timeout_ms.to_string())
            // Three heartbeats per session, as Kafka recommends.
            .set(
                "heartbeat.interval.ms",
                (spec.session_timeout_ms / 3).max(100).to_string(),
            );
    }
    config
}

/// Stores `point` as the next offset to commit; harmless when the partition was
/// revoked meanwhile (the store fails and the new owner redelivers).
fn store_offset(consumer: &Consumed, (topic, partition): &TopicPartition, point: i64) {
    let mut offsets = TopicPartitionList::new();
    if offsets
        .add_partition_offset(topic, *partition, Offset::Offset(point))
        .is_err()
    {
        return;
    }
    if let Err(e) = consumer.store_offsets(&offsets) {
        tracing::debug!(%topic, partition, error = %e, "offset not stored");
    }
}

/// Everything one record's task needs.
struct Delivery<H> {
    handler: Arc<H>,
    publisher: Publisher,
    metrics: Metrics,
    health: Health,
    dlq_topic: String,
    dlq_excerpt_bytes: usize,
}

/// First and largest pause between two attempts at a failing record.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

impl<H: RecordHandler> Delivery<H> {
    /// Handles `record` until it is delivered (true) or `stop` fires while it is
    /// failing (false).
    async fn deliver(&self, record: &Record, stop: &CancellationToken) -> bool {
        let mut backoff = RETRY_BACKOFF.0;
        loop {
            let outcome = match self.handler.handle(record, stop).await {
                Ok(()) => return true,
                Err(poison @ HandlerError::Poison { .. }) => {
                    self.dead_letter(record, &poison).await
                }
                Err(HandlerError::Transient(reason)) => Err(reason),
                Err(HandlerError::Abandoned(reason)) => {
                    tracing::debug!(topic = %record.topic, partition = record.partition,
                        offset = record.offset, %reason, "record abandoned; not committed");
                    return false;
                }
            };
            match outcome {
                Ok(()) => return true,
                Err(reason) => {
                    self.count_error(record, "transient");
                    // During an outage every record in flight fails alike;
                    // the outage itself was logged once.
                    if self.health.ready().is_ok() {
                        tracing::warn!(topic = %record.topic, partition = record.partition,
                            offset = record.offset, %reason, ?backoff, "record failed; retrying");
                    } else {
                        tracing::debug!(topic = %record.topic, partition = record.partition,
                            offset = record.offset, %reason, ?backoff, "record failed during an outage; retrying");
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RETRY_BACKOFF.1);
        }
    }

    /// Produces `poison`'s letter for `record`; an error that is not poison
    /// is a passing failure, retried with the record.
    async fn dead_letter(&self, record: &Record, poison: &HandlerError) -> Result<(), String> {
        let HandlerError::Poison { kind, reason } = poison else {
            return Err(poison.to_string());
        };
        let (kind, reason) = (*kind, reason.as_str());
        self.count_error(record, kind);
        tracing::warn!(topic = %record.topic, partition = record.partition,
            offset = record.offset, error = %poison.for_log(), "poison record sent to the DLQ");
        let source = Source {
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            key: record.key.as_deref(),
            payload: record.payload.as_deref(),
        };
        let letter = DeadLetter::new(source, kind, reason, self.dlq_excerpt_bytes);
        let key = letter.key.clone().unwrap_or_default();
        // A letter is bounded, so a failure here is the broker's (an outage):
        // counted, and retried with the record like any passing failure.
        if let Err(e) = self.publisher.publish(&self.dlq_topic, &key, &letter).await {
            self.metrics.consumer.dead_letter_failures.inc();
            return Err(format!("dead letter not produced: {e}"));
        }
        self.metrics
            .consumer
            .dead_letters
            .with_label_values(&[kind])
            .inc();
        Ok(())
    }

    fn count_error(&self, record: &Record, kind: &str) {
        self.metrics
            .consumer
            .handler_errors
            .with_label_values(&[record.topic.as_str(), kind])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poison's reason may quote the record's document (a value that
    /// did not parse); the log says its kind, and the letter keeps the rest.
    #[test]
    fn a_poisons_log_says_its_kind_and_not_the_document_it_quotes() {
        let poison = HandlerError::Poison {
            kind: "invalid_request",
            reason: "request_json: invalid type: string \"4111 1111 1111 1111\", expected u32"
                .into(),
        };
        let logged = poison.for_log();
        assert!(logged.contains("invalid_request"), "{logged}");
        assert!(!logged.contains("4111"), "{logged}");
    }
}
