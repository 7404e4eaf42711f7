//! Reading a topic the way an operator does: every record from its oldest
//! retained one to where it ends now, or the one record at a place. No
//! consumer group is joined and no offset is committed, so reading moves
//! nothing for the consumers of the topic. A record read may be produced
//! again ([`produce_copy`]): a dead letter's replay.

use std::time::{Duration, Instant};

use crate::config::KafkaClient;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

/// The group the reader names (it joins none and commits nothing, but a
/// consumer names one, and an authorizer checks it): with the topic prefix,
/// so one prefixed ACL covers every group docstream uses.
pub const READER_GROUP: &str = "docstream-operator-reader";

/// How long a read waits for the broker before it gives up.
const PATIENCE: Duration = Duration::from_secs(30);

/// A reader of the topics of the brokers at `brokers`.
pub struct TopicReader {
    consumer: BaseConsumer,
}

/// Why a read did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The broker refused or failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The broker did not deliver what it holds in time.
    #[error("the broker did not deliver {0} within {PATIENCE:?}")]
    TimedOut(String),
}

impl TopicReader {
    /// A reader through `kafka` naming `group` (see [`READER_GROUP`]; it
    /// joins no group and commits nothing).
    pub fn new(kafka: &KafkaClient, group: &str) -> Result<Self, KafkaError> {
        let consumer = kafka
            .config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .create()?;
        Ok(Self { consumer })
    }

    /// Every record of `topic` retained now, partition by partition, each
    /// in offset order.
    pub fn read_all(&self, topic: &str) -> Result<Vec<OwnedMessage>, ReadError> {
        let metadata = self.consumer.fetch_metadata(Some(topic), PATIENCE)?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        let mut records = Vec::new();
        for partition in partitions {
            let (low, high) = self.consumer.fetch_watermarks(topic, partition, PATIENCE)?;
            if low < high {
                records.extend(self.read_range(topic, partition, low, high)?);
            }
        }
        Ok(records)
    }

    /// The record at `offset` of `topic`'s `partition`, if it is still
    /// retained.
    pub fn read_one(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<Option<OwnedMessage>, ReadError> {
        let (low, high) = self.consumer.fetch_watermarks(topic, partition, PATIENCE)?;
        if offset < low || offset >= high {
            return Ok(None);
        }
        let records = self.read_range(topic, partition, offset, offset + 1)?;
        Ok(records.into_iter().find(|r| r.offset() == offset))
    }

    /// The records of `partition` from `from` up to (not including) `to`.
    fn read_range(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
    ) -> Result<Vec<OwnedMessage>, ReadError> {
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, partition, Offset::Offset(from))?;
        self.consumer.assign(&assignment)?;
        let deadline = Instant::now() + PATIENCE;
        let mut records = Vec::new();
        let mut next = from;
        while next < to {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let place = format!("{topic}/{partition} offsets {next} to {to}");
                return Err(ReadError::TimedOut(place));
            }
            match self.consumer.poll(left.min(Duration::from_millis(500))) {
                Some(Ok(message)) if message.partition() == partition => {
                    // Offsets may skip (compaction, transaction markers).
                    next = message.offset() + 1;
                    if message.offset() < to {
                        records.push(message.detach());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => {}
            }
        }
        Ok(records)
    }
}

/// Produces a copy of `original` (its key and headers) with `value` to
/// `topic` on `brokers`; where it went. A producer of its own, idempotent:
/// replays are rare, and this keeps them out of the pipeline's producers.
pub async fn produce_copy(
    kafka: &KafkaClient,
    topic: &str,
    original: &OwnedMessage,
    value: &[u8],
) -> Result<(i32, i64), KafkaError> {
    let config = super::durability::producer_config(kafka);
    super::durability::check_producer(&config)?;
    let producer: FutureProducer = config.create()?;
    let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(value);
    if let Some(key) = original.key() {
        record = record.key(key);
    }
    if let Some(headers) = original.headers() {
        record = record.headers(headers.clone());
    }
    let delivered = producer.send(record, PATIENCE).await;
    let delivery = delivered.map_err(|(e, _)| e)?;
    Ok((delivery.partition, delivery.offset))
}
