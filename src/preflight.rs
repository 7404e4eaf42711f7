//! Before a process starts: can it reach Kafka and Postgres with what it was
//! given? A process rides through an outage (it starts not ready and becomes
//! ready when both answer), but no retry makes a wrong password, a CA that
//! does not sign the server's certificate or a host name the certificate does
//! not name pass. Those end the process at start, with the error that says
//! which, and never with a secret in it.
//!
//! Each check makes one connection and waits at most [`PATIENCE`]. Its first
//! error decides: a refusal ends the process; anything else (nobody listens,
//! no answer in time) is an outage, and the process goes on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use sqlx::Connection;

use crate::config::{KafkaClient, Settings};

/// How long a check waits for its dependency to answer.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A dependency refused what the process was given.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The brokers refused the credentials, or their certificate.
    #[error("Kafka refused the connection ({brokers}): {reason}")]
    Kafka {
        /// The bootstrap servers.
        brokers: String,
        /// librdkafka's words.
        reason: String,
    },
    /// Postgres refused the credentials, or its certificate.
    #[error("Postgres refused the connection: {0}")]
    Postgres(String),
}

/// What a check found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reached {
    /// The dependency answered.
    Yes,
    /// It did not answer within [`PATIENCE`] (or could not be reached at
    /// all): an outage to ride through. The last error, for the log.
    NotYet(String),
}

/// Checks Kafka and Postgres at once; an outage is logged, a refusal returned.
pub async fn check(settings: &Settings) -> Result<(), Refused> {
    let client = settings.kafka();
    let (kafka, postgres) = tokio::join!(
        check_kafka(&client, PATIENCE),
        check_postgres(&settings.database_url, PATIENCE)
    );
    for (name, reached) in [("kafka", kafka?), ("postgres", postgres?)] {
        if let Reached::NotYet(last) = reached {
            tracing::warn!(dependency = name, error = %last, "not reachable at start; starting not ready");
        }
    }
    Ok(())
}

/// Whether `error` is a refusal (credentials, certificates, permissions)
/// rather than an outage.
fn kafka_refusal(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::SSL | RDKafkaErrorCode::Authentication)
    ) || crate::kafka::context::is_fatal(error)
}

/// The errors librdkafka raised while the check waited: whether each is a
/// refusal, and what it said.
#[derive(Clone, Default)]
struct Witness(Arc<Mutex<Vec<(bool, String)>>>);

impl Witness {
    fn take(&self) -> Vec<(bool, String)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl ClientContext for Witness {
    fn error(&self, error: KafkaError, reason: &str) {
        // A TLS alert from the broker (a client certificate it does not
        // accept, say) reaches librdkafka as a failed receive: still a refusal.
        let refusal =
            kafka_refusal(&error) || (reason.contains("SSL routines") && reason.contains("alert"));
        let hint = match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::SSL) => {
                " (is ssl.ca.location the CA that signed the broker's certificate, and does \
                 the certificate name the host in DOCSTREAM_KAFKA_BROKERS?)"
            }
            _ => "",
        };
        let seen = (refusal, format!("{reason}{hint}"));
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(seen);
    }
}

impl ProducerContext for Witness {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// Asks the brokers of `kafka` for the cluster's metadata until they answer,
/// refuse, or `patience` passes.
pub async fn check_kafka(kafka: &KafkaClient, patience: Duration) -> Result<Reached, Refused> {
    let kafka = kafka.clone();
    tokio::task::spawn_blocking(move || check_kafka_blocking(&kafka, patience))
        .await
        .unwrap_or_else(|e| Ok(Reached::NotYet(format!("the check did not finish: {e}"))))
}

fn check_kafka_blocking(kafka: &KafkaClient, patience: Duration) -> Result<Reached, Refused> {
    let refused = |reason: String| Refused::Kafka {
        brokers: kafka.brokers().to_owned(),
        reason: crate::config::redact_kafka(&reason, kafka.properties()),
    };
    let witness = Witness::default();
    let producer: BaseProducer<Witness> = kafka
        .config()
        .create_with_context(witness.clone())
        .map_err(|e| refused(e.to_string()))?;
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        let answer = producer
            .client()
            .fetch_metadata(None, Duration::from_secs(1));
        if answer.is_ok() {
            return Ok(Reached::Yes);
        }
        // Serves the error callbacks of what happened meanwhile: the first
        // one decides, as no later attempt would go differently.
        producer.poll(Duration::from_millis(100));
        if let Some((refusal, said)) = witness.take().into_iter().next() {
            return match refusal {
                true => Err(refused(said)),
                false => Ok(Reached::NotYet(crate::config::redact_kafka(
                    &said,
                    kafka.properties(),
                ))),
            };
        }
        if let Err(e) = answer {
            if kafka_refusal(&e) {
                return Err(refused(e.to_string()));
            }
        }
    }
    Ok(Reached::NotYet("no answer".into()))
}

/// Opens one connection to `url` and closes it.
pub async fn check_postgres(url: &str, patience: Duration) -> Result<Reached, Refused> {
    let options: sqlx::postgres::PgConnectOptions = url
        .parse()
        .map_err(|e: sqlx::Error| Refused::Postgres(e.to_string()))?;
    let attempt = tokio::time::timeout(patience, sqlx::PgConnection::connect_with(&options)).await;
    match attempt {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(Reached::Yes)
        }
        Ok(Err(e)) if postgres_refusal(&e) => Err(Refused::Postgres(postgres_said(&e))),
        Ok(Err(e)) => Ok(Reached::NotYet(e.to_string())),
        Err(_) => Ok(Reached::NotYet("no answer".into())),
    }
}

/// What `error` says, with a hint where sqlx's words leave the cause open.
fn postgres_said(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => format!(
            "{error} (is sslrootcert the CA that signed the server's certificate, and does the \
             certificate name the host in DATABASE_URL?)"
        ),
        _ => error.to_string(),
    }
}

/// Whether `error` is a refusal: a TLS failure, or the server turning the
/// role away (a wrong password, no `pg_hba.conf` line for this connection, an
/// unknown role or database).
fn postgres_refusal(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Tls(_) | sqlx::Error::Configuration(_) => true,
        // A certificate refused in the handshake comes back as the stream's
        // error, carrying rustls's.
        sqlx::Error::Io(e) => e
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
        sqlx::Error::Database(e) => {
            let code = e.code().unwrap_or_default();
            // Class 28 (invalid authorization), 3D000 (no such database).
            code.starts_with("28") || code == "3D000"
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_nobody_listens_on_is_an_outage_not_a_refusal() {
        let kafka = KafkaClient::plaintext("127.0.0.1:1");
        let reached = check_kafka(&kafka, Duration::from_secs(1)).await.unwrap();
        assert!(matches!(reached, Reached::NotYet(_)), "{reached:?}");
        let pg = check_postgres("postgres://u:p@127.0.0.1:1/x", Duration::from_secs(1))
            .await
            .unwrap();
        assert!(matches!(pg, Reached::NotYet(_)), "{pg:?}");
    }

    #[tokio::test]
    async fn a_url_that_does_not_parse_is_refused_without_its_password() {
        let e = check_postgres(
            "postgres://u:s3cret@127.0.0.1:1/x?sslmode=sideways",
            Duration::from_secs(1),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"sideways\""), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }
}
