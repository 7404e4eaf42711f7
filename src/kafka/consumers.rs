//! The consumers of one process. Every consumer a role starts (a stage's,
//! the intake's, an export stream's) is described by the settings the same
//! way and runs on the process's producer, metrics and health; this is the
//! handle that knows how, so that no role needs the whole settings for it.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::consumer::{ConsumerError, ConsumerRuntime, ConsumerSpec, RecordHandler};
use super::Publisher;
use crate::config::{KafkaClient, Settings};
use crate::domain::schedule::Weights;
use crate::health::Health;
use crate::metrics::Metrics;

/// Starts this process's consumers. A clone is one reference count.
#[derive(Clone)]
pub struct Consumers(Arc<Inner>);

struct Inner {
    /// Every consumer's spec but its group, topic and lanes.
    template: ConsumerSpec,
    /// The prefix of every topic and group name.
    prefix: String,
    /// The job stages' topics, whose records name their lanes.
    lane_topics: [String; 2],
    publisher: Publisher,
    metrics: Metrics,
    health: Health,
}

impl Consumers {
    /// Consumers as `settings` describe them, sharing their slots among
    /// tenants by `weights`.
    pub fn new(
        settings: &Settings,
        weights: Weights,
        publisher: Publisher,
        (metrics, health): (Metrics, Health),
    ) -> Self {
        let template = ConsumerSpec {
            kafka: settings.kafka(),
            group: String::new(),
            topic: String::new(),
            dlq_topic: settings.topic(&settings.topic_dlq),
            dlq_excerpt_bytes: settings.dlq_excerpt_bytes,
            max_in_flight: settings.consumer_max_in_flight,
            read_ahead: settings.consumer_read_ahead,
            pass_full_lanes: false,
            priority_max_wait: settings.worker_priority_max_wait_s.get(),
            weights,
            drain_timeout: settings.subscriber_drain_timeout_s.get(),
            rebalance_drain_timeout: settings.rebalance_drain_timeout_s.get(),
            session_timeout_ms: settings.kafka_session_timeout_ms,
            group_protocol: settings.kafka_group_protocol,
            prefetch_kbytes: settings.consumer_prefetch_kbytes,
            from_earliest: true,
            statistics_interval_ms: settings.kafka_statistics_interval_ms(),
        };
        let lane_topics = [
            settings.topic_submitted.clone(),
            settings.topic_post_processing.clone(),
        ];
        Self(Arc::new(Inner {
            template,
            prefix: settings.topic_prefix.clone(),
            lane_topics,
            publisher,
            metrics,
            health,
        }))
    }

    /// The consumer of `group` on `topic` (both named without the prefix).
    pub fn spec(&self, group: &str, topic: &str) -> ConsumerSpec {
        let inner = &self.0;
        ConsumerSpec {
            group: self.name(group),
            topic: self.name(topic),
            // The job stages' records name their lanes; the intake's and
            // the export streams' do not.
            pass_full_lanes: inner.lane_topics.iter().any(|t| t == topic),
            ..inner.template.clone()
        }
    }

    /// A topic's or group's full name: `name` with the prefix.
    pub fn name(&self, name: &str) -> String {
        format!("{}{name}", self.0.prefix)
    }

    /// The bootstrap servers.
    pub fn kafka(&self) -> &KafkaClient {
        &self.0.template.kafka
    }

    /// The largest number of records a consumer has in flight.
    pub fn max_in_flight(&self) -> usize {
        self.0.template.max_in_flight
    }

    /// A consumer per `spec` running `handler`, subscribed and ready to run
    /// until `shutdown`.
    pub fn start<H: RecordHandler>(
        &self,
        spec: ConsumerSpec,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<ConsumerRuntime<H>, ConsumerError> {
        let inner = &self.0;
        ConsumerRuntime::new(
            spec,
            Arc::new(handler),
            inner.publisher.clone(),
            inner.metrics.clone(),
            inner.health.clone(),
            shutdown,
        )
    }

    /// Runs `handler` on `topic` as a member of `group` until `shutdown`.
    pub async fn run<H: RecordHandler>(
        &self,
        group: &str,
        topic: &str,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<(), ConsumerError> {
        let spec = self.spec(group, topic);
        self.start(spec, handler, shutdown)?.run().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the job stages' records name their lanes, so only their
    /// consumers may pass over a full lane (`kafka::passing`): the intake's
    /// and the export streams' records would all fall in one lane.
    #[tokio::test]
    async fn the_stages_pass_over_full_lanes_and_the_others_do_not() {
        let settings = Settings {
            topic_prefix: "t.".into(),
            kafka_brokers: "127.0.0.1:1".into(),
            ..Settings::default()
        };
        let metrics = Metrics::new();
        let health = Health::new(metrics.clone());
        let limits = (settings.publisher_queue_size, settings.publisher_linger_ms);
        let second = std::time::Duration::from_secs(1);
        let (m, h) = (metrics.clone(), health.clone());
        let publisher = Publisher::new(
            &KafkaClient::plaintext("127.0.0.1:1"),
            second,
            limits,
            0,
            m,
            h,
        )
        .unwrap();
        let consumers = Consumers::new(&settings, Weights::default(), publisher, (metrics, health));
        let passes = |topic: &str| consumers.spec("g", topic).pass_full_lanes;
        assert!(passes(&settings.topic_submitted));
        assert!(passes(&settings.topic_post_processing));
        assert!(!passes(&settings.topic_requests));
        assert!(!passes(&settings.topic_events));
        let spec = consumers.spec("g", &settings.topic_submitted);
        assert_eq!(spec.group, "t.g");
        assert_eq!(spec.topic, format!("t.{}", settings.topic_submitted));
        assert_eq!(spec.dlq_topic, format!("t.{}", settings.topic_dlq));
    }
}
