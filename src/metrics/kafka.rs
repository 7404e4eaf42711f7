//! librdkafka's statistics (`statistics.interval.ms`) as metrics: each
//! consumer's lag and committed offset per assigned partition, and the
//! producer's queue and requests in flight.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rdkafka::Statistics;

use super::areas::{OffsetMetrics, ProducerMetrics};

/// Turns one client's statistics into series. A consumer's series are those
/// of the partitions it holds now: a partition it lost (to a rebalance) is
/// removed at its next report, so the group's lag is never counted twice.
#[derive(Clone)]
pub struct KafkaStats {
    client: Client,
    /// The (topic, partition) series this client set at its last report.
    reported: Arc<Mutex<HashSet<(String, String)>>>,
}

impl KafkaStats {
    /// The statistics of a consumer in `group`, which starts from the
    /// earliest offset when it has none committed, if `from_earliest`.
    pub fn consumer(offsets: OffsetMetrics, group: &str, from_earliest: bool) -> Self {
        let group = group.to_owned();
        Self {
            client: Client::Consumer(offsets, group, from_earliest),
            reported: Arc::default(),
        }
    }

    /// The statistics of the producer.
    pub fn producer(producer: ProducerMetrics) -> Self {
        Self {
            client: Client::Producer(producer),
            reported: Arc::default(),
        }
    }

    /// Records one report.
    pub fn report(&self, statistics: &Statistics) {
        match &self.client {
            Client::Consumer(offsets, group, from_earliest) => {
                self.report_consumer(offsets, (group, *from_earliest), statistics)
            }
            Client::Producer(producer) => report_producer(producer, statistics),
        }
    }

    fn report_consumer(
        &self,
        offsets: &OffsetMetrics,
        (group, from_earliest): (&str, bool),
        statistics: &Statistics,
    ) {
        let mut now = HashSet::new();
        for (topic, stats) in &statistics.topics {
            // Partition -1 is librdkafka's internal "unassigned" queue; a
            // partition whose fetch state is `none` is not this consumer's.
            let held = stats
                .partitions
                .values()
                .filter(|p| p.partition >= 0 && p.fetch_state != "none");
            for p in held {
                let positions = (p.committed_offset, p.lo_offset, p.hi_offset);
                let Some(lag) = lag(p.consumer_lag, positions, from_earliest) else {
                    continue;
                };
                let partition = p.partition.to_string();
                let labels = [group, topic.as_str(), partition.as_str()];
                offsets.lag.with_label_values(&labels).set(lag);
                if p.committed_offset >= 0 {
                    offsets
                        .committed
                        .with_label_values(&labels)
                        .set(p.committed_offset);
                }
                now.insert((topic.clone(), partition));
            }
        }
        let mut reported = self.reported.lock().expect("stats lock");
        for (topic, partition) in reported.difference(&now) {
            let labels = [group, topic.as_str(), partition.as_str()];
            let _ = offsets.lag.remove_label_values(&labels);
            let _ = offsets.committed.remove_label_values(&labels);
        }
        *reported = now;
    }
}

/// Whose statistics: a consumer's (its group's positions, the group, and
/// whether it starts from the earliest offset), or the producer's.
#[derive(Clone)]
enum Client {
    Consumer(OffsetMetrics, String, bool),
    Producer(ProducerMetrics),
}

/// The producer's queue and its requests in flight.
fn report_producer(producer: &ProducerMetrics, statistics: &Statistics) {
    (producer.queue_records).set(i64::try_from(statistics.msg_cnt).unwrap_or(i64::MAX));
    let waiting: i64 = statistics.brokers.values().map(|b| b.waitresp_cnt).sum();
    producer.in_flight_requests.set(waiting);
}

/// A partition's lag: librdkafka's (high watermark less the committed
/// offset) once both are known. Before the group's first commit on it, a
/// group that starts from the earliest offset has the whole retained log
/// behind it, and one that starts from the latest has nothing. `None` while
/// the watermark is not known yet.
fn lag(
    consumer_lag: i64,
    (committed, low, high): (i64, i64, i64),
    from_earliest: bool,
) -> Option<i64> {
    if consumer_lag >= 0 {
        Some(consumer_lag)
    } else if high >= 0 && committed < 0 {
        Some(if from_earliest { high - low.max(0) } else { 0 })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_librdkafkas_once_committed_and_the_whole_log_before() {
        assert_eq!(lag(7, (93, 0, 100), true), Some(7));
        assert_eq!(lag(-1, (-1001, 10, 100), true), Some(90));
        assert_eq!(lag(-1, (-1001, 10, 100), false), Some(0));
        assert_eq!(lag(-1, (-1001, -1, -1), true), None);
    }
}
