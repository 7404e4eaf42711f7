//! Kafka: topics made ready, read back (records, positions, headers),
//! committed offsets and watermarks, and the headers of intake records.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use docstream::config::KafkaClient;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::env::unique;
use super::process::wait_for;
use super::TestEnv;

impl TestEnv {
    /// The committed offsets of consumer group `group` (full name) on `topic`.
    pub fn committed(&self, group: &str, topic: &str) -> HashMap<i32, i64> {
        committed_offsets(&self.settings.kafka_brokers, group, &self.topic(topic))
    }

    /// Every record of `topic` written so far: (key, value).
    pub fn read_topic(&self, topic: &str) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
        read_topic(&self.settings.kafka_brokers, &self.topic(topic))
    }
}

/// Waits until every partition of `topic` has a leader that answers for it.
pub async fn wait_topic_ready(brokers: &str, topic: &str) {
    wait_topic_ready_on(&KafkaClient::plaintext(brokers), topic).await
}

/// [`wait_topic_ready`] through `kafka`'s connection (TLS, SASL).
pub async fn wait_topic_ready_on(kafka: &KafkaClient, topic: &str) {
    let consumer: BaseConsumer = kafka.config().create().expect("client");
    wait_for(
        &format!("topic {topic} to have leaders"),
        Duration::from_secs(60),
        || {
            let ready = (|| {
                let metadata = consumer
                    .fetch_metadata(Some(topic), Duration::from_secs(5))
                    .map_err(|e| e.to_string())?;
                let partitions = metadata.topics()[0].partitions();
                if partitions.is_empty() {
                    return Err("no partitions yet".to_owned());
                }
                for p in partitions {
                    consumer
                        .fetch_watermarks(topic, p.id(), Duration::from_secs(5))
                        .map_err(|e| format!("partition {}: {e}", p.id()))?;
                }
                Ok(())
            })();
            async move { ready }
        },
    )
    .await
}

/// The headers that submit a Kafka intake record as `tenant` with `api_key`.
pub fn intake_headers(tenant: &str, api_key: &str) -> rdkafka::message::OwnedHeaders {
    use rdkafka::message::{Header, OwnedHeaders};
    OwnedHeaders::new()
        .insert(Header {
            key: docstream::pipeline::TENANT_HEADER,
            value: Some(tenant),
        })
        .insert(Header {
            key: docstream::pipeline::API_KEY_HEADER,
            value: Some(api_key),
        })
}

/// A record read back: partition, offset, key, value.
pub type Positioned = (i32, i64, Option<Vec<u8>>, Vec<u8>);

/// Reads a topic from the beginning to its current end.
pub fn read_topic(brokers: &str, topic: &str) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    read_topic_positioned(brokers, topic)
        .into_iter()
        .map(|(_, _, key, value)| (key, value))
        .collect()
}

/// Reads a topic from the beginning to its current end, with positions.
pub fn read_topic_positioned(brokers: &str, topic: &str) -> Vec<Positioned> {
    read_topic_as(brokers, topic, |message| {
        (
            message.partition(),
            message.offset(),
            message.key().map(<[u8]>::to_vec),
            message.payload().unwrap_or_default().to_vec(),
        )
    })
}

/// Each record's key and `traceparent` header, from the beginning of `topic`
/// to its current end.
pub fn read_traceparents(brokers: &str, topic: &str) -> Vec<(Option<Vec<u8>>, Option<String>)> {
    use rdkafka::message::Headers;
    read_topic_as(brokers, topic, |message| {
        let traceparent = message.headers().and_then(|headers| {
            headers
                .iter()
                .find(|h| h.key == docstream::trace::TRACEPARENT)
                .and_then(|h| String::from_utf8(h.value?.to_vec()).ok())
        });
        (message.key().map(<[u8]>::to_vec), traceparent)
    })
}

/// Reads a topic from the beginning to its current end, each record as `map`
/// makes it.
pub fn read_topic_as<T>(
    brokers: &str,
    topic: &str,
    map: impl Fn(&rdkafka::message::BorrowedMessage<'_>) -> T,
) -> Vec<T> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.id())
        .collect();
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for &p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .expect("watermarks");
        if high > low {
            ends.insert(p, high);
            assignment
                .add_partition_offset(topic, p, Offset::Offset(low))
                .unwrap();
        }
    }
    let mut records = Vec::new();
    if ends.is_empty() {
        return records;
    }
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ends.is_empty() {
        assert!(
            Instant::now() < deadline,
            "reading {topic} timed out; {ends:?} left"
        );
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let message = message.expect("consume");
        let end = ends.get(&message.partition()).copied();
        if let Some(end) = end {
            records.push(map(&message));
            if message.offset() + 1 >= end {
                ends.remove(&message.partition());
            }
        }
    }
    records
}

/// The committed offsets of `group` on `topic`, by partition (absent when none).
pub fn committed_offsets(brokers: &str, group: &str, topic: &str) -> HashMap<i32, i64> {
    CommittedReader::new(brokers, group, topic)
        .read()
        .expect("committed offsets")
}

/// Reads the committed offsets of a group on a topic, again and again, with
/// one client.
pub struct CommittedReader {
    consumer: BaseConsumer,
    topic: String,
}

impl CommittedReader {
    pub fn new(brokers: &str, group: &str, topic: &str) -> Self {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("client");
        Self {
            consumer,
            topic: topic.to_owned(),
        }
    }

    /// The committed offsets by partition (absent when none), or the error
    /// that kept the broker from answering.
    pub fn read(&self) -> Result<HashMap<i32, i64>, rdkafka::error::KafkaError> {
        let topic = &self.topic;
        let metadata = self
            .consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let mut partitions = TopicPartitionList::new();
        for p in metadata.topics()[0].partitions() {
            partitions.add_partition(topic, p.id());
        }
        let committed = self
            .consumer
            .committed_offsets(partitions, Duration::from_secs(10))?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect())
    }
}

/// Sum of the high watermarks of every partition of `topic`: records ever written.
pub fn topic_size(brokers: &str, topic: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("client");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .unwrap()
                .1
        })
        .sum()
}
