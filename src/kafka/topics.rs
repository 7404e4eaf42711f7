//! The topics docstream uses, each with its configured partition count: what
//! topic administration creates and what the durability check inspects.

use crate::config::Settings;

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// Full name, prefix included.
    pub name: String,
    /// Partition count.
    pub partitions: i32,
}

/// Every topic docstream uses, with its configured partition count.
pub fn topic_specs(settings: &Settings) -> Vec<TopicSpec> {
    let spec = |name: &str, partitions| TopicSpec {
        name: settings.topic(name),
        partitions,
    };
    vec![
        spec(&settings.topic_requests, settings.stream_topic_partitions),
        spec(&settings.topic_submitted, settings.job_topic_partitions),
        spec(
            &settings.topic_post_processing,
            settings.job_topic_partitions,
        ),
        spec(&settings.topic_events, settings.stream_topic_partitions),
        spec(&settings.topic_dlq, settings.dlq_topic_partitions),
    ]
}
