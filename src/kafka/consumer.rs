//! The consumer runtime every docstream consumer runs on.
//!
//! Guarantee: an offset is stored (and so committed) only when the record and
//! every record before it in its partition were delivered — the handler's row
//! transition is durable and every event it publishes was acknowledged. Records
//! of a partition are handled concurrently, up to `max_in_flight` per consumer;
//! [`OffsetTracker`] turns out-of-order completions into the contiguous prefix.
//!
//! A record that can never be processed (poison) is produced to the DLQ, and only
//! once the DLQ acknowledged it does it count as delivered, so one bad record never
//! stalls its partition. A record whose handling failed for a passing reason is
//! retried with backoff until it succeeds or the consumer stops; a record not
//! delivered when the consumer stops is not committed and will be redelivered.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::offsets::{OffsetTracker, Ticket};
use super::Publisher;
use crate::events::{now_ms, DeadLetter};
use crate::metrics::Metrics;

/// A received record, detached from the consumer.
#[derive(Debug, Clone)]
pub struct Record {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
    /// Record key.
    pub key: Option<Vec<u8>>,
    /// Record value.
    pub payload: Option<Vec<u8>>,
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
}

/// What a consumer does with each record. `Ok` means delivered: every durable
/// effect of the record happened and every event it publishes was acknowledged.
/// Handling must be idempotent: a record may be delivered again after a crash.
pub trait RecordHandler: Send + Sync + 'static {
    /// Handles one record.
    fn handle(&self, record: &Record) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// Where and how a consumer runs.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// Bootstrap servers.
    pub brokers: String,
    /// Consumer group.
    pub group: String,
    /// Topic to consume.
    pub topic: String,
    /// Topic poison records go to.
    pub dlq_topic: String,
    /// Most records in flight at once.
    pub max_in_flight: usize,
    /// How long a stop waits for in-flight records.
    pub drain_timeout: Duration,
    /// Consumer session timeout, ms.
    pub session_timeout_ms: u32,
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

/// Keeps the offset tracker in step with the group's assignment.
struct TrackingContext {
    tracker: Arc<Mutex<OffsetTracker>>,
}

impl ClientContext for TrackingContext {}

impl ConsumerContext for TrackingContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            let mut tracker = self.tracker.lock().expect("tracker lock");
            for p in partitions.elements() {
                tracker.revoke(&(p.topic().to_owned(), p.partition()));
            }
            tracing::info!(partitions = partitions.count(), "partitions revoked");
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            let mut tracker = self.tracker.lock().expect("tracker lock");
            for p in partitions.elements() {
                tracker.assign((p.topic().to_owned(), p.partition()));
            }
            tracing::info!(partitions = partitions.count(), "partitions assigned");
        }
    }
}

/// The consumer loop of one role.
pub struct ConsumerRuntime<H> {
    spec: ConsumerSpec,
    handler: Arc<H>,
    publisher: Publisher,
    metrics: Metrics,
    tracker: Arc<Mutex<OffsetTracker>>,
    consumer: StreamConsumer<TrackingContext>,
}

impl<H: RecordHandler> ConsumerRuntime<H> {
    /// Creates the consumer and subscribes it; nothing is received until [`run`](Self::run).
    pub fn new(
        spec: ConsumerSpec,
        handler: Arc<H>,
        publisher: Publisher,
        metrics: Metrics,
    ) -> Result<Self, ConsumerError> {
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        let context = TrackingContext {
            tracker: tracker.clone(),
        };
        let consumer: StreamConsumer<TrackingContext> = ClientConfig::new()
            .set("bootstrap.servers", &spec.brokers)
            .set("group.id", &spec.group)
            // Offsets are stored by us, after delivery; librdkafka commits what is stored.
            .set("enable.auto.offset.store", "false")
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", spec.session_timeout_ms.to_string())
            // Three heartbeats per session, as Kafka recommends; librdkafka's
            // default (3 s) would miss every short session.
            .set(
                "heartbeat.interval.ms",
                (spec.session_timeout_ms / 3).max(100).to_string(),
            )
            .set("partition.assignment.strategy", "cooperative-sticky")
            .create_with_context(context)?;
        consumer.subscribe(&[&spec.topic])?;
        Ok(Self {
            spec,
            handler,
            publisher,
            metrics,
            tracker,
            consumer,
        })
    }

    /// Consumes until `shutdown` fires, then drains in-flight records within the
    /// drain timeout and commits what was delivered.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ConsumerError> {
        let mut tasks: JoinSet<(Ticket, bool)> = JoinSet::new();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(joined) = tasks.join_next() => self.finish(joined)?,
                received = self.consumer.recv(), if tasks.len() < self.spec.max_in_flight => {
                    let record = received?;
                    let record = Record {
                        topic: record.topic().to_owned(),
                        partition: record.partition(),
                        offset: record.offset(),
                        key: record.key().map(<[u8]>::to_vec),
                        payload: record.payload().map(<[u8]>::to_vec),
                    };
                    self.start(&mut tasks, record, &shutdown);
                }
            }
        }
        self.drain(tasks).await
    }

    fn start(
        &self,
        tasks: &mut JoinSet<(Ticket, bool)>,
        record: Record,
        shutdown: &CancellationToken,
    ) {
        self.metrics
            .events_consumed
            .with_label_values(&[&record.topic])
            .inc();
        let partition = (record.topic.clone(), record.partition);
        let ticket = self
            .tracker
            .lock()
            .expect("tracker lock")
            .begin(partition, record.offset);
        self.in_flight_gauge(&ticket).inc();
        let delivery = Delivery {
            handler: self.handler.clone(),
            publisher: self.publisher.clone(),
            metrics: self.metrics.clone(),
            dlq_topic: self.spec.dlq_topic.clone(),
            shutdown: shutdown.clone(),
        };
        tasks.spawn(async move {
            let delivered = delivery.deliver(&record).await;
            (ticket, delivered)
        });
    }

    fn finish(
        &self,
        joined: Result<(Ticket, bool), tokio::task::JoinError>,
    ) -> Result<(), ConsumerError> {
        let (ticket, delivered) =
            joined.map_err(|e| ConsumerError::HandlerPanicked(e.to_string()))?;
        self.in_flight_gauge(&ticket).dec();
        if !delivered {
            return Ok(());
        }
        let point = self.tracker.lock().expect("tracker lock").finish(&ticket);
        if let Some(point) = point {
            let mut offsets = TopicPartitionList::new();
            let (topic, partition) = &ticket.partition;
            offsets.add_partition_offset(topic, *partition, Offset::Offset(point))?;
            // Fails harmlessly when the partition was revoked meanwhile.
            if let Err(e) = self.consumer.store_offsets(&offsets) {
                tracing::debug!(%topic, partition, error = %e, "offset not stored");
            }
        }
        Ok(())
    }

    async fn drain(&self, mut tasks: JoinSet<(Ticket, bool)>) -> Result<(), ConsumerError> {
        let pending = tasks.len();
        tracing::info!(pending, "draining in-flight records");
        let drained = tokio::time::timeout(self.spec.drain_timeout, async {
            while let Some(joined) = tasks.join_next().await {
                self.finish(joined)?;
            }
            Ok::<_, ConsumerError>(())
        })
        .await;
        let abandoned = tasks.len();
        tasks.abort_all();
        self.commit_delivered();
        match drained {
            Ok(result) => result,
            Err(_) => Err(ConsumerError::DrainTimedOut { abandoned }),
        }
    }

    /// Commits the delivered prefix of every owned partition, synchronously.
    fn commit_delivered(&self) {
        let points = self.tracker.lock().expect("tracker lock").commit_points();
        if points.is_empty() {
            return;
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), point) in points {
            let _ = offsets.add_partition_offset(&topic, partition, Offset::Offset(point));
        }
        match self.consumer.commit(&offsets, CommitMode::Sync) {
            Ok(()) => tracing::info!(partitions = offsets.count(), "committed delivered offsets"),
            Err(e) => {
                tracing::warn!(error = %e, "final commit failed; records will be redelivered")
            }
        }
    }

    fn in_flight_gauge(&self, ticket: &Ticket) -> prometheus::IntGauge {
        let (topic, partition) = &ticket.partition;
        self.metrics
            .in_flight
            .with_label_values(&[topic.as_str(), &partition.to_string()])
    }
}

/// Everything one record's task needs.
struct Delivery<H> {
    handler: Arc<H>,
    publisher: Publisher,
    metrics: Metrics,
    dlq_topic: String,
    shutdown: CancellationToken,
}

/// First and largest pause between two attempts at a failing record.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

impl<H: RecordHandler> Delivery<H> {
    /// Handles `record` until it is delivered (true) or the consumer stops (false).
    async fn deliver(&self, record: &Record) -> bool {
        let mut backoff = RETRY_BACKOFF.0;
        loop {
            let outcome = match self.handler.handle(record).await {
                Ok(()) => return true,
                Err(HandlerError::Poison { kind, reason }) => {
                    self.count_error(record, kind);
                    self.dead_letter(record, kind, &reason).await
                }
                Err(HandlerError::Transient(reason)) => Err(reason),
            };
            match outcome {
                Ok(()) => return true,
                Err(reason) => {
                    self.count_error(record, "transient");
                    tracing::warn!(topic = %record.topic, partition = record.partition,
                        offset = record.offset, %reason, ?backoff, "record failed; retrying");
                }
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return false,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RETRY_BACKOFF.1);
        }
    }

    async fn dead_letter(&self, record: &Record, kind: &str, reason: &str) -> Result<(), String> {
        tracing::warn!(topic = %record.topic, partition = record.partition,
            offset = record.offset, kind, reason, "poison record sent to the DLQ");
        let letter = DeadLetter {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            key: record.key.clone(),
            payload: record.payload.clone(),
            error_kind: kind.to_owned(),
            error: reason.to_owned(),
            published_at_ms: now_ms(),
        };
        let key = record.key.clone().unwrap_or_default();
        self.publisher
            .publish(&self.dlq_topic, &key, &letter)
            .await
            .map_err(|e| e.to_string())
    }

    fn count_error(&self, record: &Record, kind: &str) {
        self.metrics
            .handler_errors
            .with_label_values(&[record.topic.as_str(), kind])
            .inc();
    }
}
