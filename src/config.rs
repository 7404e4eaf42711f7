//! Typed settings. Sources, later ones winning: built-in defaults, an optional TOML
//! file (`--config` or `DOCSTREAM_CONFIG`), then environment variables. Every
//! setting has one environment variable (`DOCSTREAM_…`, or `DATABASE_URL`), and
//! every default carries the reason it was chosen. [`Settings::validate`] refuses
//! combinations that cannot work before anything starts.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML file could not be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// An environment variable does not parse as its setting's type.
    #[error("{var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What the parser said.
        reason: String,
    },
    /// A combination of settings that cannot work.
    #[error("invalid settings: {0}")]
    Invalid(String),
}

/// Declares the settings once: field, type, default, variable, and the reason.
macro_rules! settings {
    ($( $(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr, env $var:literal; )*) => {
        /// Every setting of a docstream process.
        #[derive(Debug, Clone, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Settings {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for Settings {
            fn default() -> Self {
                Self { $( $field: $default.into(), )* }
            }
        }

        impl Settings {
            /// Overrides each setting whose variable `lookup` knows.
            fn apply_env(&mut self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
                $(
                    if let Some(value) = lookup($var) {
                        self.$field = value.parse::<$ty>().map_err(|e| ConfigError::Env {
                            var: $var,
                            value: value.clone(),
                            reason: e.to_string(),
                        })?;
                    }
                )*
                Ok(())
            }

            /// Each setting's variable and current value, for `--help`-like listings.
            pub fn variables() -> &'static [&'static str] {
                &[$( $var, )*]
            }
        }
    };
}

settings! {
    /// Postgres connection string. Default: the cluster `scripts/services.sh` starts.
    database_url: String = "postgres://docstream:docstream@127.0.0.1:55432/docstream", env "DATABASE_URL";
    /// Kafka bootstrap servers. Default: the broker `scripts/services.sh` starts.
    kafka_brokers: String = "127.0.0.1:59092", env "DOCSTREAM_KAFKA_BROKERS";
    /// Prepended to every topic and consumer-group name, so several deployments (or
    /// test runs) share one cluster without seeing each other. Default: none.
    topic_prefix: String = "", env "DOCSTREAM_TOPIC_PREFIX";
    /// Jobs produced straight to Kafka.
    topic_requests: String = "extraction.requests", env "DOCSTREAM_TOPIC_REQUESTS";
    /// Queued jobs waiting for a worker.
    topic_submitted: String = "extraction.submitted", env "DOCSTREAM_TOPIC_SUBMITTED";
    /// Bbox refinements waiting for a bbox worker.
    topic_post_processing: String = "extraction.post_processing.requested", env "DOCSTREAM_TOPIC_POST_PROCESSING";
    /// One event per state change.
    topic_events: String = "extraction.events", env "DOCSTREAM_TOPIC_EVENTS";
    /// Records that could not be processed.
    topic_dlq: String = "extraction.dlq", env "DOCSTREAM_TOPIC_DLQ";
    /// Partitions of the two job topics: the most worker replicas that can share
    /// the work. 6 lets 1, 2, 3 or 6 replicas split it evenly.
    job_topic_partitions: i32 = 6, env "DOCSTREAM_JOB_TOPIC_PARTITIONS";
    /// Partitions of extraction.events and extraction.requests; 6 for the same reason.
    stream_topic_partitions: i32 = 6, env "DOCSTREAM_STREAM_TOPIC_PARTITIONS";
    /// Partitions of the DLQ: 1, since it is rare and read by humans in order.
    dlq_topic_partitions: i32 = 1, env "DOCSTREAM_DLQ_TOPIC_PARTITIONS";
    /// Replication factor of created topics: 1 suits the single local broker;
    /// production clusters want 3.
    topic_replication_factor: i32 = 1, env "DOCSTREAM_TOPIC_REPLICATION_FACTOR";
    /// Consumer group of `worker`.
    worker_group: String = "docstream-worker", env "DOCSTREAM_WORKER_GROUP";
    /// Consumer group of `bbox-worker`.
    bbox_worker_group: String = "docstream-bbox-worker", env "DOCSTREAM_BBOX_WORKER_GROUP";
    /// Listen address of `serve` (and of `all`). Loopback by default: exposing it is
    /// a decision, not an accident.
    http_addr: String = "127.0.0.1:8080", env "DOCSTREAM_HTTP_ADDR";
    /// Listen address of `/metrics` for processes without the API (workers). Port 0
    /// picks a free one, which is what tests running several workers want.
    metrics_addr: String = "127.0.0.1:9464", env "DOCSTREAM_METRICS_ADDR";
    /// Largest accepted request body. 4 MiB fits a multi-page OCR document with
    /// word geometry; larger bodies get 413.
    http_body_limit_bytes: usize = 4_usize * 1024 * 1024, env "DOCSTREAM_HTTP_BODY_LIMIT_BYTES";
    /// How long a worker's claim on an extraction lasts. Without heartbeats a
    /// claim must outlive the longest run, so it is the async timeout plus a margin.
    extraction_run_lease_s: f64 = 40.0, env "DOCSTREAM_EXTRACTION_RUN_LEASE_S";
    /// How long a bbox worker's claim lasts: the bbox timeout plus a margin.
    bbox_refinement_lease_s: f64 = 40.0, env "DOCSTREAM_BBOX_REFINEMENT_LEASE_S";
    /// Longest an extractor may run before the job fails. The rule extractor takes
    /// milliseconds; 30 s leaves room for an HTTP extractor.
    async_timeout_s: f64 = 30.0, env "DOCSTREAM_ASYNC_TIMEOUT_S";
    /// Longest bbox grounding may run.
    bbox_refine_timeout_s: f64 = 30.0, env "DOCSTREAM_BBOX_REFINE_TIMEOUT_S";
    /// Records a consumer works on at once. 16 keeps two cores and a 20-connection
    /// pool busy without queueing inside the process.
    consumer_max_in_flight: usize = 16_usize, env "DOCSTREAM_CONSUMER_MAX_IN_FLIGHT";
    /// How long a stopping consumer waits for in-flight records before it gives up
    /// on them (they are not committed and will be redelivered).
    subscriber_drain_timeout_s: f64 = 10.0, env "DOCSTREAM_SUBSCRIBER_DRAIN_TIMEOUT_S";
    /// Longest the producer keeps trying to deliver one record (message.timeout.ms).
    publish_timeout_s: f64 = 30.0, env "DOCSTREAM_PUBLISH_TIMEOUT_S";
    /// Postgres connections per process. 20 covers the in-flight records of one
    /// worker and the API's concurrency on the default 300-connection server.
    db_max_connections: u32 = 20_u32, env "DOCSTREAM_DB_MAX_CONNECTIONS";
    /// Logs as JSON lines instead of text.
    log_json: bool = false, env "DOCSTREAM_LOG_JSON";
}

impl Settings {
    /// Defaults, then `file` if given, then the process environment; validated.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, &|var| std::env::var(var).ok())
    }

    /// Like [`Settings::load`], with `lookup` standing in for the environment.
    pub fn load_from(
        file: Option<&Path>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut settings = match file {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        settings.apply_env(lookup)?;
        settings.validate()?;
        Ok(settings)
    }

    fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let error = |reason: String| ConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        toml::from_str(&text).map_err(|e| error(e.to_string()))
    }

    /// Refuses settings that cannot work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        for (name, secs) in [
            (
                "DOCSTREAM_EXTRACTION_RUN_LEASE_S",
                self.extraction_run_lease_s,
            ),
            (
                "DOCSTREAM_BBOX_REFINEMENT_LEASE_S",
                self.bbox_refinement_lease_s,
            ),
            ("DOCSTREAM_ASYNC_TIMEOUT_S", self.async_timeout_s),
            (
                "DOCSTREAM_BBOX_REFINE_TIMEOUT_S",
                self.bbox_refine_timeout_s,
            ),
            (
                "DOCSTREAM_SUBSCRIBER_DRAIN_TIMEOUT_S",
                self.subscriber_drain_timeout_s,
            ),
            ("DOCSTREAM_PUBLISH_TIMEOUT_S", self.publish_timeout_s),
        ] {
            if !(secs.is_finite() && secs > 0.0) {
                return invalid(format!("{name} must be a positive number of seconds"));
            }
        }
        if self.extraction_run_lease_s <= self.async_timeout_s {
            return invalid(format!(
                "DOCSTREAM_EXTRACTION_RUN_LEASE_S ({}) must exceed DOCSTREAM_ASYNC_TIMEOUT_S ({}): \
                 a claim that expires while its extractor may still run lets a second worker run it too",
                self.extraction_run_lease_s, self.async_timeout_s
            ));
        }
        if self.bbox_refinement_lease_s <= self.bbox_refine_timeout_s {
            return invalid(format!(
                "DOCSTREAM_BBOX_REFINEMENT_LEASE_S ({}) must exceed DOCSTREAM_BBOX_REFINE_TIMEOUT_S ({})",
                self.bbox_refinement_lease_s, self.bbox_refine_timeout_s
            ));
        }
        for (name, n) in [
            ("DOCSTREAM_JOB_TOPIC_PARTITIONS", self.job_topic_partitions),
            (
                "DOCSTREAM_STREAM_TOPIC_PARTITIONS",
                self.stream_topic_partitions,
            ),
            ("DOCSTREAM_DLQ_TOPIC_PARTITIONS", self.dlq_topic_partitions),
            (
                "DOCSTREAM_TOPIC_REPLICATION_FACTOR",
                self.topic_replication_factor,
            ),
        ] {
            if n < 1 {
                return invalid(format!("{name} must be at least 1"));
            }
        }
        if self.consumer_max_in_flight == 0 || self.db_max_connections == 0 {
            return invalid(
                "consumer_max_in_flight and db_max_connections must be at least 1".into(),
            );
        }
        for (name, addr) in [
            ("DOCSTREAM_HTTP_ADDR", &self.http_addr),
            ("DOCSTREAM_METRICS_ADDR", &self.metrics_addr),
        ] {
            if addr.parse::<SocketAddr>().is_err() {
                return invalid(format!("{name}={addr:?} is not a socket address (ip:port)"));
            }
        }
        Ok(())
    }

    /// The full name of a topic, with the prefix.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{}", self.topic_prefix, name)
    }

    /// The full name of a consumer group, with the prefix.
    pub fn group(&self, name: &str) -> String {
        format!("{}{}", self.topic_prefix, name)
    }

    /// `async_timeout_s` as a duration.
    pub fn async_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.async_timeout_s)
    }

    /// `subscriber_drain_timeout_s` as a duration.
    pub fn subscriber_drain_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.subscriber_drain_timeout_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load_from(None, &move |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_are_valid() {
        assert!(load(&[]).is_ok());
    }

    #[test]
    fn env_overrides_and_bad_values_name_their_variable() {
        let s = load(&[("DOCSTREAM_JOB_TOPIC_PARTITIONS", "12")]).unwrap();
        assert_eq!(s.job_topic_partitions, 12);
        let err = load(&[("DOCSTREAM_JOB_TOPIC_PARTITIONS", "many")]).unwrap_err();
        assert!(err.to_string().contains("DOCSTREAM_JOB_TOPIC_PARTITIONS"));
    }

    #[test]
    fn a_lease_shorter_than_the_run_is_refused() {
        let err = load(&[
            ("DOCSTREAM_EXTRACTION_RUN_LEASE_S", "5"),
            ("DOCSTREAM_ASYNC_TIMEOUT_S", "10"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("must exceed"), "{err}");
    }

    #[test]
    fn toml_file_is_read_and_env_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docstream.toml");
        std::fs::write(&path, "topic_prefix = \"a.\"\njob_topic_partitions = 3\n").unwrap();
        let s = Settings::load_from(Some(&path), &|v| {
            (v == "DOCSTREAM_TOPIC_PREFIX").then(|| "b.".to_string())
        })
        .unwrap();
        assert_eq!((s.topic_prefix.as_str(), s.job_topic_partitions), ("b.", 3));
        std::fs::write(&path, "no_such_setting = 1\n").unwrap();
        assert!(Settings::load_from(Some(&path), &|_| None).is_err());
    }
}
