//! For machines with a Docker engine: `cargo test --features docker` with
//! `DOCSTREAM_TEST_SERVICES=docker` starts Kafka and Postgres in containers
//! (testcontainers) instead of using the ones `scripts/services.sh` runs.
//! `scripts/test.sh` never takes this path.

use std::sync::OnceLock;

use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

/// Host ports of the containers: the same as the native services', so
/// settings and documentation agree.
const PG_PORT: u16 = 55432;
const KAFKA_PORT: u16 = 59092;

struct Services {
    _postgres: Container<GenericImage>,
    _kafka: Container<GenericImage>,
}

static SERVICES: OnceLock<Services> = OnceLock::new();

/// `(DATABASE_URL, brokers)` of containerised services, started on first use
/// and kept for the life of the test binary.
pub fn services() -> (String, String) {
    SERVICES.get_or_init(|| {
        let postgres = GenericImage::new("postgres", "15")
            .with_wait_for(WaitFor::message_on_stderr(
                "database system is ready to accept connections",
            ))
            .with_mapped_port(PG_PORT, 5432.tcp())
            .with_env_var("POSTGRES_USER", "docstream")
            .with_env_var("POSTGRES_PASSWORD", "docstream")
            .with_env_var("POSTGRES_DB", "docstream")
            .start()
            .expect("start postgres container");
        let kafka = GenericImage::new("apache/kafka", "4.1.1")
            .with_wait_for(WaitFor::message_on_stdout("Kafka Server started"))
            .with_mapped_port(KAFKA_PORT, 9092.tcp())
            .with_env_var("KAFKA_NODE_ID", "1")
            .with_env_var("KAFKA_PROCESS_ROLES", "broker,controller")
            .with_env_var("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
            .with_env_var(
                "KAFKA_ADVERTISED_LISTENERS",
                format!("PLAINTEXT://127.0.0.1:{KAFKA_PORT}"),
            )
            .with_env_var("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
            .with_env_var(
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            )
            .with_env_var("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
            .with_env_var("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
            .with_env_var("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env_var("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env_var("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
            .with_env_var("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
            .start()
            .expect("start kafka container");
        Services {
            _postgres: postgres,
            _kafka: kafka,
        }
    });
    (
        format!("postgres://docstream:docstream@127.0.0.1:{PG_PORT}/docstream"),
        format!("127.0.0.1:{KAFKA_PORT}"),
    )
}
