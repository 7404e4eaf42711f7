//! How every Kafka client of a process reaches the cluster: the bootstrap
//! servers, and the properties that secure the connection (TLS, SASL, client
//! certificates), read from `DOCSTREAM_KAFKA_PROPERTIES_FILE` in librdkafka's
//! own names, the file a team keeps for its Kafka command-line tools.
//!
//! The file may set any librdkafka property except those docstream's
//! guarantees rest on ([`GUARDED`]): each of those is refused at start, named,
//! with what it would break. Secrets (a password, a key) are never printed:
//! [`KafkaClient`]'s `Debug` and every error here show `***` for them.

use std::fmt;
use std::path::Path;

use rdkafka::ClientConfig;

use super::ConfigError;

/// The properties docstream sets itself, and why a file may not set them.
pub const GUARDED: &[(&str, &str)] = &[
    ("bootstrap.servers", "set DOCSTREAM_KAFKA_BROKERS instead"),
    (
        "metadata.broker.list",
        "set DOCSTREAM_KAFKA_BROKERS instead",
    ),
    (
        "enable.auto.offset.store",
        "an offset is stored only after the work behind it was delivered",
    ),
    (
        "enable.auto.commit",
        "librdkafka commits only the offsets docstream stored",
    ),
    (
        "auto.commit.interval.ms",
        "how soon a delivered record's offset is committed",
    ),
    (
        "auto.offset.reset",
        "where a new group starts is docstream's choice per consumer",
    ),
    (
        "enable.idempotence",
        "a retried produce must not write a record twice",
    ),
    (
        "acks",
        "a record is acknowledged only once all in-sync replicas hold it",
    ),
    (
        "request.required.acks",
        "a record is acknowledged only once all in-sync replicas hold it",
    ),
    (
        "transactional.id",
        "docstream's producers are idempotent, not transactional",
    ),
    (
        "message.timeout.ms",
        "set DOCSTREAM_PUBLISH_TIMEOUT_S instead",
    ),
    (
        "delivery.timeout.ms",
        "set DOCSTREAM_PUBLISH_TIMEOUT_S instead",
    ),
    ("linger.ms", "set DOCSTREAM_PUBLISHER_LINGER_MS instead"),
    (
        "queue.buffering.max.ms",
        "set DOCSTREAM_PUBLISHER_LINGER_MS instead",
    ),
    (
        "queued.max.messages.kbytes",
        "set DOCSTREAM_CONSUMER_PREFETCH_KBYTES instead",
    ),
    (
        "isolation.level",
        "the readers' view of the topics is docstream's",
    ),
    ("group.id", "set the DOCSTREAM_*_GROUP settings instead"),
    (
        "group.instance.id",
        "a static member would hold its partitions past a crash",
    ),
    (
        "group.protocol",
        "set DOCSTREAM_KAFKA_GROUP_PROTOCOL instead",
    ),
    (
        "group.remote.assignor",
        "the assignment follows DOCSTREAM_KAFKA_GROUP_PROTOCOL",
    ),
    (
        "partition.assignment.strategy",
        "cooperative-sticky keeps a rebalance from stopping every lane",
    ),
    (
        "session.timeout.ms",
        "set DOCSTREAM_KAFKA_SESSION_TIMEOUT_MS instead; the drains are checked against it",
    ),
    (
        "heartbeat.interval.ms",
        "follows DOCSTREAM_KAFKA_SESSION_TIMEOUT_MS",
    ),
    (
        "enable.partition.eof",
        "the consumers do not expect end-of-partition events",
    ),
    (
        "statistics.interval.ms",
        "set DOCSTREAM_KAFKA_STATISTICS_INTERVAL_S instead; the metrics are made of it",
    ),
];

/// Properties whose values are secrets: never printed.
const SECRET: &[&str] = &[
    "sasl.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
];

/// Whether `key`'s value must never be printed.
pub fn is_secret(key: &str) -> bool {
    SECRET.contains(&key)
        || [".password", ".secret", ".passphrase", ".pem"]
            .iter()
            .any(|end| key.ends_with(end))
}

/// The properties of every client beyond its bootstrap servers, in the order
/// given: the file's, then the secrets given by their own settings.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties(Vec<(String, String)>);

impl KafkaProperties {
    /// The properties of `file` (none when empty), with the SASL password and
    /// the OIDC client secret of their own settings when given. A property
    /// given twice, a guarded one, or one librdkafka does not know or accept
    /// is refused.
    pub fn load(
        file: &str,
        sasl_password: &str,
        oauth_client_secret: &str,
    ) -> Result<Self, ConfigError> {
        let mut properties = if file.is_empty() {
            Self::default()
        } else {
            let path = Path::new(file);
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: file.to_owned(),
                reason: format!("DOCSTREAM_KAFKA_PROPERTIES_FILE: {e}"),
            })?;
            Self::parse(&text).map_err(|reason| ConfigError::File {
                path: file.to_owned(),
                reason,
            })?
        };
        for (var, key, value) in [
            (
                "DOCSTREAM_KAFKA_SASL_PASSWORD",
                "sasl.password",
                sasl_password,
            ),
            (
                "DOCSTREAM_KAFKA_OAUTH_CLIENT_SECRET",
                "sasl.oauthbearer.client.secret",
                oauth_client_secret,
            ),
        ] {
            if value.is_empty() {
                continue;
            }
            if properties.get(key).is_some() {
                return Err(ConfigError::Invalid(format!(
                    "{var} and the properties file's {key} are both given: keep one"
                )));
            }
            properties.0.push((key.to_owned(), value.to_owned()));
        }
        properties.check_with_librdkafka()?;
        Ok(properties)
    }

    /// `key=value` lines as Java's properties files and Kafka's tools write
    /// them: blank lines and lines starting with `#` or `!` are skipped, and
    /// space around the key and the value is trimmed.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut properties: Vec<(String, String)> = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let at = number + 1;
            let Some((key, value)) = line.split_once('=') else {
                return Err(format!("line {at}: not a key=value line"));
            };
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() {
                return Err(format!("line {at}: no property name before '='"));
            }
            if let Some((_, why)) = GUARDED.iter().find(|(guarded, _)| *guarded == key) {
                return Err(format!(
                    "line {at}: {key} is docstream's to set, not the file's: {why}"
                ));
            }
            if properties.iter().any(|(k, _)| k == key) {
                return Err(format!("line {at}: {key} is given twice"));
            }
            properties.push((key.to_owned(), value.to_owned()));
        }
        Ok(Self(properties))
    }

    /// The value of `key`, when given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Hands every property to librdkafka without making a client: an unknown
    /// name or a value it refuses (a misspelt mechanism, a missing CA file)
    /// fails here, at start, naming the property but never a secret's value.
    fn check_with_librdkafka(&self) -> Result<(), ConfigError> {
        let mut config = ClientConfig::new();
        self.apply(&mut config);
        config.create_native_config().map(drop).map_err(|e| {
            let said = match &e {
                rdkafka::error::KafkaError::ClientConfig(_, description, key, _) => {
                    format!("{key}: {description}")
                }
                other => redact(&other.to_string(), self),
            };
            ConfigError::Invalid(format!("Kafka client properties: {said}"))
        })
    }

    /// Sets every property on `config`.
    pub fn apply(&self, config: &mut ClientConfig) {
        for (key, value) in &self.0 {
            config.set(key, value);
        }
    }
}

/// `text` with every secret value of `properties` replaced by `***`.
pub fn redact(text: &str, properties: &KafkaProperties) -> String {
    let mut text = text.to_owned();
    for (key, value) in &properties.0 {
        if is_secret(key) && !value.is_empty() {
            text = text.replace(value.as_str(), "***");
        }
    }
    text
}

impl fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (key, value) in &self.0 {
            if is_secret(key) {
                map.entry(key, &"***");
            } else {
                map.entry(key, value);
            }
        }
        map.finish()
    }
}

/// Where and how a Kafka client connects: cheap to clone, and the start of
/// every client's configuration ([`KafkaClient::config`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaClient {
    brokers: String,
    properties: KafkaProperties,
}

impl KafkaClient {
    /// A client of `brokers` with `properties`.
    pub fn new(brokers: impl Into<String>, properties: KafkaProperties) -> Self {
        Self {
            brokers: brokers.into(),
            properties,
        }
    }

    /// A plaintext client of `brokers`, as the local services and the tests use.
    pub fn plaintext(brokers: impl Into<String>) -> Self {
        Self::new(brokers, KafkaProperties::default())
    }

    /// The bootstrap servers.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The security properties.
    pub fn properties(&self) -> &KafkaProperties {
        &self.properties
    }

    /// A new client configuration: the bootstrap servers and the security
    /// properties; each client adds its own settings.
    pub fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        self.properties.apply(&mut config);
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_properties_file_reads_and_its_secret_is_never_printed() {
        let text = "# Confluent Cloud\nsecurity.protocol=SASL_SSL\n\nsasl.mechanisms = PLAIN\n! old style\nsasl.username=key\nsasl.password=hunter2=x\n";
        let properties = KafkaProperties::parse(text).unwrap();
        assert_eq!(properties.get("sasl.mechanisms"), Some("PLAIN"));
        assert_eq!(properties.get("sasl.password"), Some("hunter2=x"));
        let printed = format!("{:?}", KafkaClient::new("b:1", properties.clone()));
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("SASL_SSL"), "{printed}");
        assert_eq!(
            redact("auth failed with hunter2=x", &properties),
            "auth failed with ***"
        );
        properties.check_with_librdkafka().unwrap();
    }

    #[test]
    fn the_properties_docstream_keeps_are_refused_by_name() {
        for (key, _) in GUARDED {
            let e =
                KafkaProperties::parse(&format!("security.protocol=SSL\n{key}=x\n")).unwrap_err();
            assert!(
                e.starts_with(&format!("line 2: {key} is docstream's")),
                "{e}"
            );
        }
        let twice = KafkaProperties::parse("sasl.username=a\nsasl.username=b").unwrap_err();
        assert_eq!(twice, "line 2: sasl.username is given twice");
        let bare = KafkaProperties::parse("security.protocol").unwrap_err();
        assert_eq!(bare, "line 1: not a key=value line");
    }

    #[test]
    fn librdkafka_refuses_what_it_does_not_know_without_the_secret() {
        let unknown = KafkaProperties::parse("sasl.pasword=hunter2\n").unwrap();
        let e = unknown.check_with_librdkafka().unwrap_err().to_string();
        assert!(e.contains("sasl.pasword"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let protocol = KafkaProperties::parse("security.protocol=SASL_TLS\n").unwrap();
        let e = protocol.check_with_librdkafka().unwrap_err().to_string();
        assert!(e.contains("security.protocol"), "{e}");
    }

    #[test]
    fn a_password_setting_beside_the_file_is_added_unless_the_file_has_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.properties");
        std::fs::write(
            &file,
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=u\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let loaded = KafkaProperties::load(path, "s3cret", "").unwrap();
        assert_eq!(loaded.get("sasl.password"), Some("s3cret"));
        std::fs::write(&file, "sasl.password=x\n").unwrap();
        let e = KafkaProperties::load(path, "s3cret", "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("both given"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        let missing = KafkaProperties::load("/nonexistent/client.properties", "", "")
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("/nonexistent/client.properties"),
            "{missing}"
        );
    }
}
