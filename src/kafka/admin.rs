//! Topic administration: create docstream's topics with their partition counts
//! and a replication that fits the cluster.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::durability::{self, Replication};
use super::topics::{topic_specs, TopicSpec};
use crate::config::Settings;

/// What happened to one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicOutcome {
    /// Created now.
    Created,
    /// It was there already (left as it is).
    Existed,
}

/// Why topics could not be created.
#[derive(Debug, thiserror::Error)]
pub enum TopicsError {
    /// The broker refused or could not be reached.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The configured replication does not fit the cluster.
    #[error("{0}")]
    Replication(String),
}

/// Creates every topic that does not exist yet, with the replication that
/// fits the cluster ([`durability::replication_for`]); the replication used.
/// Idempotent: a topic that exists is left as it is.
pub async fn create_topics(
    settings: &Settings,
) -> Result<(Replication, Vec<(TopicSpec, TopicOutcome)>), TopicsError> {
    let admin: AdminClient<DefaultClientContext> = settings.kafka().config().create()?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, std::time::Duration::from_secs(30))?;
    let replication = durability::replication_for(metadata.brokers().len(), settings)
        .map_err(TopicsError::Replication)?;
    let min_insync = replication.min_insync.to_string();
    let specs = topic_specs(settings);
    let new_topics: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|s| {
            NewTopic::new(
                &s.name,
                s.partitions,
                TopicReplication::Fixed(replication.factor),
            )
            .set("min.insync.replicas", &min_insync)
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(std::time::Duration::from_secs(30)));
    let results = admin.create_topics(&new_topics, &options).await?;
    let mut outcomes = Vec::with_capacity(specs.len());
    for (spec, result) in specs.into_iter().zip(results) {
        let outcome = match result {
            Ok(_) => TopicOutcome::Created,
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => TopicOutcome::Existed,
            Err((_, code)) => return Err(KafkaError::AdminOp(code).into()),
        };
        outcomes.push((spec, outcome));
    }
    Ok((replication, outcomes))
}
