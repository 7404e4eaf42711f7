//! Consumer groups renamed: a group's committed offsets carried over to the
//! new name, so a consumer that comes back under it resumes where the old
//! one stopped instead of at `auto.offset.reset`.
//!
//! The copy is made by a consumer that never joins either group: it reads
//! the old group's commits and commits them for the new one (an offset
//! commit outside a generation, which a broker takes for a group with no
//! members). It runs only while the new group has committed nothing, so it
//! is done at most once, and a group already in use is never touched.
//!
//! The same outside view reads a group's lag ([`lag`]) for the census.

use std::time::Duration;

use crate::config::KafkaClient;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

/// What a carry-over did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    /// The new group had commits of its own: nothing was copied.
    AlreadyCommitted,
    /// The old group had no commits: nothing to copy.
    NothingToCarry,
    /// This many partitions' offsets were copied.
    Partitions(usize),
}

/// Copies the offsets `old` committed on `topic` to `new`, unless `new` has
/// commits of its own. Blocking (up to a few `timeout`s): call it off the
/// async runtime.
pub fn carry_over(
    kafka: &KafkaClient,
    topic: &str,
    old: &str,
    new: &str,
    timeout: Duration,
) -> Result<Carried, KafkaError> {
    let to = outside_member(kafka, new)?;
    let partitions = partitions(&to, topic, timeout)?;
    if !committed(&to, &partitions, timeout)?.is_empty() {
        return Ok(Carried::AlreadyCommitted);
    }
    let from = outside_member(kafka, old)?;
    let offsets = committed(&from, &partitions, timeout)?;
    if offsets.is_empty() {
        return Ok(Carried::NothingToCarry);
    }
    let mut carried = TopicPartitionList::new();
    for (partition, offset) in &offsets {
        carried.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
    }
    to.commit(&carried, CommitMode::Sync)?;
    Ok(Carried::Partitions(offsets.len()))
}

/// A client of `group` that commits and reads commits but never joins it.
fn outside_member(kafka: &KafkaClient, group: &str) -> Result<BaseConsumer, KafkaError> {
    kafka
        .config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
}

/// Every partition of `topic`, each at no particular offset.
fn partitions(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<TopicPartitionList, KafkaError> {
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let mut list = TopicPartitionList::new();
    for found in metadata.topics().iter().filter(|t| t.name() == topic) {
        for partition in found.partitions() {
            list.add_partition(topic, partition.id());
        }
    }
    Ok(list)
}

/// The offsets the consumer's group committed on `partitions`, for the
/// partitions it committed on.
fn committed(
    consumer: &BaseConsumer,
    partitions: &TopicPartitionList,
    timeout: Duration,
) -> Result<Vec<(i32, i64)>, KafkaError> {
    let committed = consumer.committed_offsets(partitions.clone(), timeout)?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) => Some((e.partition(), offset)),
            _ => None,
        })
        .collect())
}

/// How far `group` is behind on `topic`: over its partitions, the records
/// past the group's committed offset (past the oldest retained record where
/// it committed nothing). Read from outside the group, like
/// [`carry_over`]; blocking, so call it off the async runtime.
pub fn lag(
    kafka: &KafkaClient,
    group: &str,
    topic: &str,
    timeout: Duration,
) -> Result<i64, KafkaError> {
    let consumer = outside_member(kafka, group)?;
    let partitions = partitions(&consumer, topic, timeout)?;
    let committed = committed(&consumer, &partitions, timeout)?;
    let mut lag = 0;
    for element in partitions.elements() {
        let partition = element.partition();
        let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
        let from = committed
            .iter()
            .find(|(p, _)| *p == partition)
            .map_or(low, |(_, offset)| (*offset).max(low));
        lag += (high - from).max(0);
    }
    Ok(lag)
}
