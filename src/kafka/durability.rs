//! What keeps an acknowledged record through the loss of a broker: the
//! producer's settings, and the topics' replication factor and
//! `min.insync.replicas`.
//!
//! A record is acknowledged (and a submit answered 202) only once every
//! in-sync replica has it (`acks=all`), and a partition refuses writes while
//! fewer than `min.insync.replicas` replicas are in sync. With three replicas
//! and a minimum of two, an acknowledged record is on at least two brokers,
//! so losing any one of them loses nothing, and the partition keeps taking
//! writes. Idempotence keeps a retried send from writing a record twice or out
//! of order when the leader moves.
//!
//! Topics are created with a replication factor that fits the cluster (three
//! when it has three brokers or more, one on a single node) unless one is
//! configured. Every process surveys the cluster once the broker answers and
//! logs what it found, with a warning for each setting that can lose an
//! acknowledged record or stop writes.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use tokio_util::sync::CancellationToken;

use crate::config::{KafkaClient, Settings};

/// The producer settings without which an acknowledged record can be lost
/// (`acks`) or written twice by a retry (`enable.idempotence`).
pub const PRODUCER_SETTINGS: [(&str, &str); 2] = [("enable.idempotence", "true"), ("acks", "all")];

/// A producer's configuration for `kafka` with [`PRODUCER_SETTINGS`].
pub fn producer_config(kafka: &KafkaClient) -> ClientConfig {
    let mut config = kafka.config();
    for (key, value) in PRODUCER_SETTINGS {
        config.set(key, value);
    }
    config
}

/// An error naming each of [`PRODUCER_SETTINGS`] that `config` lacks or
/// overrides: a producer without them must not start.
pub fn check_producer(config: &ClientConfig) -> Result<(), KafkaError> {
    let wrong: Vec<String> = PRODUCER_SETTINGS
        .iter()
        .filter(|(key, want)| {
            let have = config.get(key);
            // librdkafka takes -1 for all.
            !(have == Some(*want) || (*key == "acks" && have == Some("-1")))
        })
        .map(|(key, want)| {
            format!(
                "{key}={} (needs {want})",
                config.get(key).unwrap_or("unset")
            )
        })
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    Err(KafkaError::ClientCreation(format!(
        "a producer that can lose or repeat acknowledged records: {}",
        wrong.join(", ")
    )))
}

/// The replication of docstream's topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replication {
    /// Copies of each partition.
    pub factor: i32,
    /// `min.insync.replicas`: copies a write needs before it is acknowledged.
    pub min_insync: i32,
}

/// The replication for new topics on a cluster of `brokers`: the configured
/// factor, or 3 (fewer on a smaller cluster); the configured minimum, or a
/// majority of the replicas (1 for one or two). An error when the cluster is
/// too small for the factor, or the minimum exceeds it (no write would ever be
/// acknowledged).
pub fn replication_for(brokers: usize, settings: &Settings) -> Result<Replication, String> {
    let brokers = i32::try_from(brokers).unwrap_or(i32::MAX);
    let factor = match settings.topic_replication_factor {
        0 => brokers.clamp(1, 3),
        configured => configured,
    };
    if factor > brokers {
        return Err(format!(
            "replication factor {factor} needs {factor} brokers; the cluster has {brokers} (DOCSTREAM_TOPIC_REPLICATION_FACTOR)"
        ));
    }
    let min_insync = match settings.topic_min_insync_replicas {
        0 => default_min_insync(factor),
        configured => configured,
    };
    if min_insync > factor {
        return Err(format!(
            "min.insync.replicas {min_insync} is more than the replication factor {factor}: no write would be acknowledged (DOCSTREAM_TOPIC_MIN_INSYNC_REPLICAS)"
        ));
    }
    Ok(Replication { factor, min_insync })
}

/// A majority of `factor` replicas, or 1 for one or two: with two, a minimum
/// of two would stop every write while either broker is away.
fn default_min_insync(factor: i32) -> i32 {
    if factor <= 2 {
        1
    } else {
        factor / 2 + 1
    }
}

/// What the survey found of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDurability {
    /// Full name.
    pub name: String,
    /// The fewest replicas of any of its partitions.
    pub factor: i32,
    /// Its `min.insync.replicas`.
    pub min_insync: i32,
}

/// The cluster as the survey saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Survey {
    /// Brokers in the cluster's metadata.
    pub brokers: usize,
    /// docstream's topics that exist.
    pub topics: Vec<TopicDurability>,
}

impl Survey {
    /// Each setting that can lose an acknowledged record, or stop writes.
    pub fn weaknesses(&self) -> Vec<String> {
        let mut found = Vec::new();
        for topic in &self.topics {
            let TopicDurability {
                name,
                factor,
                min_insync,
            } = topic;
            if *factor == 1 && self.brokers >= 3 {
                found.push(format!(
                    "{name}: one replica on a cluster of {} brokers; losing its broker loses acknowledged records",
                    self.brokers
                ));
            } else if *factor >= 3 && *min_insync < 2 {
                found.push(format!(
                    "{name}: min.insync.replicas {min_insync} with {factor} replicas; a record acknowledged by its leader alone is lost if that leader is"
                ));
            }
            if *min_insync > *factor {
                found.push(format!(
                    "{name}: min.insync.replicas {min_insync} is more than its {factor} replicas; every write is refused"
                ));
            }
        }
        found
    }

    /// One line: the brokers, and each topic's factor and minimum.
    pub fn summary(&self) -> String {
        let topics: Vec<String> = self
            .topics
            .iter()
            .map(|t| format!("{} {}/{}", t.name, t.factor, t.min_insync))
            .collect();
        format!(
            "{} brokers; topics (replicas/min.insync.replicas): {}",
            self.brokers,
            topics.join(", ")
        )
    }
}

/// Reads the cluster's brokers and the replication of docstream's topics
/// (those that exist).
pub async fn survey(settings: &Settings) -> Result<Survey, KafkaError> {
    let admin: AdminClient<DefaultClientContext> = settings.kafka().config().create()?;
    let timeout = Duration::from_secs(10);
    let metadata = admin.inner().fetch_metadata(None, timeout)?;
    let wanted: Vec<String> = super::topics::topic_specs(settings)
        .into_iter()
        .map(|spec| spec.name)
        .collect();
    let mut factors: HashMap<String, i32> = HashMap::new();
    for topic in metadata.topics() {
        if !wanted.iter().any(|name| name == topic.name()) {
            continue;
        }
        let fewest = topic.partitions().iter().map(|p| p.replicas().len()).min();
        let fewest = i32::try_from(fewest.unwrap_or(0)).unwrap_or(i32::MAX);
        factors.insert(topic.name().to_owned(), fewest);
    }
    let brokers = metadata.brokers().len();
    let names: Vec<&String> = wanted.iter().filter(|n| factors.contains_key(*n)).collect();
    let resources: Vec<ResourceSpecifier<'_>> =
        names.iter().map(|n| ResourceSpecifier::Topic(n)).collect();
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let configs = admin.describe_configs(&resources, &options).await?;
    let mut topics = Vec::with_capacity(names.len());
    for (name, config) in names.into_iter().zip(configs) {
        let config = config.map_err(KafkaError::AdminOp)?;
        let min_insync = config
            .get("min.insync.replicas")
            .and_then(|entry| entry.value.as_deref())
            .and_then(|value| value.parse().ok())
            .unwrap_or(1);
        topics.push(TopicDurability {
            name: name.clone(),
            factor: factors[name],
            min_insync,
        });
    }
    Ok(Survey { brokers, topics })
}

/// Surveys the cluster once the broker answers (trying every 5 s until
/// `shutdown`), and logs what it found: a warning per weakness, else one
/// line.
pub async fn log_survey(settings: std::sync::Arc<Settings>, shutdown: CancellationToken) {
    loop {
        match survey(&settings).await {
            Ok(survey) => {
                let weaknesses = survey.weaknesses();
                for weakness in &weaknesses {
                    tracing::warn!(%weakness, "kafka durability");
                }
                tracing::info!(
                    summary = %survey.summary(),
                    weaknesses = weaknesses.len(),
                    "kafka durability surveyed"
                );
                return;
            }
            Err(e) => tracing::debug!(error = %e, "kafka durability survey failed; trying again"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(factor: i32, min_insync: i32) -> Settings {
        Settings {
            topic_replication_factor: factor,
            topic_min_insync_replicas: min_insync,
            ..Settings::default()
        }
    }

    #[test]
    fn a_cluster_gets_three_replicas_and_a_majority() {
        let auto = settings(0, 0);
        let r = |brokers| replication_for(brokers, &auto).unwrap();
        assert_eq!(
            r(1),
            Replication {
                factor: 1,
                min_insync: 1
            }
        );
        assert_eq!(
            r(2),
            Replication {
                factor: 2,
                min_insync: 1
            }
        );
        assert_eq!(
            r(3),
            Replication {
                factor: 3,
                min_insync: 2
            }
        );
        assert_eq!(
            r(6),
            Replication {
                factor: 3,
                min_insync: 2
            }
        );
        let five = replication_for(5, &settings(5, 0)).unwrap();
        assert_eq!(
            five,
            Replication {
                factor: 5,
                min_insync: 3
            }
        );
    }

    #[test]
    fn a_factor_the_cluster_cannot_hold_or_an_unreachable_minimum_is_refused() {
        let too_big = replication_for(1, &settings(3, 0)).unwrap_err();
        assert!(too_big.contains("needs 3 brokers"), "{too_big}");
        let unreachable = replication_for(3, &settings(3, 4)).unwrap_err();
        assert!(unreachable.contains("no write"), "{unreachable}");
    }

    #[test]
    fn a_producer_without_acks_all_or_idempotence_is_refused() {
        assert!(check_producer(&producer_config(&KafkaClient::plaintext("b:1"))).is_ok());
        let mut one = producer_config(&KafkaClient::plaintext("b:1"));
        one.set("acks", "1");
        let e = check_producer(&one).unwrap_err().to_string();
        assert!(e.contains("acks=1 (needs all)"), "{e}");
        let mut minus_one = producer_config(&KafkaClient::plaintext("b:1"));
        minus_one.set("acks", "-1");
        assert!(check_producer(&minus_one).is_ok());
        let mut bare = ClientConfig::new();
        bare.set("bootstrap.servers", "b:1");
        let e = check_producer(&bare).unwrap_err().to_string();
        assert!(e.contains("enable.idempotence=unset"), "{e}");
    }

    #[test]
    fn weaknesses_name_the_topic_and_what_it_risks() {
        let topic = |name: &str, factor, min_insync| TopicDurability {
            name: name.into(),
            factor,
            min_insync,
        };
        let survey = Survey {
            brokers: 3,
            topics: vec![
                topic("a", 3, 2),
                topic("b", 1, 1),
                topic("c", 3, 1),
                topic("d", 2, 3),
            ],
        };
        let found = survey.weaknesses();
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("b: one replica"));
        assert!(found[1].starts_with("c: min.insync.replicas 1"));
        assert!(found[2].starts_with("d: min.insync.replicas 3 is more"));
        let single = Survey {
            brokers: 1,
            topics: vec![topic("a", 1, 1)],
        };
        assert!(single.weaknesses().is_empty());
    }
}
