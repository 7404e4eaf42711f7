//! For machines with a Docker engine: `cargo test --features docker` with
//! `DOCSTREAM_TEST_SERVICES=docker` starts Kafka and Postgres in containers
//! (testcontainers) instead of using the ones `scripts/services.sh` runs.
//! `scripts/test.sh` never takes this path.

use std::sync::OnceLock;

use testcontainers_modules::kafka::apache::{Kafka, KAFKA_PORT as KAFKA_CONTAINER_PORT};
use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::testcontainers::core::IntoContainerPort;
use testcontainers_modules::testcontainers::runners::SyncRunner;
use testcontainers_modules::testcontainers::{Container, ImageExt};

/// Host ports of the containers: the same as the native services', so
/// settings and documentation agree.
const PG_PORT: u16 = 55432;
const KAFKA_PORT: u16 = 59092;

struct Services {
    _postgres: Container<Postgres>,
    _kafka: Container<Kafka>,
}

static SERVICES: OnceLock<Services> = OnceLock::new();

/// `(DATABASE_URL, brokers)` of containerised services, started on first use
/// and kept for the life of the test binary.
pub fn services() -> (String, String) {
    SERVICES.get_or_init(|| {
        let postgres = Postgres::default()
            .with_user("docstream")
            .with_password("docstream")
            .with_db_name("docstream")
            .with_tag("15")
            .with_mapped_port(PG_PORT, 5432.tcp())
            .start()
            .expect("start postgres container");
        // The module's KRaft broker, on the JVM image of the Kafka release
        // the native services run.
        let kafka = Kafka::default()
            .with_jvm_image()
            .with_tag("4.1.1")
            .with_mapped_port(KAFKA_PORT, KAFKA_CONTAINER_PORT)
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
