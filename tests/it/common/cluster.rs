//! The three-node Kafka cluster that `scripts/services.sh up --kafka-nodes 3`
//! runs: where it listens, and which node leads what. A node's broker id is
//! its number (1-3), as `scripts/services.sh kill kafka-node N` takes it.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::metadata::Metadata;
use rdkafka::ClientConfig;

/// The offsets topic of the group coordinators, and its partition count
/// (`offsets.topic.num.partitions` of the cluster's nodes).
const OFFSETS_TOPIC: &str = "__consumer_offsets";
const OFFSETS_PARTITIONS: i32 = 10;

/// The cluster's bootstrap servers (`DOCSTREAM_TEST_KAFKA_CLUSTER`, which
/// `scripts/services.sh env` prints).
pub fn brokers() -> String {
    std::env::var("DOCSTREAM_TEST_KAFKA_CLUSTER")
        .unwrap_or_else(|_| "127.0.0.1:59101,127.0.0.1:59102,127.0.0.1:59103".into())
}

/// The cluster's metadata of `topic` (every topic: `None`).
async fn metadata(topic: Option<&str>) -> Result<Metadata, String> {
    let topic = topic.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .create()
            .map_err(|e| e.to_string())?;
        consumer
            .fetch_metadata(topic.as_deref(), Duration::from_secs(5))
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap()
}

/// How many partitions of `topics` each node leads.
pub async fn leaders_of(topics: &[String]) -> Result<BTreeMap<i32, usize>, String> {
    let mut led = BTreeMap::new();
    for topic in topics {
        for partition in metadata(Some(topic)).await?.topics()[0].partitions() {
            *led.entry(partition.leader()).or_default() += 1;
        }
    }
    Ok(led)
}

/// The node leading the most partitions of `topics`.
pub async fn busiest_leader(topics: &[String]) -> i32 {
    let led = leaders_of(topics).await.expect("the cluster's leaders");
    let (node, _) = led
        .into_iter()
        .filter(|(node, _)| *node > 0)
        .max_by_key(|(_, count)| *count)
        .expect("a leader");
    node
}

/// The node coordinating `group`: the leader of the offsets topic's partition
/// the group's id hashes to (Java's `String.hashCode`, as the broker does).
pub async fn coordinator_of(group: &str) -> Result<i32, String> {
    let hash = group
        .encode_utf16()
        .fold(0_i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    let partition = (hash & 0x7fff_ffff) % OFFSETS_PARTITIONS;
    let metadata = metadata(Some(OFFSETS_TOPIC)).await?;
    let leader = metadata.topics()[0]
        .partitions()
        .iter()
        .find(|p| p.id() == partition)
        .map(|p| p.leader())
        .ok_or_else(|| format!("{OFFSETS_TOPIC} has no partition {partition}"))?;
    if leader > 0 {
        Ok(leader)
    } else {
        Err(format!("{OFFSETS_TOPIC}-{partition} has no leader"))
    }
}

/// The active controller: the KRaft quorum's leader, as
/// `kafka-metadata-quorum describe --status` reports it.
pub async fn active_controller() -> Result<i32, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services.sh");
    let output = tokio::process::Command::new("bash")
        .arg(script)
        .args([
            "kafka-tool",
            "org.apache.kafka.tools.MetadataQuorumCommand",
            "--bootstrap-server",
            &brokers(),
            "describe",
            "--status",
        ])
        .output()
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|line| line.strip_prefix("LeaderId:"))
        .and_then(|id| id.trim().parse().ok())
        .filter(|id: &i32| *id > 0)
        .ok_or_else(|| format!("no LeaderId in: {text}"))
}

/// `Ok` once every partition of `topics` is led by a node other than `gone`.
pub async fn led_without(topics: &[String], gone: i32) -> Result<(), String> {
    let led = leaders_of(topics).await?;
    match led.keys().find(|node| **node == gone || **node <= 0) {
        None => Ok(()),
        Some(node) => Err(format!("leaders by node: {led:?} (node {node})")),
    }
}

/// `Ok` once every partition of `topics` and of the offsets topic has every
/// replica in sync.
pub async fn fully_in_sync(topics: &[String]) -> Result<(), String> {
    let offsets = [OFFSETS_TOPIC.to_owned()];
    for topic in topics.iter().chain(&offsets) {
        for partition in metadata(Some(topic)).await?.topics()[0].partitions() {
            if partition.isr().len() < partition.replicas().len() || partition.leader() <= 0 {
                return Err(format!(
                    "{topic}-{}: leader {}, in sync {:?} of {:?}",
                    partition.id(),
                    partition.leader(),
                    partition.isr(),
                    partition.replicas()
                ));
            }
        }
    }
    Ok(())
}
