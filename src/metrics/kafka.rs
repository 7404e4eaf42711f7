//! librdkafka's statistics (`statistics.interval.ms`) as metrics: each
//! consumer's lag and committed offset per assigned partition, and the
//! producer's queue and requests in flight.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rdkafka::Statistics;

use super::Metrics;

/// Turns one client's statistics into series. A consumer's series are those
/// of the partitions it holds now: a partition it lost (to a rebalance) is
/// removed at its next report, so the group's lag is never counted twice.
#[derive(Clone)]
pub struct KafkaStats {
    metrics: Metrics,
    /// The consumer's group and whether it starts from the earliest offset;
    /// `None` for a producer.
    group: Option<(String, bool)>,
    /// The (topic, partition) series this client set at its last report.
    reported: Arc<Mutex<HashSet<(String, String)>>>,
}

impl KafkaStats {
    /// The statistics of a consumer in `group`, which starts from the
    /// earliest offset when it has none committed, if `from_earliest`.
    pub fn consumer(metrics: Metrics, group: &str, from_earliest: bool) -> Self {
        Self {
            metrics,
            group: Some((group.to_owned(), from_earliest)),
            reported: Arc::default(),
        }
    }

    /// The statistics of the producer.
    pub fn producer(metrics: Metrics) -> Self {
        Self {
            metrics,
            group: None,
            reported: Arc::default(),
        }
    }

    /// Records one report.
    pub fn report(&self, statistics: &Statistics) {
        match &self.group {
            Some((group, from_earliest)) => self.report_consumer(group, *from_earliest, statistics),
            None => self.report_producer(statistics),
        }
    }

    fn report_producer(&self, statistics: &Statistics) {
        let metrics = &self.metrics;
        metrics
            .producer
            .queue_records
            .set(i64::try_from(statistics.msg_cnt).unwrap_or(i64::MAX));
        let waiting: i64 = statistics.brokers.values().map(|b| b.waitresp_cnt).sum();
        metrics.producer.in_flight_requests.set(waiting);
    }

    fn report_consumer(&self, group: &str, from_earliest: bool, statistics: &Statistics) {
        let metrics = &self.metrics;
        let mut now = HashSet::new();
        for (topic, stats) in &statistics.topics {
            // Partition -1 is librdkafka's internal "unassigned" queue; a
            // partition whose fetch state is `none` is not this consumer's.
            let held = stats
                .partitions
                .values()
                .filter(|p| p.partition >= 0 && p.fetch_state != "none");
            for p in held {
                let offsets = (p.committed_offset, p.lo_offset, p.hi_offset);
                let Some(lag) = lag(p.consumer_lag, offsets, from_earliest) else {
                    continue;
                };
                let partition = p.partition.to_string();
                let labels = [group, topic.as_str(), partition.as_str()];
                metrics.offsets.lag.with_label_values(&labels).set(lag);
                if p.committed_offset >= 0 {
                    metrics
                        .offsets
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
            let _ = metrics.offsets.lag.remove_label_values(&labels);
            let _ = metrics.offsets.committed.remove_label_values(&labels);
        }
        *reported = now;
    }
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
